r"""Task-specific distillation: a fine-tuned teacher into a student, on a task.

  python experiments/task_distill.py \
      --config=experiments/configs/task_distill.py \
      --config.teacher=$WORK/bert-base-sst2 --config.init=$WORK/tinybert4 \
      --workdir=$WORK/tinybert4-sst2

Jiao et al. 2020 (TinyBERT), Sec. 3.3-3.4, as huawei-noah/
Pretrained-Language-Model's TinyBERT/task_distill.py and
data_augmentation.py do it:

- ``teacher``: a fine-tuning run (bertjax.finetune's workdir) on the same
  task, frozen; its encoder and head run without dropout.
- ``init``: the student's pretrained encoder (a TinyBERT general
  distillation run, or any run fine-tuning reads), with a new head.
- Stage 1, intermediate layers (``distill.intermediate_epochs`` epochs at
  ``distill.intermediate_learning_rate``, constant as the reference's
  BertAdam ``schedule='none'``; ``distill.intermediate_schedule``): the
  embedding, hidden-state and attention-score losses of general
  distillation (objectives/tinybert.py), through the learned projections,
  student layer m against teacher layer g(m). Stage 2, prediction layer
  (``distill.prediction_epochs`` at ``distill.prediction_learning_rate``,
  warmup then linear decay;
  ``distill.prediction_schedule``): soft cross-entropy between the
  heads' logits at ``distill.temperature`` (regression: the student's
  squared error against the gold scores, as the code's STS-B branch).
  Each stage is one run of the script in the reference (a fresh BertAdam
  each); here two phases of one command, ``WORKDIR/intermediate`` and
  ``WORKDIR/prediction``, each checkpointed and resumed like fine-tuning,
  the second starting from the first's student. The first starts the
  projections from a general TinyBERT ``init``'s where they fit, as the
  code's task student loads ``fit_dense`` with the encoder.
- Augmentation (``augment.copies`` > 0): each training example also
  appears as ``copies`` rewrites in which each word, with probability
  ``augment.replace_prob``, is replaced by one of the ``augment.candidates``
  most likely words of a BERT MLM (``augment.mlm`` : the teacher's
  pretraining run by default) at that word's position masked, with the
  text again as segment B (``MaskedLM.row``); a pair's texts in turn
  (``augment_examples``). Words are
  the reference's: split at punctuation as BERT's basic tokenizer does,
  letters a-z only, never one of its English stop words (``not`` stays
  ``not``). The paper takes MLM candidates for single-piece words and
  GloVe neighbours for the rest; with no GloVe here, words of several
  pieces are kept.

Writes ``distilled.json`` (the student's held-out scores as fine-tuning's
``downstream.json`` has them: the task's metrics, the dev split's with
``task.dev_fraction``, and the per-example predictions of classification
and regression) and ``augment.json`` (what augmentation added; the dev
split is carved out before it, so no rewrite of a dev example trains).
Covers sentence-level tasks (classification and regression), as the
paper's GLUE tasks; every random draw derives from ``cfg.seed``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import finetune
from bertjax import optim
from bertjax import runs
from bertjax import sharding
from bertjax import storage
from bertjax import train as train_lib
from bertjax.interop import hf_convert
from bertjax.models import bert as bert_lib
from bertjax.models import heads
from bertjax.objectives import distillation
from bertjax.objectives import tinybert
from bertjax.runtime import checkpoint as checkpoint_lib
from data_pipelines import instances as instances_lib
from data_pipelines import tokenizer as tokenizer_lib

RESULT = 'distilled.json'
AUGMENT = 'augment.json'
META = 'task_distill_meta.json'
# The config sections a resumed run must share (the rest says where files
# go and how often to log).
_IDENTITY = ('seed', 'init', 'init_step', 'teacher', 'task', 'max_seq_length',
             'batch_size', 'pooling', 'head_init', 'model', 'optimizer',
             'distill', 'augment')
STAGES = ('intermediate', 'prediction')
KINDS = ('classification', 'regression')
_FINETUNE_META = 'finetune_meta.json'
_AUGMENT_KEY = 5   # Beside finetune's keys 1-4 (init, dropout, order, dev).
_say = train_lib.say


class DistillError(finetune.FinetuneError):
  """A config, teacher or student task distillation cannot use."""


def base_config() -> ml_collections.ConfigDict:
  """Fine-tuning's fields with task_distill.py's settings (batch 32; stage
  1: 10 epochs at 5e-5; stage 2: 3 epochs at 3e-5; temperature 1) and
  data_augmentation.py's (20 copies, p 0.4, 15 candidates; off)."""
  c = finetune.base_config()
  # BertAdam: each gradient tensor clipped to norm 1. Each stage has its
  # own rate and schedule (distill.*).
  c.optimizer.grad_clip = 'per_tensor'
  del c.optimizer['schedule']
  c.teacher = ''                  # A fine-tuning run's workdir.
  c.distill = tinybert.defaults()
  del c.distill['teacher_workdir'], c.distill['intermediate_steps']
  del c.distill['mlm_weight'], c.distill['prediction_weight']
  c.distill.intermediate_epochs = 10.0
  c.distill.prediction_epochs = 3.0
  c.distill.intermediate_learning_rate = 5e-5
  c.distill.prediction_learning_rate = 3e-5
  # task_distill.py's BertAdam: schedule 'none' (a constant rate, no
  # warmup) unless --pred_distill, then warmup then linear decay to 0.
  c.distill.intermediate_schedule = 'constant'
  c.distill.prediction_schedule = 'warmup_linear'
  c.augment = ml_collections.ConfigDict()
  c.augment.copies = 0            # Rewrites per example; 0 = none (20).
  c.augment.replace_prob = 0.4
  c.augment.candidates = 15
  c.augment.mlm = ''              # '' = the teacher's pretraining run.
  c.augment.batch_size = 64       # MLM forward passes at a time.
  return c


