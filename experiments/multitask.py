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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# bertjax.train_flags defines the flags this command shares with
# pretraining: --config, --workdir, and the multi-host ones (--multihost,
# ...).
from bertjax import errors  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import multitask  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(train_flags)   # Listed by --help.


def main(argv) -> None:
  train_flags.start(argv)
  with errors.reporting('multitask'):
    multitask.multitask(FLAGS.config, FLAGS.workdir)   # Prints its scores.


if __name__ == '__main__':
  app.run(main, flags_parser=errors.flags_parser('multitask'))
