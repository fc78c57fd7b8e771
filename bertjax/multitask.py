r"""Multi-task fine-tuning: one encoder, a head per task, top to bottom.

  python experiments/multitask.py --config=experiments/configs/multitask.py \
      --config.init=runs/demo --workdir=runs/demo-multitask

``multitask(cfg, workdir)`` puts one head per task (``cfg.tasks``, any of
the fine-tuning harness's tasks and kinds) on one shared encoder, taken
from a pretrained run exactly as ``bertjax.finetune`` takes it, and trains
them together, as MT-DNN (Liu et al., 2019, Sec. 3.1) does: every step's
batch comes from ONE task, chosen by a seeded sampler, and updates the
shared encoder and that task's head.

Mixing rates (T5, Raffel et al., 2020, Sec. 3.5.2), with ``e_m`` the
number of training examples of task m:

- ``proportional``: ``r_m = min(e_m, K) / sum_n min(e_n, K)``; K is
  ``mixing_cap`` (0: no cap), which keeps a large task from drowning the
  others.
- ``temperature``: ``r_m`` proportional to ``min(e_m, K)^(1/T)``
  (``mixing_temperature`` = T > 0; the cap first, as T5 applies it):
  T = 1 is ``proportional``, a large T approaches uniform mixing.

The sampler (``TaskSampler``) realises the rates exactly, per block of
``mixing_block_steps`` steps (0: the whole run is one block): a block holds
``round(r_m * block)`` steps of task m (largest remainders, at least one
each: ``data_pipelines.mixture.block_slots``, as corpus mixtures do) in an
order permuted from (seed, block), MT-DNN's "merge the tasks' mini-batches
and shuffle" when the block is the run. A task's n-th step reads its n-th
batch, ``finetune.batch_rows(seed, n, ...)``: the batches a single-task
run with that seed reads, in the same order. So the task and the rows of
step s are a pure function of (seed, s), and resuming is starting from the
checkpoint's step: the run is bitwise that of an uninterrupted one.

The model (``MultitaskModel``): the encoder's parameters sit at
``finetune``'s names (``embeddings``, ``layer_{g}``) with one ``pooler``
shared by the sentence-level tasks (as MT-DNN shares BERT's pooler), and
each task's output layer under ``heads/{task}/classifier``; a task's view of
the parameters is exactly a ``heads.DownstreamModel``'s, which computes its
logits. A multi-task workdir is itself a valid ``init`` of
``finetune`` (its encoder and pooler, at its latest checkpoint), for
per-task fine-tuning after multi-task training (T5's Table 13, last rows).

One optimizer state over all parameters, one train step compiled per task.
A step updates only the leaves its task reads (the encoder, the pooler for
a sentence-level task, its own head): the other heads' parameters take no
step and their Adam moments are not advanced (``optax.tree_utils.
tree_map_params`` keeps their old state), the semantics of today's
PyTorch optimizers, which skip a parameter whose gradient is None (MT-DNN's
own code, on torch 1.1, zeroed gradients instead, so its BertAdam went on
moving an unsampled head by momentum and weight decay). Why not apply
the update to every leaf with zero gradients: decoupled weight decay
(``wd * param``) and the momentum of earlier steps would still move a head
whose task was not sampled, and its moments would decay towards zero while
other tasks train. Why not per-task optimizer masks (``optax.masked``):
the masked state would differ per task, where one shared state is what
resuming and checkpointing want. The learning-rate schedule and Adam's
step count follow the global step (a head's bias correction in ``adamw``
counts the steps of every task; BERT's AdamWeightDecay, the default, has
none).

Writes to ``workdir``: checkpoints (a rerun resumes), ``metrics.jsonl``,
``multitask_meta.json`` (what a resumed run must share, and the pretrained
run it started from) and ``multitask.json``: per task, the held-out
metrics (the first is its headline), its rate and steps, and for
classification and regression the per-example predictions, as
``downstream.json`` has them (for intervals over examples).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from typing import Callable, NamedTuple, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import finetune
from bertjax import optim
from bertjax import quantization
from bertjax import sharding
from bertjax import storage
from bertjax import train as train_lib
from bertjax.models import bert as bert_lib
from bertjax.models import heads
from bertjax.runtime import checkpoint as checkpoint_lib
from bertjax.runtime import metric_writers
from data_pipelines import downstream
from data_pipelines import mixture as mixture_lib
from data_pipelines import tokenizer as tokenizer_lib

MIXING = ('proportional', 'temperature')
RESULT = 'multitask.json'
META = finetune.MULTITASK_META
_say = train_lib.say  # Process 0 prints.
# Keys split once from the seed: finetune's (task 0's model is initialised
# exactly as a single-task run's; dropout follows the global step, so its
# masks differ once another task has stepped).
_INIT_KEY, _DROPOUT_KEY = finetune.INIT_KEY, finetune.DROPOUT_KEY
_MIX_KEY = 5              # The order of the tasks' steps in each block.
_SENTENCE_KINDS = ('classification', 'regression')
_INPUTS = ('input_ids', 'token_type_ids', 'attention_mask')
# Task names the harness loads without files (besides TFDS's).
_NAMED_TASKS = (downstream.EMBEDDED_NAME, downstream.EMBEDDED_TOP4_NAME,
                'files')
# finetune's fields that multi-task training has no use for: it trains
# every weight, its tasks are ``tasks``, and it evaluates at the end.
_NOT_SHARED = ('task', 'mode', 'adapter_size', 'adapter_layer_norms',
               'unfreeze_every_steps', 'eval_every_steps')
# The config sections a resumed multi-task run must share.
_IDENTITY = ('seed', 'init', 'init_step', 'init_weights', 'tasks', 'mixing',
             'mixing_cap', 'mixing_temperature', 'mixing_block_steps',
             'num_steps', 'num_epochs', 'max_seq_length', 'doc_stride',
             'max_query_length', 'batch_size',
             'pooling', 'head_init', 'model', 'optimizer', 'loss_reduction')


class MultitaskError(finetune.FinetuneError):
  """A config or source that multi-task training cannot use; the message
  says why."""


def task_config(name: str, **fields) -> ml_collections.ConfigDict:
  """A task's section: ``finetune``'s ``task`` fields (defaults there),
  ``name`` and ``fields`` set."""
  section = copy.deepcopy(finetune.base_config().task)
  section.name = name
  for key, value in fields.items():
    section[key] = value
  return section


def base_config() -> ml_collections.ConfigDict:
  """Every field: ``finetune.base_config()``'s (seed, init, lengths,
  pooling, batch, model, optimizer, sharding, logging and checkpoints)
  less those of one task and of its training modes, plus:

  ``tasks``: task key -> a task section (``task_config``); the key names
  the task's head and its results, the section is ``finetune``'s ``task``.
  A ConfigDict keyed by task rather than a list, so that any field of any
  task can be set on the command line (``--config.tasks.KEY.FIELD=...``)
  and the config serializes; tasks run in sorted key order.
  """
  c = finetune.base_config()
  for name in _NOT_SHARED:
    del c[name]
  c.tasks = ml_collections.ConfigDict()   # key -> task_config(...)
  c.mixing = 'proportional'       # MIXING
  c.mixing_cap = 0                # K in examples; 0 = no cap.
  c.mixing_temperature = 1.0      # T > 0, for mixing=temperature.
  c.mixing_block_steps = 0        # Steps whose task shares are exact; 0 =
                                  # the whole run.
  c.num_steps = 0                 # 0 = num_epochs over every task's rows.
  return c


def task_keys(cfg) -> list[str]:
  """The tasks' keys, in the order of their heads: sorted."""
  return sorted(cfg.tasks.keys())


