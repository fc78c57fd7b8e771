"""A Cloud Storage API on localhost for the tests (conftest.gcs_bucket).

  python tests/gcs_emulator.py PORT BUCKET

gcp-storage-emulator, in memory, with BUCKET created, and two gaps of it
filled:

- its media downloads omit the object's ``x-goog-generation`` and
  ``x-goog-metageneration`` headers, which Cloud Storage sends and
  TensorStore (orbax's checkpoints) reads to make its conditional writes;
- it reads a multipart upload with the email parser, which takes a line
  ending before the closing delimiter as the delimiter's: gcsfs ends its
  lines with LF, so an object whose last byte is CR lost it (1 upload in
  256 of random bytes). Here a part ends exactly where the delimiter, in
  the client's own line ending, begins.
"""

import json
import re
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


_READ_DATA = server._read_data  # pylint: disable=protected-access


def _read_data(request_handler, query):
  """A request's body, a multipart/related upload split exactly."""
  content_type = request_handler.headers.get('Content-Type') or ''
  if not content_type.startswith('multipart/related'):
    return _READ_DATA(request_handler, query)
  # pylint: disable=protected-access
  raw = server._decode_raw_data(server._read_raw_data(request_handler),
                                request_handler)
  boundary = re.search(r'boundary="?([^";]+)"?', content_type).group(1)
  opening = b'--' + boundary.encode()
  eol = b'\r\n' if raw.startswith(opening + b'\r\n') else b'\n'
  # [before the first delimiter, part, part, '--' after the last]
  meta, content = [part[len(eol):].split(eol + eol, 1)
                   for part in (eol + raw).split(eol + opening)[1:3]]
  headers = {name.strip().lower(): value.strip() for name, value in (
      line.split(b':', 1) for line in content[0].split(eol))}
  return {'meta': json.loads(meta[1]), 'content': content[1],
          'content-type': headers[b'content-type'].decode()}


def main(port: int, bucket: str) -> None:
  server._read_data = _read_data  # pylint: disable=protected-access
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
