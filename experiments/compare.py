r"""Compares objectives side by side: seeds, a random-init control, intervals.

  python experiments/compare.py --out=runs/compare_small --seeds=5 \
      --budget=steps:1200 --finetune_lrs=1e-4,3e-4,1e-3 \
      --run bert=experiments/configs/compare_small.py:objective=bert \
      --run roberta=experiments/configs/compare_small.py:objective=roberta

Each ``--run NAME=SPEC`` is a config file (``path.py[:arg]``; ``--set``
overrides apply to every one) or, with one seed, a finished workdir. Every
arm (a run, or a run at one value of ``--sweep FIELD=v1,v2,...``; two
sweeps give their product) is pretrained for each budget (``steps:N``,
``tokens:N`` or ``flops:N``; several as ``steps:300,600,1200``; each preset
keeps its warmup fraction) under each seed ``seed .. seed + seeds - 1``,
the pretraining seed and the fine-tuning seed both.

Then each pretrained encoder is fine-tuned on the downstream task
(``--finetune``, default the embedded task) once per learning rate of
``--finetune_lrs``, on the training examples less a dev split
(``--dev_fraction`` of them, drawn from the seed), and so is the control:
``scratch``, the same fine-tuning from random weights of each architecture
under the same seeds (arms that share an architecture and tokenizer share
it). Fine-tuning from random weights is the noisiest run here and the
cheapest (no pretraining): ``--control_repeats=K`` fine-tunes the control
K times per seed (fine-tuning seeds ``seed + 10000 k``) and pairs each
arm's seed with the mean of those K, example by example, so the
difference's interval is not set by the control's spread alone. Each arm's
learning rate is the grid's best mean dev score; its
held-out scores are the ones reported. The held-out set is never used to
choose.

What is reported (``--results``, default ``--out``):

- ``compare.md``: the exact command, the seeds, the grid and the chosen
  rates; pretraining metrics as mean +- 95% interval over seeds; the
  downstream headline as mean [95% interval] over seeds and held-out
  examples; each arm's paired difference to ``scratch`` and to
  ``--baseline`` (default: the first arm) with its interval, marked where
  the interval excludes 0 (bertjax/intervals.py says how); the grid's dev
  and held-out means per rate.
- ``downstream_vs_flops.png`` (headline against pretraining FLOPs, a line
  per arm with its band, the control as a horizontal band),
  ``difference_vs_steps.png`` (pretrained minus scratch against the
  pretraining budget, per arm, with bands), ``loss_vs_steps.png`` and
  ``loss_vs_flops.png`` (MLM loss, mean over seeds with a band),
  ``objectives.png``.
- ``rows.jsonl``: one raw row per finished pretraining or fine-tuning run,
  appended as each finishes (``--report_only`` writes the report of the
  rows so far without running anything). A rerun skips every run whose
  row is there (with the same settings) and resumes an unfinished one
  from its checkpoint, bitwise; so a long comparison can be stopped and
  continued, in another session, from the rows alone: commit them as they
  come.

The wall time of this invocation and the comparison's total (the sum of its
rows' runs) are printed and written.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import shlex
import sys
import time

import ml_collections
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:   # Run as a script from a checkout.
  sys.path.insert(0, _ROOT)

from bertjax import config_lib  # pylint: disable=g-import-not-at-top
from bertjax import errors  # pylint: disable=g-import-not-at-top
from bertjax import finetune  # pylint: disable=g-import-not-at-top
from bertjax import intervals  # pylint: disable=g-import-not-at-top
from bertjax.runtime import metric_writers  # pylint: disable=g-import-not-at-top
from bertjax import objectives  # pylint: disable=g-import-not-at-top
from bertjax.objectives import mobilebert as mobilebert_lib  # pylint: disable=g-import-not-at-top
from bertjax import storage  # pylint: disable=g-import-not-at-top
from bertjax import train  # pylint: disable=g-import-not-at-top
from data_pipelines import continual as continual_lib  # pylint: disable=g-import-not-at-top
from data_pipelines import downstream  # pylint: disable=g-import-not-at-top
from data_pipelines import tasks as tasks_lib  # pylint: disable=g-import-not-at-top

BUDGET_KINDS = ('steps', 'tokens', 'flops')
SCRATCH = 'scratch'
ROWS = 'rows.jsonl'
# In each run's workdir: the key of the row it computes (_claim).
CLAIM = 'compare_key.txt'
# In each run's workdir: the wall seconds of its earlier invocations
# (_timed), so that a resumed run's row counts all of them.
WALL = 'compare_wall_seconds.txt'
# Held-out pretraining metrics in the table; (column, metric, objectives it
# means the same thing for). None: every objective.
COLUMNS = (
    ('MLM loss', 'eval_mlm_loss', ('bert', 'distillation', 'tinybert')),
    ('MLM acc.', 'eval_mlm_accuracy', ('bert', 'distillation', 'tinybert')),
    ('NSP/SOP acc.', 'eval_nsp_accuracy', None),
    ('SBO acc.', 'eval_sbo_accuracy', None),
    ('generator MLM acc.', 'eval_mlm_accuracy', ('electra',)),
    ('RTD acc.', 'eval_rtd_accuracy', None),
    ('KL loss', 'eval_kl_loss', None),
)
DEFAULT_FINETUNE = os.path.join(_ROOT, 'experiments', 'configs',
                                'finetune.py')
# Objective-specific training metrics, one axis each.
OBJECTIVE_METRICS = ('nsp_accuracy', 'sbo_loss', 'rtd_loss', 'rtd_accuracy',
                     'kl_loss', 'cos_loss', 'att_loss', 'hidden_loss',
                     'pred_loss')
# Fields that say where files go, not what is computed: left out of a
# row's settings key, so a rerun elsewhere still finds its rows.
_LOCATION_FIELDS = ('data_dir', 'tfds_data_dir', 'init', 'teacher_workdir')
# The control's repeat k of seed s fine-tunes under seed s + k * stride.
REPEAT_SEED_STRIDE = 10_000


class CompareError(ValueError):
  """A bad argument; the message says which and why."""


# ---------------------------------------------------------------------------
# Configs, budgets and arms: everything is checked before anything trains.


def load_config(spec: str):
  """``path.py[:arg]`` -> the file's ``get_config(arg)``."""
  try:
    return config_lib.load_config_file(spec)
  except ValueError as e:
    if os.path.isfile(spec.partition(':')[0]):
      raise   # The file's own complaint about its arg.
    raise CompareError(f'{spec!r} is neither a config file (path.py[:arg]) '
                       'nor a workdir with run_meta.json.') from e