def finetune_config(cfg, key: str) -> ml_collections.ConfigDict:
  """``finetune``'s config of task ``key``: its task section and the
  shared fields (for the harness's task loading, encoding and scoring)."""
  c = finetune.base_config()
  for name in c.keys():
    if name != 'task' and name in cfg:
      c[name] = copy.deepcopy(cfg[name])
  for field, value in cfg.tasks[key].items():
    c.task[field] = copy.deepcopy(value)
  return c


def _source(section) -> tuple[str, str]:
  """What a task section loads: two tasks with one source are one task."""
  return (section.name, section.train_path if section.name == 'files'
          else '')


def validate(cfg, check_init: bool = True) -> None:
  """Every check that reads no data, with the field and what to use
  (``check_init=False``: all but ``init``, for a run not trained yet)."""
  # Long: one check per field, each with its message; reads as a list.
  errors = []

  def check(ok: bool, message: str) -> None:
    if not ok:
      errors.append(message)

  # The shared fields: finetune's own checks, on a task that passes them.
  shared = finetune.base_config()
  for name in shared.keys():
    if name != 'task' and name in cfg:
      shared[name] = copy.deepcopy(cfg[name])
  try:
    finetune.validate(shared, check_init)
  except finetune.FinetuneError as e:
    errors.append(str(e).removeprefix('fine-tuning config: '))
  known = _NAMED_TASKS + downstream.TFDS_TASKS
  fields = set(finetune.base_config().task.keys())
  keys = task_keys(cfg)
  check(bool(keys), 'tasks is empty: give at least one task in the config '
        'file, cfg.tasks.KEY = multitask.task_config(NAME, ...) '
        '(experiments/configs/multitask.py has two).')
  seen = {}
  for key in keys:
    t = cfg.tasks[key]
    unknown = sorted(set(t.keys()) - fields)
    if unknown:
      errors.append(f'tasks.{key} has no field {unknown}; a task has '
                    f'finetune\'s task fields {sorted(fields)}.')
      continue
    check(t.name in known, f'tasks.{key}.name={t.name!r} is not a task; '
          f'use one of {known}.')
    check(t.name != 'files' or t.kind in heads.KINDS,
          f'tasks.{key}.kind={t.kind!r}; a files task needs one of '
          f'{heads.KINDS}.')
    check(t.name != 'files' or (t.train_path and t.eval_path),
          f'tasks.{key}: a files task needs train_path and eval_path.')
    check(0 <= t.dev_fraction < 1,
          f'tasks.{key}.dev_fraction={t.dev_fraction} must be in [0, 1).')
    check(t.examples_per_class >= 0,
          f'tasks.{key}.examples_per_class={t.examples_per_class} must be '
          '>= 0 (0 = all).')
    kind = t.kind if t.name == 'files' else downstream.tfds_kind(t.name)
    errors.extend(finetune.task_problems(t, kind, cfg.loss_reduction,
                                         f'tasks.{key}'))
    errors.extend(f'tasks.{key}: {problem}'
                  for problem in finetune.window_problems(cfg, kind))
    source = _source(t)
    check(source not in seen, f'tasks.{key} and tasks.{seen.get(source)} '
          f'are the same task (name={t.name!r}, train_path='
          f'{t.train_path!r}): each task has one head; drop one of them.')
    seen.setdefault(source, key)
  check(cfg.mixing in MIXING, f'mixing={cfg.mixing!r}; use one of {MIXING}.')
  check(cfg.mixing_cap >= 0, f'mixing_cap={cfg.mixing_cap} must be >= 0 '
        '(a number of examples K; 0 = no cap).')
  check(cfg.mixing_temperature > 0,
        f'mixing_temperature={cfg.mixing_temperature} must be > 0: 1 mixes '
        'in proportion to size, larger values towards uniform.')
  check(cfg.mixing_block_steps == 0 or cfg.mixing_block_steps >= len(keys),
        f'mixing_block_steps={cfg.mixing_block_steps} must hold a step of '
        f'each of the {len(keys)} tasks (or be 0: the whole run).')
  check(cfg.num_steps >= 0, f'num_steps={cfg.num_steps} must be >= 0 (0 = '
        'num_epochs over the tasks).')
  o = cfg.optimizer
  check(o.name in optim.OPTIMIZERS,
        f'optimizer.name={o.name!r}; use one of {optim.OPTIMIZERS}.')
  check(o.schedule in optim.SCHEDULES,
        f'optimizer.schedule={o.schedule!r}; use one of {optim.SCHEDULES}.')
  check(o.decay_mask in optim.DECAY_MASKS,
        f'optimizer.decay_mask={o.decay_mask!r}; use one of '
        f'{optim.DECAY_MASKS}.')
  if errors:
    raise MultitaskError('multi-task config: ' + ' '.join(errors))


