"""Suite-wide fixtures."""

import os
import socket
import subprocess
import sys
import time

# The suite runs on the CPU. The test extra installs libtpu (the TPU
# compiler the pre-flight tests use), which JAX would otherwise try to
# start as a backend in every process, and fail with a page of warnings.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

# JAX's persistent compilation cache, read and written by this run's tests,
# in both xdist workers and in the trainers they start as subprocesses
# (which inherit the environment). The tiny end-to-end runs compile the same
# programs many times over (the same shapes, the same step functions): a
# rerun of an identical 2-step run costs 1.8 s instead of 10.5 s, most of it
# the train step's compile. Every program is cached, however quick its
# compile or small its executable: a cached executable is the one XLA would
# compile, so results are the same bytes. The two workers write without a
# lock: an entry read while the other is still writing it fails to
# decompress, and JAX warns and compiles instead.
_CACHE_EVERY_PROGRAM = {
    'jax_persistent_cache_min_compile_time_secs': 0.0,
    'jax_persistent_cache_min_entry_size_bytes': -1,
}


@pytest.fixture(scope='session', autouse=True)
def jax_compilation_cache(tmp_path_factory):
  """One cache directory per test run, shared by its xdist workers.

  A worker's base temporary directory is ``<run's basetemp>/<worker id>``,
  so the run's own is its parent; pytest removes old runs' directories.
  """
  base = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    base = base.parent
  cache_dir = str(base / 'jax_cache')
  for name, value in {**_CACHE_EVERY_PROGRAM,
                      'jax_compilation_cache_dir': cache_dir}.items():
    jax.config.update(name, value)
    os.environ[name.upper()] = str(value)   # For the subprocesses.
  return cache_dir


def pytest_collection_modifyitems(items):
  """Modules with end-to-end, fault or long tests run first.

  ``--dist loadfile`` hands each module to whichever worker is free, in
  collection order; when the long modules come last, one worker finishes
  the last of them while the other idles. Longest first keeps both busy to
  the end. Tests keep their order within a module.
  """
  heavy = {item.module.__name__ for item in items
           if any(item.get_closest_marker(m) for m in ('e2e', 'fault', 'long'))}
  order = {id(item): i for i, item in enumerate(items)}
  items.sort(key=lambda item: (item.module.__name__ not in heavy,
                               order[id(item)]))


# The clients' documented settings that point them at a Cloud Storage
# emulator: gcsfs (and so fsspec and etils.epath), ArrayRecord's GCS
# client, and TensorStore (orbax's checkpoints).
_EMULATOR_SETTINGS = ('STORAGE_EMULATOR_HOST', 'CLOUD_STORAGE_EMULATOR_ENDPOINT',
                      'TENSORSTORE_GCS_HTTP_URL')
TEST_BUCKET = 'bertjax-test'


@pytest.fixture(scope='session')
def gcs_bucket():
  """``gs://bertjax-test``: a bucket in a Cloud Storage API served on
  localhost (tests/gcs_emulator.py), with every client of this process and
  the processes it starts pointed at it. Yields the URL."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  server = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, os.path.join(os.path.dirname(__file__),
                                    'gcs_emulator.py'), str(port),
       TEST_BUCKET],
      # Its log of clients closing reads early (ArrayRecord's range reads).
      stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 30
  while True:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1).close()
      break
    except OSError:
      if time.monotonic() > deadline or server.poll() is not None:
        server.kill()
        raise RuntimeError('the Cloud Storage emulator did not start')
      time.sleep(0.1)
  saved = {k: os.environ.get(k) for k in (
      *_EMULATOR_SETTINGS, 'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT')}
  for name in _EMULATOR_SETTINGS:
    os.environ[name] = f'http://127.0.0.1:{port}'
  # gcsfs's bucket-type probe needs a control-plane API the emulator lacks.
  os.environ['GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'] = 'false'
  yield f'gs://{TEST_BUCKET}'
  server.kill()
  server.wait()
  for name, value in saved.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
