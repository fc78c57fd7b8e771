"""Files on a local disk or in a bucket (``gs://``), read and written alike.

A path with a scheme (``gs://bucket/dir``; any fsspec protocol) goes
through fsspec (gcsfs for Cloud Storage, the library etils.epath and TFDS
use too); any other path is the local filesystem, through ``os``. Orbax
and TensorStore read ``gs://`` on their own, and ArrayRecord reads it
natively (its own GCS client); this module covers the rest.

Atomicity is the same on both: a reader never sees a torn file.

- Locally a file is written under a temporary name next to it and renamed
  over the final one (``os.replace``, atomic on POSIX).
- In a bucket an object becomes visible only when its upload completes, so
  a file is written in one upload (``write_bytes``), or staged on the
  local disk and uploaded whole (``staged``). There is no atomic rename of
  a directory: what is made of several files is sealed by a last file
  written after the others (a manifest), and readers look for that.

Credentials are the client libraries' own (Application Default
Credentials); the emulator settings they document (``STORAGE_EMULATOR_HOST``
for gcsfs, ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` for ArrayRecord,
``TENSORSTORE_GCS_HTTP_URL`` for TensorStore) point them elsewhere.
"""

import builtins
import contextlib
import dataclasses
import functools
import glob as glob_lib
import hashlib
import os
import shutil
import socket
import tempfile
from typing import IO, Callable, Iterator

import fsspec

from bertjax import errors

# Bucket listings are never cached: other writers (TensorStore writing a
# checkpoint, another host, another process) change a bucket behind this
# process's back, and a stale listing would hide a checkpoint or a shard.
for _protocol in ('gs', 'gcs'):
  fsspec.config.conf.setdefault(_protocol, {})['use_listings_cache'] = False

# The packages whose errors mean the object store did not answer as asked
# (unreachable, credentials refused): fsspec passes them on as they are.
_CLIENT_PACKAGES = ('aiohttp', 'google', 'gcsfs', 'requests', 'urllib3')


class StorageError(errors.UserError, OSError):
  """A path cannot be used; the message says why and what to do."""


def _reporting_client_errors(fn: Callable) -> Callable:
  """``fn(path, ...)``, with a client library's error on a remote ``path``
  (after its own retries) as a ``StorageError`` that says what to check;
  a missing file stays FileNotFoundError."""

  @functools.wraps(fn)
  def wrapped(path, *args, **kwargs):
    try:
      return fn(path, *args, **kwargs)
    except Exception as e:  # pylint: disable=broad-exception-caught
      if (not is_remote(path) or isinstance(e, FileNotFoundError)
          or type(e).__module__.split('.')[0] not in _CLIENT_PACKAGES):
        raise
      raise StorageError(
          f'{path}: the object store did not answer ({type(e).__name__}: '
          f'{e}). Check the network, the bucket\'s name and the '
          'credentials (Application Default Credentials: gcloud auth '
          'application-default login, or the VM\'s service account).'
          ) from e

  return wrapped


def is_remote(path: str) -> bool:
  """Whether ``path`` names an object store (has a scheme), not a file."""
  return '://' in str(path)


def _fs(path: str):
  """(fsspec filesystem, path inside it) of a remote ``path``."""
  try:
    return fsspec.core.url_to_fs(path)
  except ImportError as e:
    raise StorageError(
        f'{path}: {path.split("://")[0]}:// needs the fsspec filesystem '
        f'that serves it (gcsfs, a bertjax dependency, for gs://; e.g. s3fs '
        f'for s3://): {e}') from e


def absolute(path: str) -> str:
  """A local path made absolute; a URL as it is."""
  return path if is_remote(path) else os.path.abspath(path)


@_reporting_client_errors
def exists(path: str) -> bool:
  if is_remote(path):
    fs, p = _fs(path)
    return fs.exists(p)
  return os.path.exists(path)


@_reporting_client_errors
def isdir(path: str) -> bool:
  """A local directory, or a bucket prefix with objects under it."""
  if is_remote(path):
    fs, p = _fs(path)
    return fs.isdir(p)
  return os.path.isdir(path)


@_reporting_client_errors
def isfile(path: str) -> bool:
  if is_remote(path):
    fs, p = _fs(path)
    return fs.isfile(p)
  return os.path.isfile(path)


@_reporting_client_errors
def getsize(path: str) -> int:
  """Bytes of a file; FileNotFoundError when there is none."""
  if is_remote(path):
    fs, p = _fs(path)
    return int(fs.size(p))
  return os.path.getsize(path)


@dataclasses.dataclass(frozen=True)
class Stat:
  """A file's size, and ``version``: what changes when the file is
  rewritten, without reading it (its size and modification time, or a
  bucket object's generation)."""
  size: int
  version: str


@_reporting_client_errors
def stat(path: str) -> Stat:
  """``path``'s Stat; FileNotFoundError when there is none."""
  if is_remote(path):
    fs, p = _fs(path)
    return _remote_stat(fs.info(p))
  st = os.stat(path)
  return Stat(st.st_size, f'{st.st_size}:{st.st_mtime_ns}')


def _remote_stat(info: dict) -> Stat:
  generation = info.get('generation') or info.get('mtime') or info.get(
      'updated') or info.get('LastModified') or ''
  return Stat(int(info['size']), f'{info["size"]}:{generation}')


