"""Pretraining: ``train_and_evaluate`` reads top to bottom, in named steps.

  python -m bertjax.train --config=experiments/configs/demo.py \
      --workdir=/tmp/bertjax-demo [--config.total_steps=100 ...]

Rerunning the same command in the same workdir resumes from the latest
intact checkpoint (model, optimizer, step, divergence counters and data
iterator), so the resumed run reaches the same final metrics as one that
never stopped, on the same mesh or another one. A SIGTERM (a preemption
notice) saves a checkpoint at the next step and exits with status 75
(``preemption.EXIT_PREEMPTED``), which the launchers relaunch on.

Multi-host: one process per host (or GPU) runs the same command; see
``bertjax/runtime/distributed.py`` for how the processes find each other, and
``experiments/launch/`` for TPU pods and SLURM clusters.

The steps, each a section below in this order: checks that write nothing,
mesh, input pipeline, task and its steps, shard and compile, restore or
initialize (the first write to the workdir), train loop, final evaluation.
``bertjax/finetune.py`` shares the mesh, the compiled step with donated state
and the atomic JSON write.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any, Callable, NamedTuple

from absl import app
from absl import flags
from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from bertjax.runtime import checkpoint as checkpoint_lib
from bertjax import config_check
from bertjax import config_lib
from bertjax.runtime import distributed
from bertjax.runtime import divergence
from bertjax import errors
from bertjax import flops
from bertjax.runtime import metric_writers
from bertjax import objectives
from bertjax.objectives import losses
from bertjax import optim
from bertjax.runtime import preemption
from bertjax import sharding
from bertjax import storage
from bertjax import train_flags
from data_pipelines import continual as continual_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import masking as masking_lib
from data_pipelines import mixture as mixture_lib
from data_pipelines import pipeline
from data_pipelines import pretokenize
from data_pipelines import tokenizer as tokenizer_lib

# Independent keys split once from the seed: model init, the training
# steps' keys (dropout; ELECTRA's masking and sampling), and evaluation's.
_MODEL_KEY, _DROPOUT_KEY, _EVAL_KEY = 1, 2, 3
# Config sections a resumed run must share with the run that wrote the
# checkpoints: anything else (steps, logging, eval, the learning rate and
# its schedule) may change on resume. What the data stream is (its rows,
# their batches and masking) and the optimizer's state tree are here too:
# the saved iterator position is a count of batches, and Grain's state
# holds one entry per worker process. With a mixture, its components and
# exponent replace data.corpus (which the mixture ignores), see
# run_identity.
_RUN_IDENTITY = ('seed', 'model', 'data.corpus', 'data.tokenizer',
                 'data.max_seq_length', 'batch_size', 'data.layout',
                 'data.dupe_factor', 'data.split_seed', 'data.eval_fraction',
                 'data.num_workers', 'masking', 'optimizer.name')
_MIXTURE_IDENTITY = ('data.mixture', 'data.mixture_exponent')
RUN_META = 'run_meta.json'
_SHARDING_REPORT = 'sharding.txt'


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # divergence.init_health()'s counters (None: a fine-tuning state).
  health: Any = None


class ResumeError(errors.UserError, ValueError):
  """The workdir holds a run that this config cannot continue."""


def say(text: str) -> None:
  """Prints on process 0 only (absl INFO is silenced by default)."""
  if jax.process_index() == 0:
    print(text, flush=True)


def write_json_atomic(path: str, value) -> None:
  """``value`` as indented JSON at ``path`` (local or in a bucket); a
  reader never sees half of it."""
  storage.write_text(path, json.dumps(value, indent=2, sort_keys=True))


def train_unless_finished(cfg, workdir: str) -> bool:
  """Trains ``cfg`` in ``workdir`` (resuming it) unless its checkpoint at
  ``cfg.total_steps`` is saved already, intact; returns whether it
  trained. A finished run is not started again, which would compile its
  step; one whose last checkpoint is damaged sets it aside and trains
  again from the one before."""
  directory = os.path.join(workdir, 'checkpoints')
  step = checkpoint_lib.latest_step(directory)
  if step is not None and step >= cfg.total_steps:
    try:
      checkpoint_lib.verify(os.path.join(storage.absolute(directory),
                                         str(step)))
      return False
    except checkpoint_lib.CorruptCheckpointError:
      pass   # Training restores the newest intact step.
  train_and_evaluate(cfg, workdir)
  return True


def train_and_evaluate(cfg, workdir: str) -> dict:
  """Trains per ``cfg`` in ``workdir`` (resuming if possible).

  Returns the final eval metrics (``eval_mlm_accuracy`` etc.) together with
  ``baseline_mlm_accuracy``, the accuracy of predicting the most frequent
  token at the same positions.
  """
  # ---- From here a preemption notice is watched for (the checks may read
  # a bucket, the input and the compile take a while): it ends the run at
  # the next step boundary, or before the first, with the relaunch status.
  with preemption.PreemptionWatch() as watch:
    # ---- Checks that read no data and write nothing.
    cfg, saved_meta = check_before_writing(cfg, workdir)

    # ---- Mesh, and the rows of each global batch this process reads.
    place = make_placement(cfg)
    say(f'mesh {dict(place.mesh.shape)} over {place.mesh.size} device(s) '
        f'({jax.devices()[0].device_kind}), {jax.process_count()} '
        f'process(es); each reads {len(place.rows)} of the {cfg.batch_size} '
        'rows of a batch')

    # ---- Input pipeline (the tokenizer is checked before the data is built).
    data = input_pipeline(cfg, saved_meta, workdir, place.rows)

    # ---- Task, and the init, update and eval steps of its model.
    task = objectives.get(cfg.objective.name).make_task(
        cfg, data.tokenizer.vocab_size)
    steps = make_steps(cfg, task, data.global_spec)

    with jax.set_mesh(place.mesh), nn.logical_axis_rules(place.rules):
      if cfg.init_from:   # Another model there: refused before compiling.
        check_init_from(cfg.init_from, steps)
      # ---- Shard (the state is born sharded), compile ahead of time.
      compiled = shard_and_compile(steps, place, data.global_spec, workdir)

      # ---- Restore a checkpoint, or initialize. First write to the workdir.
      write_run_files(cfg, workdir, data, task, place, compiled)
      ckpt = checkpoint_lib.Checkpointer(
          os.path.join(workdir, 'checkpoints'), cfg.checkpoint_every_steps,
          cfg.keep_checkpoints)
      state = restore_or_init(cfg, workdir, ckpt, steps, compiled, place,
                              data.train_iter)

      # ---- Train loop (a preemption notice ends it with Preempted).
      loop = TrainLoop(cfg, workdir, place, data, compiled, ckpt,
                       task.flops_per_token, state)
      state = loop.run(state, watch)

      # ---- Final evaluation against the most-frequent-token baseline.
      return final_evaluation(loop, state.params, data)


# ---------------------------------------------------------------------------
# Checks that read no data and write nothing.


def check_before_writing(cfg, workdir: str) -> tuple[Any, dict | None]:
  """Every check that reads no data, before anything is written.

  Returns ``cfg`` as its objective prepares it (e.g. with a teacher's
  tokenizer) and the ``run_meta.json`` that ``workdir`` holds (None: a new
  run).
  """
  cfg = objectives.get(cfg.objective.name).prepare_config(cfg)
  config_lib.validate(cfg)
  for warning in config_check.warnings_for(cfg):  # Mixes no paper used.
    logging.warning('config: %s', warning)
    say(f'warning: {warning}')
  if mixture_lib.is_mixture(cfg.data):  # Every component, before any build.
    mixture_lib.validate(cfg.data)
  else:
    corpus_lib.validate(corpus_lib.CorpusSpec.from_config(cfg.data.corpus))
  if cfg.init_from and checkpoint_lib.latest_step(
      os.path.join(cfg.init_from, 'checkpoints')) is None:
    raise ResumeError(f'init_from={cfg.init_from!r} has no checkpoint.')
  return cfg, check_resume_compatible(workdir, cfg)


def config_section(cfg, dotted: str):
  """The section (or field) ``dotted`` of ``cfg``, as plain values."""
  value = cfg
  for part in dotted.split('.'):
    value = value[part]
  return value.to_dict() if hasattr(value, 'to_dict') else value


def run_identity(cfg) -> dict:
  names = list(_RUN_IDENTITY)
  if mixture_lib.is_mixture(cfg.data):
    names.remove('data.corpus')
    names.extend(_MIXTURE_IDENTITY)
  # An objective's own (none for most: a run saved before the field keeps
  # resuming).
  names.extend(objectives.get(cfg.objective.name).run_identity)
  identity = {name: config_section(cfg, name) for name in names}
  if continual_lib.is_continual(cfg):
    # The embedding row each stream trains: a renamed or re-staged stream
    # would move onto another's row.
    identity['continual.task_ids'] = {
        name: task_id
        for task_id, name in enumerate(continual_lib.stream_order(cfg))}
  # Rematerialization changes memory, not results, and the attention kernel
  # only the rounding: a run may resume with another setting (and predates
  # the field).
  identity['model'].pop('remat', None)
  identity['model'].pop('attention', None)
  return identity


def identity_changes(saved: dict, mine: dict, defaults: dict
                     ) -> dict[str, tuple[Any, Any]]:
  """``{name: (saved value, value now)}`` for each setting in which a run's
  saved identity (as read from its JSON) differs from ``mine``.

  Names on one side only are changes (a mixture run and a single-corpus
  run, or two objectives, differ in their names), but for a name of
  ``defaults`` (the base config's identity) that the run lacks: the code
  added it since, and the run recorded nothing to compare it with. A
  field added to a saved section since counts at its value in
  ``defaults``: a new field's default keeps the behaviour of the code
  before it, so an older run resumes unless its setting changed. Shared by
  every command that resumes a workdir.
  """
  mine, defaults = json.loads(json.dumps([mine, defaults]))
  theirs = {name: ({**defaults[name], **value}
                   if isinstance(value, dict)
                   and isinstance(defaults.get(name), dict) else value)
            for name, value in saved.items()}
  names = set(theirs) | {n for n in mine if n not in defaults}
  return {name: (theirs.get(name), mine.get(name)) for name in sorted(names)
          if theirs.get(name) != mine.get(name)}


def binding_meta(workdir: str, name: str,
                 checkpoint_dirs: tuple[str, ...] = ('checkpoints',)
                 ) -> dict | None:
  """``workdir``'s metadata file ``name`` (the settings its run was written
  with) when a checkpoint under one of ``checkpoint_dirs`` holds the run to
  them (or was set aside as corrupt there, to be repaired), else None. A
  start that failed before its first checkpoint left nothing to continue:
  a new start, with any settings, replaces it."""
  try:
    saved = json.loads(storage.read_text(os.path.join(workdir, name)))
  except FileNotFoundError:
    return None
  if all(checkpoint_lib.latest_step(os.path.join(workdir, d)) is None
         and not storage.listdir(os.path.join(workdir, d)
                                 + checkpoint_lib.CORRUPT_SUFFIX)
         for d in checkpoint_dirs):
    return None
  return saved


def refuse_other_settings(workdir: str, meta: str, identity: dict,
                          defaults: dict, error: type[Exception], run: str,
                          checkpoint_dirs: tuple[str, ...] = ('checkpoints',)
                          ) -> dict | None:
  """The metadata file ``meta`` of the run that ``workdir`` holds (None:
  a new start, see ``binding_meta``), once checked that this config's
  ``identity`` continues it: a run saved with other settings raises
  ``error``, naming each setting as saved and as now. ``defaults``: the
  base config's identity (see ``identity_changes``); ``run`` names what
  the workdir holds ('a fine-tuning run'). Shared by every command that
  resumes a workdir."""
  checkpoint_lib.check_directory(storage.absolute(workdir))
  saved = binding_meta(workdir, meta, checkpoint_dirs)
  if saved is None:
    return None
  changed = identity_changes(saved['identity'], identity, defaults)
  if changed:
    details = '; '.join(
        f'{name}: {theirs!r} saved, {mine!r} now'
        for section, (old, new) in changed.items()
        for name, theirs, mine in _leaf_changes(section, old, new))
    raise error(
        f'workdir {workdir!r} holds {run} whose {", ".join(changed)} differ '
        f'from this config ({details}). Its checkpoints cannot continue '
        'with other settings: use a new --workdir, or restore the original '
        'settings.')
  return saved


def _leaf_changes(name: str, theirs: Any, mine: Any
                  ) -> list[tuple[str, Any, Any]]:
  """The fields in which a saved setting ``theirs`` and ``mine`` differ,
  as (dotted name, saved, now): inside a section only the fields that
  changed (a missing one reads None)."""
  if not (isinstance(theirs, dict) and isinstance(mine, dict)):
    return [(name, theirs, mine)]
  return [change for key in sorted(set(theirs) | set(mine))
          if theirs.get(key) != mine.get(key)
          for change in _leaf_changes(f'{name}.{key}', theirs.get(key),
                                      mine.get(key))]


def check_resume_compatible(workdir: str, cfg) -> dict | None:
  """Fails when ``workdir`` holds a run with a different identity."""
  return refuse_other_settings(
      workdir, RUN_META, run_identity(cfg),
      run_identity(config_lib.base_config()), ResumeError, 'a run')


# ---------------------------------------------------------------------------
# Mesh (pretraining's and fine-tuning's).


class Placement(NamedTuple):
  """The device mesh, and where a global batch lies on it."""
  mesh: jax.sharding.Mesh
  rules: tuple                # ((logical axis, mesh axes), ...) for Flax.
  batch_sh: jax.sharding.NamedSharding   # A [batch, ...] array's sharding.
  rows: np.ndarray            # [rows] int64: the global batch's rows that
                              # this process's devices hold (and it reads).
  counted: np.ndarray         # [rows] bool: those it counts in totals over
                              # processes (each row on one process).


def make_placement(cfg) -> Placement:
  """The mesh of ``cfg.sharding``; fails when ``cfg.batch_size`` rows do not
  split over its batch axes."""
  mesh = sharding.make_mesh(cfg.sharding.mesh_shape, cfg.sharding.replicas)
  rules = sharding.logical_rules(cfg)
  batch_sh = sharding.batch_sharding(mesh)
  sharding.check_batch_divisible(cfg.batch_size, mesh)
  return Placement(mesh, rules, batch_sh,
                   sharding.process_batch_rows(batch_sh, cfg.batch_size),
                   sharding.rows_counted_here(batch_sh, cfg.batch_size))


# ---------------------------------------------------------------------------
# Input pipeline.


class InputData(NamedTuple):
  """The tokenizer, the pre-tokenized data and this process's batches."""
  tokenizer: tokenizer_lib.Tokenizer
  prepared: Any               # pretokenize.prepare's (or the mixture's).
  train_iter: Any             # Grain iterator of local training batches;
                              # checkpointed with the state.
  eval_batches: list[dict]    # Local eval batches, the same every time.
  global_spec: dict           # Feature -> (shape, dtype) of a global batch.
  masking_cfg: Any            # What the masking audit compares against.
  data_skipped: dict          # data_skipped_* -> count: what reading the
                              # corpus dropped or repaired.