def _literal(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def set_field(cfg, key: str, value, what: str) -> None:
  """``cfg.<key> = value`` for a dotted ``key`` the config has."""
  *parents, leaf = key.split('.')
  section = cfg
  try:
    for part in parents:
      section = section[part]
    if leaf not in section:
      raise KeyError(leaf)
    section[leaf] = value
  except (KeyError, AttributeError) as e:
    raise CompareError(f'{what}: the config has no field {key}.') from e
  except TypeError as e:
    raise CompareError(f'{what}: {e}') from e


def apply_override(cfg, item: str) -> None:
  """``a.b.c=value`` (a Python literal, or else a string) into ``cfg``."""
  key, sep, text = item.partition('=')
  if not sep:
    raise CompareError(f'--set {item!r}: use --set field=value.')
  set_field(cfg, key, _literal(text), f'--set {item!r}')


def parse_budgets(text: str) -> list[tuple[str, float]]:
  """``steps:300`` or ``steps:300,600`` -> [(kind, amount), ...]."""
  kind, _, amounts = text.partition(':')
  values = []
  for amount in amounts.split(','):
    try:
      values.append(float(amount))
    except ValueError:
      values.append(-1.0)
  if kind not in BUDGET_KINDS or not values or min(values) <= 0:
    raise CompareError(f'--budget={text!r}: use steps:N, tokens:N or '
                       'flops:N with N > 0 (several: steps:300,600).')
  if len(set(values)) != len(values):
    raise CompareError(f'--budget={text!r} repeats a value.')
  return [(kind, v) for v in sorted(values)]


def parse_budget(text: str) -> tuple[str, float]:
  """One budget (``steps:N``, ``tokens:N`` or ``flops:N``)."""
  budgets = parse_budgets(text)
  if len(budgets) != 1:
    raise CompareError(f'--budget={text!r}: one budget here.')
  return budgets[0]


def budget_label(kind: str, amount: float) -> str:
  return f'{kind}{amount:g}'


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
  fraction (a paper's 10k warmup of 1M steps stays 1%; of the steps after
  a hold, where the warmup runs), a continual run's stage fractions and
  MobileBERT's progressive transfer's share (the lr held through it)."""
  o = cfg.optimizer
  fraction = o.warmup_steps / max(cfg.total_steps - o.hold_steps, 1)
  stages = continual_lib.scaled_stages(cfg.continual.stage_steps, steps)
  hold = round(o.hold_steps * steps / max(cfg.total_steps, 1))
  if cfg.objective.name == 'mobilebert' and cfg.mobilebert.steps_per_layer:
    # Any vocabulary size: only the student's layer count is read.
    layers = mobilebert_lib.student_config(cfg, 128).num_layers
    per_layer = max(1, round(cfg.mobilebert.steps_per_layer * steps /
                             max(cfg.total_steps, 1)))
    cfg.mobilebert.steps_per_layer = per_layer
    hold = per_layer * layers   # mobilebert.check ties them.
    if hold >= steps:
      raise CompareError(
          f'{steps} steps leave none after MobileBERT\'s progressive '
          f'transfer ({per_layer} per layer x {layers} layers = {hold} '
          'steps; at least one per layer) for its pretraining distillation: '
          'give a larger budget.')
  cfg.total_steps = steps
  cfg.num_train_steps = 0
  o.hold_steps = hold
  # A preset with a warmup keeps at least one step of it; one without
  # (a constant schedule, which refuses any) keeps none.
  o.warmup_steps = (max(1, round(fraction * (steps - hold))) if fraction
                    else 0)
  cfg.continual.stage_steps = stages


def _flops_per_token(cfg) -> float:
  """The task's FLOPs per token, without reading any data."""
  return objectives.get(cfg.objective.name).make_task(
      cfg, cfg.data.tokenizer.vocab_size).flops_per_token


def parse_sweeps(sweeps: list[str]) -> list[tuple[str, list]]:
  """``FIELD=v1,v2`` (one or two) -> [(field, [values])]."""
  if len(sweeps) > 2:
    raise CompareError(f'--sweep is given {len(sweeps)} times; sweep one or '
                       'two fields (their product is run).')
  parsed = []
  for item in sweeps:
    key, sep, text = item.partition('=')
    values = [_literal(v) for v in text.split(',')] if text else []
    if not sep or not key or len(values) < 2:
      raise CompareError(f'--sweep {item!r}: use --sweep FIELD=v1,v2[,...] '
                         'with at least two values.')
    if len(set(map(repr, values))) != len(values):
      raise CompareError(f'--sweep {item!r} repeats a value.')
    parsed.append((key, values))
  if len(parsed) == 2 and parsed[0][0] == parsed[1][0]:
    raise CompareError(f'--sweep names {parsed[0][0]} twice.')
  return parsed


@dataclasses.dataclass
class Arm:
  """One pretraining recipe: a run, at one value of each swept field."""
  name: str
  spec: str
  setting: tuple[tuple[str, object], ...] = ()  # The swept fields' values.
  workdir: str = ''                             # A finished run, as it is.

  @property
  def directory(self) -> str:
    """A file-system-safe name."""
    return ''.join(c if c.isalnum() or c in '-_.=' else '_'
                   for c in self.name)


def make_arms(runs: list[str], sweeps: list[str]) -> list[Arm]:
  """The arms, in order: each run, at each point of the sweep's grid."""
  swept = parse_sweeps(sweeps)
  arms, names = [], set()
  for item in runs:
    name, sep, spec = item.partition('=')
    if not sep or not name or not spec:
      raise CompareError(f'--run {item!r}: use --run NAME=path.py[:arg] or '
                         '--run NAME=WORKDIR.')
    if name in names or name == SCRATCH:
      raise CompareError(f'--run {item!r}: the name {name!r} is '
                         + ('the control\'s.' if name == SCRATCH else
                            'used twice.'))
    names.add(name)
    if storage.isfile(os.path.join(spec, train.RUN_META)):
      if swept:
        raise CompareError(f'--run {item!r} is a finished workdir; a sweep '
                           'needs config runs.')
      arms.append(Arm(name, spec, workdir=spec))
      continue
    for values in itertools.product(*[v for _, v in swept]):
      setting = tuple((k, v) for (k, _), v in zip(swept, values))
      label = ','.join(f'{k}={v}' for k, v in setting)
      arms.append(Arm(f'{name}[{label}]' if label else name, spec, setting))
  if not arms:
    raise CompareError('no --run given.')
  return arms


def arm_config(arm: Arm, overrides: list[str], seed: int, kind: str,
               amount: float):
  """The arm's pretraining config at ``seed`` and one budget, checked."""
  cfg = load_config(arm.spec)
  for override in overrides:
    apply_override(cfg, override)
  for key, value in arm.setting:
    set_field(cfg, key, value, f'--sweep {key}')
  cfg.seed = seed
  # FLOPs per token only for a FLOPs budget: a distillation task reads its
  # teacher to know them.
  per_token = _flops_per_token(cfg) if kind == 'flops' else 0.0
  rescale_schedule(cfg, budget_steps(cfg, kind, amount, per_token))
  config_lib.validate(cfg)
  return cfg


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


def parse_lrs(text: str) -> list[float]:
  try:
    lrs = [float(v) for v in text.split(',')] if text else []
  except ValueError:
    lrs = [-1.0]
  if any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
    raise CompareError(f'--finetune_lrs={text!r}: distinct learning rates '
                       '> 0, comma-separated.')
  return lrs


@dataclasses.dataclass
class Plan:
  """What a comparison runs, checked before anything trains."""
  arms: list[Arm]
  budgets: list[tuple[str, float]]
  seeds: list[int]
  overrides: list[str]
  finetune: ml_collections.ConfigDict | None
  lrs: list[float]
  baseline: str
  control_repeats: int = 1


def control_seed(seed: int, repeat: int) -> int:
  """The fine-tuning seed of the control's ``repeat`` (0 = ``seed``)."""
  return seed + repeat * REPEAT_SEED_STRIDE


def make_plan(runs, overrides, budget, seeds=1, seed=0, sweeps=(),
              finetune_spec=DEFAULT_FINETUNE, finetune_overrides=(),
              finetune_lrs='', dev_fraction=0.2, baseline='',
              control_repeats=1) -> Plan:
  """Parses and checks every argument and every arm's config."""
  if seeds < 1:
    raise CompareError(f'--seeds={seeds}: at least 1.')
  if control_repeats < 1:
    raise CompareError(f'--control_repeats={control_repeats}: at least 1.')
  if control_repeats > 1 and not 0 <= seed < seed + seeds <= (
      REPEAT_SEED_STRIDE):
    raise CompareError(
        f'--control_repeats={control_repeats} fine-tunes the control under '
        f'seeds seed + {REPEAT_SEED_STRIDE} k; with seeds {seed}..'
        f'{seed + seeds - 1} they would collide: keep the seeds in '
        f'[0, {REPEAT_SEED_STRIDE}).')
  budgets = parse_budgets(budget)
  arms = make_arms(list(runs), list(sweeps))
  if seeds > 1 and any(a.workdir for a in arms):
    raise CompareError('a finished workdir is one seed; --seeds > 1 needs '
                       'config runs.')
  seed_list = list(range(seed, seed + seeds))
  overrides = list(overrides)
  for arm in arms:
    if arm.workdir:
      continue
    for kind, amount in budgets:   # Every config checked, for every budget.
      arm_config(arm, overrides, seed_list[0], kind, amount)
  ft = finetune_config(finetune_spec, list(finetune_overrides), seed)
  lrs = parse_lrs(finetune_lrs)
  if ft is not None:
    lrs = lrs or [float(ft.optimizer.learning_rate)]
    if len(lrs) > 1:
      if not 0 < dev_fraction < 1:
        raise CompareError(f'--dev_fraction={dev_fraction}: a learning-rate '
                           'grid is chosen on a dev split; give a fraction '
                           'in (0, 1).')
      ft.task.dev_fraction = dev_fraction
  names = [a.name for a in arms]
  baseline = baseline or names[0]
  if baseline not in names:
    raise CompareError(f'--baseline={baseline!r} is not an arm; the arms '
                       f'are {names}.')
  return Plan(arms, budgets, seed_list, overrides, ft, lrs, baseline,
              control_repeats)


# ---------------------------------------------------------------------------
# Rows: the raw record, one JSON line per finished run.


def settings_key(cfg) -> str:
  """A digest of what a config computes: the fields that differ from the
  defaults (``config_lib.base_config`` for pretraining,
  ``finetune.base_config`` for fine-tuning), less where files go. A field
  added later at its default leaves the key as it was, as it leaves a
  run's resume (a new field's default keeps the old behaviour)."""
  base = (finetune.base_config() if 'task' in cfg
          else config_lib.base_config()).to_dict()
  return _changed_digest(cfg.to_dict(), base)


def _changed_digest(tree: dict, defaults: dict) -> str:
  """A digest of the fields of ``tree`` that differ from ``defaults``,
  less where files go."""

  def changed(tree, defaults):
    if isinstance(tree, dict):
      out = {}
      for k, v in sorted(tree.items()):
        if k in _LOCATION_FIELDS:
          continue
        d = defaults.get(k) if isinstance(defaults, dict) else None
        sub = changed(v, d)
        if sub is not _SAME:
          out[k] = sub
      return out if out else _SAME
    return _SAME if _same(tree, defaults) else tree

  diff = changed(tree, defaults)
  # Nothing changed: {} (the _SAME sentinel's repr holds its address).
  text = json.dumps({} if diff is _SAME else diff, sort_keys=True,
                    default=repr)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


# The sections that decide a run's held-out MLM batches (inputs and masks)
# at its seed; besides them, the tasks that rewrite the input.
_HELD_OUT_SECTIONS = ('data', 'masking', 'continual')


def held_out_sections(cfg) -> dict:
  """Section -> digest, for what decides the run's held-out MLM batches at
  its seed: two runs whose digests agree are evaluated on the same inputs
  and masks (a task that only adds labels leaves them as they are)."""
  base = config_lib.base_config()
  names = list(_HELD_OUT_SECTIONS) + [
      f'tasks.{n}' for n in tasks_lib.names()
      if tasks_lib.get(n).corrupts and cfg.tasks[n].weight]
  return {name: _changed_digest(train.config_section(cfg, name),
                                train.config_section(base, name))
          for name in names}


_SAME = object()


def _same(a, b) -> bool:
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return type(a) is type(b) and a == b


class Rows:
  """``rows.jsonl``: read at start, appended (and flushed to disk) as each
  run finishes, so a stopped comparison keeps what it finished. In a
  bucket, which cannot append, the file is rewritten whole each time."""

  def __init__(self, path: str):
    self.path = path
    self.rows: list[dict] = []
    if not storage.isfile(path):
      return
    lines = storage.read_text(path).splitlines(keepends=True)
    for number, line in enumerate(lines):
      try:
        self.rows.append(json.loads(line))
      except json.JSONDecodeError:
        if number != len(lines) - 1:
          raise CompareError(f'{path} line {number + 1} is not a row; only '
                             'the last line can be torn (a killed run). '
                             'Fix or remove it.') from None
        # A torn last line from a killed run: cut it off; its run reruns.
        print(f'{path}: dropping a torn last line', flush=True)
        storage.write_text(path, ''.join(lines[:number]))
        return
    if lines and not lines[-1].endswith('\n'):   # Killed before its newline.
      storage.write_text(path, ''.join(lines) + '\n')

  def find(self, key: str) -> dict | None:
    return next((r for r in self.rows if r['key'] == key), None)

  def add(self, row: dict) -> dict:
    line = json.dumps(row, sort_keys=True) + '\n'
    if storage.is_remote(self.path):
      storage.write_text(self.path, ''.join(
          json.dumps(r, sort_keys=True) + '\n' for r in self.rows) + line)
    else:
      with open(self.path, 'a') as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    self.rows.append(row)
    return row


def _row_key(*parts) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr)
                        .encode()).hexdigest()[:20]


