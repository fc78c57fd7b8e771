r"""What it costs to keep the padding rows out of the vocabulary softmax.

BERT's 30,522-piece vocabulary has a table of 30,592 rows (a multiple of
128); every head that scores the vocabulary gives the 70 padding rows the
logit -1e9 through their output bias (bertjax/models/bert.py
``real_vocab_bias``). This times the
trainer's own step (step.py's ``Bertjax``: compiled and sharded as in
training, MLM + NSP) with that mask against the same step with the mask
taken out, in one process, alternating rounds, and prints the time per
step of each and their ratio with a 95% interval over the rounds.

  python experiments/benchmarks/vocab_mask.py --size=cpu --rounds=7
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from unittest import mock

_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'step.py')
_spec = importlib.util.spec_from_file_location('step_benchmark', _STEP)
step = importlib.util.module_from_spec(_spec)
sys.modules['step_benchmark'] = step
_spec.loader.exec_module(step)   # Puts the repository on sys.path.

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bertjax import intervals  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.models import bert as bert_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', choices=sorted(step.SIZES), default='cpu')
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--steps', type=int, default=10,
                      help='steps per timed round.')
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args(argv)
  # step.py's settings for its own default run.
  args.dtype, args.predictions = '', 0
  args.remat, args.scan_layers, args.dropout = 'none', False, True
  args.attention, args.step_rng = 'auto', 'threefry'
  args = step.fill_defaults(args)
  if step.VOCAB_SIZE % 128 == 0:
    raise AssertionError('the benchmark needs a vocabulary with padding rows')
  masked = step.Bertjax(args)
  # The step with the mask taken out: the logits over all 30,592 rows.
  with mock.patch.object(bert_lib, 'real_vocab_bias',
                         lambda cfg, bias: bias):
    unmasked = step.Bertjax(args)
  for arm in (masked, unmasked):
    arm.run(args.warmup)
  times = {'masked': [], 'unmasked': []}
  for r in range(args.rounds):
    order = (('masked', masked), ('unmasked', unmasked))
    for name, arm in order if r % 2 == 0 else order[::-1]:
      times[name].append(arm.run(args.steps) / args.steps)
  ratio = intervals.seed_interval(
      np.asarray(times['masked']) / np.asarray(times['unmasked']))
  print(f'{jax.devices()[0].device_kind}, size {args.size}, seq {args.seq}, '
        f'batch {args.batch}, {args.rounds} rounds of {args.steps} steps')
  print('| step | ms per step (mean over rounds) |')
  print('| --- | --- |')
  for name in times:
    print(f'| {name} | {1e3 * np.mean(times[name]):.1f} |')
  print(f'masked / unmasked: {ratio.estimate:.3f} [{ratio.low:.3f}, '
        f'{ratio.high:.3f}] (95% interval over rounds)')


if __name__ == '__main__':
  main()