def makedirs(path: str) -> None:
  """A directory and its parents (a bucket has none to make)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def open(path: str, mode: str = 'rb', **kwargs) -> IO:  # pylint: disable=redefined-builtin
  """An open file. Writing to a bucket uploads on close: write whole
  files with ``write_bytes`` or ``staged`` instead."""
  if is_remote(path):
    fs, p = _fs(path)
    return fs.open(p, mode, **kwargs)
  return builtins.open(path, mode, **kwargs)  # pylint: disable=consider-using-with


@_reporting_client_errors
def read_bytes(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def read_text(path: str) -> str:
  return read_bytes(path).decode('utf-8')


def temporary_name(path: str) -> str:
  """A temporary name next to ``path``, of this process on this machine
  (a Beam runner may run one bundle twice, on two machines)."""
  return f'{path}.tmp-{socket.gethostname()}-{os.getpid()}'


@_reporting_client_errors
def write_bytes(path: str, data: bytes) -> None:
  """Writes ``data`` to ``path`` so that readers see the old file or the
  new one, never part of it; a crash leaves the old one."""
  if is_remote(path):
    fs, p = _fs(path)
    fs.pipe_file(p, data)   # One upload: the object appears whole.
    return
  tmp = temporary_name(path)
  try:
    with builtins.open(tmp, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode('utf-8'))


def _fsync(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


@contextlib.contextmanager
def staged(path: str) -> Iterator[str]:
  """A local file to write ``path``'s content into, for writers that take
  only a local path (ArrayRecord's, NumPy's streaming ones). When the block
  ends normally it becomes ``path`` whole (renamed, or uploaded); when it
  raises, nothing is left."""
  if not is_remote(path):
    tmp = temporary_name(path)
    try:
      yield tmp
      _fsync(tmp)   # On disk before the name points at it.
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
    return
  directory = tempfile.mkdtemp(prefix='bertjax-staged-')
  try:
    tmp = os.path.join(directory, os.path.basename(path))
    yield tmp
    fs, p = _fs(path)
    fs.put_file(tmp, p)
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def upload(local_path: str, path: str) -> None:
  """Copies local file ``local_path`` to ``path`` (one upload, or a
  rename-over locally)."""
  if is_remote(path):
    _reporting_client_errors(_put_file)(path, local_path)
  else:
    with builtins.open(local_path, 'rb') as f:
      write_bytes(path, f.read())


def _put_file(path: str, local_path: str) -> None:
  fs, p = _fs(path)
  fs.put_file(local_path, p)


@_reporting_client_errors
def download(path: str, local_path: str) -> None:
  """Copies ``path`` to local file ``local_path``."""
  with open(path, 'rb') as src, builtins.open(local_path, 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 20)


@_reporting_client_errors
def move(path: str, target: str) -> None:
  """Moves a directory (or every object under a prefix) to ``target``.
  Locally a rename; in a bucket each object is copied then deleted, so a
  reader may see both for a moment, never neither. A commit marker
  (orbax's ``commit_success.txt``) is copied last and deleted first: a
  kill midway leaves, at either end, an uncommitted step, not a committed
  one with files missing."""
  if is_remote(path):
    fs, p = _fs(path)
    objects = _objects(fs, p)
    to = _fs(target)[1]
    marker_first = sorted(objects, key=lambda n: not n.endswith(
        '/commit_success.txt'))
    for name in reversed(marker_first):
      fs.cp_file(name, to + name[len(p):])
    for name in marker_first:
      fs.rm_file(name)
  else:
    os.replace(path, target)


@_reporting_client_errors
def remove(path: str) -> None:
  if is_remote(path):
    fs, p = _fs(path)
    fs.rm_file(p)
  else:
    os.remove(path)


@_reporting_client_errors
def rmtree(path: str) -> None:
  """Removes a directory (or every object under a prefix), if any."""
  if is_remote(path):
    fs, p = _fs(path)
    for name in _objects(fs, p):
      fs.rm_file(name)
  else:
    shutil.rmtree(path, ignore_errors=True)


def _objects(fs, p: str) -> list[str]:
  """The objects under prefix ``p`` of bucket filesystem ``fs``, listed by
  name: fsspec's recursive rm and mv read glob characters in a path as a
  pattern (a workdir named lr[3e-4]), per-object calls do not."""
  if not fs.exists(p):
    return []
  return sorted(k for k, v in fs.find(p, detail=True, withdirs=False).items()
                if v.get('type') == 'file')


@_reporting_client_errors
def listdir(path: str) -> list[str]:
  """The names directly under ``path`` (sorted; [] if there is none)."""
  if is_remote(path):
    fs, p = _fs(path)
    try:
      return sorted(os.path.basename(x.rstrip('/'))
                    for x in fs.ls(p, detail=False))
    except FileNotFoundError:
      return []
  return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _url(fs, p: str) -> str:
  return fs.unstrip_protocol(p)


@_reporting_client_errors
def find(path: str) -> dict[str, Stat]:
  """Every file under directory ``path``, recursively, or the one file
  ``path``, or every file matching glob ``path`` (``**`` recurses):
  {path: its Stat}, sorted by path. A path that exists is taken as it is,
  glob characters and all (a workdir named ``lr[3e-4]``). In a bucket
  this is a few listing calls, not one per file."""
  if is_remote(path):
    fs, p = _fs(path)
    if fs.isdir(p):
      found = fs.find(p, detail=True)
    elif fs.exists(p):
      found = {p: fs.info(p)}
    elif any(c in p for c in '*?['):
      found = fs.glob(p, detail=True)
    else:
      found = {}
    return {_url(fs, k): _remote_stat(v) for k, v in sorted(found.items())
            if v.get('type') == 'file'}
  if os.path.isdir(path):
    files = [os.path.join(root, name)
             for root, _, names in os.walk(path) for name in names]
  elif os.path.isfile(path):
    files = [path]
  else:
    files = glob_lib.glob(path, recursive=True)
  return {f: stat(f) for f in sorted(files) if os.path.isfile(f)}


@_reporting_client_errors
def sha256(path: str) -> str:
  """The SHA-256 of a file, read a block at a time."""
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()