def objective_label(cfg) -> str:
  """What a run trains, e.g. ``MLM+SOP``, ``ELECTRA`` or
  ``MLM+capitalization`` (the tasks beyond masking by name)."""
  name = cfg.objective.name
  if name != 'bert':
    return {'electra': 'ELECTRA (MLM+RTD)',
            'distillation': 'distillation',
            'tinybert': 'TinyBERT distillation'}.get(name, name)
  parts = ['MLM'] if cfg.objective.mlm_weight else []
  if cfg.objective.nsp_weight and cfg.data.layout in ('nsp', 'sop'):
    parts.append(cfg.data.layout.upper())
  if cfg.objective.get('sbo_weight'):
    parts.append('SBO')
  parts += continual_lib.run_tasks(cfg)
  if continual_lib.is_continual(cfg):
    return f'continual ({"+".join(parts)})'
  return '+'.join(parts)


def _run_meta(workdir: str) -> dict:
  return json.loads(storage.read_text(os.path.join(workdir, train.RUN_META)))


def saved_config(workdir: str):
  """A finished run's config, as it trained."""
  return config_lib.from_saved(_run_meta(workdir)['config'])


def read_run(workdir: str) -> dict:
  """A finished run's config, metric records and sizes, from its workdir."""
  meta = _run_meta(workdir)
  records = [entry for _, entry in metric_writers.logged_lines(
      os.path.join(workdir, 'metrics.jsonl'))]
  if not records:
    raise CompareError(f'{workdir} has no metrics.')
  cfg = config_lib.from_saved(meta['config'])
  return {'cfg': cfg, 'records': records,
          'flops_per_token': (meta.get('flops_per_token')
                              or _flops_per_token(cfg)),
          'parameters': meta.get('trainable_parameters')}


def pretrain_row(arm: Arm, budget: str, seed: int, key: str, run: dict,
                 wall: float | None) -> dict:
  cfg, records = run['cfg'], run['records']
  step = records[-1]['step']
  tokens = step * cfg.batch_size * cfg.data.max_seq_length
  # The last evaluation (a task beyond masking alone has no MLM loss).
  final = next((r for r in reversed(records)
                if any(k.startswith('eval_') and k.endswith('_loss')
                       for k in r)), {})
  curve_keys = ('mlm_loss', 'eval_mlm_loss') + OBJECTIVE_METRICS
  return {
      'kind': 'pretrain', 'key': key, 'arm': arm.name, 'budget': budget,
      'seed': seed, 'objective': cfg.objective.name,
      'objective_label': objective_label(cfg), 'steps': step,
      'tokens': tokens, 'flops': tokens * run['flops_per_token'],
      'parameters': run['parameters'], 'wall_seconds': wall,
      'final': {k: v for k, v in final.items() if k.startswith('eval_')},
      'curve': [{k: r[k] for k in ('step',) + curve_keys if k in r}
                for r in records]}


def architecture_key(workdir: str) -> str:
  """What random weights depend on: the encoder's shape and the tokenizer
  (arms with equal keys share one scratch control)."""
  pretrained = finetune.load_pretrained(workdir)
  return model_key(pretrained.model, pretrained.tokenizer.model_proto)


# The encoder's fields when the key was first written. A field added since
# enters the key only where it differs from its default, so that runs of a
# comparison that spans code versions keep their key, and their control,
# when the new field changes nothing for them.
_KEYED_MODEL_FIELDS = frozenset((
    'vocab_size', 'real_vocab_size', 'hidden_size', 'num_layers',
    'num_heads', 'intermediate_size', 'max_position_embeddings',
    'type_vocab_size', 'task_type_vocab_size', 'embedding_size',
    'num_layer_groups', 'sbo_positions', 'sbo_position_width',
    'with_pooler_nsp', 'hidden_dropout_rate', 'attention_dropout_rate',
    'layer_norm_epsilon', 'initializer_range', 'gelu_approximate', 'dtype',
    'param_dtype', 'remat', 'scan_layers', 'attend_across_documents',
    'attention_impl', 'pad_row_trains', 'adapter_size'))


