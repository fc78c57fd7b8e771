r"""T5's Table 13 in miniature: single-task fine-tuning against multi-task
training, on the two embedded tasks, from one pretrained encoder.

  python experiments/multitask_table.py --init=runs/demo \
      --workdir=runs/multitask_table --seeds=0,1,2

Rows (every one from ``--init``, under each seed; the settings are
experiments/configs/multitask.py's: max_seq_length 64, batch 32, peak lr
5e-4, mean pooling, the tasks' sizes):

- ``single-task fine-tuning``: each task alone, ``--steps_per_task``
  steps (default 150);
- ``multi-task, proportional (K=512)`` and ``multi-task, temperature
  (T=2)``: both tasks together (bertjax.multitask), for the sum of the
  single-task steps, so the arms see the same number of training examples
  in all (each task's share is set by the mixing rates);
- ``multi-task (proportional) + fine-tuning``: the proportional run's
  encoder fine-tuned on each task as the first row does (its multi-task
  steps come on top: this row sees more examples, as T5's does).

Columns: each task's headline metric (accuracy) as mean [95% interval]
over the seeds and the held-out examples (bertjax/intervals.py), each row's
paired difference to single-task fine-tuning with its interval (bold
where it excludes 0 over two or more seeds; an interval holding 0 is no
difference, one seed's no claim), and the training examples each task
saw.

Results (``--results``, default experiments/results/multitask):
``rows.jsonl``, one row per task of each finished run, appended as the run
finishes; ``table.md``, the table with the exact command, the seeds, each
task's training-set size and majority-class accuracy, and a one-line
conclusion computed from the numbers. A rerun skips the runs whose
rows are there and resumes an unfinished run from its checkpoint (runs in
``--workdir``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time

import jax
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:   # Run as a script from a checkout.
  sys.path.insert(0, _ROOT)

from bertjax import finetune  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import intervals  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import multitask  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import storage  # pylint: disable=g-import-not-at-top,wrong-import-position
from data_pipelines import downstream  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = os.path.join(_ROOT, 'experiments', 'configs', 'multitask.py')
# (arm, row title, config arg of experiments/configs/multitask.py).
SINGLE = 'single'
MULTITASK_ARMS = (('proportional', 'multi-task, proportional (K=512)',
                   'mixing=proportional'),
                  ('temperature', 'multi-task, temperature (T=2)',
                   'mixing=temperature'))
FINETUNED = 'proportional+finetune'
TITLES = {SINGLE: 'single-task fine-tuning',
          **{arm: title for arm, title, _ in MULTITASK_ARMS},
          FINETUNED: 'multi-task (proportional) + fine-tuning'}
ARMS = tuple(TITLES)


def load_config(arg: str):
  """experiments/configs/multitask.py's config at ``arg``."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location('multitask_config', _CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def multitask_config(arg: str, init: str, seed: int, steps_per_task: int):
  """A multi-task arm's config: as many steps as the single-task runs."""
  cfg = load_config(arg)
  cfg.init, cfg.seed = init, seed
  cfg.num_steps = steps_per_task * len(cfg.tasks)
  return cfg


def single_config(key: str, init: str, seed: int, steps_per_task: int):
  """Task ``key`` alone, in the multi-task config's settings, for
  ``steps_per_task`` steps (the epochs that give them)."""
  cfg = multitask.finetune_config(load_config('mixing=proportional'), key)
  cfg.init, cfg.seed = init, seed
  task, _ = finetune.load_task(cfg)
  batches = len(task.train) // cfg.batch_size
  epochs = steps_per_task / batches
  while math.ceil(epochs * batches) > steps_per_task:   # Rounded up.
    epochs = math.nextafter(epochs, 0.0)
  cfg.num_epochs = epochs
  cfg.log_every_steps = 50
  cfg.checkpoint_every_steps = 100
  return cfg


class Rows:
  """rows.jsonl: appended one run at a time."""

  def __init__(self, path: str):
    self.path = path
    self.rows = []
    if os.path.exists(path):
      with open(path) as f:
        self.rows = [json.loads(line) for line in f if line.strip()]

  def has(self, arm: str, seed: int, task: str) -> bool:
    return any(r['arm'] == arm and r['seed'] == seed and r['task'] == task
               for r in self.rows)

  def check_settings(self, init: str, steps_per_task: int) -> None:
    """Fails unless every row was made from ``init`` with
    ``steps_per_task`` (a row of other settings would pass for this
    table's)."""
    made = {(r.get('init'), r.get('steps_per_task')) for r in self.rows}
    other = made - {(os.path.normpath(init), steps_per_task)}
    if other:   # (None, None): rows from before the settings were kept.
      raise SystemExit(
          f'{self.path} holds rows made with (--init, --steps_per_task) '
          f'{sorted(other, key=str)}; this table asks for '
          f'{(os.path.normpath(init), steps_per_task)}: give those settings, '
          'or another --results.')

  def add(self, rows: list[dict]) -> None:
    with open(self.path, 'a') as f:
      for row in rows:
        f.write(json.dumps(row, sort_keys=True) + '\n')
    self.rows.extend(rows)


