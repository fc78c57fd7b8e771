"""Pretraining: one ``train_and_evaluate`` that reads top to bottom.

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
from ml_collections import config_flags
import numpy as np
import optax

from bertjax.runtime import checkpoint as checkpoint_lib
from bertjax import config_check
from bertjax import config_lib
from bertjax.runtime import distributed
from bertjax.runtime import divergence
from bertjax import flops
from bertjax.runtime import metric_writers
from bertjax import objectives
from bertjax.objectives import losses
from bertjax import optim
from bertjax.runtime import preemption
from bertjax import sharding
from data_pipelines import corpus as corpus_lib
from data_pipelines import masking as masking_lib
from data_pipelines import mixture as mixture_lib
from data_pipelines import pipeline
from data_pipelines import pretokenize
from data_pipelines import tokenizer as tokenizer_lib

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, e.g. '
    'experiments/configs/demo.py or experiments/configs/bert.py:size=large',
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory for checkpoints, metrics and TensorBoard '
    'events. Rerunning in the same workdir resumes.')
_MULTIHOST = flags.DEFINE_enum(
    'multihost', 'auto', distributed.MODES, 'auto: join a multi-process job '
    'when SLURM or a TPU pod is detected, or when the coordinator flags are '
    'given; on: always call jax.distributed.initialize() (Cloud TPU VM '
    'slices); off: single process.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', '', 'HOST:PORT of process 0, for a multi-process '
    'job that JAX cannot detect (with --num_processes and --process_id).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0,
                                      'Processes in the job (explicit mode).')
_PROCESS_ID = flags.DEFINE_integer('process_id', -1,
                                   'This process, 0..num_processes-1.')

# Independent keys split once from the seed: model init, the training
# steps' keys (dropout; ELECTRA's masking and sampling), and evaluation's.
_MODEL_KEY, _DROPOUT_KEY, _EVAL_KEY = 1, 2, 3
# Config sections a resumed run must share with the run that wrote the
# checkpoints: anything else (steps, logging, eval) may change on resume.
# With a mixture, its components and exponent replace data.corpus (which the
# mixture ignores), see run_identity.
_RUN_IDENTITY = ('seed', 'model', 'data.corpus', 'data.tokenizer',
                 'data.max_seq_length')
_MIXTURE_IDENTITY = ('data.mixture', 'data.mixture_exponent')
_RUN_META = 'run_meta.json'
_SHARDING_REPORT = 'sharding.txt'


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # divergence.init_health()'s counters (None: a fine-tuning state).
  health: Any = None


class ResumeError(ValueError):
  """The workdir holds a run that this config cannot continue."""


def _section(cfg, dotted: str):
  value = cfg
  for part in dotted.split('.'):
    value = value[part]
  return value.to_dict() if hasattr(value, 'to_dict') else value


def run_identity(cfg) -> dict:
  names = list(_RUN_IDENTITY)
  if mixture_lib.is_mixture(cfg.data):
    names.remove('data.corpus')
    names.extend(_MIXTURE_IDENTITY)
  identity = {name: _section(cfg, name) for name in names}
  # Rematerialization changes memory, not results, and the attention kernel
  # only the rounding: a run may resume with another setting (and predates
  # the field).
  identity['model'].pop('remat', None)
  identity['model'].pop('attention', None)
  return identity


def _with_new_fields(identity: dict) -> dict:
  """A saved identity with the fields added to its sections since it was
  written, at their defaults: a new field's default keeps the behaviour of
  the code before it, so an older run resumes unless its setting changed."""
  defaults = json.loads(json.dumps(run_identity(config_lib.base_config())))
  return {name: ({**defaults[name], **value}
                 if isinstance(value, dict)
                 and isinstance(defaults.get(name), dict) else value)
          for name, value in identity.items()}


def check_resume_compatible(workdir: str, cfg) -> dict | None:
  """Fails when ``workdir`` holds a run with a different identity."""
  path = os.path.join(workdir, _RUN_META)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  mine = json.loads(json.dumps(run_identity(cfg)))
  theirs = _with_new_fields(saved['identity'])
  # Over both key sets: a mixture run and a single-corpus run differ in them.
  changed = sorted(k for k in set(mine) | set(theirs)
                   if theirs.get(k) != mine.get(k))
  if changed:
    raise ResumeError(
        f'workdir {workdir!r} holds a run whose {", ".join(changed)} differ '
        f'from this config (saved: {[theirs.get(k) for k in changed]}'
        f', now: {[mine.get(k) for k in changed]}). Its checkpoints cannot '
        'continue with these settings: use a new --workdir, or restore the '
        'original settings.')
  return saved


def check_tokenizer_matches(saved_meta: dict | None,
                            tokenizer: tokenizer_lib.Tokenizer,
                            workdir: str) -> None:
  if saved_meta and saved_meta['tokenizer_sha256'] != tokenizer.sha256:
    raise ResumeError(
        f'the tokenizer (sha256 {tokenizer.sha256[:12]}, '
        f'{tokenizer.vocab_size} pieces) is not the one the checkpoints in '
        f'{workdir!r} were trained with (sha256 '
        f'{saved_meta["tokenizer_sha256"][:12]}, {saved_meta["vocab_size"]} '
        'pieces). Use the original tokenizer model, or a new --workdir.')


def _say(text: str) -> None:
  """Prints on process 0 only (absl INFO is silenced by default)."""
  if jax.process_index() == 0:
    print(text, flush=True)


def _write_json_atomic(path: str, value) -> None:
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def _prepare_data(cfg, saved_meta: dict | None, workdir: str):
  """The tokenizer (checked against the workdir's) and the pre-tokenized
  data, built on first use and then reused."""
  if mixture_lib.is_mixture(cfg.data):
    # One tokenizer for all components; each component built alone.
    fingerprints = mixture_lib.fingerprints(cfg.data)
    tokenizer = mixture_lib.load_or_train_tokenizer(cfg.data, fingerprints)
    check_tokenizer_matches(saved_meta, tokenizer, workdir)
    prepared = mixture_lib.prepare(cfg.data, tokenizer=tokenizer,
                                   corpus_fingerprints=fingerprints)
    _say(f'corpus mixture:\n{prepared.summary()}')
    return tokenizer, prepared
  corpus_spec = corpus_lib.CorpusSpec.from_config(cfg.data.corpus)
  corpus_fingerprint = corpus_lib.fingerprint(corpus_spec)
  tokenizer = pretokenize.load_or_train_tokenizer(cfg.data, corpus_spec,
                                                  corpus_fingerprint)
  check_tokenizer_matches(saved_meta, tokenizer, workdir)
  return tokenizer, pretokenize.prepare(cfg.data, tokenizer=tokenizer,
                                        corpus_fingerprint=corpus_fingerprint)


def most_frequent_token(unigram_counts: np.ndarray) -> int:
  """The most frequent non-special token of the training split(s)."""
  counts = unigram_counts.copy()
  counts[:tokenizer_lib.NUM_SPECIAL] = -1
  return int(np.argmax(counts))


def trainable_parameters(params, trainable=None) -> int:
  """Parameters that train (a frozen teacher's excluded)."""
  sizes = jax.tree.map(lambda x: int(np.prod(x.shape)), nn.unbox(params))
  if trainable is not None:
    sizes = jax.tree.map(lambda n, t: n if t else 0, sizes,
                         trainable(nn.unbox(params)))
  return sum(jax.tree.leaves(sizes))


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


class Steps(NamedTuple):
  """What training runs on the devices, before it is sharded and compiled.

  ``init_state()`` -> ``TrainState`` (boxed with logical axes);
  ``train_step(state, batch)`` -> (state, metrics);
  ``eval_step(params, batch)`` -> metric sums.
  """
  init_state: Callable[[], TrainState]
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  eval_step: Callable[[Any, dict], dict]


def make_steps(cfg, task: objectives.Task, global_spec: dict) -> Steps:
  """The init, update and eval functions of ``task`` with ``cfg``'s
  optimizer; every key derives from ``cfg.seed``."""
  tx, schedule = optim.make_optimizer(cfg)
  root_key = jax.random.key(cfg.seed)
  eval_key = jax.random.fold_in(root_key, _EVAL_KEY)
  step_root = root_key if cfg.step_rng == 'threefry' else jax.random.key(
      cfg.seed, impl=cfg.step_rng)

  def init_state():
    dummy = {k: jnp.zeros(shape, dtype) for k, (shape, dtype)
             in global_spec.items()}
    params = task.init(jax.random.fold_in(root_key, _MODEL_KEY), dummy)
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

  def loss_fn(params, batch, key):
    deterministic = key is None
    return task.loss(params, batch, eval_key if deterministic else key,
                     deterministic)

  def train_step(state: TrainState, batch):
    dropout_key = jax.random.fold_in(
        jax.random.fold_in(step_root, _DROPOUT_KEY), state.step)
    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, dropout_key)
    updates, opt_state = optimizer(state.params).update(
        grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    # A non-finite step keeps the state it started from (and is counted).
    (params, opt_state), health = divergence.guard(
        state.health, state.step, loss, grad_norm, (params, opt_state),
        (state.params, state.opt_state), cfg.divergence.spike_factor,
        cfg.divergence.spike_window)
    metrics = dict(sums, loss=loss, grad_norm=grad_norm,
                   learning_rate=schedule(state.step), health=health)
    return TrainState(state.step + 1, params, opt_state, health), metrics

  def eval_step(params, batch):
    return loss_fn(params, batch, None)[1]

  return Steps(init_state, train_step, eval_step)


def compile_train_step(steps: Steps, mesh, state_sh, batch_sh,
                       abstract_state, abstract_batch):
  """The update step compiled ahead of time for these shardings; the
  state's buffers are donated (updated in place)."""
  return jax.jit(steps.train_step, in_shardings=(state_sh, batch_sh),
                 out_shardings=(state_sh, sharding.replicated(mesh)),
                 donate_argnums=0).lower(abstract_state,
                                         abstract_batch).compile()


def train_and_evaluate(cfg, workdir: str) -> dict:
  """Trains per ``cfg`` in ``workdir`` (resuming if possible).

  Returns the final eval metrics (``eval_mlm_accuracy`` etc.) together with
  ``baseline_mlm_accuracy``, the accuracy of predicting the most frequent
  token at the same positions.
  """
  # ---- Checks that read no data and write nothing.
  objective = objectives.get(cfg.objective.name)
  cfg = objective.prepare_config(cfg)   # E.g. a teacher's tokenizer.
  config_lib.validate(cfg)
  for warning in config_check.warnings_for(cfg):  # Mixes no paper used.
    logging.warning('config: %s', warning)
    _say(f'warning: {warning}')
  is_mixture = mixture_lib.is_mixture(cfg.data)
  if is_mixture:  # Every component, before any of them is built.
    mixture_lib.validate(cfg.data)
  else:
    corpus_lib.validate(corpus_lib.CorpusSpec.from_config(cfg.data.corpus))
  if cfg.init_from and checkpoint_lib.latest_step(
      os.path.join(cfg.init_from, 'checkpoints')) is None:
    raise ResumeError(f'init_from={cfg.init_from!r} has no checkpoint.')
  if '://' in workdir:
    raise ValueError(f'--workdir={workdir!r}: the workdir is written through '
                     'the local filesystem; for a bucket, mount it (gcsfuse) '
                     'and give the mounted path.')
  saved_meta = check_resume_compatible(workdir, cfg)
  is_main = jax.process_index() == 0
  num_train_steps = cfg.num_train_steps or cfg.total_steps

  # ---- Mesh, and the rows of each global batch this process reads.
  mesh = sharding.make_mesh(cfg.sharding.mesh_shape, cfg.sharding.replicas)
  rules = sharding.logical_rules(cfg)
  batch_sh = sharding.batch_sharding(mesh)
  sharding.check_batch_divisible(cfg.batch_size, mesh)
  rows = sharding.process_batch_rows(batch_sh, cfg.batch_size)
  _say(f'mesh {dict(mesh.shape)} over {mesh.size} device(s) '
       f'({jax.devices()[0].device_kind}), {jax.process_count()} '
       f'process(es); each reads {len(rows)} of the {cfg.batch_size} rows '
       'of a batch')

  # ---- Input pipeline (the tokenizer is checked before the data is built).
  _say(f'tokenizer and pre-tokenized data under {cfg.data.data_dir} (built '
       'on first use, then reused)')
  with distributed.process_zero_first('input data'):
    tokenizer, prepared = _prepare_data(cfg, saved_meta, workdir)
  # What reading the corpus dropped or repaired, in every logged step's
  # metrics (data_skipped_*) and run_meta.json.
  data_skipped = {f'data_skipped_{k}': v for k, v in prepared.skipped.items()}
  if any(data_skipped.values()):
    _say('warning: preparing the data skipped or repaired '
         f'{pretokenize.format_skipped(prepared.skipped)} (what each count '
         'means: data_pipelines/corpus.py SKIP_COUNTERS)')
  vocab_size = tokenizer_lib.padded_vocab_size(tokenizer.vocab_size)
  train_iter = iter(pipeline.train_dataset(prepared, cfg, rows))
  eval_batches = pipeline.eval_batches(prepared, cfg, rows)
  spec = pipeline.batch_spec(cfg, len(rows))
  masking_cfg = pipeline.masking_config(cfg, prepared)
  audit_tolerance = cfg.masking.audit_tolerance
  if audit_tolerance:  # Fail fast, before compiling: audit the eval batches.
    masking_lib.audit(
        masking_lib.summarize_statistics(
            sum(b[pipeline.STATISTICS] for b in eval_batches)),
        masking_cfg, audit_tolerance, 'on the eval batches')
  global_spec = pipeline.batch_spec(cfg)

  # ---- Model and optimizer.
  task = objective.make_task(cfg, vocab_size)
  steps = make_steps(cfg, task, global_spec)

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    # ---- Shard: the state is born sharded.
    abstract_state, state_sh = sharding.state_shardings(steps.init_state,
                                                        mesh, rules)
    sharding.check_divisible(abstract_state, mesh)
    layout, replicated_warnings = sharding.sharding_report(
        abstract_state.params, mesh)
    for warning in replicated_warnings:
      logging.warning('sharding: %s', warning)
      _say(f'warning: {warning}')
    _say(f'parameters: {layout.splitlines()[-1]} (the layout of every leaf '
         f'is in {os.path.join(workdir, _SHARDING_REPORT)})')
    abstract_batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sh)
                      for k, (shape, dtype) in global_spec.items()}

    def to_global(batch):
      return sharding.make_global_batch({k: batch[k] for k in spec},
                                        batch_sh, cfg.batch_size)

    # ---- Update step, compiled ahead of time.
    t0 = time.time()
    step_fn = compile_train_step(steps, mesh, state_sh, batch_sh,
                                 abstract_state, abstract_batch)
    eval_fn = jax.jit(steps.eval_step,
                      in_shardings=(state_sh.params, batch_sh),
                      out_shardings=sharding.replicated(mesh))
    compile_seconds = time.time() - t0
    # Fails here, before anything is written, when a device is too small.
    memory_text, memory_bytes = sharding.memory_report(
        step_fn, jax.local_devices()[0])
    logging.info('train step: %s', memory_text)
    _say(f'compiled the train step in {compile_seconds:.1f}s; {memory_text}')

    # ---- Load checkpoint, or initialize. First write to the workdir.
    os.makedirs(workdir, exist_ok=True)
    distributed.check_shared_directory(workdir)
    if is_main:
      _write_json_atomic(os.path.join(workdir, _RUN_META), {
          'identity': run_identity(cfg), 'tokenizer_sha256': tokenizer.sha256,
          'vocab_size': tokenizer.vocab_size, 'config': cfg.to_dict(),
          'trainable_parameters': trainable_parameters(
              abstract_state.params, task.trainable),
          'flops_per_token': task.flops_per_token,
          'mesh': dict(mesh.shape), 'processes': jax.process_count(),
          'step_memory_bytes': memory_bytes,
          'data_skipped': prepared.skipped})
      with open(os.path.join(workdir, _SHARDING_REPORT), 'w') as f:
        f.write(f'mesh {dict(mesh.shape)}\n{layout}\n')
      tokenizer.save(os.path.join(workdir, 'tokenizer.model'))
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, 'checkpoints'), cfg.checkpoint_every_steps,
        cfg.keep_checkpoints)
    # The newest intact checkpoint; corrupt ones are set aside (kept).
    # A checkpoint written before the divergence counters existed gets
    # fresh ones.
    restored = ckpt.restore_latest(
        abstract_state, train_iter, say=_say,
        defaults=lambda: {'health': jax.jit(
            divergence.init_health, out_shardings=state_sh.health)()})
    if restored is not None:
      state, latest = restored
      _say(f'resumed from the checkpoint at step {latest} in {workdir}')
    elif cfg.init_from and checkpoint_lib.is_params_only(cfg.init_from):
      # An imported checkpoint (experiments/import_hf.py): its parameters,
      # with this run's fresh optimizer state.
      state = sharding.create_sharded(steps.init_state, state_sh).replace(
          params=checkpoint_lib.restore_params(cfg.init_from,
                                               abstract_state.params))
      _say(f'initialized from the parameters imported in {cfg.init_from}')
    elif cfg.init_from:
      state = _init_from(cfg.init_from, abstract_state)
    else:
      state = sharding.create_sharded(steps.init_state, state_sh)
    step = int(jax.device_get(state.step))

    def evaluate(params) -> dict:
      sums = None
      for batch in eval_batches:
        out = eval_fn(params, to_global(batch))
        sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
      return {f'eval_{k}': v for k, v in
              losses.summarize(jax.device_get(sums)).items()}

    # ---- Train loop.
    writer = metric_writers.MetricWriter(workdir, num_train_steps, step,
                                         enabled=is_main)
    monitor = divergence.Monitor(
        cfg.divergence.policy, cfg.divergence.halt_after,
        cfg.divergence.spike_factor, writer.message,
        start=jax.device_get(state.health))

    def last_checkpoint() -> str:
      latest = ckpt.latest_step()
      return ('none (no checkpoint was written)' if latest is None else
              f'step {latest} in {ckpt.directory}')
    peak = flops.peak_flops(mesh.devices.flat[0].device_kind)
    writer.message(f'training steps {step}..{num_train_steps} on '
                   f'{mesh.size} device(s); compile {compile_seconds:.1f}s; '
                   f'{task.flops_per_token / 1e9:.3f} GFLOP per token; '
                   f'{memory_text}')
    tokens, t_last = 0, time.time()

    def log(entry: dict) -> None:
      """Writes a logged step's metrics, fetched now (waiting for it)."""
      nonlocal t_last
      step_logged, metrics = entry['step'], jax.device_get(entry['metrics'])
      monitor.check(step_logged, metrics['health'], last_checkpoint())
      now = time.time()
      summary = losses.summarize(metrics)
      summary.update(loss=metrics['loss'], grad_norm=metrics['grad_norm'],
                     learning_rate=metrics['learning_rate'])
      summary.update({k: metrics['health'][k] for k in divergence.LOGGED})
      # Achieved model FLOP/s (analytic, real tokens) and, where the device's
      # peak is known, MFU: timings, kept apart from the metrics that a
      # rerun reproduces byte for byte.
      timing = {'tokens_per_second': entry['tokens'] / max(now - t_last,
                                                           1e-9)}
      timing['tflops_per_second'] = (timing['tokens_per_second']
                                     * task.flops_per_token / 1e12)
      if peak:
        timing['mfu'] = timing['tflops_per_second'] * 1e12 / (
            peak * mesh.size)
      # Masking telemetry of the logged step's batch (like the metrics).
      masking_summary = masking_lib.summarize_statistics(entry['statistics'])
      if audit_tolerance:
        masking_lib.audit(masking_summary, masking_cfg, audit_tolerance,
                          f'at step {step_logged}')
      summary.update(masking_summary)
      summary.update(entry['eval'])
      summary.update(data_skipped)
      writer.write(step_logged, summary, timing)
      t_last = now

    def save(force: bool = False) -> None:
      """A checkpoint of ``step`` if due (or ``force``), after the divergence
      check (its counters are fetched with the state) and after the metrics
      written so far reach the disk."""
      if not (force or ckpt.is_due(step)):
        return
      monitor.check(step, jax.device_get(state.health), last_checkpoint())
      writer.sync()
      ckpt.save(step, state, train_iter, force=True)

    # A logged step's metrics are fetched after the next step is dispatched,
    # so the device never waits for the host; they are fetched at once where
    # a checkpoint follows (no checkpoint after an unseen divergence) and at
    # the last step.
    pending, preempted = None, False
    try:
      with preemption.PreemptionWatch() as watch:
        while step < num_train_steps:
          batch = next(train_iter)
          tokens += int(batch['attention_mask'].sum()) * jax.process_count()
          state, metrics = step_fn(state, to_global(batch))
          step += 1
          ckpt.check()   # A failed background save stops the run now.
          writer.advance(step)
          if pending is not None:
            log(pending)
            pending = None
          last = step == num_train_steps
          if step % cfg.log_every_steps == 0 or last:
            for value in jax.tree.leaves(metrics):
              value.copy_to_host_async()
            entry = {'step': step, 'metrics': metrics, 'tokens': tokens,
                     'statistics': batch[pipeline.STATISTICS],
                     'eval': (evaluate(state.params)
                              if step % cfg.eval_every_steps == 0 or last
                              else {})}
            tokens = 0
            if last or ckpt.is_due(step):
              log(entry)
            else:
              pending = entry
          preempted = not last and watch.reached(step)
          if preempted and pending is not None:
            log(pending)
          save(force=last or preempted)
          if preempted:
            break
    except BaseException:
      # The save in flight completes, so the checkpoint a message names
      # exists; the original error is the one raised.
      with contextlib.suppress(Exception):
        ckpt.close()
      raise
    ckpt.close()         # Waits until the last checkpoint is written.
    train_iter.close()   # Stops Grain's workers and frees their buffers.
    if preempted:
      writer.message(f'preemption notice: saved the checkpoint at step '
                     f'{step}; exiting with status '
                     f'{preemption.EXIT_PREEMPTED} to be relaunched.')
      writer.close()
      raise preemption.Preempted(step, workdir)

    # ---- Final evaluation against the most-frequent-token baseline.
    final = evaluate(state.params)
    token = most_frequent_token(prepared.train_unigram_counts)
    final['baseline_mlm_accuracy'] = baseline_accuracy(
        [to_global(b) for b in eval_batches], token)
    writer.message(
        f'final held-out MLM accuracy {final["eval_mlm_accuracy"]:.4f}; '
        f'always predicting the most frequent token '
        f'({tokenizer.id_to_piece(token)!r}) scores '
        f'{final["baseline_mlm_accuracy"]:.4f} on the same positions '
        f'({final["eval_mlm_accuracy"] / max(final["baseline_mlm_accuracy"], 1e-9):.2f}x).')
    writer.close()
    return final


def _init_from(other_workdir: str, abstract_state):
  """The latest state of another run (e.g. phase 1 for phase 2)."""
  directory = os.path.join(other_workdir, 'checkpoints')
  step = checkpoint_lib.latest_step(directory)
  if step is None:
    raise ResumeError(f'init_from={other_workdir!r} has no checkpoint.')
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.CheckpointManager(
      os.path.abspath(directory),
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state)))
  _say(f'initialized from {other_workdir} step {step}')
  return restored['state']


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError('--config and --workdir are required.')
  if not flags.FLAGS['verbosity'].present:
    # Orbax and TFDS log every step of every save at INFO; -v 0 shows them.
    logging.set_verbosity(logging.WARNING)
  how = distributed.initialize(_MULTIHOST.value, _COORDINATOR.value,
                               _NUM_PROCESSES.value, _PROCESS_ID.value)
  _say(f'jax {jax.__version__}: {how}')
  try:
    train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except preemption.Preempted as e:
    _say(str(e))
    sys.exit(preemption.EXIT_PREEMPTED)


def run() -> None:
  """Console entry point (``bertjax-train``)."""
  app.run(main)


if __name__ == '__main__':
  run()