def model_key(model, tokenizer_proto: bytes) -> str:
  """``architecture_key`` of an encoder config (a ``BertConfig``) and a
  serialized tokenizer model."""
  tokenizer = hashlib.sha256(tokenizer_proto).hexdigest()
  defaults = {f.name: f.default for f in dataclasses.fields(model)}
  keyed = {k: v for k, v in dataclasses.asdict(model).items()
           if k in _KEYED_MODEL_FIELDS or v != defaults[k]}
  return _row_key(repr(sorted(keyed.items())), tokenizer)[:12]


# ---------------------------------------------------------------------------
# Running: seed-major, so every finished seed covers every arm.


def _pretrain(arm: Arm, cfg, workdir: str, rows: Rows, budget: str,
              seed: int) -> dict:
  """The arm's pretraining at one budget and seed: its row, training
  (or resuming) only if the row is not there yet."""
  key = _pretrain_key(arm, cfg)
  if (found := rows.find(key)) is not None:
    return found
  if arm.workdir:
    run = read_run(arm.workdir)
    wall = None
  else:
    print(f'== {arm.name} seed {seed} {budget}: {cfg.total_steps} steps in '
          f'{workdir}', flush=True)
    _claim(workdir, key)
    _, wall = _timed(workdir, train.train_and_evaluate, cfg, workdir)
    run = read_run(workdir)
  row = pretrain_row(arm, budget, seed, key, run, wall)
  row['architecture'] = architecture_key(workdir)
  return rows.add(row)


def _pretrain_key(arm: Arm, cfg) -> str:
  """The row key of the arm's pretraining under ``cfg`` (a finished
  workdir's saved config, for a workdir arm)."""
  if arm.workdir:
    return _row_key('pretrain', arm.name, arm.workdir, settings_key(cfg))
  return _row_key('pretrain', arm.name, settings_key(cfg))


def _ensure_trained(arm: Arm, cfg, workdir: str, key: str) -> None:
  """The arm's encoder in ``workdir`` for fine-tuning: a row found without
  its workdir (another machine) trains again; the run is deterministic,
  so it is the same encoder."""
  if arm.workdir:
    return
  _claim(workdir, key)
  train.train_unless_finished(cfg, workdir)


def _claim(workdir: str, key: str) -> None:
  """Marks ``workdir`` as the run of row ``key``, or fails if it is
  another's: a workdir's path names the arm, budget and seed but not the
  settings, and a run of other settings there would otherwise be resumed
  (or, finished, reported) as this one. A workdir from before the mark
  is taken as it is."""
  path = os.path.join(workdir, CLAIM)
  if storage.isfile(path):
    theirs = storage.read_text(path).strip()
    if theirs != key:
      raise CompareError(
          f'{workdir} holds the run of other settings (row key {theirs}; '
          f'this plan\'s is {key}): the arm\'s config, a --set or the '
          'fine-tuning settings changed since it ran. Use a new --out, or '
          'move that directory away to run it again.')
    return
  storage.makedirs(workdir)
  storage.write_text(path, key + '\n')


def _timed(workdir: str, fn, *args) -> tuple[object, float]:
  """``fn(*args)``, and the wall seconds of the run in ``workdir`` over
  every invocation: this one's added to the earlier ones' (kept in
  ``WALL``, also when ``fn`` raises, as pretraining does on a preemption
  notice; a run killed outright, or a fine-tuning, which takes no
  notice, loses that invocation's time)."""
  path = os.path.join(workdir, WALL)
  earlier = float(storage.read_text(path)) if storage.isfile(path) else 0.0
  start = time.time()
  try:
    result = fn(*args)
  finally:
    total = earlier + time.time() - start
    storage.write_text(path, f'{total!r}\n')
  return result, total


def _finetune(ft_cfg, init: str, workdir: str, rows: Rows, key: str,
              row: dict) -> dict:
  found = rows.find(key)
  if found is not None:
    return found
  print(f'== {row["arm"]} seed {row["seed"]}'
        + (f' repeat {row["repeat"]}' if row.get('repeat') else '')
        + ': fine-tuning at lr '
        f'{row["lr"]:g} ({ft_cfg.init_weights} weights) in {workdir}',
        flush=True)
  _claim(workdir, key)
  cfg = ft_cfg.copy_and_resolve_references()
  cfg.init = init
  result, wall = _timed(workdir, finetune.finetune, cfg, workdir)
  row.update(key=key, wall_seconds=wall,
             **{k: result[k] for k in ('task', 'headline', 'metrics', 'steps')},
             **{k: result[k] for k in ('dev_metrics', 'eval_predictions',
                                       'eval_labels') if k in result})
  return rows.add(row)


def _walk(plan: Plan):
  """Every pretraining of the plan, in order: (seed, the fine-tuning
  config at that seed or None, budget kind, amount, arm, the arm's config:
  a finished workdir's as it trained)."""
  for seed in plan.seeds:
    ft = None
    if plan.finetune is not None:
      ft = plan.finetune.copy_and_resolve_references()
      ft.seed = seed
    for kind, amount in plan.budgets:
      for arm in plan.arms:
        cfg = (saved_config(arm.workdir) if arm.workdir else
               arm_config(arm, plan.overrides, seed, kind, amount))
        yield seed, ft, kind, amount, arm, cfg


def _repeats(plan: Plan, ft):
  """(repeat, its fine-tuning config) of the control at ``ft.seed``."""
  for repeat in range(plan.control_repeats):
    rep_ft = ft.copy_and_resolve_references()
    rep_ft.seed = control_seed(ft.seed, repeat)
    yield repeat, rep_ft


def run_plan(plan: Plan, out: str, rows: Rows) -> None:
  """Trains and fine-tunes whatever has no row yet."""
  scratch_done = set()
  for seed, ft, kind, amount, arm, cfg in _walk(plan):
    budget = budget_label(kind, amount)
    workdir = arm.workdir or os.path.join(out, 'runs', arm.directory,
                                          budget, f'seed{seed}')
    pre = _pretrain(arm, cfg, workdir, rows, budget, seed)
    if ft is None:
      continue
    todo = [lr for lr in plan.lrs if rows.find(
        _finetune_key(ft, lr, pre['key'])) is None]
    arch = pre['architecture']
    if todo:
      _ensure_trained(arm, cfg, workdir, pre['key'])
    for lr in todo:
      _finetune(_with_lr(ft, lr, 'pretrained'), workdir,
                os.path.join(out, 'finetune', arm.directory, budget,
                             f'seed{seed}', f'lr{lr:g}'),
                rows, _finetune_key(ft, lr, pre['key']),
                {'kind': 'finetune', 'arm': arm.name, 'budget': budget,
                 'seed': seed, 'lr': lr, 'pretrain_key': pre['key'],
                 'init_weights': 'pretrained', 'architecture': arch})
    if (arch, seed) in scratch_done:
      continue
    scratch_done.add((arch, seed))
    _control(plan, ft, arm, cfg, workdir, pre['key'], arch, out, rows)


def _control(plan: Plan, ft, arm: Arm, cfg, workdir: str,
             pretrain_key: str, arch: str, out: str, rows: Rows) -> None:
  """The control's fine-tunes of one architecture at one seed (``ft.seed``):
  each rate, each repeat; the encoder in ``workdir`` gives the shapes."""
  seed = ft.seed
  for repeat, rep_ft in _repeats(plan, ft):
    where = f'seed{seed}' + (f'-repeat{repeat}' if repeat else '')
    for lr in plan.lrs:
      key = _control_key(rep_ft, lr, arch)
      if rows.find(key) is not None:
        continue
      _ensure_trained(arm, cfg, workdir, pretrain_key)
      _finetune(_with_lr(rep_ft, lr, 'random'), workdir,
                os.path.join(out, 'finetune', f'{SCRATCH}-{arch}', where,
                             f'lr{lr:g}'),
                rows, key,
                {'kind': 'finetune', 'arm': SCRATCH, 'budget': '',
                 'seed': seed, 'repeat': repeat, 'lr': lr,
                 'init_weights': 'random', 'architecture': arch})


