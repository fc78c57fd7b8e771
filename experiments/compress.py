"""Makes a trained run smaller: one sub-command per method.

  # Michel et al.'s head pruning: half the heads, least important first
  # (importance on the run's own held-out batches); in 2 rounds with 200
  # pretraining steps between them.
  python experiments/compress.py prune_heads --workdir=runs/demo \\
      --out=runs/demo-heads50 --fraction=0.5 --rounds=2 --train_steps=200

  # LayerDrop's pruning at inference: keep layers 0 and 2 of a run trained
  # with model.layerdrop > 0 (or --keep=N: N layers spread evenly).
  python experiments/compress.py keep_layers --workdir=runs/ld \\
      --out=runs/ld-keep02 --layers=0,2

  # Q8BERT's int8 model of a fine-tuning run trained with
  # --config.model.quantize=int8: the kernels and tables as int8 with
  # their scales (bertjax.compress.load_int8 reads them back), checked
  # against the run's fake-quantized forward on the held-out set.
  python experiments/compress.py int8 --workdir=runs/demo-q8 \\
      --out=runs/demo-q8-int8

The first two write a new directory that fine-tuning (``init=DIR``), export
(experiments/export.py, with transformers' ``pruned_heads``) and continued
pretraining (``experiments/configs/imported.py:DIR/config.json``) take
like a run, with ``compression.json`` saying how it was made.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

from bertjax import compress  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import errors  # pylint: disable=g-import-not-at-top,wrong-import-position


def _layers(text: str) -> list[int]:
  try:
    return [int(x) for x in text.split(',')]
  except ValueError as e:
    raise argparse.ArgumentTypeError(
        f'--layers={text!r}: give layer numbers separated by commas, e.g. '
        '0,2') from e


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  commands = parser.add_subparsers(dest='command', required=True)
  for name, help_text in (
      ('prune_heads', 'remove the least important attention heads'),
      ('keep_layers', 'keep a subset of the layers (LayerDrop runs)')):
    sub = commands.add_parser(name, help=help_text)
    sub.add_argument('--workdir', required=True,
                     help='a bert-objective training run (or a compressed '
                     'or imported directory).')
    sub.add_argument('--out', required=True,
                     help='a new directory to write (never overwritten).')
    sub.add_argument('--step', type=int, default=None,
                     help='the checkpoint step (default: the latest).')
    if name == 'prune_heads':
      sub.add_argument('--fraction', type=float, required=True,
                       help='of all the heads, the share removed when done '
                       '(e.g. 0.5).')
      sub.add_argument('--batches', type=int, default=0,
                       help='held-out batches to score on (default: the '
                       'run\'s eval.num_batches).')
      sub.add_argument('--rounds', type=int, default=1,
                       help='prune in this many equal rounds, scoring the '
                       'heads left again each time.')
      sub.add_argument('--train_steps', type=int, default=0,
                       help='pretraining steps between two rounds (the '
                       'run\'s own config); rounds and runs are kept in '
                       'OUT.rounds, and a rerun resumes them.')
    else:
      which = sub.add_mutually_exclusive_group(required=True)
      which.add_argument('--layers', type=_layers,
                         help='the layers kept, e.g. 0,2.')
      which.add_argument('--keep', type=int,
                         help='this many layers, spread evenly, the last '
                         'one kept.')
  sub = commands.add_parser('int8', help="Q8BERT's int8 model of a "
                            'quantization-aware fine-tuning run')
  sub.add_argument('--workdir', required=True,
                   help='a fine-tuning run trained with model.quantize=int8.')
  sub.add_argument('--out', required=True,
                   help='a new directory to write (never overwritten).')
  args = parser.parse_args(argv)
  try:
    if args.command == 'int8':
      record = compress.int8(args.workdir, args.out)
    elif args.command == 'prune_heads':
      record = compress.prune_heads(args.workdir, args.out, args.fraction,
                                    args.step, args.batches, args.rounds,
                                    args.train_steps)
    else:
      record = compress.keep_layers(args.workdir, args.out, args.layers,
                                    args.step, args.keep or 0)
  except errors.UserError as e:   # CompressError is one.
    parser.exit(2, f'compress: {e}\n')
  print(json.dumps({k: v for k, v in record.items()
                    if k not in ('importance', 'rounds', 'eval_predictions',
                                 'eval_labels')}, sort_keys=True))
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