# ---------------------------------------------------------------------------
# Mixing: rates, and the sampler that realises them.


def mixing_rates(sizes: Sequence[int], mixing: str, cap: int = 0,
                 temperature: float = 1.0) -> np.ndarray:
  """T5's mixing rates (Sec. 3.5.2) of tasks of ``sizes`` training rows.

  ``proportional``: ``r_m = min(e_m, K) / sum_n min(e_n, K)``;
  ``temperature``: ``r_m`` proportional to ``min(e_m, K)^(1 / T)``. ``cap``
  is K (0: none), ``temperature`` T (> 0; ignored by ``proportional``).

  Returns:
    float64 [tasks], summing to 1.
  """
  sizes = np.asarray(sizes, np.float64)
  if sizes.ndim != 1 or not sizes.size or np.any(sizes <= 0):
    raise ValueError(f'mixing needs tasks of > 0 examples; got {sizes}.')
  if mixing not in MIXING:
    raise ValueError(f'mixing={mixing!r}; use one of {MIXING}.')
  if temperature <= 0:
    raise ValueError(f'mixing_temperature={temperature} must be > 0.')
  capped = np.minimum(sizes, cap) if cap else sizes
  weights = capped if mixing == 'proportional' else capped**(1 / temperature)
  return weights / weights.sum()