def validate(cfg) -> None:
  """Every check that reads no data, naming the field and what to use."""
  finetune.validate(cfg)
  d, a = cfg.distill, cfg.augment
  errors = []
  if not (cfg.teacher and storage.isfile(os.path.join(cfg.teacher,
                                                      _FINETUNE_META))):
    errors.append(f'teacher={cfg.teacher!r} is not a fine-tuning run\'s '
                  'workdir (it has no finetune_meta.json): fine-tune the '
                  'teacher on the task first (experiments/finetune.py; '
                  'with --compare_scratch its runs are in '
                  'WORKDIR/pretrained/seed<N>).')
  if d.temperature <= 0:
    errors.append(f'distill.temperature={d.temperature} must be > 0.')
  for name in ('embedding_weight', 'hidden_weight', 'attention_weight'):
    if d[name] < 0:
      errors.append(f'distill.{name}={d[name]} must be >= 0.')
  for stage in STAGES:
    if d[f'{stage}_epochs'] < 0 or d[f'{stage}_learning_rate'] <= 0:
      errors.append(f'distill.{stage}_epochs must be >= 0 and '
                    f'distill.{stage}_learning_rate > 0.')
    if d[f'{stage}_schedule'] not in optim.SCHEDULES:
      errors.append(f'distill.{stage}_schedule={d[f"{stage}_schedule"]!r}; '
                    f'use one of {optim.SCHEDULES}.')
  if not d.intermediate_epochs + d.prediction_epochs:
    errors.append('distill.intermediate_epochs and prediction_epochs are '
                  'both 0: nothing would train (TinyBERT: 10 and 3).')
  if cfg.mode != 'full':
    errors.append(f'mode={cfg.mode!r}: the student distils in full (every '
                  "weight trains); use mode='full'.")
  if cfg.loss_reduction != 'mean':
    errors.append(f'loss_reduction={cfg.loss_reduction!r}: task '
                  "distillation's losses are TinyBERT's means; use 'mean'.")
  if cfg.optimizer.layerwise_lr_decay:
    errors.append('optimizer.layerwise_lr_decay='
                  f'{cfg.optimizer.layerwise_lr_decay}: TinyBERT trains '
                  'every layer at one rate, and task distillation has no '
                  'layer-wise decay; set it to 0.')
  if a.copies < 0 or not 0 <= a.replace_prob <= 1 or a.candidates < 1 or (
      a.batch_size < 1):
    errors.append('augment: copies >= 0, replace_prob in [0, 1], '
                  'candidates >= 1 and batch_size >= 1 (TinyBERT: 20, 0.4, '
                  f'15); got {a.copies}, {a.replace_prob}, {a.candidates}, '
                  f'{a.batch_size}.')
  if errors:
    raise DistillError('task distillation config: ' + ' '.join(errors))


