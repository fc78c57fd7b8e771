"""The command-line flags of ``python -m bertjax.train`` (and
``bertjax-train``).

A module of their own: under ``python -m bertjax.train`` the trainer's file
runs as ``__main__``, and a config file that imports ``bertjax.train``
under its own name (experiments/configs/compare_small.py does, through
``bertjax.finetune``) runs it a second time; flags defined there would be
defined twice, which absl refuses. Defined here, they are defined once,
whichever copy imports them.
"""

from absl import flags
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
