"""MobileBERT's training: the transfer losses and the distillation target
against numpy, the schedule's gates and lr multipliers, the copy from the
teacher, the transfer under rematerialized layers, a tiny student through
the whole schedule (frozen and gated parameters bitwise, the export to
transformers), the checks and the preset, and end to end: a written
teacher, the student, export, resume."""

import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import config_check
from bertjax import config_lib
from bertjax import objectives
from bertjax import runs
from bertjax import train
from bertjax.interop import hf_convert
from bertjax.models import bert
from bertjax.objectives import distillation
from bertjax.objectives import mobilebert
from bertjax.objectives import tinybert
from bertjax.runtime import checkpoint as checkpoint_lib
import preset_helpers
import teacher_helpers
import test_mobilebert_export

_set = preset_helpers.set_fields
# IB-BERT in miniature (the bert objective): Q, K and V read the 32-wide
# stream and project to the 64-wide intra-block width.
TEACHER = {'model.num_layers': 2, 'model.hidden_size': 32,
           'model.num_heads': 2, 'model.intermediate_size': 64,
           'model.embedding_size': 8, 'model.trigram_input': True,
           'model.intra_bottleneck_size': 64}
# MobileBERT in miniature: the teacher's stream, embedding and heads.
STUDENT = {**TEACHER, 'model.intermediate_size': 16,
           'model.intra_bottleneck_size': 8,
           'model.key_query_shared_bottleneck': True,
           'model.num_feedforward_networks': 2,
           'model.normalization': 'no_norm', 'model.hidden_act': 'relu'}
# Two phases of 2 steps (layer 0, then layer 1), then 2 of distillation.
SCHEDULE = {'mobilebert.steps_per_layer': 2, 'total_steps': 6}
# What the student copies from the teacher (not the embedding NoNorm).
COPIED = ('embeddings/word', 'embeddings/trigram_projection',
          'embeddings/position', 'embeddings/token_type', 'mlm_transform',
          'mlm_norm', 'mlm_output_bias', 'mlm_extra_embedding', 'pooler',
          'nsp')