def _with_lr(ft_cfg, lr: float, init_weights: str):
  cfg = ft_cfg.copy_and_resolve_references()
  cfg.optimizer.learning_rate = lr
  cfg.init_weights = init_weights
  return cfg


def _finetune_key(ft_cfg, lr: float, pretrain_key: str) -> str:
  return _row_key('finetune', pretrain_key,
                  settings_key(_with_lr(ft_cfg, lr, 'pretrained')))


def _control_key(rep_ft, lr: float, arch: str) -> str:
  return _row_key('scratch', arch,
                  settings_key(_with_lr(rep_ft, lr, 'random')))


def plan_rows(plan: Plan, rows: list[dict]) -> list[dict]:
  """The rows this plan computes, by their keys: a row of other settings
  (an earlier grid, another --set, a changed preset) is left out of the
  report. A control's keys need its architecture, from the pretraining
  rows."""
  by_key = {r['key']: r for r in rows}
  keys = set()
  for _, ft, _, _, arm, cfg in _walk(plan):
    key = _pretrain_key(arm, cfg)
    keys.add(key)
    if ft is None:
      continue
    keys.update(_finetune_key(ft, lr, key) for lr in plan.lrs)
    if key in by_key:
      arch = by_key[key]['architecture']
      keys.update(_control_key(rep_ft, lr, arch) for _, rep_ft in
                  _repeats(plan, ft) for lr in plan.lrs)
  return [r for r in rows if r['key'] in keys]


# ---------------------------------------------------------------------------
# Summaries: choose each arm's rate on dev, intervals on held-out.


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


def mean_pm(values) -> str:
  """``mean ± half-width`` (95%, Student t over seeds); the mean alone for
  one value."""
  values = [v for v in values if v is not None]
  if not values:
    return '-'
  iv = intervals.seed_interval(values)
  if len(values) < 2:
    return _fmt(iv.estimate)
  return f'{iv.estimate:.4f} ± {(iv.high - iv.low) / 2:.4f}'


def interval_text(iv: intervals.Interval, signed: bool = False) -> str:
  """``mean [low, high]``, bold where a difference excludes 0 over two or
  more seeds (over one seed's examples it says nothing of the seed spread,
  so it is no claim); the mean alone where there is no interval (one
  seed, no per-example scores)."""
  sign = '+' if signed else ''
  if math.isnan(iv.low):
    return f'{iv.estimate:{sign}.4f}'
  text = (f'{iv.estimate:{sign}.4f} [{iv.low:{sign}.4f}, '
          f'{iv.high:{sign}.4f}]')
  claim = signed and iv.is_claim
  return f'**{text}**' if claim else text


@dataclasses.dataclass
class Group:
  """One arm at one budget (or the control of one architecture): its
  fine-tuning rows by learning rate and seed, and the chosen rate."""
  arm: str
  budget: str
  architecture: str
  by_lr: dict            # lr -> {seed: row}
  chosen_lr: float = 0.0

  def chosen(self) -> dict:   # seed -> row at the chosen rate
    return self.by_lr[self.chosen_lr]


def _dev_score(row: dict) -> float | None:
  """The row's dev headline; None for a row fine-tuned without a dev
  split (one rate: nothing to choose)."""
  dev = row.get('dev_metrics')
  return None if dev is None else dev[row['headline']]


def downstream_groups(rows: list[dict], control_repeats: int = 1
                      ) -> list[Group]:
  """Fine-tuning rows grouped per (arm, budget, architecture), each with
  its rate chosen by the best mean dev headline over the seeds that every
  rate has (the held-out set is never read to choose). A control seed
  counts once all its ``control_repeats`` are in, as their mean
  (``merge_repeats``)."""
  groups: dict = {}
  repeats: dict = {}
  for row in rows:
    if row['kind'] != 'finetune':
      continue
    key = (row['arm'], row['budget'], row['architecture'])
    group = groups.setdefault(key, Group(*key, by_lr={}))
    repeat = row.get('repeat', 0)
    if repeat == 0:
      group.by_lr.setdefault(row['lr'], {})[row['seed']] = row
    if row['arm'] == SCRATCH and control_repeats > 1 and (
        repeat < control_repeats):
      repeats.setdefault((key, row['lr'], row['seed']), {})[repeat] = row
  if control_repeats > 1:
    for (key, lr, seed), found in repeats.items():
      by_seed = groups[key].by_lr.setdefault(lr, {})
      if len(found) == control_repeats:
        by_seed[seed] = merge_repeats([found[k] for k in sorted(found)])
      else:   # Not all in yet: the seed waits.
        by_seed.pop(seed, None)
    for group in groups.values():
      group.by_lr = {lr: s for lr, s in group.by_lr.items() if s}
    groups = {k: g for k, g in groups.items() if g.by_lr}
  for group in groups.values():
    if len(group.by_lr) == 1:
      (group.chosen_lr,) = group.by_lr
      continue
    if any(
        _dev_score(r) is None for s in group.by_lr.values()
        for r in s.values()):
      raise CompareError(
          f'{group.arm}: fine-tuning rows at {len(group.by_lr)} rates, some '
          'without a dev split: the rate would be chosen on held-out '
          'scores. Fine-tune a grid with --dev_fraction in (0, 1).')
    common = set.intersection(*(set(s) for s in group.by_lr.values()))
    group.chosen_lr = max(
        sorted(group.by_lr),
        key=lambda lr, g=group, c=common: np.mean(
            [_dev_score(g.by_lr[lr][s]) for s in sorted(c)]) if c else -1)
  return list(groups.values())


def seed_ids(seeds) -> str:
  """The seeds (keys of ``{seed: row}``, or a set), for a ``seeds`` cell."""
  return ', '.join(map(str, sorted(seeds)))


def merge_repeats(rows: list[dict]) -> dict:
  """One row for a control seed's repeats: every metric their mean, and
  per held-out example the fraction of them that were right
  (``eval_correct``), which the crossed interval takes as that seed's
  score on the example."""
  merged = dict(rows[0], repeats=len(rows))
  for field in ('metrics', 'dev_metrics'):
    if all(field in r for r in rows):
      merged[field] = {m: float(np.mean([r[field][m] for r in rows]))
                       for m in rows[0][field]}
  if all('eval_predictions' in r for r in rows):
    merged['eval_correct'] = np.mean([_correct(r) for r in rows], axis=0)
  else:   # Repeat 0's predictions alone would stand for all the repeats.
    for field in ('eval_predictions', 'eval_labels'):
      merged.pop(field, None)
  merged['wall_seconds'] = sum(r.get('wall_seconds') or 0 for r in rows)
  return merged


def _correct(row: dict) -> np.ndarray:
  """[examples] 1.0 where the row's held-out prediction is right (a merged
  control row: the fraction of its repeats that were)."""
  if 'eval_correct' in row:
    return np.asarray(row['eval_correct'], np.float64)
  return (np.asarray(row['eval_predictions'])
          == np.asarray(row['eval_labels'])).astype(np.float64)


def headline_interval(a: dict, b: dict | None = None
                      ) -> intervals.Interval | None:
  """Arm A's held-out headline (minus B's, paired by seed and example) with
  its 95% interval, over seeds and examples where every row has
  per-example predictions: accuracy as crossed seeds x examples, another
  metric (F1, Matthews, Pearson) recomputed per bootstrap resample of the
  examples. Over seeds alone for token and span tasks (no per-example
  predictions) and a non-accuracy control averaged over repeats. ``a`` and
  ``b`` map seed -> row."""
  seeds = sorted(set(a) & set(b)) if b is not None else sorted(a)
  if not seeds:
    return None
  headline = a[seeds[0]]['headline']
  arms = [a] if b is None else [a, b]
  rows = [arm[s] for arm in arms for s in seeds]
  if all('eval_predictions' in r for r in rows):
    labels = rows[0]['eval_labels']
    if any(r['eval_labels'] != labels for r in rows):
      raise ValueError('rows paired by example hold different held-out '
                       'labels (another eval set or order): their '
                       'predictions cannot be paired.')
    if headline == 'accuracy':
      return intervals.hierarchical_interval(
          *[np.stack([_correct(arm[s]) for s in seeds]) for arm in arms])
    if not any(r.get('repeats', 1) > 1 for r in rows):
      return intervals.hierarchical_interval(
          *[np.stack([arm[s]['eval_predictions'] for s in seeds])
            for arm in arms], labels=np.asarray(labels),
          metric=downstream.per_seed(headline))
  values = [a[s]['metrics'][headline] - (0 if b is None else
                                         b[s]['metrics'][headline])
            for s in seeds]
  if len(values) < 2 or np.ptp(values) == 0:
    # One seed, or seeds alike to the last digit (a metric over a finite
    # eval set takes few values): no spread measured, so no interval.
    return intervals.Interval(float(np.mean(values)), math.nan, math.nan,
                              len(values))
  return intervals.seed_interval(values)


