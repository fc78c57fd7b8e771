"""Multi-host start-up: one process per host (or per GPU), JAX's own runtime.

``initialize`` runs before anything touches a device. With
``--coordinator_address``, ``--num_processes`` and ``--process_id`` it joins
that job; otherwise, under ``auto``, it lets ``jax.distributed.initialize``
detect the cluster where one is present (a multi-task SLURM step, a Cloud
TPU pod with ``TPU_WORKER_HOSTNAMES``), and stays single-process elsewhere.
``mode='on'`` always calls it (Cloud TPU VM slices, where JAX reads the
workers from the metadata server; the TPU launcher passes it), ``'off'``
never.

  # Two processes on one machine, 4 CPU devices each, gloo collectives:
  XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m bertjax.train \
      --config=... --workdir=... --coordinator_address=localhost:12345 \
      --num_processes=2 --process_id=0    # and --process_id=1
"""

from __future__ import annotations

import contextlib
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertjax import errors
from bertjax import storage

MODES = ('auto', 'on', 'off')


def _cluster_detected() -> str | None:
  """The multi-process environment JAX would detect, or None."""
  if 'SLURM_JOB_ID' in os.environ and 'SLURM_PROCID' in os.environ:
    if int(os.environ.get('SLURM_NTASKS', '1')) > 1:
      return 'SLURM'
  if ',' in os.environ.get('TPU_WORKER_HOSTNAMES', ''):
    return 'TPU pod'
  if os.environ.get('MEGASCALE_COORDINATOR_ADDRESS'):
    return 'TPU multislice'
  return None


def initialize(mode: str = 'auto', coordinator_address: str = '',
               num_processes: int = 0, process_id: int = -1) -> str:
  """Starts JAX's distributed runtime if the job has several processes.

  Returns how it started (for the log). Call before any other JAX call.
  """
  if mode not in MODES:
    raise ValueError(f'--multihost={mode!r}; use one of {MODES}.')
  explicit = {'--coordinator_address': coordinator_address,
              '--num_processes': num_processes > 0,
              '--process_id': process_id >= 0}
  if any(explicit.values()):
    missing = [k for k, v in explicit.items() if not v]
    if missing:
      raise ValueError(f'{", ".join(missing)} missing: an explicit '
                       'multi-process job needs --coordinator_address=HOST:'
                       'PORT, --num_processes=N and --process_id=I (0..N-1) '
                       'on every process.')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'--process_id={process_id} must be in [0, '
                       f'--num_processes={num_processes}).')
    if mode == 'off':
      raise ValueError('--multihost=off contradicts --coordinator_address.')
    _use_gloo_on_cpu()
    jax.distributed.initialize(coordinator_address, num_processes,
                               process_id)
    return (f'process {process_id} of {num_processes} (coordinator '
            f'{coordinator_address})')
  cluster = _cluster_detected() if mode == 'auto' else None
  if mode == 'on' or cluster:
    _use_gloo_on_cpu()
    jax.distributed.initialize()
    return (f'process {jax.process_index()} of {jax.process_count()} '
            f'({cluster or "detected by jax.distributed"})')
  return 'single process'


def _use_gloo_on_cpu() -> None:
  """Cross-process collectives of the CPU backend (loopback tests, CPU
  clusters) go through gloo; accelerators use their own."""
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')


def sum_over_processes(values: np.ndarray) -> np.ndarray:
  """``values`` (a float64 vector, the same length on every process)
  summed over every process, exactly and in process order; with one
  process, as they are. A collective: every process calls it at the same
  point. Sent as bytes, since JAX without x64 would send float32 (exact
  for counts to 2^24 only)."""
  values = np.ascontiguousarray(values, np.float64).reshape(-1)
  if jax.process_count() == 1:
    return values
  gathered = np.asarray(multihost_utils.process_allgather(
      values.view(np.uint8)))
  return np.ascontiguousarray(gathered).reshape(
      jax.process_count(), -1).view(np.float64).sum(0)


def process_zero_choice(value: int | None) -> int | None:
  """Process 0's ``value`` (a non-negative int, or None) on every process;
  with one process, ``value``. A collective: every process calls it at
  the same point.

  For a choice each process would otherwise make from its own reads, such
  as a directory's latest checkpoint step: a listing can lag on one host
  (NFS attribute caching, gcsfuse's listing cache) while a run commits a
  step, and processes that restore different steps train on a silent mix.
  """
  if jax.process_count() == 1:
    return value
  sent = np.zeros(1)
  if jax.process_index() == 0:
    sent[0] = -1 if value is None else value
  got = int(sum_over_processes(sent)[0])
  return None if got < 0 else got


def check_shared_directory(directory: str) -> None:
  """Fails unless every process sees the files process 0 writes in
  ``directory`` (checkpoints of a multi-host run are written by all)."""
  if jax.process_count() == 1 or storage.is_remote(directory):
    return   # A bucket is the same for every process.
  marker = os.path.join(directory, '.shared_check')
  if jax.process_index() == 0:
    with open(marker, 'w') as f:
      f.write(str(os.getpid()))
  multihost_utils.sync_global_devices('workdir marker written')
  seen = os.path.exists(marker)
  everyone = np.asarray(
      multihost_utils.process_allgather(np.asarray([seen]))).reshape(-1)
  multihost_utils.sync_global_devices('workdir marker read')
  if jax.process_index() == 0:
    os.remove(marker)
  if not everyone.all():
    missing = [i for i, ok in enumerate(everyone.tolist()) if not ok]
    raise ValueError(
        f'the workdir {directory!r} is not shared: processes {missing} do '
        'not see the file process 0 wrote there. A multi-host run needs a '
        'workdir on a filesystem every host mounts at the same path (NFS, '
        'Filestore), or in a bucket (gs://).')


class ProcessZeroFailed(errors.UserError, RuntimeError):
  """Process 0 stopped with an error in a block the others wait for."""


@contextlib.contextmanager
def process_zero_first(name: str):
  """Process 0 runs the block first, the others after it has finished.

  For work that fills a cache others can reuse (the tokenizer, the
  pre-tokenized data): on a shared filesystem the others find it built; on
  per-host disks each builds its own copy, byte-identical. If the block
  raises on process 0 (a corpus with no usable text, a changed config),
  the others raise ``ProcessZeroFailed`` at once, instead of waiting at
  the barrier until the runtime gives up with an error that does not say
  why.
  """
  if jax.process_count() == 1:
    yield
    return
  if jax.process_index() == 0:
    try:
      yield
    except BaseException:
      _tell_the_others(failed=True)
      raise
    _tell_the_others(failed=False)
  else:
    if _tell_the_others(failed=False):
      raise ProcessZeroFailed(
          f'process 0 stopped with an error while preparing the {name} '
          '(its log says which); this process stops too.')
    yield


def _tell_the_others(failed: bool) -> bool:
  """Whether process 0 failed (a collective)."""
  return bool(sum_over_processes(np.asarray([float(failed)]))[0])
