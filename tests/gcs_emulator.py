"""A Cloud Storage API on localhost for the tests (conftest.gcs_bucket).

  python tests/gcs_emulator.py PORT BUCKET

gcp-storage-emulator, in memory, with BUCKET created, and one gap of it
filled: its media downloads omit the object's ``x-goog-generation`` and
``x-goog-metageneration`` headers, which Cloud Storage sends and
TensorStore (orbax's checkpoints) reads to make its conditional writes.
"""

import sys
import time

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


_DOWNLOAD = objects.download


def _download(request, response, storage, *args, **kwargs):
  _DOWNLOAD(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params['bucket_name'],
                               request.params['object_id'])
  except NotFound:
    return
  response['x-goog-generation'] = str(obj['generation'])
  response['x-goog-metageneration'] = str(obj['metageneration'])


def main(port: int, bucket: str) -> None:
  objects.download = _download   # Also what a JSON API GET ?alt=media calls.
  for _, handlers in server.HANDLERS:
    for method, handler in list(handlers.items()):
      if handler is _DOWNLOAD:
        handlers[method] = _download
  storage = server.create_server('127.0.0.1', port, in_memory=True,
                                 default_bucket=bucket)
  storage.start()
  while True:
    time.sleep(3600)


if __name__ == '__main__':
  main(int(sys.argv[1]), sys.argv[2])