def pretrain_groups(rows: list[dict]) -> dict:
  """(arm, budget) -> {seed: pretraining row}."""
  groups: dict = {}
  for row in rows:
    if row['kind'] == 'pretrain':
      groups.setdefault((row['arm'], row['budget']), {})[row['seed']] = row
  return groups


def _budget_order(budget: str) -> float:
  """``steps1200`` -> 1200.0 (the control's '' -> 0)."""
  return float(budget.lstrip('abcdefghijklmnopqrstuvwxyz') or 0)


def report(plan: Plan, rows: list[dict], command: str,
           wall_seconds: float) -> str:
  """The markdown report of everything ``rows`` holds for ``plan``."""
  arms = [a.name for a in plan.arms]
  budgets = [budget_label(*b) for b in plan.budgets]
  pre = pretrain_groups(rows)
  total = sum(r.get('wall_seconds') or 0 for r in rows)
  done = sorted({r['seed'] for r in rows})
  lines = [
      '# Objective comparison', '',
      '```bash', command, '```', '',
      f'Seeds: {", ".join(map(str, plan.seeds))} (N = {len(plan.seeds)}; '
      'each the pretraining and the fine-tuning seed)'
      + ('' if done == plan.seeds else
         f'; in the rows so far: {", ".join(map(str, done)) or "none"} '
         '(the `seeds` columns say which each row rests on)')
      + '. Intervals are 95%: '
      'pretraining metrics over seeds (Student t); downstream over seeds '
      'and held-out examples (bertjax/intervals.py; over seeds alone for '
      'token and span tasks, and for a non-accuracy control\'s averaged '
      'repeats). A difference is '
      'marked in bold where its interval excludes 0 over two or more seeds '
      '(over one seed\'s examples it says nothing of the seed-to-seed '
      'spread); one whose interval holds 0 is no difference.', '',
      f'Wall time: {total / 60:.1f} min for every run in the rows '
      f'(pretraining and fine-tuning); this invocation {wall_seconds / 60:.1f}'
      ' min.', '', '## Pretraining (held-out)', '']
  head = ['arm', 'budget', 'objective', 'seeds', 'params', 'steps',
          'tokens', 'train FLOPs', 'wall s'] + [c for c, _, _ in COLUMNS] + [
              'tasks acc.']
  lines += ['| ' + ' | '.join(head) + ' |',
            '|' + ' --- |' * len(head)]
  for budget in budgets:
    for arm in arms:
      by_seed = pre.get((arm, budget))
      if not by_seed:
        continue
      first = next(iter(by_seed.values()))
      cells = [arm, budget, first['objective_label'], seed_ids(by_seed),
               _human(first['parameters']) if first['parameters'] else '-',
               str(first['steps']), _human(first['tokens']),
               _human(first['flops']),
               _fmt(np.mean([r['wall_seconds'] for r in by_seed.values()
                             if r['wall_seconds'] is not None] or [math.nan]),
                    0)]
      for _, metric, only in COLUMNS:
        same = only is None or first['objective'] in only
        cells.append(mean_pm([r['final'].get(metric)
                              for r in by_seed.values()]) if same else '-')
      cells.append(_task_accuracies(by_seed.values()))
      lines.append('| ' + ' | '.join(cells) + ' |')
  lines += _pretrain_differences(plan, pre)
  groups = downstream_groups(rows, plan.control_repeats)
  if groups:
    lines += _downstream_section(plan, groups, arms, budgets)
  return '\n'.join(lines) + '\n'


def _task_accuracies(rows) -> str:
  """The held-out accuracy of each task beyond masking the rows trained
  (data_pipelines/tasks/), ``name mean ± half-width``; '-' for none."""
  rows = list(rows)
  cells = []
  for name in tasks_lib.names():
    values = [r['final'].get(f'eval_{name}_accuracy') for r in rows]
    if any(v is not None for v in values):
      cells.append(f'{name} {mean_pm(values)}')
  return '; '.join(cells) or '-'


def _held_out_sections(plan: Plan, arm: Arm, kind: str, amount: float):
  """``held_out_sections`` of the arm's config at one budget (a finished
  workdir's as it trained)."""
  return held_out_sections(
      saved_config(arm.workdir) if arm.workdir else
      arm_config(arm, plan.overrides, plan.seeds[0], kind, amount))


def _pretrain_differences(plan: Plan, pre: dict) -> list[str]:
  """Each arm's held-out MLM loss minus the baseline's, paired by seed,
  with its 95% interval over the seeds both have; only between arms whose
  MLM loss is the encoder's own (``COLUMNS``: not ELECTRA's generator's)
  and whose held-out batches are the baseline's (the same data, masking
  and corruption: at one seed, the same inputs and masks). The others are
  named, with what differs: their losses are over other tokens."""
  _, metric, objectives = COLUMNS[0]
  lines, apart = [], {}

  def measured(row) -> bool:
    return (row['objective'] in objectives and
            row['final'].get(metric) is not None)

  by_name = {a.name: a for a in plan.arms}
  for kind, amount in plan.budgets:
    budget = budget_label(kind, amount)
    base = pre.get((plan.baseline, budget), {})
    base_sections = None
    for arm in (a.name for a in plan.arms if a.name != plan.baseline):
      ours = pre.get((arm, budget), {})
      seeds = sorted(s for s in set(ours) & set(base)
                     if measured(ours[s]) and measured(base[s]))
      if not seeds:
        continue
      if base_sections is None:
        base_sections = _held_out_sections(
            plan, by_name[plan.baseline], kind, amount)
      sections = _held_out_sections(plan, by_name[arm], kind, amount)
      differ = sorted(n for n in set(sections) | set(base_sections)
                      if sections.get(n) != base_sections.get(n))
      if differ:
        apart.setdefault(arm, differ)
        continue
      iv = intervals.seed_interval([ours[s]['final'][metric] -
                                    base[s]['final'][metric] for s in seeds])
      lines.append(f'| {arm} | {budget} | {", ".join(map(str, seeds))} | '
                   f'{interval_text(iv, signed=True)} |')
  out = []
  if lines:
    out += ['', f'Held-out MLM loss minus `{plan.baseline}`\'s, paired by '
            'seed (95% interval over seeds; bold where it excludes 0):', '',
            '| arm | budget | seeds | difference |',
            '| --- | --- | --- | --- |'] + lines
  if apart:
    out += ['', f'Not compared with `{plan.baseline}`\'s MLM loss, since '
            'their held-out batches are other inputs or masks (the config '
            'sections that differ): ' + '; '.join(
                f'{arm} ({", ".join(differ)})'
                for arm, differ in apart.items())
            + '.']
  return out