# ---------------------------------------------------------------------------
# The teacher: a fine-tuning run, read back.


@dataclasses.dataclass(frozen=True)
class Teacher:
  workdir: str
  config: Any                      # Its fine-tuning config.
  pretrained: finetune.Pretrained  # What it was fine-tuned from.
  model: heads.DownstreamModel
  params: dict                     # Host arrays, at its latest step.


def read_teacher(cfg) -> Teacher:
  """The fine-tuned teacher of ``cfg.teacher``, checked against ``cfg``.

  Raises:
    DistillError: it has no checkpoint, was fine-tuned on another task
      (or another dev split of it), or is not sentence-level.
  """
  try:
    run = finetune.read_run(cfg.teacher)
  except finetune.FinetuneError as e:
    raise DistillError(f'teacher={cfg.teacher!r}: {e}') from e
  ours = json.loads(json.dumps(cfg.task.to_dict()))
  theirs = json.loads(json.dumps(run.config.task.to_dict()))
  if theirs != ours:
    raise DistillError(f'teacher={cfg.teacher!r} was fine-tuned on task '
                       f'{theirs}; this run distils {ours}: use the same '
                       'task settings.')
  if cfg.task.dev_fraction and run.config.seed != cfg.seed:
    raise DistillError(
        f'task.dev_fraction={cfg.task.dev_fraction} with seed={cfg.seed}: '
        f'teacher={cfg.teacher!r} was fine-tuned with seed='
        f'{run.config.seed}, whose dev split (drawn from the seed) is '
        'another, so it trained on examples this run holds out. Use its '
        'seed, or a teacher fine-tuned with this one.')
  if run.task.kind not in KINDS:
    raise DistillError(f'task {run.task.name!r} is a {run.task.kind} task; '
                       f'task distillation covers {KINDS} (TinyBERT\'s GLUE).')
  return Teacher(cfg.teacher, run.config, run.pretrained, run.model,
                 run.params)


# ---------------------------------------------------------------------------
# Augmentation: words replaced by a BERT MLM's candidates.


# The words data_augmentation.py never replaces: NLTK's English stop words
# (its StopWordsList), e.g. 'not', whose rewrite would flip a label.
STOP_WORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your
yours yourself yourselves he him his himself she she's her hers herself it
it's its itself they them their theirs themselves this that that'll these
those am is are was were be been being have has had having do does did
doing a an the and but if or because as until while of at by for with about
against between into through during before after above below to from up
down in out on off over under again further then once here there all any
both each few more most other some such no nor not only own same so than
too very s t can will just don don't should should've now d ll m o re ve y
ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn
hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn
needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't
wouldn wouldn't 's 're""".split())


@functools.cache
def _piece_tables(tok: tokenizer_lib.Tokenizer) -> tuple[np.ndarray, ...]:
  """bool [vocab] twice: is the piece punctuation; is it a word the
  reference rewrites (letters a-z only once lower-cased, not a stop word;
  ``_is_valid`` and ``StopWordsList``)."""
  texts = [tok.id_to_piece(i).lstrip('\u2581').lower()
           for i in range(tok.vocab_size)]
  special = np.arange(tok.vocab_size) < tokenizer_lib.NUM_SPECIAL
  punct = tok.punctuation_table
  valid = np.array([re.fullmatch('[a-z]+', t) is not None and
                    t not in STOP_WORDS for t in texts]) & ~special
  return punct, valid


def rewritable_words(ids: np.ndarray,
                     tok: tokenizer_lib.Tokenizer) -> list[int]:
  """The positions of the words data_augmentation.py would rewrite with the
  MLM: words as BERT's basic tokenizer splits them (at word-start pieces,
  and before and after punctuation), of one piece, valid and no stop word.
  (Words of several pieces take GloVe neighbours there; none here.)"""
  punct, valid = _piece_tables(tok)
  after_punct = np.concatenate([[False], punct[ids[:-1]]])
  starts = tok.word_starts(ids) | punct[ids] | after_punct
  ends = np.concatenate([starts[1:], [True]])
  return np.flatnonzero(starts & ends & valid[ids]).tolist()


