"""TinyBERT: sizes against the paper and transformers, the layer-wise losses
against numpy, the layer map, the stages, the checks, and a teacher that is
an argument of every compiled program, never a constant."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import config_check
from bertjax import config_lib
from bertjax import sharding
from bertjax import train
from bertjax.models import bert
from bertjax.objectives import distillation
from bertjax.objectives import tinybert
from data_pipelines import pipeline
import preset_helpers
import teacher_helpers

_set = preset_helpers.set_fields
BERT_VOCAB = 30522
# The student of the tests below: 1 layer, 16 wide, as many heads (2) as
# the teachers.
STUDENT = {**preset_helpers.TINY, 'model.num_layers': 1,
           'model.hidden_size': 16, 'model.intermediate_size': 32}


def _count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def _abstract(model, *inputs):
  return nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0),
                                                    *inputs)['params']))


# ---- 1. Sizes: the paper's and transformers' BertModel.


@pytest.mark.parametrize('size,paper_millions', [('4', 14.5), ('6', 67.0)])
def test_parameter_counts_match_the_paper_and_transformers(size,
                                                           paper_millions):
  cfg = preset_helpers.load_preset('tinybert', f'size={size}')
  student = tinybert.student_config(cfg, BERT_VOCAB)
  # BERT's WordPiece vocabulary, unpadded, as the paper's model has it.
  student = dataclasses.replace(student, vocab_size=BERT_VOCAB,
                                real_vocab_size=0)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = _abstract(bert.BertForPreTraining(student), ids, ids, ids,
                     ids[:, :2])
  encoder = {k: v for k, v in params.items()
             if k == 'embeddings' or k.startswith('layer_')}
  with torch.device('meta'):
    theirs = transformers.BertModel(transformers.BertConfig(
        vocab_size=BERT_VOCAB, hidden_size=student.hidden_size,
        num_hidden_layers=student.num_layers,
        num_attention_heads=student.num_heads,
        intermediate_size=student.intermediate_size))
  assert _count(encoder) + _count(params['pooler']) == sum(
      p.numel() for p in theirs.parameters())
  # The paper's figure is the encoder and the projection to BERT-base's
  # width that distillation trains (TinyBERT-4: 14.25M + 0.24M); counted
  # with the pooler instead, TinyBERT-4 would be 14.35M, not 14.5M.
  x = jnp.zeros((1, 1, student.hidden_size))
  projection = _abstract(tinybert.Projections(student, 768, True), x, [x])
  assert round((_count(encoder) + _count(projection)) / 1e6, 1) == (
      paper_millions)


# ---- 2. The losses against a direct numpy computation.

TEACHER_MODEL = bert.BertConfig(vocab_size=128, hidden_size=24, num_layers=2,
                                num_heads=2, intermediate_size=48,
                                max_position_embeddings=16)
STUDENT_MODEL = bert.BertConfig(vocab_size=128, hidden_size=8, num_layers=1,
                                num_heads=2, intermediate_size=16,
                                max_position_embeddings=16)


def _pair_inputs():
  ids = (np.arange(2 * 10).reshape(2, 10) * 7 % 120 + 5).astype(np.int32)
  mask = np.ones((2, 10), np.int32)
  mask[1, 6:] = 0          # Padding keys: their scores count as 0.
  positions = np.tile(np.arange(1, 4, dtype=np.int32), (2, 1))
  return ids, np.zeros_like(ids), mask, positions


def _numpy_scores(hidden, layer, mask):
  """QK^T / sqrt(d) [B, H, L, L] of ``layer`` on ``hidden``, 0 at masked
  keys."""
  kernel = np.asarray(layer['attention']['qkv_kernel'], np.float64)
  bias = np.asarray(layer['attention']['qkv_bias'], np.float64)
  qkv = np.einsum('bld,dqhk->blqhk', np.asarray(hidden, np.float64),
                  kernel) + bias
  q, k = qkv[:, :, 0], qkv[:, :, 1]
  scores = np.einsum('blhk,bmhk->bhlm', q, k) / np.sqrt(q.shape[-1])
  return np.where(mask[:, None, None, :].astype(bool), scores, 0.0)


def test_attention_and_hidden_losses_match_numpy():
  ids, types, mask, positions = _pair_inputs()
  inputs = (ids, types, mask, positions)
  teacher, student = (bert.BertForPreTraining(c)
                      for c in (TEACHER_MODEL, STUDENT_MODEL))
  projections = tinybert.Projections(STUDENT_MODEL, 24, shared=False)
  x = jnp.zeros((1, 1, 8))
  params = {'teacher': _init(teacher, inputs, 1),
            'student': _init(student, inputs, 2),
            'projection': nn.unbox(projections.init(jax.random.key(3), x,
                                                    [x])['params'])}
  nets = tinybert.Networks(student, teacher, projections, mapping=(2,))
  terms, _, _ = jax.jit(nets.losses, static_argnums=2)(
      params, inputs, True, None)

  def recorded(model, p):
    out, rec = jax.jit(lambda p: model.apply(
        {'params': p}, *inputs, mutable=['intermediates']))(p)
    # Recording takes the explicit softmax: the outputs do not change.
    plain = jax.jit(lambda p: model.apply({'params': p}, *inputs))(p)
    np.testing.assert_allclose(out['mlm_logits'], plain['mlm_logits'],
                               atol=1e-5)
    return [np.asarray(h, np.float64)
            for h in rec['intermediates']['hidden_states']]

  t_states = recorded(teacher, params['teacher'])
  s_states = recorded(student, params['student'])
  # Student layer 1 against teacher layer 2 (whose input is hidden state 1).
  s_scores = _numpy_scores(s_states[0], params['student']['layer_0'], mask)
  t_scores = _numpy_scores(t_states[1], params['teacher']['layer_1'], mask)
  assert float(terms['att']) == pytest.approx(
      np.mean((s_scores - t_scores) ** 2), rel=1e-4)

  def project(h, dense):
    return h @ np.asarray(dense['kernel'], np.float64) + np.asarray(
        dense['bias'], np.float64)

  w = params['projection']
  assert float(terms['hidden']) == pytest.approx(np.mean(
      (project(s_states[1], w['hidden']) - t_states[2]) ** 2), rel=1e-4)
  assert float(terms['emb']) == pytest.approx(np.mean(
      (project(s_states[0], w['embedding']) - t_states[0]) ** 2), rel=1e-4)


def _init(model, inputs, seed):
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), *inputs)[
      'params'])


def test_soft_cross_entropy_matches_numpy():
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  loss, sums = tinybert.soft_cross_entropy(s, t, weights, 2.0)
  p = np.exp(t / 2) / np.exp(t / 2).sum(-1, keepdims=True)
  log_q = s / 2 - np.log(np.exp(s / 2).sum(-1, keepdims=True))
  ce = -(p * log_q).sum(-1)
  assert float(loss) == pytest.approx((ce * weights).sum() / 3, rel=1e-5)
  assert float(sums['pred_count']) == 3


# ---- 3. The layer map.


def test_uniform_layer_map_is_m_n_over_m():
  assert tinybert.layer_map((), 4, 12) == (3, 6, 9, 12)
  assert tinybert.layer_map((), 6, 12) == (2, 4, 6, 8, 10, 12)
  assert tinybert.layer_map((), 1, 2) == (2,)
  assert tinybert.layer_map([1, 5, 12], 3, 12) == (1, 5, 12)


@pytest.mark.parametrize('explicit,student,teacher,match', [
    ((3, 13), 2, 12, 'points past the teacher'),
    ((0, 4), 2, 12, 'points past the teacher'),
    ((6, 3), 2, 12, 'must increase'),
    ((3,), 2, 12, 'names 1 teacher layers for a student of 2'),
    ((), 5, 12, 'multiple of the student'),
    ((), 13, 12, 'cannot learn layer by layer'),
])
def test_bad_layer_maps_fail_with_the_reason(explicit, student, teacher,
                                             match):
  with pytest.raises(ValueError, match=match):
    tinybert.layer_map(explicit, student, teacher)


# ---- 4. Stages: intermediate-layer first, then prediction-layer.


def test_stages_choose_the_loss_by_step():
  section = tinybert.defaults()
  section.embedding_weight, section.hidden_weight = 2.0, 3.0
  section.attention_weight, section.prediction_weight = 5.0, 7.0
  section.mlm_weight, section.intermediate_steps = 11.0, 10
  terms = {'emb': 1.0, 'hidden': 10.0, 'att': 100.0}
  logits = jnp.zeros((1, 2, 5)).at[0, 0, 1].set(2.0)
  batch = {'masked_weights': jnp.ones((1, 2)), 'masked_ids': jnp.ones(
      (1, 2), jnp.int32), 'input_ids': jnp.zeros((1, 4), jnp.int32)}
  out = {'mlm_logits': logits}
  intermediate = 2 + 30 + 500
  _, m = tinybert.objective(terms, out, out, batch, section, None)
  prediction = 7 * float(m['pred_loss_sum']) / 2 + 11 * float(
      m['mlm_loss_sum']) / 2
  for step, expected in ((0, intermediate), (9, intermediate),
                         (10, prediction), (50, prediction),
                         (None, intermediate + prediction)):
    loss, _ = tinybert.objective(terms, out, out, batch, section, step)
    assert float(loss) == pytest.approx(expected, rel=1e-5), step


# ---- 5. The checks (trap checker) and the preset.


@pytest.fixture(scope='module')
def teachers(tmp_path_factory):
  """Two-layer teachers, 32 and 256 wide, 2 heads: width -> workdir."""
  root = tmp_path_factory.mktemp('tinybert_teachers')
  out = {}
  for width in (32, 256):
    cfg = _set(config_lib.demo_config(), {
        **preset_helpers.TINY, 'model.num_layers': 2,
        'model.hidden_size': width, 'model.intermediate_size': 2 * width})
    out[width] = str(root / f'teacher{width}')
    teacher_helpers.write_teacher(out[width], cfg)
  return out


def _student_config(teacher_workdir, **fields):
  cfg = _set(preset_helpers.load_preset('tinybert', 'size=demo'),
             {**STUDENT, 'tinybert.teacher_workdir': teacher_workdir})
  return distillation.prepare_config(_set(cfg, fields), tinybert.NAME)


@pytest.mark.parametrize('fields,match', [
    ({'tinybert.temperature': 0.0}, r'tinybert.temperature=0.0 must be > 0'),
    ({'tinybert.layer_map': (3,)}, r'points past the teacher\'s 2 layers'),
    ({'model.num_heads': 4}, r'4 attention heads and the teacher 2'),
    ({'tinybert.embedding_weight': 0.0, 'tinybert.hidden_weight': 0.0,
      'tinybert.attention_weight': 0.0, 'tinybert.prediction_weight': 0.0},
     'every loss weight is 0'),
    ({'tinybert.prediction_weight': 0.0}, 'prediction-layer stage runs 20 '
     'steps'),
    ({'tinybert.embedding_weight': 0.0, 'tinybert.hidden_weight': 0.0,
      'tinybert.attention_weight': 0.0}, 'intermediate-layer stage runs 20'),
    ({'model.num_layer_groups': 1}, 'distinct and unscanned'),
])
def test_config_check_names_the_trap(teachers, fields, match):
  cfg = _student_config(teachers[32], **{'total_steps': 40,
                                          'optimizer.warmup_steps': 4,
                                          **fields})
  with pytest.raises(ValueError, match=match):
    config_lib.validate(cfg)


def test_preset_is_general_distills():
  c = preset_helpers.load_preset('tinybert', 'size=4')
  m, o, t = c.model, c.optimizer, c.tinybert
  assert (m.num_layers, m.hidden_size, m.intermediate_size, m.num_heads) == (
      4, 312, 1200, 12)
  assert (c.batch_size, c.data.max_seq_length, o.learning_rate,
          o.warmup_steps, c.total_steps) == (256, 128, 5e-5, 30_000, 300_000)
  assert (o.name, o.schedule, o.weight_decay, o.grad_clip_norm,
          o.grad_clip) == ('bert_adamw', 'warmup_linear', 0.01, 1.0,
                           'per_tensor')
  assert t.intermediate_steps == c.total_steps and t.layer_map == ()
  assert config_check.warnings_for(c) == [] and config_check.errors_for(c) == []
  c.total_steps = 1000
  assert (t.intermediate_steps, o.warmup_steps) == (1000, 100)
  with pytest.raises(ValueError, match='use size='):
    preset_helpers.load_preset('tinybert', 'size=5')


# ---- 6. The trainer passes the step and the teacher.


def _steps(teacher_workdir, **fields):
  cfg = _student_config(teacher_workdir, **fields)
  task = tinybert.make_task(cfg, teacher_helpers.VOCAB)
  spec = pipeline.batch_spec(cfg)
  return train.make_steps(cfg, task, spec), spec


def test_train_step_runs_each_stage_and_freezes_the_teacher(teachers):
  steps, spec = _steps(teachers[32], **{'tinybert.intermediate_steps': 5})
  state = jax.jit(lambda teacher: sharding.strip_boxes(steps.init_state(
      teacher)))(*train.init_inputs(steps))
  step = jax.jit(steps.train_step)
  batch = teacher_helpers.batch(spec)
  # Two steps: the warmup's rate at the first is 0.
  after, m = step(*step(state, batch)[:1], batch)
  assert float(m['loss']) == pytest.approx(
      sum(float(m[f'{k}_loss_sum']) for k in ('emb', 'hidden', 'att')) /
      float(m['emb_count']), rel=1e-5)
  def moved(a, b):
    return jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.any(x != y)),
                                        a, b))

  # Stage 1 moves the encoder and the projections; the teacher, and what
  # no stage-1 loss reads (the MLM head, pooler, NSP head), stay bitwise.
  student, before = after.params['student'], state.params['student']
  assert all(moved(after.params['projection'], state.params['projection']))
  assert all(moved(student['layer_0'], before['layer_0']))
  for name in ('teacher',):
    assert not any(moved(after.params[name], state.params[name]))
  for name in ('mlm_transform', 'mlm_norm', 'mlm_output_bias', 'pooler',
               'nsp'):
    assert not any(moved(student[name], before[name])), name
  # Stage 2 (from step 5): the prediction loss; the MLM head moves, the
  # projections and the pooler do not.
  later = state.replace(step=jnp.asarray(5, jnp.int32))
  later, _ = step(later, batch)
  final, m = step(later, batch)
  assert float(m['loss']) == pytest.approx(
      float(m['pred_loss_sum']) / float(m['pred_count']), rel=1e-5)
  assert all(moved(final.params['student']['mlm_transform'],
                   state.params['student']['mlm_transform']))
  for name in ('pooler', 'nsp'):
    assert not any(moved(final.params['student'][name], before[name]))
  assert not any(moved(final.params['projection'], later.params[
      'projection']))


def _program_bytes(steps, spec) -> tuple[int, int]:
  """Sizes of the init and train-step programs as lowered for XLA
  (StableHLO text: a constant appears there in full; XLA's compiled text
  elides large ones and reports no code size on CPU)."""
  args = train.init_inputs(steps)
  init = jax.jit(steps.init_state).lower(*args)
  state = jax.eval_shape(steps.init_state, *args)
  batch = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in spec.items()}
  step = jax.jit(steps.train_step).lower(state, batch)
  return len(init.as_text()), len(step.as_text())


def _teacher_bytes(steps) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(
      sharding.strip_boxes(steps.init_inputs)))


def test_programs_do_not_grow_with_the_teacher(teachers):
  """A teacher 8x as wide (64x the layer weights) adds megabytes of
  parameters and nothing but shape digits to the programs: its parameters
  are arguments. Compiled in, the same teacher grows the init program by
  more than its own bytes (the check this test makes can fail)."""
  small, spec = _steps(teachers[32])
  large, _ = _steps(teachers[256])
  grown = _teacher_bytes(large) - _teacher_bytes(small)
  assert grown > 2_000_000
  for a, b in zip(_program_bytes(small, spec), _program_bytes(large, spec)):
    assert abs(b - a) < 32_000, (a, b)
  values = jax.tree.map(jnp.asarray,
                        sharding.strip_boxes(large.init_inputs))
  constant = jax.jit(lambda: large.init_state(values)).lower()
  assert len(constant.as_text()) - _program_bytes(large, spec)[0] > grown


def test_distilbert_init_takes_its_teacher_as_an_argument(teachers):
  cfg = _set(preset_helpers.load_preset('distilbert'), {
      **preset_helpers.TINY, 'distillation.teacher_workdir': teachers[256],
      'distillation.student_layers': 1})
  cfg = distillation.prepare_config(cfg)
  task = distillation.make_task(cfg, teacher_helpers.VOCAB)
  steps = train.make_steps(cfg, task, pipeline.batch_spec(cfg))
  init = jax.jit(steps.init_state).lower(*train.init_inputs(steps))
  assert len(init.as_text()) < _teacher_bytes(steps) / 4
  with pytest.raises(TypeError):   # It has no teacher without one.
    steps.init_state()


def test_a_scanned_teacher_is_refused_before_anything_is_restored(tmp_path):
  cfg = _set(config_lib.demo_config(), {
      **preset_helpers.TINY, 'model.num_layers': 2,
      'model.scan_layers': True})
  workdir = str(tmp_path / 'scanned')
  teacher_helpers.write_teacher(workdir, cfg)
  with pytest.raises(distillation.TeacherError, match='stacks its layers'):
    _student_config(workdir)