def input_pipeline(cfg, saved_meta: dict | None, workdir: str,
                   rows: np.ndarray) -> InputData:
  """The data, built on first use (process 0 first) and then reused; this
  process reads ``rows`` of each global batch. Audits the eval batches'
  masking before anything is compiled."""
  say(f'tokenizer and pre-tokenized data under {cfg.data.data_dir} (built '
      'on first use, then reused)')
  with distributed.process_zero_first('input data'):
    tokenizer, prepared = prepare_data(cfg, saved_meta, workdir)
  # In every logged step's metrics (data_skipped_*) and run_meta.json.
  data_skipped = {f'data_skipped_{k}': v for k, v in prepared.skipped.items()}
  if any(data_skipped.values()):
    say('warning: preparing the data skipped or repaired '
        f'{pretokenize.format_skipped(prepared.skipped)} (what each count '
        'means: data_pipelines/corpus.py SKIP_COUNTERS)')
  train_iter = iter(pipeline.train_dataset(prepared, cfg, rows))
  eval_batches = pipeline.eval_batches(
      prepared, cfg, rows, distributed.sum_over_processes)
  masking_cfg = pipeline.masking_config(cfg, prepared)
  # Every process's rows of the eval batches, so the audit (which raises
  # on every process alike) reads the global batches.
  counts = distributed.sum_over_processes(
      sum(b[pipeline.STATISTICS] for b in eval_batches))
  # Fail fast, before compiling; a run without MLM has nothing to audit.
  if cfg.masking.audit_tolerance and np.any(counts):
    masking_lib.audit(masking_lib.summarize_statistics(counts), masking_cfg,
                      cfg.masking.audit_tolerance, 'on the eval batches')
  return InputData(tokenizer, prepared, train_iter, eval_batches,
                   pipeline.batch_spec(cfg), masking_cfg, data_skipped)