def _leaves(tree) -> dict:
  return {'/'.join(k.key for k in path): np.asarray(leaf) for path, leaf in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ---- The transfer's losses against numpy.


def _states(seed):
  rng = np.random.default_rng(seed)
  return [rng.normal(1.0, 2.0, (2, 5, 8)).astype(np.float32)
          for _ in range(2)]


def test_feature_map_mse_standardizes_both_sides():
  s, t = _states(0)
  ln = lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(
      x.var(-1, keepdims=True) + 1e-12)
  expected = np.mean((ln(np.float64(s)) - ln(np.float64(t))) ** 2)
  assert float(mobilebert.feature_map_mse(s, t)) == pytest.approx(
      expected, rel=1e-5)
  assert float(mobilebert.feature_map_mse(s, 3 * s + 1)) < 1e-10


def test_mean_var_terms_match_numpy():
  s, t = _states(1)
  mean, var = mobilebert.mean_var_terms(s, t)
  s, t = np.float64(s), np.float64(t)
  assert float(mean) == pytest.approx(
      np.mean((t.mean(-1) - s.mean(-1)) ** 2), rel=1e-5)
  assert float(var) == pytest.approx(
      np.mean(np.abs(t.var(-1) - s.var(-1))), rel=1e-5)


def test_attention_kl_matches_numpy_with_a_padded_row():
  """Scores as SelfAttention records them (0 at masked keys): the KL over
  the real keys, mean over batch, heads and every query (the padded ones
  too), is the reference's cross-entropy less the teacher's entropy; a
  teacher that masks more keys (documents kept apart) is masked alone."""
  rng = np.random.default_rng(2)
  mask = np.ones((2, 5), np.int32)
  mask[1, 3:] = 0
  keys = mask[:, None, None, :].astype(bool)
  s, t = (np.where(keys, rng.normal(0, 2, (2, 2, 5, 5)), 0.0)
          for _ in range(2))
  teacher_keys = np.broadcast_to(keys, (2, 1, 5, 5)).copy()
  teacher_keys[0, 0, 0, 4] = False

  def numpy_kl(teacher_mask):
    log_s = _log_softmax(np.where(keys, s, -np.inf))
    log_t = _log_softmax(np.where(teacher_mask, t, -np.inf))
    p_t = np.exp(log_t)   # 0 at the keys the teacher masks.
    ce = -np.sum(p_t * np.where(p_t > 0, log_s, 0), -1)
    entropy = -np.sum(p_t * np.where(p_t > 0, log_t, 0), -1)
    return np.mean(ce) - np.mean(entropy)

  got = mobilebert.attention_kl(s.astype(np.float32), t.astype(np.float32),
                                mask)
  assert float(got) == pytest.approx(numpy_kl(keys), rel=1e-5)
  got = mobilebert.attention_kl(s.astype(np.float32), t.astype(np.float32),
                                mask, teacher_keys)
  assert float(got) == pytest.approx(numpy_kl(teacher_keys), rel=1e-5)
  same = mobilebert.attention_kl(s.astype(np.float32), s.astype(np.float32),
                                 mask)
  assert abs(float(same)) < 1e-6


# ---- The distillation's target and the stages.


def _outputs(seed):
  rng = np.random.default_rng(seed)
  return {'mlm_logits': rng.normal(0, 3, (2, 3, 7)).astype(np.float32),
          'nsp_logits': rng.normal(0, 1, (2, 2)).astype(np.float32)}


def _distill_batch():
  weights = np.ones((2, 3), np.float32)
  weights[1, 2] = 0
  return {'masked_ids': np.array([[1, 4, 6], [0, 2, 2]], np.int32),
          'masked_weights': weights, 'input_ids': np.zeros((2, 8), np.int32),
          'next_sentence_labels': np.array([1, 0], np.int32)}


@pytest.mark.parametrize('ratio', [0.5, 0.2])
def test_distillation_is_cross_entropy_against_the_mixed_target(ratio):
  student, teacher, batch = _outputs(3), _outputs(4), _distill_batch()
  loss, sums = mobilebert.distillation_loss(student, teacher, batch, ratio,
                                            nsp_weight=1.0)
  onehot = np.eye(7)[batch['masked_ids']]
  p_t = np.exp(_log_softmax(np.float64(teacher['mlm_logits'])))
  target = ratio * onehot + (1 - ratio) * p_t
  ce = -np.sum(target * _log_softmax(np.float64(student['mlm_logits'])), -1)
  w = batch['masked_weights']
  nsp = -np.mean(np.take_along_axis(_log_softmax(np.float64(
      student['nsp_logits'])), batch['next_sentence_labels'][:, None], -1))
  assert float(loss) == pytest.approx(np.sum(w * ce) / np.sum(w) + nsp,
                                      rel=1e-5)
  assert {'mlm_count', 'pred_count', 'nsp_count',
          'teacher_mlm_count'} <= set(sums)


def test_objective_chooses_the_stage_and_layer_by_step():
  section = mobilebert.defaults()
  section.steps_per_layer = 10
  terms = {'hidden': jnp.array([1.0, 2.0]), 'att': jnp.array([3.0, 4.0]),
           'mean': jnp.array([5.0, 6.0]), 'var': jnp.array([7.0, 8.0])}
  student, teacher, batch = _outputs(3), _outputs(4), _distill_batch()
  layer = [100 * terms['hidden'][i] + terms['att'][i] + 5000 *
           terms['mean'][i] + 5 * terms['var'][i] for i in range(2)]
  distill, _ = mobilebert.distillation_loss(student, teacher, batch, 0.5,
                                            1.0)
  for step, expected, current in ((0, layer[0] / 2, 0), (9, layer[0] / 2, 0),
                                  (10, layer[1] / 2, 1),
                                  (19, layer[1] / 2, 1), (20, distill, -1)):
    loss, sums = mobilebert.objective(terms, student, teacher, batch,
                                      section, 1.0, jnp.asarray(step))
    assert float(loss) == pytest.approx(float(expected), rel=1e-6), step
    assert float(sums['progressive_layer_sum']) == current
  loss, sums = mobilebert.objective(terms, student, teacher, batch, section,
                                    1.0, None)
  assert float(loss) == pytest.approx(float(sum(layer) / 2 + distill),
                                      rel=1e-6)
  assert float(sums['hidden_loss_sum']) == 3.0 * 2   # Summed, x sequences.
  assert 'progressive_layer_sum' not in sums


# ---- The schedule: which layer learns, at which multiple of the lr.

# bg = min(0.1 sqrt(1 - p) + 0.9, 10 p) at p = 0.1 and 0.9.
BG_01, BG_09 = 0.99486833, 0.93162278


@pytest.mark.parametrize('step, gates, multipliers', [
    (0, [1, 0, 0], [0, 0, 0]),                  # bg(0) = 0: no update.
    (1, [1, 0, 0], [3 * BG_01, 0, 0]),
    (9, [1, 0, 0], [3 * BG_09, 0, 0]),          # P - 1.
    (10, [0, 1, 0], [0, 0, 0]),                 # P.
    (19, [0, 1, 0], [0.3 * BG_09, 3 * BG_09, 0]),
    (29, [0, 0, 1], [0.3 * BG_09, 0.3 * BG_09, 3 * BG_09]),
    (30, [0, 0, 0], [1, 1, 1]),                 # L P: distillation.
    (500, [0, 0, 0], [1, 1, 1]),
])
def test_gates_and_lr_multipliers_at_the_phase_edges(step, gates,
                                                     multipliers):
  section = mobilebert.defaults()
  section.steps_per_layer = 10
  np.testing.assert_array_equal(mobilebert.layer_gates(step, 10, 3), gates)
  np.testing.assert_allclose(mobilebert.lr_multipliers(step, section, 3),
                             multipliers, rtol=1e-6, atol=1e-7)


def test_multipliers_without_warmup_or_transfer():
  section = mobilebert.defaults()
  section.steps_per_layer, section.phase_warmup = 10, False
  np.testing.assert_allclose(mobilebert.lr_multipliers(10, section, 3),
                             [0.3, 3, 0], rtol=1e-6)
  section.steps_per_layer, section.phase_warmup = 1, True
  np.testing.assert_allclose(mobilebert.lr_multipliers(0, section, 3),
                             [3, 0, 0], rtol=1e-6)   # bg 1, as TF's.
  section.steps_per_layer = 0
  np.testing.assert_array_equal(mobilebert.lr_multipliers(0, section, 3),
                                [1, 1, 1])
  np.testing.assert_array_equal(mobilebert.layer_gates(0, 0, 3), [0, 0, 0])


# ---- The student's init from the teacher.


def _random_params(model_cfg, seed):
  ids = jnp.zeros((1, 8), jnp.int32)
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: rng.normal(size=x.shape).astype(np.float32),
      nn.unbox(jax.eval_shape(bert.BertForPreTraining(model_cfg).init,
                              jax.random.key(0), ids, ids, ids, ids)))['params']


