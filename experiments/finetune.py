r"""Fine-tunes a pretrained run on a downstream task; see bertjax.finetune.

  python experiments/finetune.py --config=experiments/configs/finetune.py \
      --config.init=/tmp/bertjax-demo --workdir=/tmp/bertjax-demo-finetuned \
      [--compare_scratch [--seeds=3]]

With ``--compare_scratch`` the same harness also trains from random weights
(the pretrained run's architecture and tokenizer, same steps), each at
``--seeds`` seeds from ``config.seed`` on, in
``WORKDIR/{pretrained,scratch}/seed<N>``, and prints the two side by side
with the difference's 95% interval, paired by seed and held-out example
(compare.py's). Finished runs are read back, unfinished ones resume.
"""

import math
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
from bertjax import finetune  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import storage  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train_flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import compare  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(train_flags)   # Listed by --help.
_COMPARE = flags.DEFINE_bool(
    'compare_scratch', False, 'Also fine-tune from random weights and print '
    'both scores with the difference\'s 95% interval.')
_SEEDS = flags.DEFINE_integer(
    'seeds', 3, 'With --compare_scratch: fine-tuning seeds per arm, from '
    'config.seed on (one seed: an interval over examples only, no claim).',
    lower_bound=1)


def compare_scratch(cfg, workdir: str, seeds: int = 3) -> str:
  """Fine-tunes from the pretrained and from random weights at ``seeds``
  seeds; returns the side-by-side table (also written to
  ``WORKDIR/compare_scratch.md``)."""
  arms = {}
  for weights in finetune.INIT_WEIGHTS:
    name = 'scratch' if weights == 'random' else weights
    arms[name] = {}
    for seed in range(cfg.seed, cfg.seed + seeds):
      run_cfg = cfg.copy_and_resolve_references()
      run_cfg.init_weights, run_cfg.seed = weights, seed
      arms[name][seed] = finetune.finetune(
          run_cfg, os.path.join(workdir, name, f'seed{seed}'))
  text = scratch_table(arms, cfg.mode)
  storage.write_text(os.path.join(workdir, 'compare_scratch.md'), text)
  return text


def scratch_table(arms: dict, mode: str) -> str:
  """The table of ``arms`` ({'pretrained', 'scratch'} -> {seed: result of
  finetune.finetune}) and the verdict on their difference."""
  first = next(iter(arms['pretrained'].values()))
  headline, metrics = first['headline'], list(first['metrics'])
  seeds = sorted(arms['pretrained'])
  lines = [f'{first["task"]} ({mode}), seeds {compare.seed_ids(seeds)}; '
           'each cell the mean ± the 95% half-width over the seeds.', '',
           '| weights | ' + ' | '.join(metrics) + ' |',
           '| --- |' + ' --- |' * len(metrics)]
  for name, by_seed in arms.items():
    lines.append(f'| {name} | ' + ' | '.join(
        compare.mean_pm([r['metrics'][m] for r in by_seed.values()])
        for m in metrics) + ' |')
  iv = compare.headline_interval(arms['pretrained'], arms['scratch'])
  if iv.seeds < 2:
    verdict = ('one seed, so no claim (an interval over its held-out '
               'examples leaves out the seed spread); run --seeds=3 or more')
  elif math.isnan(iv.low):
    verdict = ('no interval: every seed\'s difference is the same (a '
               'metric over a small eval set takes few values)')
  elif iv.is_claim:
    verdict = ('pretraining helps' if iv.estimate > 0 else
               'pretraining hurts') + ' (the interval excludes 0)'
  else:
    verdict = 'no difference (the interval holds 0)'
  lines += ['', f'pretrained - random weights, {headline}: '
            f'{compare.interval_text(iv, signed=True).strip("*")}: {verdict}.']
  return '\n'.join(lines) + '\n'


def main(argv) -> None:
  train_flags.start(argv)
  with errors.reporting('finetune'):
    if _COMPARE.value:
      print(compare_scratch(FLAGS.config, FLAGS.workdir, _SEEDS.value),
            end='')
    else:
      finetune.finetune(FLAGS.config, FLAGS.workdir)   # Prints its scores.


if __name__ == '__main__':
  app.run(main, flags_parser=errors.flags_parser('finetune'))