def check_tokenizer_matches(cfg, saved_meta: dict | None,
                            tokenizer: tokenizer_lib.Tokenizer,
                            workdir: str) -> None:
  """The tokenizer is the one the workdir's checkpoints, and ``init_from``'s
  parameters, were trained with: with another, the same ids would be other
  pieces (and a run of the same vocabulary size would not say so)."""
  if saved_meta and saved_meta['tokenizer_sha256'] != tokenizer.sha256:
    raise ResumeError(
        f'the tokenizer (sha256 {tokenizer.sha256[:12]}, '
        f'{tokenizer.vocab_size} pieces) is not the one the checkpoints in '
        f'{workdir!r} were trained with (sha256 '
        f'{saved_meta["tokenizer_sha256"][:12]}, {saved_meta["vocab_size"]} '
        'pieces). Use the original tokenizer model, or a new --workdir.')
  # A run's workdir and an import both keep their tokenizer here.
  theirs = os.path.join(cfg.init_from, 'tokenizer.model')
  if not (cfg.init_from and storage.isfile(theirs)):
    return
  their_sha = storage.sha256(theirs)
  if their_sha != tokenizer.sha256:
    raise ResumeError(
        f'the tokenizer (sha256 {tokenizer.sha256[:12]}, '
        f'{tokenizer.vocab_size} pieces) is not the one '
        f'init_from={cfg.init_from!r} was trained with (its {theirs}, '
        f'sha256 {their_sha[:12]}): its embeddings would be read as other '
        'pieces. Set data.tokenizer.model_path to that file, or the '
        'data.tokenizer settings that run had.')