class MaskedLM:
  """A pretraining run's MLM: the most likely words at a masked position."""

  def __init__(self, workdir: str, max_seq_length: int):
    run = runs.load_run(workdir)
    if run.config.objective.name != 'bert':
      raise DistillError(f'augment.mlm={workdir!r} is an '
                         f'objective.name={run.config.objective.name!r} '
                         'run; augmentation needs a BERT MLM head.')
    model_cfg = dataclasses.replace(
        hf_convert.encoder_config(run.config, run.vocab_size),
        scan_layers=False, with_pooler_nsp=False, sbo_positions=0)
    params = hf_convert.unscanned(run.params, model_cfg.num_layers)
    params = {k: v for k, v in params.items() if k not in ('pooler', 'nsp')}
    model = bert_lib.BertForPreTraining(model_cfg)
    limit = model_cfg.max_position_embeddings
    # A text's first ``window`` pieces are rewritten (the student reads no
    # more); a row holds them masked and, as segment B, the text again.
    self.window = min(max_seq_length, limit) - 2
    self.length = min(2 * max_seq_length, limit)
    # Segment B as the reference's BERT reads it, where this run trained
    # pairs; a packed run (RoBERTa's) never trained a second type row.
    self.segments = (model_cfg.type_vocab_size >= 2 and run.config.data.layout
                     not in instances_lib.PACKED_LAYOUTS)
    self.tokenizer = tokenizer_lib.Tokenizer.load(run.tokenizer_path)
    # The pieces a word may become (top_words): word starts, no specials,
    # not the bare word start (which would delete the word).
    self._candidates = self.tokenizer.word_start_table & np.array(
        [self.tokenizer.id_to_piece(i) != '\u2581'
         for i in range(self.tokenizer.vocab_size)])
    self._candidates[:tokenizer_lib.NUM_SPECIAL] = False
    self._logits = jax.jit(lambda ids, types, mask, pos: model.apply(
        {'params': params}, ids, types, mask, pos[:, None],
        jnp.zeros_like(pos[:, None]))['mlm_logits'][:, 0])

  def row(self, ids: np.ndarray, start: int) -> tuple[np.ndarray,
                                                     np.ndarray]:
    """(ids, token types), each [length]: data_augmentation.py's
    ``_masked_language_model`` input for the word at ``start`` (<
    ``window``): ``[CLS] text-with-it-masked [SEP] text [SEP]``, segment 0
    then 1 (0 throughout for a run that trained no pairs), cut to fit."""
    first = ids[:self.window].copy()
    first[start] = tokenizer_lib.MASK_ID
    second = ids[:max(self.length - len(first) - 3, 0)]
    pieces = np.concatenate([[tokenizer_lib.CLS_ID], first,
                             [tokenizer_lib.SEP_ID], second,
                             [tokenizer_lib.SEP_ID]])[:self.length]
    row = np.zeros(self.length, np.int32)
    types = np.zeros(self.length, np.int32)
    row[:len(pieces)] = pieces
    if self.segments:
      types[len(first) + 2:len(pieces)] = 1
    return row, types

  def top_words(self, rows: np.ndarray, types: np.ndarray,
                positions: np.ndarray, k: int,
                batch_size: int) -> np.ndarray:
    """[N, k] ids: the k most likely word-start pieces (no specials, and
    not the bare word start, which would delete the word) at
    ``positions`` of ``rows`` ([N, L] with their token ``types``, the
    position masked: ``row``)."""
    allowed = self._candidates
    out = []
    for start in range(0, len(rows), batch_size):
      ids = np.zeros((batch_size, rows.shape[1]), np.int32)
      segments = np.zeros_like(ids)
      pos = np.zeros((batch_size,), np.int32)
      n = min(batch_size, len(rows) - start)
      ids[:n], pos[:n] = rows[start:start + n], positions[start:start + n]
      segments[:n] = types[start:start + n]
      logits = np.array(self._logits(ids, segments,
                                     (ids > 0).astype(np.int32), pos))
      logits = logits[:n, :len(allowed)]
      logits[:, ~allowed] = -np.inf
      out.append(np.argsort(-logits, axis=1, kind='stable')[:, :k])
    return np.concatenate(out) if out else np.zeros((0, k), np.int64)


