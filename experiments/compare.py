"""Trains several objectives on the same data and budget, side by side.

  python experiments/compare.py --out=runs/compare --budget=steps:300 \
      --run bert=experiments/configs/bert.py:size=base \
      --run roberta=experiments/configs/roberta.py \
      --set model.size=tiny --set data.max_seq_length=128

Each ``--run NAME=SPEC`` is a config file (``path.py[:arg]``) or an
existing workdir (a directory holding ``run_meta.json``). Config runs get
the ``--set`` overrides (for all of them: e.g. a tiny size on a CPU), one
shared seed and the shared data settings, and a budget: ``steps:N``,
``tokens:N`` (steps = N / (batch x sequence length)) or ``flops:N`` (steps
= N / (training FLOPs per token x batch x sequence length)). Each preset's
warmup keeps its fraction of the schedule. A run trains in
``OUT/runs/NAME`` unless it already finished there (resume is exact, so an
interrupted comparison continues where it stopped; a finished one is
read, not retrained, and its wall time shows as '-').

Writes to ``OUT``:
- ``compare.md``: one row per run: objective, parameters, steps, tokens,
  training FLOPs, wall time, and the held-out metrics; metrics that mean
  different things across objectives get their own columns (ELECTRA's MLM
  accuracy is its generator's, not the trained network's);
- ``loss_vs_steps.png``, ``loss_vs_flops.png``: the MLM loss of the networks
  trained by masked language modelling (not ELECTRA's discriminator, whose
  loss is of another task), training and held-out;
- ``objectives.png``: each objective-specific metric (NSP/SOP, SBO, RTD,
  distillation) on its own axis, for the runs that have it.

Each run's final checkpoint is then fine-tuned on a downstream task with
``--finetune`` (a fine-tuning config, default
``experiments/configs/finetune.py``: the embedded task, which needs no
download; ``none`` skips it; ``--finetune_set`` overrides its fields), in
``OUT/finetune/NAME-stepN``, and the table gets the task's held-out
metrics. What matters downstream is then next to what each objective
optimized.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import sys
import time

import ml_collections

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:   # Run as a script from a checkout.
  sys.path.insert(0, _ROOT)

from bertjax import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
from bertjax import config_lib  # pylint: disable=g-import-not-at-top
from bertjax import finetune  # pylint: disable=g-import-not-at-top
from bertjax import train  # pylint: disable=g-import-not-at-top

BUDGET_KINDS = ('steps', 'tokens', 'flops')
# Held-out metrics in the table; (column, metric, objectives it means the
# same thing for). None: every objective.
COLUMNS = (
    ('MLM loss', 'eval_mlm_loss', ('bert', 'distillation')),
    ('MLM acc.', 'eval_mlm_accuracy', ('bert', 'distillation')),
    ('NSP/SOP acc.', 'eval_nsp_accuracy', None),
    ('SBO acc.', 'eval_sbo_accuracy', None),
    ('generator MLM acc.', 'eval_mlm_accuracy', ('electra',)),
    ('RTD acc.', 'eval_rtd_accuracy', None),
    ('KL loss', 'eval_kl_loss', None),
)
# Objective-specific training metrics, one axis each.
DEFAULT_FINETUNE = os.path.join(_ROOT, 'experiments', 'configs',
                                'finetune.py')
OBJECTIVE_METRICS = ('nsp_accuracy', 'sbo_loss', 'rtd_loss', 'rtd_accuracy',
                     'kl_loss', 'cos_loss')


class CompareError(ValueError):
  """A bad --run, --set or --budget; the message says which and why."""


def load_config(spec: str):
  """``path.py[:arg]`` -> the file's ``get_config(arg)``."""
  path, _, arg = spec.partition(':')
  if not (path.endswith('.py') and os.path.isfile(path)):
    raise CompareError(f'{spec!r} is neither a config file (path.py[:arg]) '
                       'nor a workdir with run_meta.json.')
  module_spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def apply_override(cfg, item: str) -> None:
  """``a.b.c=value`` (a Python literal, or else a string) into ``cfg``."""
  key, sep, text = item.partition('=')
  if not sep:
    raise CompareError(f'--set {item!r}: use --set field=value.')
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  *parents, leaf = key.split('.')
  section = cfg
  try:
    for part in parents:
      section = section[part]
    if leaf not in section:
      raise KeyError(leaf)
    section[leaf] = value
  except (KeyError, AttributeError) as e:
    raise CompareError(f'--set {item!r}: the config has no field {key}.'
                       ) from e
  except TypeError as e:
    raise CompareError(f'--set {item!r}: {e}') from e


