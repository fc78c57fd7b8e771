"""bertjax.storage: one set of file operations for a local disk and a
bucket (a Cloud Storage API on localhost), with the same atomicity."""

import os

import numpy as np
import pytest

from bertjax import storage


@pytest.fixture(params=['local', 'bucket'])
def base(request, tmp_path):
  if request.param == 'local':
    return str(tmp_path)
  return f'{request.getfixturevalue("gcs_bucket")}/storage-{os.getpid()}'


def test_round_trip_listing_and_removal(base):
  storage.makedirs(f'{base}/a/b')
  storage.write_text(f'{base}/a/one.txt', 'one')
  storage.write_bytes(f'{base}/a/b/two.bin', b'\x00' * 5)
  storage.write_bytes(f'{base}/a/b/three.bin', b'33')
  assert storage.read_text(f'{base}/a/one.txt') == 'one'
  assert storage.getsize(f'{base}/a/b/two.bin') == 5
  assert storage.isdir(f'{base}/a/b') and storage.isfile(f'{base}/a/one.txt')
  assert storage.listdir(f'{base}/a') == ['b', 'one.txt']
  found = storage.find(f'{base}/a')
  assert list(found) == [f'{base}/a/b/three.bin', f'{base}/a/b/two.bin',
                         f'{base}/a/one.txt']
  assert [s.size for s in found.values()] == [2, 5, 3]
  assert list(storage.find(f'{base}/a/**/t*.bin')) == [
      f'{base}/a/b/three.bin', f'{base}/a/b/two.bin']
  version = storage.stat(f'{base}/a/one.txt').version
  storage.write_text(f'{base}/a/one.txt', 'uno')
  assert storage.stat(f'{base}/a/one.txt').version != version
  storage.rmtree(f'{base}/a')
  assert not storage.exists(f'{base}/a/one.txt')
  assert storage.find(f'{base}/a') == {}


def test_a_failed_staged_write_leaves_the_old_file(base):
  path = f'{base}/model.bin'
  storage.write_bytes(path, b'old')
  with pytest.raises(RuntimeError):
    with storage.staged(path) as local:
      with open(local, 'wb') as f:
        f.write(b'half of the new')
      raise RuntimeError('killed mid-write')
  assert storage.read_bytes(path) == b'old'
  assert storage.listdir(base) == ['model.bin']   # No temporary left.
  with storage.staged(path) as local:
    with open(local, 'wb') as f:
      f.write(b'new')
  assert storage.read_bytes(path) == b'new'


def test_sha256_of_a_file_in_a_bucket_equals_the_local_one(tmp_path,
                                                           gcs_bucket):
  # Ending in CR: the emulator once dropped a CR before the upload's
  # closing delimiter (tests/gcs_emulator.py).
  data = np.random.default_rng(0).bytes((3 << 20) - 1) + b'\r'
  (tmp_path / 'x').write_bytes(data)
  storage.write_bytes(f'{gcs_bucket}/sha/x', data)
  assert storage.sha256(f'{gcs_bucket}/sha/x') == storage.sha256(
      str(tmp_path / 'x'))


def test_a_missing_file_is_file_not_found(base):
  with pytest.raises(FileNotFoundError):
    storage.read_bytes(f'{base}/nothing')
  with pytest.raises(FileNotFoundError):
    storage.stat(f'{base}/nothing')


def test_a_path_with_glob_characters_is_found_as_it_is(base):
  # A sweep's workdir, e.g. lr[3e-4]: taken as a name where it exists.
  storage.makedirs(f'{base}/lr[3e-4]')
  storage.write_text(f'{base}/lr[3e-4]/m.json', '{}')
  assert list(storage.find(f'{base}/lr[3e-4]')) == [f'{base}/lr[3e-4]/m.json']
  assert list(storage.find(f'{base}/lr[3e-4]/m.json')) == [
      f'{base}/lr[3e-4]/m.json']
  storage.move(f'{base}/lr[3e-4]', f'{base}/lr[1e-3]')
  assert list(storage.find(f'{base}/lr[1e-3]')) == [f'{base}/lr[1e-3]/m.json']
  assert not storage.exists(f'{base}/lr[3e-4]/m.json')
  storage.rmtree(f'{base}/lr[1e-3]')
  assert storage.find(f'{base}/lr[1e-3]') == {}


def test_a_bucket_move_uncommits_a_checkpoint_step_first(gcs_bucket,
                                                        monkeypatch):
  """Moving a committed orbax step out of a bucket copies its commit
  marker after everything else and deletes it before anything else: a
  kill midway leaves no committed step with files missing at either end
  (sorted, '_CHECKPOINT_METADATA' and the manifest come first)."""
  base = f'{gcs_bucket}/move-{os.getpid()}'
  for name in ('_CHECKPOINT_METADATA', 'bertjax_manifest.json',
               'commit_success.txt', 'state/a', 'state/b'):
    storage.write_text(f'{base}/4/{name}', name)
  fs, _ = storage._fs(base)  # pylint: disable=protected-access
  removed, copied = [], []
  remove, copy = fs.rm_file, fs.cp_file   # fsspec caches the instance.
  monkeypatch.setattr(fs, 'rm_file',
                      lambda p: (removed.append(p), remove(p)))
  monkeypatch.setattr(fs, 'cp_file',
                      lambda a, b: (copied.append(b), copy(a, b)))
  storage.move(f'{base}/4', f'{base}/aside/4')
  assert removed[0].endswith('/4/commit_success.txt') and len(removed) == 5
  assert copied[-1].endswith('/aside/4/commit_success.txt')
  assert len(copied) == 5
  assert storage.read_text(f'{base}/aside/4/commit_success.txt') == (
      'commit_success.txt')
  assert not storage.exists(f'{base}/4/state/a')


def test_a_bucket_that_does_not_answer_is_a_storage_error(monkeypatch):
  """The client's own error after its retries (here a refused connection,
  as aiohttp raises it) becomes a StorageError that says what to check; a
  missing object stays FileNotFoundError; a local path is not touched."""
  import aiohttp  # pylint: disable=g-import-not-at-top

  class Unreachable:
    def exists(self, p):
      raise aiohttp.ClientOSError(111, f'Cannot connect to host ({p})')

    def open(self, p, *args, **kwargs):
      raise FileNotFoundError(p)

  monkeypatch.setattr(storage, '_fs', lambda path: (Unreachable(),
                                                    path.split('://')[1]))
  with pytest.raises(storage.StorageError, match=(
      r'gs://b/run: the object store did not answer \(ClientOSError: .*'
      r'Cannot connect to host .*Check the network, the bucket.s name and '
      'the credentials')):
    storage.exists('gs://b/run')
  with pytest.raises(FileNotFoundError) as missing:
    storage.read_bytes('gs://b/run/run_meta.json')
  assert not isinstance(missing.value, storage.StorageError)
  assert not storage.exists('/nonexistent/bertjax/path')