def warn_if_data_format_changed(saved_meta: dict | None,
                                workdir: str) -> None:
  """A checkpoint resumes on the batches it would have seen only on data
  of the format it was trained on: say so when that format has changed
  (the records are the same, their order or indices are not)."""
  saved = (saved_meta or {}).get('data_format', 'before 2.0.0')
  if saved_meta and saved not in pretokenize.SAME_BATCHES_FORMATS:
    say(f'warning: the checkpoints in {workdir!r} were trained on '
        f'pre-tokenized data of format {saved}; this bertjax prepares format '
        f'{pretokenize.FORMAT_VERSION}, whose documents are the same but in '
        'another order, so the run goes on with other batches than it would '
        'have seen. Install the bertjax that started the run to resume it '
        'exactly.')


def prepare_data(cfg, saved_meta: dict | None, workdir: str):
  """The tokenizer (checked against the workdir's) and the pre-tokenized
  data, built on first use and then reused."""
  warn_if_data_format_changed(saved_meta, workdir)
  if mixture_lib.is_mixture(cfg.data):
    # One tokenizer for all components; each component built alone.
    fingerprints = mixture_lib.fingerprints(cfg.data)
    tokenizer = mixture_lib.load_or_train_tokenizer(cfg.data, fingerprints)
    check_tokenizer_matches(cfg, saved_meta, tokenizer, workdir)
    prepared = mixture_lib.prepare(cfg.data, tokenizer=tokenizer,
                                   corpus_fingerprints=fingerprints)
    say(f'corpus mixture:\n{prepared.summary()}')
    return tokenizer, prepared
  corpus_spec = corpus_lib.CorpusSpec.from_config(cfg.data.corpus)
  corpus_fingerprint = corpus_lib.fingerprint(corpus_spec)
  tokenizer = pretokenize.load_or_train_tokenizer(cfg.data, corpus_spec,
                                                  corpus_fingerprint)
  check_tokenizer_matches(cfg, saved_meta, tokenizer, workdir)
  return tokenizer, pretokenize.prepare(cfg.data, tokenizer=tokenizer,
                                        corpus_fingerprint=corpus_fingerprint)


# ---------------------------------------------------------------------------
# Task: the model's init, update and eval steps.


def trainable_parameters(params, trainable=None) -> int:
  """Parameters that train (a frozen teacher's excluded)."""
  sizes = jax.tree.map(lambda x: int(np.prod(x.shape)), nn.unbox(params))
  if trainable is not None:
    sizes = jax.tree.map(lambda n, t: n if t else 0, sizes,
                         trainable(nn.unbox(params)))
  return sum(jax.tree.leaves(sizes))


class Steps(NamedTuple):
  """What training runs on the devices, before it is sharded and compiled.

  ``init_state(*init_inputs(steps))`` -> ``TrainState`` (boxed with
  logical axes); ``train_step(state, batch)`` -> (state, metrics);
  ``eval_step(params, batch)`` -> metric sums; ``init_inputs``: the task's
  (``objectives.Task.init_inputs``: host arrays, boxed), or None.
  """
  init_state: Callable[..., TrainState]
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  eval_step: Callable[[Any, dict], dict]
  init_inputs: Any = None


def step_key(cfg, step) -> jax.Array:
  """The key the train step at ``step`` gives the task's loss (dropout,
  and ELECTRA's masking and sampling), from ``cfg.seed`` and
  ``cfg.step_rng``."""
  root = (jax.random.key(cfg.seed) if cfg.step_rng == 'threefry'
          else jax.random.key(cfg.seed, impl=cfg.step_rng))
  return jax.random.fold_in(jax.random.fold_in(root, _DROPOUT_KEY), step)