def _model(fields: dict) -> bert.BertConfig:
  return bert.BertConfig(vocab_size=128, max_position_embeddings=16, **{
      k.split('.')[1]: v for k, v in fields.items()})


@pytest.mark.parametrize('normalization, copied', [
    ('no_norm', COPIED),
    # A LayerNorm has the teacher's names: the reference copies it too.
    ('layer_norm', COPIED + ('embeddings/layer_norm',))])
def test_student_takes_exactly_the_teachers_embeddings_and_heads(
    normalization, copied):
  teacher = _random_params(_model(TEACHER), 1)
  student = _random_params(_model({**STUDENT, 'model.normalization':
                                   normalization}), 2)
  mine = _leaves(mobilebert.student_params_from_teacher(student, teacher))
  theirs, before = _leaves(teacher), _leaves(student)
  assert mine.keys() == before.keys()
  taken = {k for k in mine if k in theirs and
           np.array_equal(mine[k], theirs[k])}
  assert taken == {k for k in mine if k.startswith(copied)}
  assert all(np.array_equal(mine[k], before[k]) for k in set(mine) - taken)


def _transfer_loss(remat: str):
  """(value, the student's gradient) of the summed transfer terms of the
  miniature student and teacher, both with ``model.remat=remat``."""
  student_cfg, teacher_cfg = (
      _model({**fields, 'model.remat': remat})
      for fields in (STUDENT, TEACHER))
  mapping, problems = mobilebert.pair(student_cfg, teacher_cfg, 1.0)
  assert not problems
  nets = mobilebert.Networks(bert.BertForPreTraining(student_cfg),
                             bert.BertForPreTraining(teacher_cfg), mapping)
  teacher = _random_params(teacher_cfg, 1)
  student = mobilebert.student_params_from_teacher(
      jax.tree.map(lambda x: 0.3 * x, _random_params(student_cfg, 2)),
      teacher)
  rng = np.random.default_rng(3)
  mask = np.ones((2, 8), np.int32)
  mask[1, 5:] = 0
  inputs = (rng.integers(5, 128, (2, 8)).astype(np.int32),
            np.zeros((2, 8), np.int32), mask,
            np.array([[1, 2, 3], [0, 2, 4]], np.int32))

  def total(student_params):
    terms, _, _ = nets.losses({'student': student_params,
                               'teacher': teacher}, inputs, True, None)
    return sum(jnp.sum(v) for v in terms.values())

  return jax.jit(jax.value_and_grad(total))(student)


