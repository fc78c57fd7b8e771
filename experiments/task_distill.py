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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# bertjax.train_flags defines the flags this command shares with
# pretraining: --config, --workdir, and the multi-host ones (--multihost,
# ...).
from bertjax import errors  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import task_distill  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(train_flags)   # Listed by --help.


def main(argv) -> None:
  train_flags.start(argv)
  with errors.reporting('task_distill'):
    task_distill.distill_task(FLAGS.config, FLAGS.workdir)   # Prints scores.


if __name__ == '__main__':
  app.run(main, flags_parser=errors.flags_parser('task_distill'))