def augment_texts(texts: list[str], mlm: MaskedLM, copies: int,
                  replace_prob: float, candidates: int, batch_size: int,
                  rng: np.random.Generator) -> list[list[str]]:
  """``copies`` rewrites of each text: each ``rewritable_words`` word
  replaced, with probability ``replace_prob``, by one of the MLM's
  ``candidates`` most likely words at its position masked
  (data_augmentation.py's ``augment``); other words, and words past the
  MLM's window, kept. A rewrite that changed nothing is the text as
  given."""
  tok = mlm.tokenizer
  encoded = tok.encode(texts)
  chosen = [rewritable_words(ids, tok) for ids in encoded]
  rows, types, positions, owners = [], [], [], []
  for t, ids in enumerate(encoded):
    for start in chosen[t]:
      if start < mlm.window:
        row, segments = mlm.row(ids, start)
        rows.append(row)
        types.append(segments)
        positions.append(start + 1)
        owners.append((t, start))
  top = mlm.top_words(np.asarray(rows).reshape(-1, mlm.length),
                      np.asarray(types).reshape(-1, mlm.length),
                      np.asarray(positions, np.int32), candidates, batch_size)
  options = {owner: top[i] for i, owner in enumerate(owners)}
  out = []
  for t, ids in enumerate(encoded):
    rewrites = []
    for _ in range(copies):
      new = ids.copy()
      for start in chosen[t]:
        if (t, start) in options and rng.random() < replace_prob:
          new[start] = rng.choice(options[(t, start)])
      # A copy that changed no word is the text itself.
      rewrites.append(texts[t] if np.array_equal(new, ids)
                      else tok.decode(new))
    out.append(rewrites)
  return out


def augment_examples(cfg, examples: list[dict], mlm: MaskedLM
                     ) -> list[dict]:
  """The examples, each followed by its distinct rewrites (labels kept): a
  rewrite equal to the example or to an earlier one is dropped, as
  data_augmentation.py's ``augment`` keeps only new sentences. A pair's
  texts are rewritten in turn, ``cfg.augment.copies`` of each with the
  other as given, as its ``augment_ids`` loop (which leaves the first text
  at its last rewrite while it rewrites the second: not reproduced)."""
  a = cfg.augment
  rng = np.random.default_rng([cfg.seed, _AUGMENT_KEY])
  fields = ['text'] + (['text_pair'] if any(e.get('text_pair')
                                            for e in examples) else [])
  rewritten = {f: augment_texts([e[f] or '' for e in examples], mlm,
                                a.copies, a.replace_prob, a.candidates,
                                a.batch_size, rng) for f in fields}
  out = []
  for i, example in enumerate(examples):
    out.append(example)
    seen = {tuple(example.get(f) for f in fields)}
    for f in fields:
      for c in range(a.copies if example.get(f) else 0):
        new = dict(example, **{f: rewritten[f][i][c]})
        texts = tuple(new.get(f) for f in fields)
        if texts not in seen:
          seen.add(texts)
          out.append(new)
  return out


# ---------------------------------------------------------------------------
# Steps: the student, the projections and the frozen teacher in one state.