def test_rematerialized_layers_record_the_same_transfer():
  """Layers under nn.remat still record their states and attention scores
  (the intermediates collection): the transfer terms and the student's
  gradient are the plain layers'."""
  value, grads = _transfer_loss('none')
  value_r, grads_r = _transfer_loss('full')
  assert np.isfinite(float(value)) and float(value) > 0
  np.testing.assert_allclose(float(value_r), float(value), rtol=1e-6)
  mine, plain = _leaves(grads_r), _leaves(grads)
  assert mine.keys() == plain.keys()
  assert any(np.any(plain[k] != 0) for k in plain if 'layer_1' in k)
  for k in plain:
    np.testing.assert_allclose(mine[k], plain[k], rtol=1e-5, atol=1e-7,
                               err_msg=k)


# ---- A tiny written teacher and its student's config.


@pytest.fixture(scope='module')
def teacher(tmp_path_factory):
  """A tiny IB-BERT teacher's workdir (written, not trained)."""
  workdir = str(tmp_path_factory.mktemp('mobilebert') / 'teacher')
  teacher_helpers.write_teacher(workdir, _set(config_lib.demo_config(), {
      **preset_helpers.TINY, **TEACHER}))
  return workdir


def _student_config(teacher_workdir, **fields):
  """The demo preset's student for ``teacher_workdir``, prepared as the
  trainer prepares it."""
  cfg = _set(preset_helpers.load_preset('mobilebert', 'size=demo'), {
      **preset_helpers.TINY, **STUDENT, **SCHEDULE,
      'mobilebert.teacher_workdir': teacher_workdir, **fields})
  return objectives.get('mobilebert').prepare_config(cfg)


def _moved(before: dict, after: dict) -> set[str]:
  """The leaves of ``after`` that differ from ``before`` in any bit."""
  a, b = _leaves(before), _leaves(after)
  return {k for k in a if a[k].tobytes() != b[k].tobytes()}