class TaskSampler:
  """Which task each training step reads, and which of that task's batches:
  a pure function of (seed, step).

  Steps are cut into blocks of ``block_steps``; every block holds
  ``slots[m]`` steps of task m (``mixture.block_slots`` of the rates) in an
  order permuted from (seed, block). Step s is position r = s % B of block
  b = s // B: task m = ``label_b[r]``, and it is task m's step
  ``b * slots[m] + (positions before r in block b labelled m)``: each
  task's batches are read in order, none skipped.
  """

  def __init__(self, rates: Sequence[float], seed: int, block_steps: int):
    self.rates = np.asarray(rates, np.float64)
    self.block_steps = block_steps
    self.slots = mixture_lib.block_slots(self.rates, block_steps)
    self._seed = seed
    self._unshuffled = np.repeat(np.arange(len(self.rates)), self.slots)
    self._cached = (-1, None, None)

  def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(task, rank) of every position of ``block``: int [block_steps];
    rank = the positions before it with the same task. The last block is
    cached (steps are asked for in order)."""
    if self._cached[0] != block:
      rng = np.random.default_rng([self._seed, _MIX_KEY, block])
      labels = self._unshuffled[rng.permutation(self.block_steps)]
      ranks = np.empty(self.block_steps, np.int64)
      ranks[np.argsort(labels, kind='stable')] = np.concatenate(
          [np.arange(n) for n in self.slots])
      self._cached = (block, labels, ranks)
    return self._cached[1], self._cached[2]

  def locate(self, step: int) -> tuple[int, int]:
    """(task, that task's step) of training step ``step``."""
    block, position = divmod(step, self.block_steps)
    labels, ranks = self._block(block)
    task = int(labels[position])
    return task, int(block * self.slots[task] + ranks[position])

  def task_steps(self, num_steps: int) -> np.ndarray:
    """int64 [tasks]: the steps each task trains in steps [0, num_steps)."""
    full, rest = divmod(num_steps, self.block_steps)
    counts = full * self.slots
    if rest:
      labels, _ = self._block(full)
      counts = counts + np.bincount(labels[:rest], minlength=len(self.slots))
    return counts


# ---------------------------------------------------------------------------
# The model: one encoder, a head per task.


class HeadSpec(NamedTuple):
  """A task's head: its key (``heads/{key}``), kind and outputs."""
  key: str
  kind: str
  num_labels: int


def _init_head(module: heads.DownstreamModel, states, with_pooler: bool):
  """Calls ``module``'s head layers (and its pooler, for a sentence-level
  task ``with_pooler``) on ``states`` [B, D]: ``init`` with this method
  creates those parameters only."""
  if with_pooler and module.kind in _SENTENCE_KINDS and (
      module.pooling != 'first'):
    states = module.pooler(states)
  return module.classifier(states)


@dataclasses.dataclass(frozen=True)
class MultitaskModel:
  """A shared encoder and a head per task.

  Parameters: ``embeddings``, ``layer_{g}`` (finetune's and pretraining's
  names), ``pooler`` (shared by the sentence-level tasks; absent when
  there are none, or with ``pooling='first'``) and
  ``heads/{key}/classifier``. Task m's view (``task_params``) is a
  ``heads.DownstreamModel``'s parameters, and that model computes its
  logits (fake-quantized where ``cfg.quantize`` says, as fine-tuning's):
  the forward pass is the single-task harness's, to the bit.
  """
  cfg: bert_lib.BertConfig
  specs: tuple[HeadSpec, ...]
  pooling: str = 'cls'
  head_init: str = 'bert'

  def module(self, task: int) -> heads.DownstreamModel:
    spec = self.specs[task]
    return heads.DownstreamModel(self.cfg, spec.kind, spec.num_labels,
                                 pooling=self.pooling,
                                 head_init=self.head_init)

  def task_params(self, params: dict, task: int) -> dict:
    """Task ``task``'s view: a ``DownstreamModel``'s parameter tree."""
    view = {k: v for k, v in params.items() if k not in ('heads', 'pooler')}
    if self.specs[task].kind in _SENTENCE_KINDS and 'pooler' in params:
      view['pooler'] = params['pooler']   # Absent with pooling='first'.
    view.update(params['heads'][self.specs[task].key])
    return view

  def init(self, key: jax.Array, length: int) -> dict:
    """Boxed parameters: task 0's ``DownstreamModel`` initialised from
    ``key`` (as a single-task run of it), each other head (and the pooler,
    when task 0 has none) from ``fold_in(key, m)``."""
    dummy = jnp.zeros((1, length), jnp.int32)
    params = dict(self.module(0).init(key, dummy, dummy, dummy + 1)['params'])
    head_trees = {self.specs[0].key: {'classifier': params.pop('classifier')}}
    for m, spec in enumerate(self.specs[1:], 1):
      # Only the head's layers: Flax draws a layer's initial values from
      # its path, so they are what a whole model's init would give.
      tree = self.module(m).init(
          jax.random.fold_in(key, m), jnp.zeros((1, self.cfg.hidden_size)),
          'pooler' not in params, method=_init_head)['params']
      params.update({k: v for k, v in tree.items() if k == 'pooler'})
      head_trees[spec.key] = {'classifier': tree['classifier']}
    params['heads'] = head_trees
    return params

  def apply(self, params: dict, task: int, batch: dict,
            deterministic: bool = True, rngs=None) -> jax.Array:
    """Task ``task``'s logits (as ``DownstreamModel``'s) on ``batch``."""
    return quantization.quantized(self.module(task)).apply(
        {'params': self.task_params(params, task)}, batch['input_ids'],
        batch['token_type_ids'], batch['attention_mask'],
        deterministic=deterministic, rngs=rngs)

  def reads(self, params: dict, task: int) -> dict:
    """A tree of Python bools shaped as ``params``: True where task
    ``task``'s step reads the leaf (and so updates it)."""
    flat = flax.traverse_util.flatten_dict(params)
    used = set(flax.traverse_util.flatten_dict(self.task_params(
        params, task)))
    key = self.specs[task].key
    return flax.traverse_util.unflatten_dict({
        k: (k[0] != 'heads' and k in used) or k[:2] == ('heads', key)
        for k in flat})


# ---------------------------------------------------------------------------
# Steps: init, one train step and one predict per task.


class Steps(NamedTuple):
  """What multi-task training runs on the devices, before it is sharded
  and compiled: ``init_state()``, and per task ``train_steps[m](state,
  batch) -> (state, metrics)`` and ``predicts[m](params, batch) ->
  logits``."""
  init_state: Callable[[], train_lib.TrainState]
  train_steps: tuple[Callable, ...]
  predicts: tuple[Callable, ...]


def make_steps(cfg, model: MultitaskModel, total_steps: int) -> Steps:
  """``model``'s steps with ``cfg``'s optimizer over ``total_steps`` (its
  warmup a proportion of them); task m's step updates only what it reads
  (the module docstring says why)."""
  tx, schedule = finetune.make_optimizer(   # Fine-tuning's warmup.
      cfg, model.cfg, total_steps, finetune.warmup_steps(cfg, total_steps))
  root_key = jax.random.key(cfg.seed)
  dropout_root = jax.random.fold_in(root_key, _DROPOUT_KEY)

  def init_state():
    params = model.init(jax.random.fold_in(root_key, _INIT_KEY),
                        cfg.max_seq_length)
    return train_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=tx.init(params))

  def train_step(task, state, batch):
    key = jax.random.fold_in(dropout_root, state.step)

    def loss_fn(params):
      logits = model.apply(params, task, batch, deterministic=False,
                           rngs={'dropout': key})
      return finetune.task_loss(model.specs[task].kind, logits, batch,
                                cfg.loss_reduction)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    # What the task does not read keeps its value and its moments.
    updates, opt_state = optim.keep_unread(
        tx, model.reads(state.params, task), updates, opt_state,
        state.opt_state)
    metrics = {'loss': loss, 'grad_norm': optax.global_norm(grads),
               'learning_rate': schedule(state.step)}
    return train_lib.TrainState(
        state.step + 1, optax.apply_updates(state.params, updates),
        opt_state), metrics

  def predict(task, params, batch):
    return model.apply(params, task, batch)

  count = len(model.specs)
  return Steps(
      init_state,
      tuple(lambda s, b, m=m: train_step(m, s, b) for m in range(count)),
      tuple(lambda p, b, m=m: predict(m, p, b) for m in range(count)))