def make_steps(cfg, task: objectives.Task, global_spec: dict) -> Steps:
  """The init, update and eval functions of ``task`` with ``cfg``'s
  optimizer; every key derives from ``cfg.seed``."""
  tx, schedule = optim.make_optimizer(cfg)
  root_key = jax.random.key(cfg.seed)
  eval_key = jax.random.fold_in(root_key, _EVAL_KEY)

  def init_state(*inputs):
    dummy = {k: jnp.zeros(shape, dtype) for k, (shape, dtype)
             in global_spec.items()}
    params = task.init(jax.random.fold_in(root_key, _MODEL_KEY), dummy,
                       *inputs)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer(params).init(params),
                      health=divergence.init_health())

  def optimizer(params):
    """``tx`` on the trainable leaves; frozen ones (a teacher) get no
    update and no optimizer state."""
    if task.trainable is None:
      return tx
    labels = jax.tree.map(lambda t: 'train' if t else 'frozen',
                          task.trainable(params))
    return optax.multi_transform({'train': tx, 'frozen': optax.set_to_zero()},
                                 labels)

  def loss_fn(params, batch, key, step=None):
    deterministic = key is None
    staged = {'step': step} if task.staged else {}
    return task.loss(params, batch, eval_key if deterministic else key,
                     deterministic, **staged)

  def train_step(state: TrainState, batch):
    dropout_key = step_key(cfg, state.step)
    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, dropout_key, state.step)
    updates, opt_state = optimizer(state.params).update(
        grads, state.opt_state, state.params)
    if task.gate is not None:
      updates = task.gate(updates, state.step)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    # A non-finite step keeps the state it started from (and is counted).
    (params, opt_state), health = divergence.guard(
        state.health, state.step, loss, grad_norm, (params, opt_state),
        (state.params, state.opt_state), cfg.divergence.spike_factor,
        cfg.divergence.spike_window,
        restart=jnp.isin(state.step, jnp.asarray(task.stage_starts,
                                                 jnp.int32)))
    # The optimizer's own count, which a skipped step did not advance.
    applied = state.step - state.health['skipped_steps']
    metrics = dict(sums, loss=loss, grad_norm=grad_norm,
                   learning_rate=schedule(applied), health=health)
    return TrainState(state.step + 1, params, opt_state, health), metrics

  def eval_step(params, batch):
    return loss_fn(params, batch, None)[1]

  return Steps(init_state, train_step, eval_step, task.init_inputs)


def init_inputs(steps: Steps, place: Placement | None = None) -> tuple:
  """The arguments of ``steps.init_state``: none for most tasks; a task's
  ``init_inputs`` (a teacher's parameters) placed on ``place``'s mesh by
  their logical axes, or without ``place`` as the host arrays they are
  (for ``jax.eval_shape``, or a jit on one device). Arguments, so the init
  executable does not embed them as constants."""
  if steps.init_inputs is None:
    return ()
  if place is None:
    return (sharding.strip_boxes(steps.init_inputs),)
  return (sharding.place_boxed(steps.init_inputs, place.mesh, place.rules),)



# ---------------------------------------------------------------------------
# Shard and compile.


def compile_step(step_fn, mesh, state_sh, batch_sh, abstract_state,
                 abstract_batch):
  """``step_fn(state, batch) -> (state, metrics)`` compiled ahead of time
  for these shardings (pretraining's and fine-tuning's); the state's buffers
  are donated (updated in place), the metrics replicated."""
  return jax.jit(step_fn, in_shardings=(state_sh, batch_sh),
                 out_shardings=(state_sh, sharding.replicated(mesh)),
                 donate_argnums=0).lower(abstract_state,
                                         abstract_batch).compile()


def compile_train_step(steps: Steps, mesh, state_sh, batch_sh,
                       abstract_state, abstract_batch):
  """The update step compiled ahead of time for these shardings; the
  state's buffers are donated (updated in place)."""
  return compile_step(steps.train_step, mesh, state_sh, batch_sh,
                      abstract_state, abstract_batch)


def jit_eval_step(steps: Steps, mesh, state_sh, batch_sh):
  """The eval step, jitted for these shardings: (params, global batch) ->
  metric sums, replicated."""
  return jax.jit(steps.eval_step, in_shardings=(state_sh.params, batch_sh),
                 out_shardings=sharding.replicated(mesh))


def abstract_batch(global_spec: dict, batch_sh) -> dict:
  """Shapes, dtypes and sharding of a global batch, without data."""
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sh)
          for k, (shape, dtype) in global_spec.items()}


class Compiled(NamedTuple):
  """The state's shardings and the steps compiled for them."""
  abstract_state: TrainState  # Shapes, dtypes and shardings; no buffers.
  state_sh: TrainState        # The sharding of every leaf.
  layout: str                 # Every parameter's layout (sharding.txt).
  train_step: Any             # (state, global batch) -> (state, metrics).
  eval_step: Any              # (params, global batch) -> metric sums.
  seconds: float              # Compile time of both.
  memory_text: str            # The train step's memory, for people.
  memory_bytes: dict          # ... in bytes, for run_meta.json.