def parse_budget(text: str) -> tuple[str, float]:
  kind, _, amount = text.partition(':')
  try:
    value = float(amount)
  except ValueError:
    value = -1.0
  if kind not in BUDGET_KINDS or value <= 0:
    raise CompareError(f'--budget={text!r}: use steps:N, tokens:N or '
                       'flops:N with N > 0.')
  return kind, value


def budget_steps(cfg, kind: str, amount: float,
                 flops_per_token: float) -> int:
  """Training steps that spend ``amount`` of the budget with ``cfg``."""
  if kind == 'steps':
    return max(1, int(amount))
  tokens_per_step = cfg.batch_size * cfg.data.max_seq_length
  if kind == 'tokens':
    return max(1, int(amount // tokens_per_step))
  return max(1, int(amount // (flops_per_token * tokens_per_step)))


def rescale_schedule(cfg, steps: int) -> None:
  """Sets the schedule's length to ``steps``, keeping the preset's warmup
  fraction (a paper's 10k warmup of 1M steps stays 1%)."""
  fraction = cfg.optimizer.warmup_steps / max(cfg.total_steps, 1)
  cfg.total_steps = steps
  cfg.num_train_steps = 0
  cfg.optimizer.warmup_steps = max(1, round(fraction * steps))


def _flops_per_token(cfg) -> float:
  """The task's FLOPs per token, without reading any data."""
  from bertjax import pretraining  # pylint: disable=g-import-not-at-top
  from data_pipelines import tokenizer  # pylint: disable=g-import-not-at-top
  vocab = tokenizer.padded_vocab_size(cfg.data.tokenizer.vocab_size)
  return pretraining.make_task(cfg, vocab).flops_per_token


def prepare_runs(runs: list[str], overrides: list[str], budget: str,
                 out: str, seed: int) -> list[dict]:
  """Every run's name, workdir and config, checked before anything trains.

  Returns dicts with ``name``, ``workdir``, ``cfg`` (None for an existing
  workdir, which is read as it is).
  """
  kind, amount = parse_budget(budget)
  prepared, names = [], set()
  for item in runs:
    name, sep, spec = item.partition('=')
    if not sep or not name or not spec:
      raise CompareError(f'--run {item!r}: use --run NAME=path.py[:arg] or '
                         '--run NAME=WORKDIR.')
    if name in names:
      raise CompareError(f'--run {item!r}: the name {name!r} is used twice.')
    names.add(name)
    if os.path.isfile(os.path.join(spec, train._RUN_META)):  # pylint: disable=protected-access
      prepared.append({'name': name, 'workdir': spec, 'cfg': None})
      continue
    cfg = load_config(spec)
    for override in overrides:
      apply_override(cfg, override)
    cfg.seed = seed
    # FLOPs per token only for a FLOPs budget: a distillation task reads
    # its teacher to know them.
    per_token = _flops_per_token(cfg) if kind == 'flops' else 0.0
    rescale_schedule(cfg, budget_steps(cfg, kind, amount, per_token))
    config_lib.validate(cfg)
    prepared.append({'name': name, 'cfg': cfg,
                     'workdir': os.path.join(out, 'runs', name)})
  if not prepared:
    raise CompareError('no --run given.')
  return prepared


def read_run(name: str, workdir: str) -> dict:
  """A finished run's config, metrics and summary, from its workdir."""
  with open(os.path.join(workdir, train._RUN_META)) as f:  # pylint: disable=protected-access
    meta = json.load(f)
  records = []
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    for line in f:
      records.append(json.loads(line))
  if not records:
    raise CompareError(f'run {name!r} in {workdir} has no metrics.')
  cfg = ml_collections.ConfigDict(meta['config'])
  return {'name': name, 'workdir': workdir, 'cfg': cfg, 'records': records,
          'flops_per_token': (meta.get('flops_per_token')
                              or _flops_per_token(cfg)),
          'parameters': meta.get('trainable_parameters')}


def _fmt(value, digits: int = 4) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return '-'
  if isinstance(value, float):
    return f'{value:.{digits}f}'
  return str(value)


def _human(n: float) -> str:
  for unit, size in (('T', 1e12), ('G', 1e9), ('M', 1e6), ('k', 1e3)):
    if abs(n) >= size:
      return f'{n / size:.3g}{unit}'
  return f'{n:.3g}'


def objective_label(cfg) -> str:
  """What a run trains, e.g. ``MLM+SOP`` or ``ELECTRA``."""
  name = cfg.objective.name
  if name != 'bert':
    return {'electra': 'ELECTRA (MLM+RTD)',
            'distillation': 'distillation'}.get(name, name)
  parts = ['MLM']
  if cfg.objective.nsp_weight and cfg.data.layout in ('nsp', 'sop'):
    parts.append(cfg.data.layout.upper())
  if cfg.objective.get('sbo_weight'):
    parts.append('SBO')
  return '+'.join(parts)


def table(runs: list[dict]) -> str:
  """The markdown table of the runs' final held-out metrics."""
  head = ['run', 'objective', 'params', 'steps', 'tokens', 'train FLOPs',
          'wall s'] + [c for c, _, _ in COLUMNS]
  downstream = next((r['downstream'] for r in runs if r.get('downstream')),
                    None)
  if downstream:   # The task's metrics, headline first.
    head += [f'{downstream["task"]} {m}' for m in downstream['metrics']]
  lines = ['| ' + ' | '.join(head) + ' |',
           '| ' + ' | '.join('---' for _ in head) + ' |']
  for run in runs:
    cfg, last = run['cfg'], run['records'][-1]
    final = next((r for r in reversed(run['records'])
                  if 'eval_mlm_loss' in r or 'eval_rtd_loss' in r), {})
    step = last['step']
    tokens = step * cfg.batch_size * cfg.data.max_seq_length
    objective = cfg.objective.name
    cells = [run['name'], objective_label(cfg), _human(run['parameters'])
             if run['parameters'] else '-', str(step), _human(tokens),
             _human(tokens * run['flops_per_token']),
             _fmt(run.get('wall_seconds'), 0)]
    for _, metric, objectives in COLUMNS:
      same = objectives is None or objective in objectives
      cells.append(_fmt(final.get(metric)) if same else '-')
    if downstream:
      scores = (run.get('downstream') or {}).get('metrics', {})
      cells += [_fmt(scores.get(m)) for m in downstream['metrics']]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def plots(runs: list[dict], out: str) -> list[str]:
  """Writes the PNGs; returns their paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  paths = []
  mlm_runs = [r for r in runs if r['cfg'].objective.name != 'electra']
  for axis in ('steps', 'flops'):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in mlm_runs:
      cfg = run['cfg']
      per_step = (cfg.batch_size * cfg.data.max_seq_length
                  * run['flops_per_token'])
      x_of = (lambda r: r['step']) if axis == 'steps' else (
          lambda r, k=per_step: r['step'] * k)
      train_points = [(x_of(r), r['mlm_loss']) for r in run['records']
                      if 'mlm_loss' in r]
      eval_points = [(x_of(r), r['eval_mlm_loss']) for r in run['records']
                     if 'eval_mlm_loss' in r]
      line, = ax.plot(*zip(*train_points), label=f'{run["name"]} (train)')
      if eval_points:
        ax.plot(*zip(*eval_points), 'o--', color=line.get_color(),
                label=f'{run["name"]} (held-out)')
    ax.set_xlabel('training step' if axis == 'steps' else
                  'training FLOPs (analytic, at the full sequence length)')
    if axis == 'flops':
      ax.set_xscale('log')
    ax.set_ylabel('MLM loss')
    ax.set_title('Masked-LM loss of the networks trained by MLM')
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, f'loss_vs_{axis}.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  present = [m for m in OBJECTIVE_METRICS
             if any(m in r for run in runs for r in run['records'])]
  if present:
    fig, axes = plt.subplots(1, len(present),
                             figsize=(4.2 * len(present), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], present):
      for run in runs:
        points = [(r['step'], r[metric]) for r in run['records']
                  if metric in r]
        if points:
          ax.plot(*zip(*points), label=run['name'])
      ax.set_title(metric)
      ax.set_xlabel('training step')
      ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, 'objectives.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  return paths


def _finished(run: dict) -> bool:
  """Whether the run's workdir already holds its last checkpoint (its
  wall time is then not this invocation's, and shows as '-')."""
  step = checkpoint_lib.latest_step(os.path.join(run['workdir'],
                                                 'checkpoints'))
  return step is not None and step >= run['cfg'].total_steps


def finetune_config(spec: str, overrides: list[str], seed: int):
  """The downstream fine-tuning config (None for ``none``), checked."""
  if spec == 'none':
    return None
  cfg = load_config(spec)
  for override in overrides:
    apply_override(cfg, override)
  cfg.seed = seed
  try:
    finetune.validate(cfg, check_init=False)
  except finetune.FinetuneError as e:
    raise CompareError(f'--finetune {spec!r}: {e}') from e
  return cfg


def run_downstream(result: dict, cfg, out: str) -> dict:
  """Fine-tunes ``result``'s last checkpoint with ``cfg`` unless that was
  done (the result is kept per pretraining step); returns downstream.json."""
  step = result['records'][-1]['step']
  workdir = os.path.join(out, 'finetune', f'{result["name"]}-step{step}')
  path = os.path.join(workdir, finetune.RESULT)
  if not os.path.isfile(path):
    run_cfg = cfg.copy_and_resolve_references()
    run_cfg.init = result['workdir']
    print(f'== {result["name"]}: fine-tuning on {cfg.task.name} in '
          f'{workdir}', flush=True)
    finetune.finetune(run_cfg, workdir)
  with open(path) as f:
    return json.load(f)


def compare(runs: list[str], overrides: list[str], budget: str, out: str,
            seed: int = 0, finetune_spec: str = DEFAULT_FINETUNE,
            finetune_overrides: tuple[str, ...] = ()) -> str:
  """Trains what has not run, fine-tunes each on the downstream task, then
  writes the table and plots to ``out``.

  Returns the markdown table.
  """
  prepared = prepare_runs(runs, overrides, budget, out, seed)
  downstream = finetune_config(finetune_spec, list(finetune_overrides), seed)
  os.makedirs(out, exist_ok=True)
  results = []
  for run in prepared:
    wall = None
    if run['cfg'] is not None and not _finished(run):
      print(f'== {run["name"]}: {run["cfg"].total_steps} steps in '
            f'{run["workdir"]}', flush=True)
      start = time.time()
      train.train_and_evaluate(run['cfg'], run['workdir'])
      wall = time.time() - start
    result = read_run(run['name'], run['workdir'])
    result['wall_seconds'] = wall
    if downstream is not None:
      result['downstream'] = run_downstream(result, downstream, out)
    results.append(result)
  markdown = table(results)
  with open(os.path.join(out, 'compare.md'), 'w') as f:
    f.write(markdown)
  plots(results, out)
  return markdown


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--run', action='append', default=[],
                      help='NAME=path.py[:arg] or NAME=WORKDIR; repeat.')
  parser.add_argument('--set', action='append', default=[], dest='overrides',
                      help='field=value for every config run; repeat.')
  parser.add_argument('--budget', default='steps:300',
                      help='steps:N, tokens:N or flops:N (default steps:300).')
  parser.add_argument('--out', required=True, help='output directory.')
  parser.add_argument('--seed', type=int, default=0,
                      help='the shared seed of every config run.')
  parser.add_argument('--finetune', default=DEFAULT_FINETUNE,
                      help='fine-tuning config (path.py[:arg]) of the '
                      'downstream task; none to skip.')
  parser.add_argument('--finetune_set', action='append', default=[],
                      help='field=value for the fine-tuning config; repeat.')
  args = parser.parse_args(argv)
  try:
    print(compare(args.run, args.overrides, args.budget, args.out,
                  args.seed, args.finetune, args.finetune_set))
  except CompareError as e:
    parser.error(str(e))


if __name__ == '__main__':
  main()