# ---------------------------------------------------------------------------
# Data: every task, encoded once.


def encode_tasks(cfg, tokenizer: tokenizer_lib.Tokenizer
                 ) -> list[finetune.TaskData]:
  """Each task (sorted keys) with its training examples less its dev
  split, encoded once with ``tokenizer`` (the pretrained run's), by the
  single-task harness's code."""
  data = []
  for key in task_keys(cfg):
    try:
      data.append(finetune.encode_task(finetune_config(cfg, key), tokenizer))
    except finetune.FinetuneError as e:
      raise MultitaskError(f'tasks.{key}: {e}') from e
  return data


def plan_steps(cfg, rows: Sequence[int], max_positions: int) -> int:
  """``num_steps``, or ``num_epochs`` over every task's training rows (the
  batches of all tasks once, MT-DNN's epoch); fails when a task has fewer
  rows than a batch."""
  for key, n in zip(task_keys(cfg), rows):
    if n < cfg.batch_size:
      raise MultitaskError(f'tasks.{key} has {n} training rows, fewer than '
                           f'batch_size={cfg.batch_size}: lower batch_size.')
  if cfg.max_seq_length > max_positions:
    raise MultitaskError(f'max_seq_length={cfg.max_seq_length} exceeds the '
                         f'model\'s {max_positions} positions.')
  total_steps = cfg.num_steps or math.ceil(
      cfg.num_epochs * sum(n // cfg.batch_size for n in rows))
  if total_steps < len(rows):
    raise MultitaskError(f'{total_steps} steps cannot train each of the '
                         f'{len(rows)} tasks once: raise num_steps (or '
                         'num_epochs).')
  return total_steps


# ---------------------------------------------------------------------------
# The run.


def _identity(cfg) -> dict:
  return {name: train_lib.config_section(cfg, name) for name in _IDENTITY}


def _check_resume(workdir: str, cfg) -> dict | None:
  """The metadata of the run ``workdir`` resumes (None for a new start);
  fails when it has other settings."""
  return train_lib.refuse_other_settings(
      workdir, META, _identity(cfg), _identity(base_config()),
      MultitaskError, 'a multi-task run')


def _every_task_steps(cfg, keys, sampler: TaskSampler,
                      total_steps: int) -> np.ndarray:
  """Each task's steps of the run; fails if one gets none (its head would
  be reported untrained)."""
  task_steps = sampler.task_steps(total_steps)
  idle = [key for key, n in zip(keys, task_steps) if n == 0]
  if idle:
    raise MultitaskError(
        f'tasks {idle} get no step of the {total_steps}: their rates are '
        'too small for the run (a block of mixing_block_steps='
        f'{cfg.mixing_block_steps} longer than the run is cut short); '
        'raise num_steps, lower mixing_block_steps, or raise the rates '
        '(mixing_cap, mixing_temperature).')
  return task_steps


def _say_mixture(cfg, keys, data, rates, task_steps, init_step: int
                 ) -> None:
  """Each task's share of the run, and where the weights come from."""
  total_steps = int(sum(task_steps))
  for key, d, rate, steps_m in zip(keys, data, rates, task_steps):
    n = len(d.train['input_ids'])
    _say(f'task {key} ({d.task.name}, {d.task.kind}): '
         f'{len(d.task.train)} train / {len(d.task.eval)} eval examples, '
         f'{n} rows; rate {rate:.4f}, {steps_m} of {total_steps} steps '
         f'({steps_m * cfg.batch_size / n:.2f} epochs)')
  _say(f'{cfg.mixing} mixing (cap {cfg.mixing_cap}, temperature '
       f'{cfg.mixing_temperature}); {cfg.init_weights} weights from '
       f'{cfg.init} step {init_step}')


def multitask(cfg, workdir: str) -> dict:
  """Trains per ``cfg`` in ``workdir`` (resuming if possible); returns
  ``multitask.json``'s content: ``tasks`` (key -> the task's held-out
  ``metrics``, ``headline``, ``rate``, ``steps``, ...) and the run's
  settings."""
  # ---- Checks that read no data and write nothing.
  validate(cfg)
  saved = _check_resume(workdir, cfg)
  keys = task_keys(cfg)
  pretrained = finetune.load_pretrained(cfg.init, cfg.init_step)
  init_step = finetune.started_from(saved, pretrained)
  model_cfg = finetune.downstream_config(finetune_config(cfg, keys[0]),
                                         pretrained)

  # ---- Tasks, encoded with the pretrained run's tokenizer; the mixture.
  data = encode_tasks(cfg, pretrained.tokenizer)
  rows = [len(d.train['input_ids']) for d in data]
  total_steps = plan_steps(cfg, rows, model_cfg.max_position_embeddings)
  rates = mixing_rates(rows, cfg.mixing, cfg.mixing_cap,   # Rows: as an
                       cfg.mixing_temperature)           # epoch counts.
  sampler = TaskSampler(rates, cfg.seed,
                        cfg.mixing_block_steps or total_steps)
  task_steps = _every_task_steps(cfg, keys, sampler, total_steps)
  _say_mixture(cfg, keys, data, rates, task_steps, init_step)

  # ---- Mesh, model and optimizer.
  place = train_lib.make_placement(cfg)
  model = MultitaskModel(model_cfg, tuple(
      HeadSpec(key, d.task.kind, d.task.num_labels)
      for key, d in zip(keys, data)), cfg.pooling, cfg.head_init)
  finetune.check_quantized_layers(model.module(0))
  steps = make_steps(cfg, model, total_steps)

  with jax.set_mesh(place.mesh), nn.logical_axis_rules(place.rules):
    # ---- Shard (the state is born sharded), compile a step per task.
    compiled = shard_and_compile(steps, place, data, cfg.batch_size)

    # ---- Restore a checkpoint, or initialize from the pretrained encoder.
    storage.makedirs(workdir)
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, 'checkpoints'), cfg.checkpoint_every_steps,
        cfg.keep_checkpoints)
    state = restore_or_init(cfg, workdir, ckpt, steps, compiled, pretrained)
    if jax.process_index() == 0:
      train_lib.write_json_atomic(os.path.join(workdir, META), {
          'identity': _identity(cfg), 'config': cfg.to_dict(),
          'pretrained': {'workdir': storage.absolute(cfg.init),
                         'step': init_step}})

    # ---- Train loop.
    loop = MultitaskLoop(cfg, workdir, place, data, compiled, ckpt, sampler,
                         total_steps, state)
    state = loop.run(state)

    # ---- Held-out evaluation, per task, by the harness's metrics.
    results = {key: loop.evaluate_task(state.params, m)
               for m, key in enumerate(keys)}

  # ---- multitask.json.
  for m, key in enumerate(keys):
    results[key].update(rate=float(rates[m]), steps=int(task_steps[m]),
                        train_rows=rows[m])
  result = {'tasks': results, 'mixing': cfg.mixing,
            'mixing_cap': cfg.mixing_cap,
            'mixing_temperature': cfg.mixing_temperature,
            'steps': total_steps, 'init': storage.absolute(cfg.init),
            'init_step': init_step, 'init_weights': cfg.init_weights,
            'parameters': sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
                compiled.abstract_state.params))}
  if jax.process_index() == 0:
    train_lib.write_json_atomic(os.path.join(workdir, RESULT), result)
  loop.writer.message(results_table(result))
  loop.writer.close()
  return result


