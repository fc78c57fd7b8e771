r"""Fine-tunes a pretrained run on a downstream task; see bertjax.finetune.

  python experiments/finetune.py --config=experiments/configs/finetune.py \
      --config.init=/tmp/bertjax-demo --workdir=/tmp/bertjax-demo-finetuned \
      [--compare_scratch]

With ``--compare_scratch`` the same harness also trains from random weights
(the pretrained run's architecture and tokenizer, same seed and steps) in
``WORKDIR/scratch`` (the pretrained fine-tuning in ``WORKDIR/pretrained``)
and prints both scores side by side with the margin.
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
from bertjax import finetune  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import storage  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(train_flags)   # Listed by --help.
_COMPARE = flags.DEFINE_bool(
    'compare_scratch', False, 'Also fine-tune from random weights and print '
    'both scores.')


def compare_scratch(cfg, workdir: str) -> str:
  """Fine-tunes from the pretrained and from random weights; returns the
  side-by-side table (also written to ``WORKDIR/compare_scratch.md``)."""
  results = {}
  for weights in finetune.INIT_WEIGHTS:
    run_cfg = cfg.copy_and_resolve_references()
    run_cfg.init_weights = weights
    name = 'scratch' if weights == 'random' else weights
    results[name] = finetune.finetune(run_cfg, os.path.join(workdir, name))
  headline = results['pretrained']['headline']
  metrics = list(results['pretrained']['metrics'])
  lines = ['| weights | ' + ' | '.join(metrics) + ' |',
           '| --- |' + ' --- |' * len(metrics)]
  for name, result in results.items():
    lines.append(f'| {name} | ' + ' | '.join(
        f'{result["metrics"][m]:.4f}' for m in metrics) + ' |')
  margin = (results['pretrained']['metrics'][headline]
            - results['scratch']['metrics'][headline])
  lines += ['', f'{results["pretrained"]["task"]} ({cfg.mode}): pretrained '
            f'{headline} {results["pretrained"]["metrics"][headline]:.4f} vs '
            f'random weights {results["scratch"]["metrics"][headline]:.4f}: '
            f'{margin:+.4f}']
  text = '\n'.join(lines) + '\n'
  storage.write_text(os.path.join(workdir, 'compare_scratch.md'), text)
  return text


def main(argv) -> None:
  train_flags.start(argv)
  try:
    if _COMPARE.value:
      print(compare_scratch(FLAGS.config, FLAGS.workdir), end='')
    else:
      finetune.finetune(FLAGS.config, FLAGS.workdir)   # Prints its scores.
  except finetune.FinetuneError as e:
    sys.exit(f'finetune: {e}')


if __name__ == '__main__':
  app.run(main)
