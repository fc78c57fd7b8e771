"""Distils a fine-tuned teacher into a student on its task; see
bertjax.task_distill.

  python experiments/task_distill.py \
      --config=experiments/configs/task_distill.py:augment=on \
      --config.teacher=runs/demo-finetuned --config.init=runs/tinybert \
      --workdir=runs/tinybert-embedded
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
from bertjax import task_distill  # pylint: disable=g-import-not-at-top,wrong-import-position
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
    task_distill.distill_task(FLAGS.config, FLAGS.workdir)   # Prints scores.
  except task_distill.DistillError as e:
    sys.exit(f'task_distill: {e}')


if __name__ == '__main__':
  app.run(main)