def results_table(result: dict) -> str:
  """``multitask.json``'s per-task metrics as a Markdown table."""
  lines = ['| task | kind | train examples | rate | steps | metrics |',
           '| --- | --- | --- | --- | --- | --- |']
  for key, r in result['tasks'].items():
    metrics = ', '.join(f'{k} {v:.4f}' for k, v in r['metrics'].items())
    lines.append(f'| {key} ({r["task"]}) | {r["kind"]} | '
                 f'{r["train_examples"]} | {r["rate"]:.4f} | {r["steps"]} | '
                 f'{metrics} |')
  return '\n'.join(lines)


# ---------------------------------------------------------------------------
# Shard and compile; restore or initialize.


class Compiled(NamedTuple):
  """The state's shardings and the steps compiled for them, per task."""
  abstract_state: train_lib.TrainState   # Shapes, dtypes and shardings.
  state_sh: train_lib.TrainState         # The sharding of every leaf.
  train_steps: tuple                     # (state, batch) -> (state, metrics).
  predicts: tuple                        # (params, batch) -> logits.


def shard_and_compile(steps: Steps, place: train_lib.Placement,
                      data: Sequence[finetune.TaskData], batch_size: int
                      ) -> Compiled:
  """Shardings from the logical axes (the state is born sharded) and every
  task's update step compiled ahead of time, under ``place``'s mesh and
  rules."""
  abstract_state, state_sh = sharding.state_shardings(
      steps.init_state, place.mesh, place.rules)
  sharding.check_divisible(abstract_state, place.mesh)
  train_steps = []
  for step_fn, d in zip(steps.train_steps, data):
    abstract_batch = {
        k: jax.ShapeDtypeStruct((batch_size,) + d.train[k].shape[1:],
                                d.train[k].dtype, sharding=place.batch_sh)
        for k in d.features}
    train_steps.append(train_lib.compile_step(
        step_fn, place.mesh, state_sh, place.batch_sh, abstract_state,
        abstract_batch))
  predicts = tuple(jax.jit(p, in_shardings=(state_sh.params, place.batch_sh),
                           out_shardings=sharding.replicated(place.mesh))
                   for p in steps.predicts)
  return Compiled(abstract_state, state_sh, tuple(train_steps), predicts)