def _downstream_section(plan: Plan, groups: list[Group], arms, budgets
                        ) -> list[str]:
  scratch = {g.architecture: g for g in groups if g.arm == SCRATCH}
  by_arm = {(g.arm, g.budget): g for g in groups if g.arm != SCRATCH}
  some = next(iter(groups)).chosen()
  first = next(iter(some.values()))
  task, headline = first['task'], first['headline']
  lines = ['', f'## Downstream: {task}, held-out {headline}', '',
           f'Fine-tuning learning rate chosen per arm from '
           f'{{{", ".join(f"{lr:g}" for lr in plan.lrs)}}} by the mean dev '
           f'{headline} ({plan.finetune.task.dev_fraction:g} of the training '
           'examples, drawn from the seed); held-out scores at that rate. '
           f'`{SCRATCH}` is the same fine-tuning from random weights of the '
           f'architecture; Δ are paired by seed.'
           + (f' Each control seed is the mean of {plan.control_repeats} '
              'fine-tunes (seeds s + '
              f'{REPEAT_SEED_STRIDE} k), example by example; its `seeds` '
              'cell says seeds × fine-tunes.'
              if plan.control_repeats > 1 else '')
           + (' A row of one seed has an interval over the held-out examples '
              'only: it says nothing of the seed-to-seed spread.'
              if any(len(g.chosen()) < 2 for g in groups) else ''), '']
  head = ['arm', 'budget', 'seeds', 'lr', f'dev {headline}',
          f'held-out {headline} [95%]', f'Δ vs {SCRATCH} [95%]',
          f'Δ vs {plan.baseline} [95%]']
  other = [m for m in first['metrics'] if m != headline]
  head += [f'held-out {m}' for m in other]
  lines += ['| ' + ' | '.join(head) + ' |', '|' + ' --- |' * len(head)]

  def row_cells(name, budget, group, control, baseline):
    chosen = group.chosen()
    own = headline_interval(chosen)
    seeds = seed_ids(chosen) + (f' × {plan.control_repeats}'
                                if group.arm == SCRATCH
                                and plan.control_repeats > 1 else '')
    cells = [name, budget or '-', seeds, f'{group.chosen_lr:g}',
             mean_pm([_dev_score(r) for r in chosen.values()]),
             interval_text(own) if own else '-']
    for ref in (control, baseline):
      theirs = ref.chosen() if ref is not None and ref is not group else None
      cells.append(_difference_cell(chosen, theirs))
    cells += [mean_pm([r['metrics'][m] for r in chosen.values()])
              for m in other]
    return cells

  for arch, group in sorted(scratch.items()):
    label = SCRATCH if len(scratch) == 1 else f'{SCRATCH} ({arch})'
    lines.append('| ' + ' | '.join(row_cells(label, '', group, None, None))
                 + ' |')
  for budget in budgets:
    base = by_arm.get((plan.baseline, budget))
    for arm in arms:
      group = by_arm.get((arm, budget))
      if group:
        lines.append('| ' + ' | '.join(row_cells(
            arm, budget, group, scratch.get(group.architecture), base))
                     + ' |')
  if len(scratch) > 1:
    lines += ['', 'Architectures (scratch controls): ' + '; '.join(
        f'{arch}: ' + ', '.join(sorted({g.arm for g in by_arm.values()
                                        if g.architecture == arch}))
        for arch in sorted(scratch))]
  lines += ['', '### The learning-rate grid', '',
            'Means over each rate\'s seeds; an arm\'s rate is chosen on '
            'the seeds every one of its rates has. Δ vs '
            f'{plan.baseline} pairs the two at the same rate, by seed: a '
            'difference found at the chosen rates but not at each rate of '
            'the grid may be the rate choice\'s, not the objective\'s.',
            '', '| arm | budget | lr | seeds | dev (mean) | held-out (mean) '
            f'| Δ vs {plan.baseline} at this rate [95%] |',
            '| --- | --- | --- | --- | --- | --- | --- |']
  for group in sorted(groups, key=lambda g: (g.arm != SCRATCH, g.arm,
                                             _budget_order(g.budget or '0'))):
    name = (f'{SCRATCH} ({group.architecture})'
            if group.arm == SCRATCH and len(scratch) > 1 else group.arm)
    base = by_arm.get((plan.baseline, group.budget))
    for lr, by_seed in sorted(group.by_lr.items()):
      mark = ' (chosen)' if lr == group.chosen_lr else ''
      theirs = (base.by_lr.get(lr) if base is not None and base is not group
                and group.arm != SCRATCH else None)
      dev = [_dev_score(r) for r in by_seed.values()]
      dev_mean = '-' if None in dev else f'{np.mean(dev):.4f}'
      lines.append(
          f'| {name} | {group.budget or "-"} | {lr:g}{mark} | '
          f'{seed_ids(by_seed)} | {dev_mean} | '
          f'{np.mean([r["metrics"][headline] for r in by_seed.values()]):.4f}'
          f' | {_difference_cell(by_seed, theirs)} |')
  return lines


def _difference_cell(mine: dict, theirs: dict | None) -> str:
  """A Δ cell: ``mine`` minus ``theirs`` (seed -> row) with its interval,
  '-' where there is nothing to pair. A difference rests on the seeds both
  sides have: named where they are not all of either side's."""
  iv = headline_interval(mine, theirs) if theirs else None
  if iv is None:
    return '-'
  both = set(mine) & set(theirs)
  return interval_text(iv, signed=True) + (
      f' (seed{"s" if len(both) > 1 else ""} {seed_ids(both)})'
      if both != set(mine) or both != set(theirs) else '')


# ---------------------------------------------------------------------------
# Plots.


def _band(ax, x, low, high, color):
  if len(x) == 1:   # A band at one budget has no width: a bar instead.
    ax.vlines(x, low, high, color=color, alpha=0.5, linewidth=4)
  else:
    ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)