def _row(arm, seed, key, result, examples_seen, seconds, init,
         steps_per_task) -> dict:
  return {'arm': arm, 'seed': seed, 'task': key,
          'init': os.path.normpath(init), 'steps_per_task': steps_per_task,
          'headline': result['headline'], 'metrics': result['metrics'],
          'examples_seen': int(examples_seen), 'seconds': round(seconds, 1),
          'eval_predictions': result['eval_predictions'],
          'eval_labels': result['eval_labels']}


def run_seed(rows: Rows, init: str, workdir: str, seed: int,
             steps_per_task: int) -> None:
  """Every run of ``seed`` whose rows are missing (the proportional
  multi-task run first: the fine-tuning row starts from it)."""
  keys = multitask.task_keys(load_config('mixing=proportional'))
  base = os.path.join(workdir, f'seed{seed}')
  for arm, _, arg in MULTITASK_ARMS:
    if all(rows.has(arm, seed, k) for k in keys):
      continue
    cfg = multitask_config(arg, init, seed, steps_per_task)
    start = time.time()
    result = multitask.multitask(cfg, os.path.join(base, arm))
    seconds = time.time() - start
    rows.add([_row(arm, seed, k, r, r['steps'] * cfg.batch_size, seconds,
                   init, steps_per_task)
              for k, r in result['tasks'].items()])
  mixed = json.loads(storage.read_text(os.path.join(
      base, 'proportional', multitask.RESULT)))
  for arm, init_dir in ((SINGLE, init),
                        (FINETUNED, os.path.join(base, 'proportional'))):
    for key in keys:
      if rows.has(arm, seed, key):
        continue
      cfg = single_config(key, init_dir, seed, steps_per_task)
      start = time.time()
      result = finetune.finetune(cfg, os.path.join(base, arm, key))
      seconds = time.time() - start
      seen = result['steps'] * cfg.batch_size
      if arm == FINETUNED:
        seen += mixed['tasks'][key]['steps'] * cfg.batch_size
      rows.add([_row(arm, seed, key, result, seen, seconds, init,
                     steps_per_task)])


# ---------------------------------------------------------------------------
# The table.


def interval(by_seed: dict, baseline: dict | None = None
             ) -> intervals.Interval:
  """The headline's mean (minus the baseline's, paired by seed and
  example) with its 95% interval over seeds and held-out examples;
  ``by_seed``: seed -> row.

  ``hierarchical_interval``'s metric path (the seeds' spread plus a paired
  bootstrap over the examples), for every headline, accuracy included:
  its additive path for per-example scores subtracts the seed-by-example
  interaction, and where seeds predict constant, opposite classes (as
  runs at chance can) that estimate goes negative, giving a zero-width
  interval or, through the Welch degrees of freedom, one of +-28,000.
  """
  seeds = sorted(by_seed)
  predictions = lambda rows: np.stack(
      [rows[s]['eval_predictions'] for s in seeds])
  return intervals.hierarchical_interval(
      predictions(by_seed),
      None if baseline is None else predictions(baseline),
      labels=np.asarray(by_seed[seeds[0]]['eval_labels']),
      metric=downstream.per_seed(by_seed[seeds[0]]['headline']))


def _iv(iv: intervals.Interval, signed: bool = False) -> str:
  sign = '+' if signed else ''
  text = f'{iv.estimate:{sign}.3f} [{iv.low:{sign}.3f}, {iv.high:{sign}.3f}]'
  return f'**{text}**' if signed and iv.is_claim else text


def _note(iv: intervals.Interval) -> str:
  """After a difference's cell: why it is no claim, where it is none."""
  if iv.is_claim:
    return ''
  return ' (no difference)' if iv.seeds > 1 else ' (one seed: no claim)'


def _verdict(iv: intervals.Interval) -> str:
  if iv.seeds < 2:
    return 'without a claim (one seed)'
  if not iv.excludes_zero:
    return 'no different'
  return 'better' if iv.estimate > 0 else 'worse'


def table(rows: list[dict], seeds: list[int]) -> tuple[str, str]:
  """(the Markdown table, the one-line conclusion) of ``rows`` at
  ``seeds``."""
  keys = sorted({r['task'] for r in rows})
  group = {(r['arm'], r['task']): {} for r in rows}
  for r in rows:
    if r['seed'] in seeds:
      group[(r['arm'], r['task'])][r['seed']] = r
  header = ['row']
  for key in keys:
    headline = next(r['headline'] for r in rows if r['task'] == key)
    header += [f'{key} {headline}', 'difference to single-task']
  header.append('examples seen (' + ' / '.join(keys) + ')')
  lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
  verdicts = []
  for arm in ARMS:
    cells, parts = [TITLES[arm]], []
    for key in keys:
      mine, single = group.get((arm, key), {}), group.get((SINGLE, key), {})
      if sorted(mine) != seeds or sorted(single) != seeds:   # Or control.
        cells += ['(not run)', '']
        continue
      cells.append(_iv(interval(mine)))
      if arm == SINGLE:
        cells.append('')
        continue
      diff = interval(mine, single)
      cells.append(_iv(diff, signed=True) + _note(diff))
      parts.append(f'{_verdict(diff)} on {key} ({diff.estimate:+.3f})')
    seen = [np.mean([r['examples_seen'] for r in
                     group.get((arm, k), {}).values()] or [0]) for k in keys]
    cells.append(' / '.join(f'{s:,.0f}' for s in seen))
    lines.append('| ' + ' | '.join(cells) + ' |')
    if parts:
      verdicts.append(f'{TITLES[arm]} is ' + ' and '.join(parts))
  conclusion = ('Against single-task fine-tuning (95% intervals over '
                f'{len(seeds)} seed{"s" if len(seeds) > 1 else ""} and the '
                'held-out examples): '
                + '; '.join(verdicts) + '.')
  return '\n'.join(lines), conclusion