def shard_and_compile(steps: Steps, place: Placement, global_spec: dict,
                      workdir: str) -> Compiled:
  """Shardings from the logical axes (the state is born sharded) and the
  steps compiled ahead of time; under ``place``'s mesh and rules. Fails
  here, before anything is written, when a device is too small."""
  mesh, batch_sh = place.mesh, place.batch_sh
  abstract_state, state_sh = sharding.state_shardings(
      steps.init_state, mesh, place.rules, *init_inputs(steps))
  sharding.check_divisible(abstract_state, mesh)
  layout, replicated_warnings = sharding.sharding_report(
      abstract_state.params, mesh)
  for warning in replicated_warnings:
    logging.warning('sharding: %s', warning)
    say(f'warning: {warning}')
  say(f'parameters: {layout.splitlines()[-1]} (the layout of every leaf '
      f'is in {os.path.join(workdir, _SHARDING_REPORT)})')
  t0 = time.time()
  step_fn = compile_train_step(steps, mesh, state_sh, batch_sh,
                               abstract_state,
                               abstract_batch(global_spec, batch_sh))
  eval_fn = jit_eval_step(steps, mesh, state_sh, batch_sh)
  seconds = time.time() - t0
  memory_text, memory_bytes = sharding.memory_report(
      step_fn, jax.local_devices()[0])
  logging.info('train step: %s', memory_text)
  say(f'compiled the train step in {seconds:.1f}s; {memory_text}')
  return Compiled(abstract_state, state_sh, layout, step_fn, eval_fn,
                  seconds, memory_text, memory_bytes)


# ---------------------------------------------------------------------------
# Restore a checkpoint, or initialize: the first writes to the workdir.


def write_run_files(cfg, workdir: str, data: InputData, task: objectives.Task,
                    place: Placement, compiled: Compiled) -> None:
  """``run_meta.json`` (what a resume is checked against), the sharding
  report and the tokenizer, written by process 0 into ``workdir``, which
  every process must see."""
  storage.makedirs(workdir)
  distributed.check_shared_directory(workdir)
  if jax.process_index() != 0:
    return
  mesh = place.mesh
  write_json_atomic(os.path.join(workdir, RUN_META), {
      'identity': run_identity(cfg),
      'tokenizer_sha256': data.tokenizer.sha256,
      'vocab_size': data.tokenizer.vocab_size, 'config': cfg.to_dict(),
      'data_format': pretokenize.FORMAT_VERSION,
      'trainable_parameters': trainable_parameters(
          compiled.abstract_state.params, task.trainable),
      'flops_per_token': task.flops_per_token,
      'mesh': dict(mesh.shape), 'processes': jax.process_count(),
      'step_memory_bytes': compiled.memory_bytes,
      'data_skipped': data.prepared.skipped})
  storage.write_text(os.path.join(workdir, _SHARDING_REPORT),
                     f'mesh {dict(mesh.shape)}\n{compiled.layout}\n')
  data.tokenizer.save(os.path.join(workdir, 'tokenizer.model'))


def restore_or_init(cfg, workdir: str, ckpt: checkpoint_lib.Checkpointer,
                    steps: Steps, compiled: Compiled, place: Placement,
                    train_iter) -> TrainState:
  """The newest intact checkpoint in ``workdir`` (``train_iter`` resumes
  with it; corrupt ones are set aside, kept), else ``cfg.init_from``'s
  parameters or state, else a fresh state; born sharded (a task's init
  inputs are placed on the mesh only for a fresh state)."""
  abstract_state, state_sh = compiled.abstract_state, compiled.state_sh
  fresh = lambda: sharding.create_sharded(steps.init_state, state_sh,
                                          *init_inputs(steps, place))
  # A checkpoint written before the divergence counters existed gets
  # fresh ones.
  restored = ckpt.restore_latest(
      abstract_state, train_iter, say=say,
      defaults=lambda: {'health': jax.jit(
          divergence.init_health, out_shardings=state_sh.health)()})
  if restored is not None:
    state, latest = restored
    say(f'resumed from the checkpoint at step {latest} in {workdir}')
    return state
  if cfg.init_from and checkpoint_lib.is_params_only(cfg.init_from):
    # An imported checkpoint (experiments/import_hf.py): its parameters,
    # with this run's fresh optimizer state.
    state = fresh().replace(
        params=checkpoint_lib.restore_params(cfg.init_from,
                                             abstract_state.params))
    say(f'initialized from the parameters imported in {cfg.init_from}')
    return state
  if cfg.init_from:
    return _init_from(cfg.init_from, abstract_state)
  return fresh()


def _init_from(other_workdir: str, abstract_state):
  """The latest state of another run (e.g. phase 1 for phase 2)."""
  directory = os.path.join(other_workdir, 'checkpoints')
  step, _ = checkpoint_lib.choose_step(directory)
  if step is None:
    raise ResumeError(f'init_from={other_workdir!r} has no checkpoint.')
  checkpoint_lib.verify_on_every_process(
      os.path.join(storage.absolute(directory), str(step)))
  with _manager(directory) as manager:
    _check_same_parameters(
        other_workdir, manager.item_metadata(step)['state']['params'],
        abstract_state.params)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state)))
  say(f'initialized from {other_workdir} step {step}')
  return restored['state']


def _manager(directory: str) -> ocp.CheckpointManager:
  """A reader of the pretraining checkpoints in ``directory``."""
  return ocp.CheckpointManager(
      storage.absolute(directory),
      item_handlers={'state': ocp.StandardCheckpointHandler()})


def check_init_from(other_workdir: str, steps: Steps) -> None:
  """Fails before anything is compiled or written when the latest
  checkpoint of ``other_workdir`` holds another model than ``steps``'s
  (``_check_same_parameters``): its parameters' shapes from orbax's
  metadata, this model's from tracing its init (``jax.eval_shape``)."""
  directory = os.path.join(other_workdir, 'checkpoints')
  step, _ = checkpoint_lib.choose_step(directory)
  if step is None:   # Gone since check_before_writing looked.
    raise ResumeError(f'init_from={other_workdir!r} has no checkpoint.')
  with _manager(directory) as manager:
    saved = manager.item_metadata(step)['state']['params']
  mine = sharding.strip_boxes(
      jax.eval_shape(steps.init_state, *init_inputs(steps))).params
  _check_same_parameters(other_workdir, saved, mine)