def make_steps(cfg, stage: str, student: heads.DownstreamModel,
               teacher: heads.DownstreamModel, total_steps: int,
               mapping: tuple[int, ...]) -> finetune.Steps:
  """One stage's init, update and predict steps: ``params = {'student',
  'projection', 'teacher'}``, the optimizer over the first two only;
  ``init_state(teacher_params)`` takes the teacher as an argument."""
  d = cfg.distill
  schedule = d[f'{stage}_schedule']
  warmup = 0 if schedule == 'constant' else round(
      cfg.optimizer.warmup_proportion * total_steps)
  schedule_cfg = ml_collections.ConfigDict({
      'total_steps': total_steps,
      'optimizer': dict(cfg.optimizer.to_dict(), schedule=schedule,
                        learning_rate=d[f'{stage}_learning_rate'],
                        warmup_steps=warmup)})
  tx, schedule = optim.make_optimizer(schedule_cfg)
  root = jax.random.key(cfg.seed)
  dropout_root = jax.random.fold_in(root, 2)
  projections = tinybert.Projections(student.cfg, teacher.cfg.hidden_size,
                                     d.share_projection)
  nets = tinybert.Networks(student, teacher, projections, mapping)
  ids = jnp.zeros((1, cfg.max_seq_length), jnp.int32)
  width = jnp.zeros((1, 1, student.cfg.hidden_size))

  def init_state(teacher_params):
    student_key, projection_key = jax.random.split(jax.random.fold_in(
        root, 1))
    params = {'student': student.init(student_key, ids, ids,
                                      ids + 1)['params'],
              'projection': projections.init(projection_key, width,
                                             [width])['params'],
              'teacher': teacher_params}
    trained = {k: params[k] for k in ('student', 'projection')}
    return train_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=tx.init(trained))

  def loss_fn(trained, teacher_params, batch, key):
    params = dict(trained, teacher=teacher_params)
    inputs = (batch['input_ids'], batch['token_type_ids'],
              batch['attention_mask'])
    if stage == 'intermediate':
      terms, _, _ = nets.losses(params, inputs, False, key)
      loss = (d.embedding_weight * terms['emb'] + d.hidden_weight *
              terms['hidden'] + d.attention_weight * terms['att'])
      return loss, {f'{k}_loss': v for k, v in terms.items()}
    s = student.apply({'params': params['student']}, *inputs,
                      deterministic=False, rngs={'dropout': key})
    t = teacher.apply({'params': jax.lax.stop_gradient(teacher_params)},
                      *inputs)
    return prediction_loss(student.kind, s, t, batch['label'],
                           d.temperature), {}

  def train_step(state, batch):
    trained = {k: state.params[k] for k in ('student', 'projection')}
    key = jax.random.fold_in(dropout_root, state.step)
    (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        trained, state.params['teacher'], batch, key)
    updates, opt_state = tx.update(grads, state.opt_state, trained)
    # The leaves this stage's loss does not read (the student's head in
    # stage 1, the projections in stage 2) take no step and no decay.
    updates, opt_state = optim.keep_unread(
        tx, stage_reads(stage, trained), updates, opt_state,
        state.opt_state)
    trained = optax.apply_updates(trained, updates)
    metrics = dict(terms, loss=loss, grad_norm=optax.global_norm(grads),
                   learning_rate=schedule(state.step))
    return train_lib.TrainState(state.step + 1, dict(
        trained, teacher=state.params['teacher']), opt_state), metrics

  def predict(params, batch):
    return student.apply({'params': params['student']}, batch['input_ids'],
                         batch['token_type_ids'], batch['attention_mask'])

  return finetune.Steps(init_state, train_step, predict)


# The student's leaves past its encoder: stage 1's losses do not read them.
_HEAD = ('pooler', 'classifier', 'layer_mix')


def stage_reads(stage: str, trained: dict) -> dict:
  """A tree of Python bools shaped as ``trained`` (``{'student',
  'projection'}``): True where ``stage``'s loss reads the leaf. Stage 1
  (intermediate) reads the student's embeddings and layers and the
  projections; stage 2 (prediction) the whole student."""
  flat = flax.traverse_util.flatten_dict(trained)
  return flax.traverse_util.unflatten_dict({
      k: (k[0] == 'projection' or k[1] not in _HEAD)
      if stage == 'intermediate' else k[0] == 'student' for k in flat})


def prediction_loss(kind: str, student_logits, teacher_logits, labels,
                    temperature: float) -> jax.Array:
  """Stage 2: soft cross-entropy of the student's logits against the
  teacher's at ``temperature``; regression: the squared error of the
  student's score against the gold ``labels`` (the code's ``loss_mse(
  student_logits, label_ids)``: its teacher has no part there)."""
  if kind == 'regression':
    return tinybert.mse(student_logits[:, 0], labels)
  weights = jnp.ones(student_logits.shape[0], jnp.float32)
  return tinybert.soft_cross_entropy(student_logits, teacher_logits, weights,
                                     temperature)[0]


# ---------------------------------------------------------------------------
# The command: both stages, resumable.


def _boxed_teacher(teacher: Teacher, max_seq_length: int):
  """The teacher's parameters as host arrays in their logical boxes."""
  ids = jnp.zeros((1, max_seq_length), jnp.int32)
  boxes = jax.eval_shape(lambda: teacher.model.init(
      jax.random.key(0), ids, ids, ids + 1)['params'])
  return distillation.boxed_like(boxes, teacher.params, np)