def _assert_one_layer_at_a_time(saved: dict, records: list[dict]) -> None:
  """The 6-step run whose parameters after each step are ``saved[step]``
  and whose metrics are ``records`` trained layer 0, then layers 0 and 1,
  then everything, and froze the rest bit for bit."""
  student = {step: params['student'] for step, params in saved.items()}
  teacher = _leaves(saved[1]['teacher'])
  # Through the transfer (steps 1-4) the copied embeddings and heads are
  # the teacher's and the embedding NoNorm its init, bit for bit.
  for step in range(1, 5):
    for name, value in _leaves(student[step]).items():
      if name.startswith(COPIED):
        assert value.tobytes() == teacher[name].tobytes(), name
    norm = student[step]['embeddings']['layer_norm']
    assert np.all(norm['scale'] == 1) and np.all(norm['bias'] == 0)
  layers = lambda names, i: {n for n in names if n.startswith(f'layer_{i}/')}
  # Each phase's first step has bg = 0: nothing moves.
  assert _moved(student[2], student[3]) == set()
  # Phase 0 moves layer 0 alone, phase 1 layers 0 (at 0.3x) and 1.
  moved = _moved(student[1], student[2])
  assert moved and moved == layers(moved, 0)
  moved = _moved(student[3], student[4])
  assert layers(moved, 0) and layers(moved, 1) and moved == (
      layers(moved, 0) | layers(moved, 1))
  # The distillation's warmup starts at lr 0; then everything trains: the
  # embeddings and heads too.
  assert _moved(student[4], student[5]) == set()
  moved = _moved(student[5], student[6])
  assert {k.split('/')[0] for k in moved} == set(student[5])
  assert {k for k in _leaves(student[5]) if k.startswith(COPIED)} <= moved
  assert [r['learning_rate'] for r in records] == pytest.approx(
      [1e-3] * 4 + [0.0, 5e-4])   # Held, then the warmup (2 steps).
  assert not _moved(saved[1]['teacher'], saved[6]['teacher'])