def _check_same_parameters(other_workdir: str, saved, mine) -> None:
  """Fails, naming them, on parameters that ``other_workdir`` lacks, that
  this model lacks, or whose shapes differ (another model size)."""
  wrong = checkpoint_lib.parameter_differences(saved, mine)
  if wrong:
    raise ResumeError(
        f'init_from={other_workdir!r} holds another model: '
        f'{checkpoint_lib.name_differences(wrong)}. Use the model settings '
        'that run had (its run_meta.json), or train from scratch.')


# ---------------------------------------------------------------------------
# Train loop.


class TrainLoop:
  """The train loop and its hooks (evaluate, log, save), over what they
  share: the compiled steps, the data, the checkpointer, the metric writer
  and the divergence monitor.

  A logged step's metrics are fetched after the next step is dispatched, so
  the device never waits for the host; they are fetched at once where a
  checkpoint follows (no checkpoint after an unseen divergence) and at the
  last step.
  """

  def __init__(self, cfg, workdir: str, place: Placement, data: InputData,
               compiled: Compiled, ckpt: checkpoint_lib.Checkpointer,
               flops_per_token: float, state: TrainState):
    self._cfg, self._workdir, self._place = cfg, workdir, place
    self._data, self._compiled, self._ckpt = data, compiled, ckpt
    self._flops_per_token = flops_per_token
    self.num_train_steps = cfg.num_train_steps or cfg.total_steps
    first_step = int(jax.device_get(state.step))
    self.writer = metric_writers.MetricWriter(
        workdir, self.num_train_steps, first_step,
        enabled=jax.process_index() == 0)
    self._monitor = divergence.Monitor(
        cfg.divergence.policy, cfg.divergence.halt_after,
        cfg.divergence.spike_factor, self.writer.message,
        start=jax.device_get(state.health))
    # The devices' peak FLOP/s (None: unknown), for MFU.
    self._peak = flops.peak_flops(place.mesh.devices.flat[0].device_kind)
    self.writer.message(
        f'training steps {first_step}..{self.num_train_steps} on '
        f'{place.mesh.size} device(s); compile {compiled.seconds:.1f}s; '
        f'{flops_per_token / 1e9:.3f} GFLOP per token; '
        f'{compiled.memory_text}')
    self._t_last = time.time()   # When the last logged step was written.

  def to_global(self, batch: dict) -> dict:
    """This process's rows of a batch as the global batch (jax.Array)."""
    return sharding.make_global_batch(
        {k: batch[k] for k in self._data.global_spec}, self._place.batch_sh,
        self._cfg.batch_size)

  def evaluate(self, params) -> dict:
    """``eval_*`` metrics of ``params`` over every eval batch."""
    sums = None
    for batch in self._data.eval_batches:
      out = self._compiled.eval_step(params, self.to_global(batch))
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    return {f'eval_{k}': v for k, v in
            losses.summarize(jax.device_get(sums)).items()}

  def run(self, state: TrainState,
          watch: preemption.PreemptionWatch) -> TrainState:
    """Trains from ``state``'s step to the last one, checkpointing when due
    and at the end; a preemption notice (``watch``'s, entered before the
    input and the compile) checkpoints the next step and raises
    ``preemption.Preempted``; one before the first step raises it at once,
    with nothing new to save (under JAX's preemption service, at the first
    step the processes agree on: the next one)."""
    cfg, ckpt, train_iter = self._cfg, self._ckpt, self._data.train_iter
    step = int(jax.device_get(state.step))
    tokens, pending = 0, None
    # A notice during start-up: no step is taken, nothing new is saved.
    early = step < self.num_train_steps and watch.reached(step)
    preempted = early
    try:
      while not preempted and step < self.num_train_steps:
        batch = next(train_iter)
        # This process's rows that no other process counts.
        tokens += int(batch['attention_mask'][self._place.counted].sum())
        state, metrics = self._compiled.train_step(state,
                                                   self.to_global(batch))
        step += 1
        ckpt.check()   # A failed background save stops the run now.
        self.writer.advance(step)
        if pending is not None:
          self._log(pending)
          pending = None
        last = step == self.num_train_steps
        if step % cfg.log_every_steps == 0 or last:
          for value in jax.tree.leaves(metrics):
            value.copy_to_host_async()
          entry = {'step': step, 'metrics': metrics, 'tokens': tokens,
                   'statistics': batch[pipeline.STATISTICS],
                   'eval': (self.evaluate(state.params)
                            if step % cfg.eval_every_steps == 0 or last
                            else {})}
          tokens = 0
          if last or ckpt.is_due(step):
            self._log(entry)
          else:
            pending = entry
        preempted = not last and watch.reached(step)
        if preempted and pending is not None:
          self._log(pending)
        self._save(step, state, force=last or preempted)
        if preempted:
          break
      # Still watching: a second notice (SLURM signals again at the time
      # limit) must not kill the save of the first one's checkpoint.
      ckpt.close()     # Waits until the last checkpoint is written.
    except BaseException:
      # The save in flight completes, so the checkpoint a message names
      # exists; the lines logged up to the error reach a bucket workdir
      # (a divergence halt's are the ones that show it); the original
      # error is the one raised.
      with contextlib.suppress(Exception):
        ckpt.close()
      with contextlib.suppress(Exception):
        self.writer.close()
      raise
    train_iter.close()   # Stops Grain's workers and frees their buffers.
    if preempted:
      self.writer.message(
          (f'preemption notice before step {step + 1}: nothing new to save'
           if early else
           f'preemption notice: saved the checkpoint at step {step}')
          + f'; exiting with status {preemption.EXIT_PREEMPTED} to be '
          'relaunched.')
      self.writer.close()
      raise preemption.Preempted(step, self._workdir, saved=not early)
    return state

  def _last_checkpoint(self) -> str:
    latest = self._ckpt.latest_step(agreed=False)   # For a message.
    return ('none (no checkpoint was written)' if latest is None else
            f'step {latest} in {self._ckpt.directory}')

  def _log(self, entry: dict) -> None:
    """Writes a logged step's metrics, fetched now (waiting for them), after
    the divergence check."""
    step, metrics = entry['step'], jax.device_get(entry['metrics'])
    self._monitor.check(step, metrics['health'], self._last_checkpoint())
    # The real tokens since the last log and the logged batch's masking
    # counts, summed over the processes' rows (each reads its own).
    counts = distributed.sum_over_processes(np.concatenate(
        [[entry['tokens']], entry['statistics']]))
    tokens, statistics = counts[0], counts[1:]
    now = time.time()
    summary = losses.summarize(metrics)
    summary.update(loss=metrics['loss'], grad_norm=metrics['grad_norm'],
                   learning_rate=metrics['learning_rate'])
    summary.update({k: metrics['health'][k] for k in divergence.LOGGED})
    # Achieved model FLOP/s (analytic, real tokens) and, where the device's
    # peak is known, MFU: timings, kept apart from the metrics that a rerun
    # reproduces byte for byte.
    timing = {'tokens_per_second': tokens / max(now - self._t_last, 1e-9)}
    timing['tflops_per_second'] = (timing['tokens_per_second']
                                   * self._flops_per_token / 1e12)
    if self._peak:
      timing['mfu'] = timing['tflops_per_second'] * 1e12 / (
          self._peak * self._place.mesh.size)
    # Masking telemetry of the logged step's batch (like the metrics); none
    # for a batch that is not masked (a task beyond masking alone).
    if np.any(statistics):
      masking_summary = masking_lib.summarize_statistics(statistics)
      if self._cfg.masking.audit_tolerance:
        masking_lib.audit(masking_summary, self._data.masking_cfg,
                          self._cfg.masking.audit_tolerance,
                          f'at step {step}')
      summary.update(masking_summary)
    summary.update(entry['eval'])
    summary.update(self._data.data_skipped)
    self.writer.write(step, summary, timing)
    self._t_last = now

  def _save(self, step: int, state: TrainState, force: bool) -> None:
    """A checkpoint of ``step`` if due (or ``force``), after the divergence
    check (its counters are fetched with the state) and after the metrics
    written so far reach the disk."""
    if not (force or self._ckpt.is_due(step)):
      return
    self._monitor.check(step, jax.device_get(state.health),
                        self._last_checkpoint())
    self.writer.sync()
    self._ckpt.save(step, state, self._data.train_iter, force=True)


