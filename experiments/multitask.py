r"""Multi-task fine-tuning of a pretrained run; see bertjax.multitask.

  python experiments/multitask.py --config=experiments/configs/multitask.py \
      --config.init=runs/demo --workdir=runs/demo-multitask

Prints the per-task held-out metrics and writes them to
``WORKDIR/multitask.json``; a rerun in the same workdir resumes. Per-task
fine-tuning afterwards takes the workdir as its ``init``:

  python experiments/finetune.py --config=experiments/configs/finetune.py \
      --config.init=runs/demo-multitask --workdir=runs/demo-mt-finetuned
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# bertjax.train defines the flags this command shares with pretraining:
# --config, --workdir, and the multi-host ones (--multihost, ...).
from bertjax.runtime import distributed  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import finetune  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import multitask  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(train)   # Listed by --help.


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.config is None or not FLAGS.workdir:
    raise app.UsageError('--config and --workdir are required.')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  distributed.initialize(FLAGS.multihost, FLAGS.coordinator_address,
                         FLAGS.num_processes, FLAGS.process_id)
  try:
    multitask.multitask(FLAGS.config, FLAGS.workdir)   # Prints its scores.
  except finetune.FinetuneError as e:   # MultitaskError is one.
    sys.exit(f'multitask: {e}')


if __name__ == '__main__':
  app.run(main)