def _assert_transformers_agree(directory, cfg, student_params, vocab_size):
  """The export in ``directory`` loads in transformers with nothing
  missing, and its hidden states (every layer's) and MLM and NSP logits
  are bertjax's on real tokens, to 1e-4."""
  export_test = test_mobilebert_export
  encoder, info = transformers.MobileBertModel.from_pretrained(
      directory, output_loading_info=True)
  assert not info['missing_keys'] and set(info['unexpected_keys']) == (
      export_test.HEADS)
  pretraining, info = transformers.MobileBertForPreTraining.from_pretrained(
      directory, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys']
  # pylint: disable=protected-access
  ids, types, mask = export_test._batch()
  positions = np.tile(np.arange(ids.shape[1])[None], (2, 1))
  model = bert.BertForPreTraining(mobilebert.encoder_config(cfg, vocab_size))
  ours, recorded = jax.jit(lambda p: model.apply(
      {'params': p}, ids, types, mask, positions,
      mutable=['intermediates']))(student_params)
  real = mask.astype(bool)
  with torch.no_grad():
    theirs = encoder.eval()(
        input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
        attention_mask=torch.tensor(mask), output_hidden_states=True)
  states = recorded['intermediates']['hidden_states']
  assert len(states) == len(theirs.hidden_states) == 3
  for mine, hf in zip(states, theirs.hidden_states):
    np.testing.assert_allclose(np.asarray(mine)[real], hf.numpy()[real],
                               rtol=0, atol=1e-4)
  export_test.assert_heads_agree(
      ours, export_test._run(pretraining, ids, types, mask), vocab_size, real)


# ---- The checks, before anything is read or compiled; the preset.


@pytest.mark.parametrize('fields, match', [
    ({'optimizer.hold_steps': 3}, r'optimizer.hold_steps=3 must equal .* '
     r'= 4'),
    ({'model.num_heads': 4}, '4 attention heads and the teacher 2'),
    ({'model.hidden_size': 64}, r'hidden_size 64 \(model.hidden_size\) and '
     'the teacher 32'),
    ({'model.embedding_size': 16}, r'word_width 16 \(model.embedding_size\)'),
    ({'model.num_layers': 3}, 'cannot learn layer by layer from a teacher '
     'of 2'),
    ({'model.scan_layers': True}, 'model.scan_layers=True needs'),
    ({'model.num_layer_groups': 1}, "model.num_layer_groups: MobileBERT's"),
    ({'mobilebert.current_lr_scale': 0.0}, 'must be > 0'),
    ({'mobilebert.hidden_weight': 0.0, 'mobilebert.attention_weight': 0.0,
      'mobilebert.mean_weight': 0.0, 'mobilebert.variance_weight': 0.0},
     'its loss is 0'),
])
def test_config_check_names_the_trap(teacher, fields, match):
  with pytest.raises(ValueError, match=match):
    config_lib.validate(_student_config(teacher, **fields))


def test_a_depth_the_teachers_is_no_multiple_of_is_refused():
  with pytest.raises(ValueError, match="use a student whose "
                     "model.num_layers divides the teacher's"):
    tinybert.layer_map((), 2, 3, section=mobilebert.NAME)


def test_an_unset_teacher_stops_the_run_before_any_data():
  cfg = preset_helpers.load_preset('mobilebert')
  with pytest.raises(distillation.TeacherError,
                     match='mobilebert.teacher_workdir is empty'):
    objectives.get(cfg.objective.name).prepare_config(cfg)


def test_a_run_that_ends_inside_the_transfer_is_warned(teacher):
  cfg = _student_config(teacher)
  assert config_check.warnings_for(cfg) == []
  cfg.total_steps = 3
  (warning,) = config_check.warnings_for(cfg)
  assert warning.startswith('total_steps=3 ends inside the progressive '
                            'transfer (mobilebert.steps_per_layer=2 x 2 '
                            'layers = 4 steps)')


def test_preset_is_the_references_recipe():
  c = preset_helpers.load_preset('mobilebert')
  m, o, t = c.model, c.optimizer, c.mobilebert
  assert (m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size,
          m.embedding_size, m.intra_bottleneck_size,
          m.num_feedforward_networks) == (24, 512, 4, 512, 128, 128, 4)
  assert m.key_query_shared_bottleneck and m.trigram_input
  assert (m.hidden_dropout_rate, m.attention_dropout_rate) == (0.0, 0.0)
  assert (o.name, o.learning_rate, o.warmup_steps, o.weight_decay,
          o.grad_clip_norm, o.grad_clip) == ('lamb', 1.5e-3, 10_000, 0.01,
                                             1.0, 'global')
  assert (c.batch_size, c.data.max_seq_length,
          c.masking.max_predictions_per_seq) == (2048, 512, 20)
  assert (t.steps_per_layer, o.hold_steps, c.total_steps) == (
      10_000, 240_000, 740_000)
  assert (t.hidden_weight, t.attention_weight, t.mean_weight,
          t.variance_weight, t.ground_truth_ratio) == (100, 1, 5000, 5, 0.5)
  assert config_check.warnings_for(c) == [] and config_check.errors_for(c) == []
  t.steps_per_layer = 100   # The hold and the run follow the transfer.
  assert (o.hold_steps, c.total_steps) == (2400, 502_400)
  teacher = preset_helpers.load_preset('mobilebert', 'model=teacher')
  assert (teacher.objective.name, teacher.model.intra_bottleneck_size,
          teacher.model.intermediate_size) == ('bert', 1024, 4096)
  demo = preset_helpers.load_preset('mobilebert', 'size=demo')
  assert (demo.optimizer.name, demo.optimizer.learning_rate,
          demo.optimizer.hold_steps, demo.total_steps) == (
              'bert_adamw', 1e-3, 400, 1200)
  tiny = preset_helpers.load_preset('mobilebert', 'model=tiny')
  assert tiny.model.bottleneck_attention and (
      tiny.model.num_feedforward_networks == 2)
  with pytest.raises(ValueError, match='use model='):
    preset_helpers.load_preset('mobilebert', 'model=large')


# ---- End to end: a teacher, the student through the schedule (one layer
# at a time, the rest frozen), export it, and resume it.


def _write_teacher(tmp_path):
  """(data_dir, workdir): a tiny IB-BERT teacher's workdir, written with
  the corpus's tokenizer (random weights, not trained)."""
  data_dir, workdir = str(tmp_path / 'data'), str(tmp_path / 'teacher')
  cfg = _set(preset_helpers.load_preset('mobilebert', 'model=teacher,'
                                        'size=demo'), {
      **preset_helpers.TINY, **TEACHER, 'data.data_dir': data_dir})
  teacher_helpers.write_run_on_corpus(workdir, cfg)
  return data_dir, workdir


@pytest.mark.e2e
@pytest.mark.filterwarnings('ignore:Sharding info not provided')
def test_teacher_student_export_and_resume_end_to_end(tmp_path):
  data_dir, teacher_dir = _write_teacher(tmp_path)
  cfg = _student_config(teacher_dir, **{
      'data.data_dir': data_dir, 'log_every_steps': 1,
      'eval_every_steps': 6, 'checkpoint_every_steps': 1,
      'keep_checkpoints': 6})
  whole = str(tmp_path / 'student')
  final = train.train_and_evaluate(cfg, whole)
  records = preset_helpers.read_jsonl(whole)
  assert [r['progressive_layer'] for r in records] == [0, 0, 1, 1, -1, -1]
  assert {'eval_hidden_loss', 'eval_att_loss', 'eval_pred_loss',
          'eval_teacher_mlm_accuracy'} <= set(final)
  # At the end of the transfer (step 4) the copied embeddings are the
  # teacher's.
  saved = {step: checkpoint_lib.restore_as_saved(
      os.path.join(whole, 'checkpoints'), step)['params']
           for step in range(1, 7)}
  _assert_one_layer_at_a_time(saved, records)
  restore = lambda workdir, step: _leaves(checkpoint_lib.restore_as_saved(
      os.path.join(workdir, 'checkpoints'), step)['params'])
  saved_teacher, transferred = restore(teacher_dir, 3), _leaves(saved[4])
  for name in ('word/embedding', 'trigram_projection/kernel',
               'position/embedding'):
    np.testing.assert_array_equal(transferred[f'student/embeddings/{name}'],
                                  saved_teacher[f'embeddings/{name}'])

  out = str(tmp_path / 'exported')
  hf_convert.export_run(whole, out)
  run = runs.load_run(whole)
  _assert_transformers_agree(out, run.config, run.params['student'],
                             run.vocab_size)
  with open(os.path.join(out, 'README.md')) as f:
    assert 'the teacher (IB-BERT)' in f.read()

  # Resumed from step 3 (inside layer 1's phase): the same run, bitwise.
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(whole, resumed)
  for step in (4, 5, 6):
    shutil.rmtree(os.path.join(resumed, 'checkpoints', str(step)))
  train.train_and_evaluate(cfg, resumed)
  assert preset_helpers.read_jsonl(resumed) == records
  a, b = _leaves(saved[6]), restore(resumed, 6)
  assert a.keys() == b.keys()
  assert all(a[k].tobytes() == b[k].tobytes() for k in a)
  # Another schedule would give another run: it does not resume.
  cfg.mobilebert.steps_per_layer = 3
  with pytest.raises(train.ResumeError, match='mobilebert.steps_per_layer'):
    train.check_resume_compatible(whole, cfg)
