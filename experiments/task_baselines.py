"""What a task's held-out accuracy is read against: its constant guess.

For each config run and seed: the held-out size of each of its tasks
(beyond masking; rows or tokens, as the task is scored) and the accuracy
of always answering the most frequent class of the training data
(counted over the first ``--train_batches`` training batches, and for a
continual run over the first ``--train_batches`` of each stage, so that
the tasks of later stages have theirs too), scored on
the held-out batches the run evaluates on: for a task what the final
"always predicting the most frequent token" is for MLM. Nothing trains;
the data are built on first use (or read from the cache), as training
builds them.

  python experiments/task_baselines.py --seeds=3 \\
      --out=experiments/results/beyond_masking/task_baselines.md \\
      $(python experiments/configs/beyond_masking.py --runs)
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys

import numpy as np

from bertjax import errors
from bertjax import storage
from bertjax import train
from bertjax.objectives import auxiliary
from data_pipelines import continual as continual_lib
from experiments import compare


def class_counts(batches, task) -> collections.Counter:
  """Class -> summed weight of ``task``'s labels over ``batches``."""
  counts = collections.Counter()
  for batch in batches:
    labels = np.asarray(batch[task.label_field]).ravel()
    weights = np.asarray(auxiliary.label_weights(task, batch),
                         np.float64).ravel()
    for label in np.unique(labels[weights > 0]):
      counts[int(label)] += float(weights[labels == label].sum())
  return counts


def constant_guess(train_counts: collections.Counter,
                   held_out: collections.Counter) -> tuple[int, float]:
  """The training data's most frequent class (the smallest on a tie) and
  the held-out accuracy of always answering it."""
  if not train_counts or not held_out:
    raise ValueError('no labelled positions to count.')
  top = max(sorted(train_counts), key=lambda c: train_counts[c])
  return top, held_out.get(top, 0.0) / sum(held_out.values())


def stage_starts(cfg) -> list[int]:
  """The first global batch of each stage of a continual run; [0] for a
  run of one stream."""
  if not continual_lib.is_continual(cfg):
    return [0]
  return continual_lib.stage_starts(cfg.continual.stage_steps)[:-1].tolist()


def counted_batches(train_iter, starts: list[int], n: int) -> list:
  """``n`` batches of ``train_iter`` from each global batch of
  ``starts`` (the iterator seeks, as a resumed run does)."""
  seen = []
  for start in starts:
    train_iter.set_state({'next_index': int(start)})
    seen.extend(itertools.islice(train_iter, n))
  return seen


def run_baselines(spec: str, seed: int, train_batches: int) -> list[dict]:
  """One row per task of the config ``spec`` at ``seed``."""
  cfg = compare.load_config(spec)
  cfg.seed = seed
  tasks = auxiliary.enabled(cfg)
  if not tasks:
    return []
  data = train.input_pipeline(cfg, None, '', train.make_placement(cfg).rows)
  seen = counted_batches(data.train_iter, stage_starts(cfg), train_batches)
  rows = []
  for task in tasks:
    held_out = class_counts(data.eval_batches, task)
    counted = class_counts(seen, task)
    # None: the counted batches hold none of its labels.
    top, accuracy = (constant_guess(counted, held_out) if counted
                     else (None, None))
    rows.append({'task': task.name, 'seed': seed, 'class': top,
                 'held_out': sum(held_out.values()), 'accuracy': accuracy})
  return rows


def table(results: dict) -> str:
  lines = ['| arm | task | seeds | held-out size | most frequent class '
           '(training) | its held-out accuracy, per seed | mean |',
           '| --- | --- | --- | --- | --- | --- | --- |']
  for arm, rows in results.items():
    for name in dict.fromkeys(r['task'] for r in rows):
      mine = [r for r in rows if r['task'] == name]
      cells = [', '.join('-' if r[key] is None else fmt.format(r[key])
                         for r in mine) for key, fmt in (
          ('seed', '{}'), ('held_out', '{:g}'), ('class', '{}'),
          ('accuracy', '{:.3f}'))]
      known = [r['accuracy'] for r in mine if r['accuracy'] is not None]
      mean = f'{np.mean(known):.3f}' if known else '-'
      lines.append(f'| {arm} | {name} | ' + ' | '.join(cells)
                   + f' | {mean} |')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--run', action='append', default=[],
                      help='NAME=path.py[:arg]; repeat.')
  parser.add_argument('--seeds', type=int, default=1)
  parser.add_argument('--train_batches', type=int, default=100)
  parser.add_argument('--out', default='', help='Also write the table here.')
  args = parser.parse_args(argv)
  if not args.run or any('=' not in r for r in args.run) or (
      args.seeds < 1 or args.train_batches < 1):
    sys.exit('task_baselines: give --run NAME=path.py[:arg] (one or more), '
             '--seeds >= 1 and --train_batches >= 1.')
  try:
    results = {}
    for item in args.run:
      name, spec = item.split('=', 1)
      rows = [r for s in range(args.seeds)
              for r in run_baselines(spec, s, args.train_batches)]
      if rows:
        results[name] = rows
  except errors.UserError as e:
    sys.exit(f'task_baselines: {e}')
  text = (f'Constant guesses, held out ({args.train_batches} training '
          'batches counted, of each stage in a continual run; `python '
          'experiments/task_baselines.py`; - where they hold none of the '
          'task\'s labels).\n\n'
          + table(results))
  print(text, end='')
  if args.out:
    storage.write_text(args.out, text)


if __name__ == '__main__':
  main()