def _size(cfg, key: str) -> str:
  """'(N training examples: how they are chosen)' of task ``key``."""
  section = cfg.tasks[key]
  task, _ = finetune.load_task(multitask.finetune_config(cfg, key))
  kept = (f'examples_per_class={section.examples_per_class}'
          if section.examples_per_class else 'all')
  name = '' if key == section.name else f'{section.name}, '
  return f'({name}{len(task.train):,} training examples: {kept})'


def report(rows: list[dict], seeds: list[int], command: str,
           steps_per_task: int) -> str:
  """table.md's text."""
  text, conclusion = table(rows, seeds)
  # A multi-task run's rows (one per task) share its seconds.
  mixed = {arm for arm, _, _ in MULTITASK_ARMS}
  runs = {(r['arm'], r['seed'], '' if r['arm'] in mixed else r['task']):
          r['seconds'] for r in rows if r['seed'] in seeds}
  seconds = sum(runs.values())
  cfg = load_config('mixing=proportional')
  sizes = ', '.join(f'{k} {_size(cfg, k)}' for k in sorted(cfg.tasks))
  labels = {r['task']: np.asarray(r['eval_labels']) for r in rows}
  majority = ', '.join(f'{k} {np.bincount(v).max() / len(v):.3f}'
                       for k, v in sorted(labels.items())
                       if v.dtype.kind in 'iu') or 'none (no class labels)'
  return '\n'.join([
      '# Multi-task fine-tuning: T5 Table 13 in miniature', '',
      '```bash', command, '```', '',
      f'Seeds {", ".join(map(str, seeds))} (each seed is the fine-tuning '
      'seed: initialisation, dropout, batch order and the training '
      f'subsample). Tasks: {sizes}; max_seq_length {cfg.max_seq_length}, '
      f'batch {cfg.batch_size}, peak lr {cfg.optimizer.learning_rate}, '
      f'pooling {cfg.pooling}. '
      f'Single-task runs: {steps_per_task} steps per task; multi-task runs: '
      f'{steps_per_task * len(cfg.tasks)} steps (the same number of '
      'training examples in all); + fine-tuning: the proportional run, then '
      f'{steps_per_task} steps per task. Majority-class accuracy on the '
      f'held-out examples: {majority}.', '',
      'Held-out headline: mean [95% interval] over seeds and held-out '
      'examples (bertjax/intervals.py, hierarchical_interval with the metric '
      'recomputed per bootstrap resample of the examples); differences are '
      'paired by seed and example, bold where the interval excludes 0.', '',
      text, '', conclusion, '',
      f'Compute: {seconds / 60:.1f} minutes of runs (the sum of the rows\' '
      f'runs) on {jax.devices()[0].device_kind} x {jax.device_count()}.', ''])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--init', required=True,
                      help='a bertjax pretraining workdir')
  parser.add_argument('--workdir', required=True,
                      help='where the runs go (each resumable)')
  parser.add_argument('--results', default=os.path.join(
      _ROOT, 'experiments', 'results', 'multitask'))
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--steps_per_task', type=int, default=150)
  parser.add_argument('--report_only', action='store_true',
                      help='write table.md from the rows so far')
  args = parser.parse_args(argv)
  seeds = sorted({int(s) for s in args.seeds.split(',')})
  # The command that runs the table (a --report_only rerun writes it too).
  command = shlex.join(['python', 'experiments/multitask_table.py'] + [
      a for a in (sys.argv[1:] if argv is None else argv)
      if a != '--report_only'])
  os.makedirs(args.results, exist_ok=True)
  # Every seed compiles the same programs: compile them once.
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(args.workdir, 'jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  rows = Rows(os.path.join(args.results, 'rows.jsonl'))
  rows.check_settings(args.init, args.steps_per_task)
  if not args.report_only:
    for seed in seeds:
      run_seed(rows, args.init, args.workdir, seed, args.steps_per_task)
  text = report(rows.rows, seeds, command, args.steps_per_task)
  with open(os.path.join(args.results, 'table.md'), 'w') as f:
    f.write(text)
  print(text)


if __name__ == '__main__':
  main()