def distill_task(cfg, workdir: str) -> dict:
  """Distils ``cfg.teacher`` into ``cfg.init``'s encoder on ``cfg.task`` in
  ``workdir`` (resuming if possible); returns ``distilled.json``."""
  validate(cfg)
  identity = _check_resume(cfg, workdir)
  teacher = read_teacher(cfg)
  student_run = finetune.load_pretrained(cfg.init, cfg.init_step)
  student_cfg, mapping = _student(cfg, teacher, student_run)
  data, augmented = _task_data(cfg, teacher, student_run)
  if jax.process_index() == 0:
    storage.makedirs(workdir)
    train_lib.write_json_atomic(os.path.join(workdir, META), {
        'identity': identity, 'config': cfg.to_dict()})
    train_lib.write_json_atomic(os.path.join(workdir, AUGMENT), {
        'examples': len(data.task.train), 'with_rewrites': len(augmented),
        'samples': [e['text'] for e in augmented[:2 + cfg.augment.copies]]})
  student = heads.DownstreamModel(student_cfg, data.task.kind,
                                  data.task.num_labels, pooling=cfg.pooling,
                                  head_init=cfg.head_init)
  scores = _run_stages(cfg, workdir, data, student, teacher, mapping,
                       student_run)
  result = {'task': data.task.name, 'kind': data.task.kind,
            'teacher': storage.absolute(cfg.teacher),
            'init': storage.absolute(cfg.init), 'headline':
            data.task.metrics[0], 'train_rows': len(data.train['input_ids']),
            **scores}
  if jax.process_index() == 0:
    train_lib.write_json_atomic(os.path.join(workdir, RESULT), result)
  _say(f'{data.task.name} (distilled): {finetune.describe_scores(scores)}')
  return result


def _identity(cfg) -> dict:
  return {name: train_lib.config_section(cfg, name) for name in _IDENTITY}


def _check_resume(cfg, workdir: str) -> dict:
  """``cfg``'s identity (what a resumed run must share), checked against
  the one ``workdir`` was written with, if any."""
  identity = json.loads(json.dumps(_identity(cfg)))
  train_lib.refuse_other_settings(
      workdir, META, identity, _identity(base_config()), DistillError,
      'a task distillation',
      tuple(os.path.join(s, 'checkpoints') for s in STAGES))
  return identity


def _student(cfg, teacher: Teacher, student_run: finetune.Pretrained):
  """(the student's BertConfig, its layer map onto the teacher), checked:
  the same tokenizer, a map within the teacher, as many heads."""
  if student_run.tokenizer.sha256 != teacher.pretrained.tokenizer.sha256:
    raise DistillError(f'init={cfg.init!r} and teacher={cfg.teacher!r} use '
                       'different tokenizers: the student must read the '
                       'teacher\'s tokens.')
  # The [PAD] row takes no gradient, as the code's nn.Embedding(
  # padding_idx=0): the MSE losses read padded positions.
  student_cfg = dataclasses.replace(
      finetune.downstream_config(cfg, student_run), pad_row_trains=False)
  mapping, problems = tinybert.pair(
      student_cfg, teacher.model.cfg, cfg.distill.layer_map,
      cfg.distill.attention_weight, section='distill')
  if problems:
    raise DistillError(' '.join(problems))
  return student_cfg, mapping


def _task_data(cfg, teacher: Teacher, student_run: finetune.Pretrained):
  """(the task encoded, its training rows with rewrites if any; the
  training examples they came from)."""
  data = finetune.encode_task(cfg, student_run.tokenizer)
  augmented = data.task.train
  if cfg.augment.copies:
    mlm = MaskedLM(cfg.augment.mlm or teacher.config.init, cfg.max_seq_length)
    augmented = augment_examples(cfg, data.task.train, mlm)
    train = finetune.encode_examples(cfg, data.task, augmented,
                                     student_run.tokenizer)
    data = data._replace(train=train)
  return data, augmented