# ---------------------------------------------------------------------------
# Final evaluation against the most-frequent-token baseline.


def final_evaluation(loop: TrainLoop, params, data: InputData) -> dict:
  """``loop.evaluate(params)`` and ``baseline_mlm_accuracy``: always
  predicting the training data's most frequent token at the same masked
  positions. Prints both (a run without MLM: its tasks' accuracies) and
  closes the metric writer."""
  final = loop.evaluate(params)
  if 'eval_mlm_accuracy' not in final:   # No MLM: the tasks' own figures.
    loop.writer.message('final held-out ' + ', '.join(
        f'{k[len("eval_"):]} {v:.4f}' for k, v in sorted(final.items())
        if k.endswith('_accuracy')))
    loop.writer.close()
    return final
  token = most_frequent_token(data.prepared.train_unigram_counts)
  final['baseline_mlm_accuracy'] = baseline = baseline_accuracy(
      [loop.to_global(b) for b in data.eval_batches], token)
  accuracy = final['eval_mlm_accuracy']
  loop.writer.message(
      f'final held-out MLM accuracy {accuracy:.4f}; '
      f'always predicting the most frequent token '
      f'({data.tokenizer.id_to_piece(token)!r}) scores '
      f'{baseline:.4f} on the same positions '
      f'({accuracy / max(baseline, 1e-9):.2f}x).')
  loop.writer.close()
  return final


def most_frequent_token(unigram_counts: np.ndarray) -> int:
  """The most frequent non-special token of the training split(s)."""
  counts = unigram_counts.copy()
  counts[:tokenizer_lib.NUM_SPECIAL] = -1
  return int(np.argmax(counts))


def baseline_accuracy(batches: list[dict], token: int) -> float:
  """Accuracy of always predicting ``token`` at the eval batches' positions.

  ``batches`` are global (jax.Array, on every host) or local numpy batches.
  """
  hits = total = 0.0
  for b in batches:
    weights, ids = b['masked_weights'], b['masked_ids']
    hits += float(jax.device_get((weights * (ids == token)).sum()))
    total += float(jax.device_get(weights.sum()))
  return hits / max(total, 1.0)


# ---------------------------------------------------------------------------
# Entry point.


def main(argv) -> None:
  how = train_flags.start(argv)
  say(f'jax {jax.__version__}: {how}')
  try:
    with errors.reporting('train'):
      train_and_evaluate(train_flags.CONFIG.value, train_flags.WORKDIR.value)
  except preemption.Preempted as e:
    say(str(e))
    sys.exit(preemption.EXIT_PREEMPTED)


def run() -> None:
  """Console entry point (``bertjax-train``)."""
  # --help lists the key flags of the script that runs (sys.argv[0]): this
  # file under python -m bertjax.train, the console script as bertjax-train.
  # The flags are train_flags' (defined once there).
  for flag in flags.FLAGS.get_key_flags_for_module(train_flags):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  app.run(main, flags_parser=errors.flags_parser('train'))


if __name__ == '__main__':
  run()