def plots(plan: Plan, rows: list[dict], out: str) -> list[str]:
  """Writes the PNGs; returns their paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  paths = []

  def save(fig, name):
    fig.tight_layout()
    path = os.path.join(out, name)
    buffer = io.BytesIO()
    fig.savefig(buffer, format='png', dpi=110)
    storage.write_bytes(path, buffer.getvalue())
    plt.close(fig)
    paths.append(path)

  present = sorted({r['seed'] for r in rows})
  seeds_note = (f'seed{"s" if len(present) > 1 else ""} '
                f'{", ".join(map(str, present))}, 95% bands')
  pre = pretrain_groups(rows)
  top = budget_label(*plan.budgets[-1])
  for axis in ('steps', 'flops'):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in plan.arms:
      by_seed = pre.get((arm.name, top), {})
      curves = [r['curve'] for r in by_seed.values()
                if r['objective'] != 'electra']
      if not curves:
        continue
      per_flop = (next(iter(by_seed.values()))['flops']
                  / max(next(iter(by_seed.values()))['steps'], 1))
      for metric, style in (('mlm_loss', '-'), ('eval_mlm_loss', 'o--')):
        steps, mean, low, high = _curve_stats(curves, metric)
        if not steps:
          continue
        x = np.array(steps) * (1 if axis == 'steps' else per_flop)
        kind = 'train' if metric == 'mlm_loss' else 'held-out'
        line, = ax.plot(x, mean, style, label=f'{arm.name} ({kind})')
        _band(ax, x, low, high, line.get_color())
    ax.set_xlabel('training step' if axis == 'steps' else
                  'training FLOPs (analytic, at the full sequence length)')
    if axis == 'flops':
      ax.set_xscale('log')
    ax.set_ylabel('MLM loss')
    ax.set_title(f'Masked-LM loss, {top} ({seeds_note})')
    ax.legend(fontsize=7)
    save(fig, f'loss_vs_{axis}.png')
  metrics = [m for m in OBJECTIVE_METRICS if any(
      m in point for r in rows if r['kind'] == 'pretrain'
      for point in r['curve'])]
  if metrics:
    fig, axes = plt.subplots(1, len(metrics),
                             figsize=(4.2 * len(metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
      for arm in plan.arms:
        curves = [r['curve'] for r in pre.get((arm.name, top), {}).values()]
        steps, mean, low, high = _curve_stats(curves, metric)
        if steps:
          line, = ax.plot(steps, mean, label=arm.name)
          _band(ax, steps, low, high, line.get_color())
      ax.set_title(metric)
      ax.set_xlabel('training step')
      ax.legend(fontsize=7)
    save(fig, 'objectives.png')
  groups = downstream_groups(rows, plan.control_repeats)
  if groups:
    paths += _downstream_plots(plan, groups, pre, out, plt, save, seeds_note)
  return paths


def _curve_stats(curves: list[list[dict]], metric: str):
  """Steps every curve logged ``metric`` at, with the mean and a 95% band
  over the curves (seeds)."""
  points = [{p['step']: p[metric] for p in c if metric in p} for c in curves]
  steps = sorted(set.intersection(*(set(p) for p in points))) if points else []
  mean, low, high = [], [], []
  for step in steps:
    iv = intervals.seed_interval([p[step] for p in points])
    mean.append(iv.estimate)
    low.append(iv.low if len(points) > 1 else iv.estimate)
    high.append(iv.high if len(points) > 1 else iv.estimate)
  return steps, mean, low, high


def _downstream_plots(plan, groups, pre, out, plt, save, seeds_note):
  scratch = {g.architecture: g for g in groups if g.arm == SCRATCH}
  by_arm = {(g.arm, g.budget): g for g in groups if g.arm != SCRATCH}
  headline = next(iter(next(iter(groups)).chosen().values()))['headline']
  budgets = [budget_label(*b) for b in plan.budgets]
  fig_a, ax_a = plt.subplots(figsize=(7, 4.5))
  fig_d, ax_d = plt.subplots(figsize=(7, 4.5))
  for arm in plan.arms:
    points = [(budget, by_arm[(arm.name, budget)]) for budget in budgets
              if (arm.name, budget) in by_arm]
    if not points:
      continue
    flops = [np.mean([r['flops'] for r in pre[(arm.name, b)].values()])
             for b, _ in points]
    steps = [np.mean([r['steps'] for r in pre[(arm.name, b)].values()])
             for b, _ in points]
    own = [headline_interval(g.chosen()) for _, g in points]
    line, = ax_a.plot(flops, [iv.estimate for iv in own], 'o-',
                      label=arm.name)
    _band(ax_a, flops, [_low(iv) for iv in own], [_high(iv) for iv in own],
          line.get_color())
    diffs = [headline_interval(g.chosen(), scratch[g.architecture].chosen())
             for _, g in points if g.architecture in scratch]
    if diffs:
      line, = ax_d.plot(steps[:len(diffs)], [iv.estimate for iv in diffs],
                        'o-', label=arm.name)
      _band(ax_d, steps[:len(diffs)], [_low(iv) for iv in diffs],
            [_high(iv) for iv in diffs], line.get_color())
  for arch, group in sorted(scratch.items()):
    iv = headline_interval(group.chosen())
    label = SCRATCH if len(scratch) == 1 else f'{SCRATCH} ({arch})'
    ax_a.axhline(iv.estimate, color='gray', linestyle=':', label=label)
    ax_a.axhspan(_low(iv), _high(iv), color='gray', alpha=0.15)
  ax_a.set_xscale('log')
  ax_a.set_xlabel('pretraining FLOPs (analytic)')
  ax_a.set_ylabel(f'held-out {headline}')
  ax_a.set_title(f'Downstream {headline} after pretraining ({seeds_note})')
  ax_a.legend(fontsize=8)
  save(fig_a, 'downstream_vs_flops.png')
  ax_d.axhline(0.0, color='black', linewidth=0.8)
  ax_d.set_xscale('log')
  ax_d.set_xlabel('pretraining steps')
  ax_d.set_ylabel(f'pretrained - {SCRATCH}, held-out {headline}')
  ax_d.set_title(f'What pretraining buys downstream ({seeds_note})')
  ax_d.legend(fontsize=8)
  save(fig_d, 'difference_vs_steps.png')
  return []


def _low(iv):
  return iv.estimate if math.isnan(iv.low) else iv.low


def _high(iv):
  return iv.estimate if math.isnan(iv.high) else iv.high


# ---------------------------------------------------------------------------
# The comparison.


def compare(runs: list[str], overrides: list[str], budget: str, out: str,
            seed: int = 0, finetune_spec: str = DEFAULT_FINETUNE,
            finetune_overrides: tuple[str, ...] = (), seeds: int = 1,
            sweeps: tuple[str, ...] = (), finetune_lrs: str = '',
            dev_fraction: float = 0.2, baseline: str = '',
            results: str = '', command: str = '',
            report_only: bool = False, control_repeats: int = 1) -> str:
  """Runs what has no row yet (nothing with ``report_only``), then writes
  the report and plots to ``results`` (default ``out``); returns the
  markdown report."""
  start = time.time()
  plan = make_plan(runs, overrides, budget, seeds, seed, sweeps,
                   finetune_spec, finetune_overrides, finetune_lrs,
                   dev_fraction, baseline, control_repeats)
  results = results or out
  if not report_only:   # A report-only reader may have no runs at all.
    storage.makedirs(out)
  storage.makedirs(results)
  rows = Rows(os.path.join(results, ROWS))
  if not report_only:
    run_plan(plan, out, rows)
  wall = time.time() - start
  current = plan_rows(plan, rows.rows)
  if len(current) < len(rows.rows):
    print(f'compare: {len(rows.rows) - len(current)} of the '
          f'{len(rows.rows)} rows in {rows.path} are not this plan\'s '
          '(other settings); the report leaves them out', flush=True)
  markdown = report(plan, current, command or 'python experiments/'
                    'compare.py ...', wall)
  storage.write_text(os.path.join(results, 'compare.md'), markdown)
  plots(plan, current, results)
  print(f'compare: this invocation {wall / 60:.1f} min; the comparison\'s '
        f'runs {sum(r.get("wall_seconds") or 0 for r in rows.rows) / 60:.1f}'
        ' min in all', flush=True)
  return markdown


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--run', action='append', default=[],
                      help='NAME=path.py[:arg] or NAME=WORKDIR; repeat.')
  parser.add_argument('--set', action='append', default=[], dest='overrides',
                      help='field=value for every config run; repeat.')
  parser.add_argument('--budget', default='steps:300',
                      help='steps:N, tokens:N or flops:N; several as '
                      'steps:300,600 (default steps:300).')
  parser.add_argument('--out', required=True,
                      help='directory of the runs (workdirs).')
  parser.add_argument('--results', default='',
                      help='directory of rows.jsonl, compare.md and the '
                      'plots (default: --out).')
  parser.add_argument('--seed', type=int, default=0,
                      help='the first seed (default 0).')
  parser.add_argument('--seeds', type=int, default=1,
                      help='seeds per arm: seed, seed + 1, ...')
  parser.add_argument('--sweep', action='append', default=[],
                      help='FIELD=v1,v2,...: one arm per value (one or two '
                      'sweeps; two run their product).')
  parser.add_argument('--baseline', default='',
                      help='the arm every other is compared to (default: '
                      'the first).')
  parser.add_argument('--finetune', default=DEFAULT_FINETUNE,
                      help='fine-tuning config (path.py[:arg]) of the '
                      'downstream task; none to skip.')
  parser.add_argument('--finetune_set', action='append', default=[],
                      help='field=value for the fine-tuning config; repeat.')
  parser.add_argument('--finetune_lrs', default='',
                      help='learning-rate grid, e.g. 1e-4,3e-4,1e-3 '
                      '(default: the fine-tuning config\'s rate).')
  parser.add_argument('--dev_fraction', type=float, default=0.2,
                      help='with a grid: the training examples held out to '
                      'choose the rate (default 0.2).')
  parser.add_argument('--control_repeats', type=int, default=1,
                      help='fine-tunes of the control per seed, averaged '
                      '(default 1).')
  parser.add_argument('--report_only', action='store_true',
                      help='write the report and plots from the rows so far; '
                      'run nothing.')
  args = parser.parse_args(argv)
  # The command that computes the rows (--report_only computes nothing).
  command = 'python experiments/compare.py ' + ' '.join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
      if a != '--report_only')
  try:
    print(compare(args.run, args.overrides, args.budget, args.out,
                  args.seed, args.finetune, args.finetune_set, args.seeds,
                  args.sweep, args.finetune_lrs, args.dev_fraction,
                  args.baseline, args.results, command, args.report_only,
                  args.control_repeats))
  except CompareError as e:
    parser.error(str(e))
  except errors.UserError as e:   # An arm's config, data or workdir.
    parser.exit(2, f'compare: {e}\n')


if __name__ == '__main__':
  main()