def _run_stages(cfg, workdir: str, data, student: heads.DownstreamModel,
                teacher: Teacher, mapping, student_run) -> dict:
  """Both stages in turn (each resumed from its own checkpoints, the second
  from the first's student); the student's held-out scores
  (``FinetuneLoop.held_out``)."""
  place = train_lib.make_placement(cfg)
  boxed = _boxed_teacher(teacher, cfg.max_seq_length)
  num_rows = len(data.train['input_ids'])
  previous = None
  with jax.set_mesh(place.mesh), nn.logical_axis_rules(place.rules):
    for stage in STAGES:
      epochs = cfg.distill[f'{stage}_epochs']
      if not epochs:
        continue
      stage_cfg = cfg.copy_and_resolve_references()
      stage_cfg.num_epochs = epochs
      total, _ = finetune.plan_steps(stage_cfg, num_rows,
                                     student.cfg.max_position_embeddings)
      steps = make_steps(cfg, stage, student, teacher.model, total, mapping)
      compiled = _compile(steps, place, data, cfg.batch_size, boxed)
      stage_dir = os.path.join(workdir, stage)
      ckpt = checkpoint_lib.Checkpointer(
          os.path.join(stage_dir, 'checkpoints'), cfg.checkpoint_every_steps,
          cfg.keep_checkpoints)
      state = _restore_or_init(ckpt, steps, compiled, place, boxed,
                               student_run, previous)
      _say(f'{stage}-layer distillation: {total} steps of {cfg.batch_size} '
           f'over {num_rows} rows')
      loop = finetune.FinetuneLoop(stage_cfg, stage_dir, place, data,
                                   compiled, ckpt, total, state)
      previous = loop.run(state)
      loop.writer.close()
    return loop.held_out(previous.params)


def _compile(steps: finetune.Steps, place, data, batch_size: int, boxed
             ) -> finetune.Compiled:
  """Fine-tuning's shardings and compiled steps; the teacher's leaves
  sharded by their logical axes (its boxes put back on its shapes)."""
  abstract_teacher = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
      sharding.strip_boxes(boxed))
  return finetune.shard_and_compile(
      steps._replace(init_state=lambda t: steps.init_state(_rebox(boxed, t))),
      place, data, batch_size, abstract_teacher)


def _rebox(boxed, values):
  """``values`` in ``boxed``'s logical boxes (so the state's teacher leaves
  are sharded by their axes)."""
  return jax.tree.map(lambda box, v: box.replace_boxed(v), boxed, values,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def _restore_or_init(ckpt, steps, compiled, place, boxed, student_run,
                     previous):
  """This stage's latest checkpoint; else a fresh state (the teacher placed
  on the mesh and passed in) with the student from the previous stage, or
  (the first stage) its pretrained encoder."""
  state = finetune.resume(ckpt, compiled.abstract_state, ckpt.directory)
  if state is not None:
    return state
  state = sharding.create_sharded(
      steps.init_state, compiled.state_sh,
      sharding.place_boxed(boxed, place.mesh, place.rules))
  params = dict(state.params)
  if previous is not None:
    params['student'] = previous.params['student']
    params['projection'] = previous.params['projection']
  else:
    params['student'] = finetune.load_encoder(
        params['student'], compiled.abstract_state.params['student'],
        student_run.params)
    params['projection'] = _general_projection(
        student_run, params['projection'],
        compiled.abstract_state.params['projection'])
  return state.replace(params=params)


def _general_projection(student_run: finetune.Pretrained, fresh: dict,
                        abstract: dict) -> dict:
  """The projections of the general distillation run the student comes
  from, where they fit this teacher (its width, ``share_projection``): the
  code's task student loads that run's ``fit_dense`` with its encoder.
  Else ``fresh`` (saying why, for a TinyBERT run)."""
  if student_run.objective != tinybert.NAME or storage.isfile(
      os.path.join(student_run.workdir, finetune.MULTITASK_META)):
    return fresh
  saved = runs.load_run(student_run.workdir, student_run.step).params
  shapes = {k: v.shape for k, v in
            flax.traverse_util.flatten_dict(abstract).items()}
  theirs = {k: v.shape for k, v in flax.traverse_util.flatten_dict(
      saved.get('projection', {})).items()}
  if theirs != shapes:
    _say(f'init={student_run.workdir!r}: its projections '
         f'({_shapes(theirs)}) do not fit this teacher\'s '
         f'({_shapes(shapes)}: its width and distill.share_projection); '
         'they start fresh.')
    return fresh
  _say(f'the projections start from init={student_run.workdir!r}\'s')
  return finetune.load_encoder(fresh, abstract, saved['projection'])


def _shapes(shapes: dict) -> str:
  return ', '.join(f'{"/".join(k)} {list(v)}'
                   for k, v in sorted(shapes.items()))

