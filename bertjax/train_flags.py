"""The command-line flags of ``python -m bertjax.train`` (and
``bertjax-train``).

A module of their own: under ``python -m bertjax.train`` the trainer's file
runs as ``__main__``, and a config file that imports ``bertjax.train``
under its own name (experiments/configs/compare_small.py does, through
``bertjax.finetune``) runs it a second time; flags defined there would be
defined twice, which absl refuses. Defined here, they are defined once,
whichever copy imports them.
"""

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bertjax.runtime import distributed

CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, e.g. '
    'experiments/configs/demo.py or experiments/configs/bert.py:size=large',
    lock_config=True)
WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory for checkpoints, metrics and TensorBoard '
    'events. Rerunning in the same workdir resumes.')
MULTIHOST = flags.DEFINE_enum(
    'multihost', 'auto', distributed.MODES, 'auto: join a multi-process job '
    'when SLURM or a TPU pod is detected, or when the coordinator flags are '
    'given; on: always call jax.distributed.initialize() (Cloud TPU VM '
    'slices); off: single process.')
COORDINATOR = flags.DEFINE_string(
    'coordinator_address', '', 'HOST:PORT of process 0, for a multi-process '
    'job that JAX cannot detect (with --num_processes and --process_id).')
NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0,
                                     'Processes in the job (explicit mode).')
PROCESS_ID = flags.DEFINE_integer('process_id', -1,
                                  'This process, 0..num_processes-1.')


def start(argv) -> str:
  """What a command taking these flags does first (the trainer, fine-tuning,
  multi-task fine-tuning, task distillation): refuses stray arguments and a
  missing --config or --workdir (``app.UsageError``), keeps Orbax's and
  TFDS's INFO logs (every step of every save) out unless --verbosity is
  given, and joins the multi-process job. Returns how it joined, as
  ``distributed.initialize`` says it."""
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if CONFIG.value is None or not WORKDIR.value:
    raise app.UsageError('--config and --workdir are required.')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  return distributed.initialize(MULTIHOST.value, COORDINATOR.value,
                                NUM_PROCESSES.value, PROCESS_ID.value)