def restore_or_init(cfg, workdir: str, ckpt: checkpoint_lib.Checkpointer,
                    steps: Steps, compiled: Compiled,
                    pretrained: finetune.Pretrained) -> train_lib.TrainState:
  """The latest checkpoint in ``workdir``, else a fresh state (born
  sharded) with ``pretrained``'s encoder and pooler put in
  (``init_weights`` pretrained) or left at random."""
  state = finetune.resume(ckpt, compiled.abstract_state, workdir)
  if state is not None:
    return state
  state = sharding.create_sharded(steps.init_state, compiled.state_sh)
  if cfg.init_weights == 'pretrained':
    state = state.replace(params=finetune.load_encoder(
        state.params, compiled.abstract_state.params, pretrained.params))
  return state


# ---------------------------------------------------------------------------
# Train loop.


class MultitaskLoop:
  """The train loop and the evaluation, over what they share: the compiled
  steps, the encoded tasks, the sampler, the mesh, the metric writer."""

  def __init__(self, cfg, workdir: str, place: train_lib.Placement,
               data: Sequence[finetune.TaskData], compiled: Compiled,
               ckpt: checkpoint_lib.Checkpointer, sampler: TaskSampler,
               total_steps: int, state: train_lib.TrainState):
    self._cfg, self._place, self._data = cfg, place, data
    self._compiled, self._ckpt, self._sampler = compiled, ckpt, sampler
    self._keys = task_keys(cfg)
    self.total_steps = total_steps
    self.writer = metric_writers.MetricWriter(
        workdir, total_steps, int(jax.device_get(state.step)),
        enabled=jax.process_index() == 0)

  def to_global(self, data: dict, row_ids: np.ndarray, keys) -> dict:
    """The global batch of ``data``'s rows ``row_ids`` [batch_size] (this
    process reads its share of them)."""
    return sharding.make_global_batch(
        {k: data[k][row_ids[self._place.rows]] for k in keys},
        self._place.batch_sh, self._cfg.batch_size)

  def predict_all(self, params, task: int, data: dict) -> np.ndarray:
    """Task ``task``'s logits on every row of ``data`` (the last batch
    padded with repeats of row 0, whose outputs are dropped)."""
    batch_size = self._cfg.batch_size
    n = len(data['input_ids'])
    outputs = []
    for start in range(0, n, batch_size):
      row_ids = np.arange(start, start + batch_size)
      row_ids = np.where(row_ids < n, row_ids, 0)
      outputs.append(np.asarray(jax.device_get(self._compiled.predicts[task](
          params, self.to_global(data, row_ids, _INPUTS)))))
    return np.concatenate(outputs)[:n]

  def evaluate_task(self, params, task: int) -> dict:
    """Task ``task``'s held-out metrics (and its dev split's), as
    ``downstream.json`` has them: ``metrics``, ``headline``, and the
    per-example predictions of classification and regression."""
    d = self._data[task]
    cfg = finetune_config(self._cfg, self._keys[task])
    logits = self.predict_all(params, task, d.eval)
    result = {'task': d.task.name, 'kind': d.task.kind,
              'headline': d.task.metrics[0],
              'metrics': finetune.evaluate_task(d.task, logits, d.eval, cfg),
              'train_examples': len(d.task.train),
              'eval_examples': len(d.task.eval)}
    if d.dev_task is not None:
      result['dev_metrics'] = finetune.evaluate_task(
          d.dev_task, self.predict_all(params, task, d.dev), d.dev, cfg)
    if d.task.kind in finetune.PER_EXAMPLE:  # Intervals over examples.
      result.update(finetune.per_example_predictions(d.task.kind, logits,
                                                     d.eval['label']))
    return result

  def run(self, state: train_lib.TrainState) -> train_lib.TrainState:
    """Trains from ``state``'s step to the last one, each step on the task
    the sampler gives it, checkpointing when due and at the end; fails on
    a non-finite logged loss."""
    cfg = self._cfg
    step = int(jax.device_get(state.step))
    last_metrics = {}    # Task -> its latest step's metrics (on device).
    t_last = time.time()
    while step < self.total_steps:
      task, task_step = self._sampler.locate(step)
      d = self._data[task]
      row_ids = finetune.batch_rows(cfg.seed, task_step,
                                    len(d.train['input_ids']),
                                    cfg.batch_size)
      state, last_metrics[task] = self._compiled.train_steps[task](
          state, self.to_global(d.train, row_ids, d.features))
      step += 1
      self.writer.advance(step)
      last = step == self.total_steps
      if step % cfg.log_every_steps == 0 or last:
        self._log(step, task, jax.device_get(last_metrics), t_last)
        t_last = time.time()
      self._ckpt.save(step, state, force=last)
    self._ckpt.wait()
    self._ckpt.close()
    return state

  def _log(self, step: int, task: int, metrics: dict, t_last: float
           ) -> None:
    """The step's metrics, and each task's latest loss (``loss_{key}``)."""
    entry = {k: float(v) for k, v in metrics[task].items()}
    for m, values in metrics.items():
      if not np.isfinite(values['loss']):
        raise FloatingPointError(
            f'task {self._keys[m]}\'s loss is {values["loss"]} at or before '
            f'step {step}; lower optimizer.learning_rate.')
      entry[f'loss_{self._keys[m]}'] = float(values['loss'])
    entry['task'] = task
    entry['steps_per_second'] = self._cfg.log_every_steps / max(
        time.time() - t_last, 1e-9)
    self.writer.write(step, entry)
