"""DistilBERT: the student's options in the encoder, its init from the
teacher, the three losses, the teacher checks, the preset, and a tiny run."""

import json
import math
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax import config_check
from bertjax import config_lib
from bertjax import objectives
from bertjax.objectives import distillation
from bertjax.objectives import losses
from bertjax import train
from bertjax.models import bert
import preset_helpers
import teacher_helpers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DEMO = os.path.join(REPO, 'experiments', 'configs', 'demo.py')
PRESET = os.path.join(REPO, 'experiments', 'configs', 'distilbert.py')
# A tiny variant of the demo (as test_train.py): 60 embedded documents, a
# 32-wide model, packed single segments as DistilBERT trains on.
TINY = {**preset_helpers.TINY_DATA, 'data.layout': 'full_sentences'}
TINY_MODEL = preset_helpers.TINY_MODEL


def _load(path, arg=None):
  return preset_helpers.load_preset(
      os.path.splitext(os.path.basename(path))[0], arg)


_set = preset_helpers.set_fields
_read_jsonl = preset_helpers.read_jsonl


# ---- The encoder's new options leave the default model as it was.

# Pinned before the options were added: parameter paths and shapes, and
# outputs of a small default model on fixed inputs.
PINNED_PARAMS = {
    'embeddings/layer_norm/LayerNorm_0/bias': (16,),
    'embeddings/layer_norm/LayerNorm_0/scale': (16,),
    'embeddings/position/embedding': (16, 16),
    'embeddings/token_type/embedding': (2, 16),
    'embeddings/word/embedding': (128, 16),
    **{f'layer_{i}/{name}': shape for i in range(2) for name, shape in {
        'attention/out_bias': (16,), 'attention/out_kernel': (2, 8, 16),
        'attention/qkv_bias': (3, 2, 8),
        'attention/qkv_kernel': (16, 3, 2, 8),
        'attention_norm/LayerNorm_0/bias': (16,),
        'attention_norm/LayerNorm_0/scale': (16,),
        'ffn/wi/bias': (32,), 'ffn/wi/kernel': (16, 32),
        'ffn/wo/bias': (16,), 'ffn/wo/kernel': (32, 16),
        'ffn_norm/LayerNorm_0/bias': (16,),
        'ffn_norm/LayerNorm_0/scale': (16,)}.items()},
    'mlm_norm/LayerNorm_0/bias': (16,),
    'mlm_norm/LayerNorm_0/scale': (16,),
    'mlm_output_bias': (128,),
    'mlm_transform/bias': (16,), 'mlm_transform/kernel': (16, 16),
    'nsp/bias': (2,), 'nsp/kernel': (16, 2),
    'pooler/bias': (16,), 'pooler/kernel': (16, 16),
}
SMALL = bert.BertConfig(vocab_size=128, hidden_size=16, num_layers=2,
                        num_heads=2, intermediate_size=32,
                        max_position_embeddings=16)


def _small_inputs():
  b, l = 2, 8
  ids = (np.arange(b * l).reshape(b, l) * 7 % 120 + 5).astype(np.int32)
  types = np.zeros((b, l), np.int32)
  types[:, 4:] = 1
  mask = np.ones((b, l), np.int32)
  mask[1, 6:] = 0
  positions = np.tile(np.array([1, 2, 5], np.int32), (b, 1))
  return ids, types, mask, positions


def _paths(params):
  return {'/'.join(k.key for k in path): leaf.shape for path, leaf in
          jax.tree_util.tree_flatten_with_path(params)[0]}


def _init(model, *inputs, seed=0):
  # Jitted: op by op, a model's first run compiles every op on its own.
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), *inputs)['params'])


def test_default_model_is_unchanged():
  model = bert.BertForPreTraining(SMALL)
  params = _init(model, *_small_inputs())
  assert _paths(params) == PINNED_PARAMS
  assert sum(np.abs(x).sum() for x in jax.tree.leaves(params)
             ) == pytest.approx(197.15176391601562, rel=1e-6)
  out = jax.jit(model.apply)({'params': params}, *_small_inputs())
  assert sorted(out) == ['mlm_logits', 'nsp_logits', 'pooled_output',
                         'sequence_output']
  np.testing.assert_allclose(
      out['nsp_logits'], [[0.00033787076245062053, 0.0022828751243650913],
                          [0.0017710165120661259, -0.0002779338974505663]],
      rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(
      out['mlm_logits'][0, 0, :4], [0.04892340302467346, -0.05275077372789383,
                                    0.14283646643161774, -0.01607479900121689],
      rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(
      out['sequence_output'][1, 2, :4], [-1.5427170991897583,
                                         0.5382481813430786,
                                         -0.6620754599571228,
                                         1.0302691459655762], rtol=1e-5)
  np.testing.assert_allclose(
      out['pooled_output'][0, :3], [-0.11070766299962997,
                                    -0.05957770347595215,
                                    -0.032465264201164246], rtol=1e-4)
  assert np.abs(out['mlm_logits']).sum() == pytest.approx(
      45.00804901123047, rel=1e-5)


def test_student_options_drop_token_types_pooler_and_nsp():
  default = bert.BertForPreTraining(SMALL)
  params = _init(default, *_small_inputs())
  student_cfg = bert.BertConfig(**{**SMALL.__dict__, 'type_vocab_size': 0,
                                   'with_pooler_nsp': False})
  student = bert.BertForPreTraining(student_cfg)
  student_params = _init(student, *_small_inputs())
  dropped = {p for p in PINNED_PARAMS if p.startswith(
      ('embeddings/token_type', 'pooler', 'nsp'))}
  assert set(_paths(student_params)) == set(PINNED_PARAMS) - dropped
  # With the default's token-type rows zeroed, the two models agree.
  params['embeddings']['token_type']['embedding'] = jnp.zeros((2, 16))
  copied = {k: v for k, v in params.items() if k not in ('pooler', 'nsp')}
  copied['embeddings'] = {k: v for k, v in params['embeddings'].items()
                          if k != 'token_type'}
  want = jax.jit(default.apply)({'params': params}, *_small_inputs())
  got = jax.jit(student.apply)({'params': copied}, *_small_inputs())
  assert sorted(got) == ['mlm_logits', 'sequence_output']
  for key in got:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6)


# ---- Which teacher layers start the student.


@pytest.mark.parametrize('teacher, student, expected', [
    (12, 6, (0, 2, 4, 7, 9, 11)),    # extract_distilbert.py's choice.
    (24, 12, (0, 2, 4, 6, 8, 10, 13, 15, 17, 19, 21, 23)),
    (4, 2, (0, 3)),
    (6, 3, (0, 3, 5)),
    (4, 4, (0, 1, 2, 3)),
    (5, 1, (0,)),
])
def test_teacher_layers_for_student(teacher, student, expected):
  assert distillation.teacher_layers_for_student(teacher, student) == expected


@pytest.mark.parametrize('student', [0, 5])
def test_teacher_layers_for_student_rejects_impossible_depths(student):
  with pytest.raises(ValueError, match='cannot be taken'):
    distillation.teacher_layers_for_student(4, student)


# ---- The losses against numpy.


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _loss_inputs(seed=0):
  rng = np.random.default_rng(seed)
  b, p, v, l, d = 3, 4, 11, 6, 5
  weights = np.ones((b, p), np.float32)
  weights[1, 2:] = 0
  weights[2, 3] = 0
  attention_mask = np.ones((b, l), np.int32)
  attention_mask[0, 4:] = 0
  attention_mask[2, 5:] = 0
  student_hidden = rng.normal(size=(b, l, d)).astype(np.float32)
  teacher_hidden = rng.normal(size=(b, l, d)).astype(np.float32)
  # Pad tokens hold values that would change the mean if counted.
  student_hidden[attention_mask == 0] = 100.0
  teacher_hidden[attention_mask == 0] = -100.0
  return {
      'student_logits': rng.normal(size=(b, p, v)).astype(np.float32) * 3,
      'teacher_logits': rng.normal(size=(b, p, v)).astype(np.float32) * 3,
      'masked_ids': rng.integers(0, v, (b, p)).astype(np.int32),
      'masked_weights': weights, 'attention_mask': attention_mask,
      'student_hidden': student_hidden, 'teacher_hidden': teacher_hidden,
  }


def _numpy_kl(x, temperature):
  keep = x['masked_weights'] > 0
  s = x['student_logits'][keep] / temperature
  t = x['teacher_logits'][keep] / temperature
  rows = (_softmax(t) * (_log_softmax(t) - _log_softmax(s))).sum(-1)
  return rows.mean() * temperature**2     # batchmean, times T^2.


def _numpy_cosine(x):
  keep = x['attention_mask'] > 0
  s, t = x['student_hidden'][keep], x['teacher_hidden'][keep]
  cos = (s * t).sum(-1) / np.sqrt((s * s).sum(-1) * (t * t).sum(-1))
  return (1 - cos).mean()


def _numpy_mlm(x):
  w = x['masked_weights']
  nll = -np.take_along_axis(_log_softmax(x['student_logits']),
                            x['masked_ids'][..., None], -1)[..., 0]
  return (w * nll).sum() / (w.sum() + 1e-5)   # BERT's, as objectives.


@pytest.mark.parametrize('temperature', [1.0, 2.0])
def test_soft_target_kl_matches_numpy(temperature):
  x = _loss_inputs()
  loss, sums = distillation.soft_target_kl(
      x['student_logits'], x['teacher_logits'], x['masked_weights'],
      temperature)
  assert float(loss) == pytest.approx(_numpy_kl(x, temperature), rel=1e-5)
  assert float(sums['kl_count']) == x['masked_weights'].sum()
  assert float(sums['kl_loss_sum'] / sums['kl_count']) == pytest.approx(
      float(loss), rel=1e-6)


@pytest.mark.parametrize('temperature', [0.5, 2.0])
def test_soft_target_kl_ignores_the_padding_rows(temperature):
  """Logits with padding rows (bert.PADDING_LOGIT, as the model makes them
  past the tokenizer's vocabulary) give the KL of the real rows alone,
  finite at any temperature (0 x log 0 stays 0)."""
  x = _loss_inputs()
  pad = lambda logits: np.concatenate([logits, np.full(
      logits.shape[:-1] + (7,), bert.PADDING_LOGIT, np.float32)], -1)
  padded, _ = distillation.soft_target_kl(
      pad(x['student_logits']), pad(x['teacher_logits']),
      x['masked_weights'], temperature)
  real, _ = distillation.soft_target_kl(
      x['student_logits'], x['teacher_logits'], x['masked_weights'],
      temperature)
  assert np.isfinite(float(padded))
  assert float(padded) == pytest.approx(float(real), rel=1e-6)


def test_soft_target_kl_is_zero_for_the_teacher_itself():
  x = _loss_inputs()
  loss, _ = distillation.soft_target_kl(x['teacher_logits'], x['teacher_logits'],
                                   x['masked_weights'], 2.0)
  assert abs(float(loss)) < 1e-6


def test_hidden_cosine_matches_numpy_over_non_pad_tokens():
  x = _loss_inputs()
  loss, sums = distillation.hidden_cosine(x['student_hidden'], x['teacher_hidden'],
                                     x['attention_mask'])
  assert float(loss) == pytest.approx(_numpy_cosine(x), rel=1e-5)
  assert float(sums['cos_count']) == x['attention_mask'].sum()


def test_distillation_objective_weights_the_three_terms():
  x = _loss_inputs()
  student = {'mlm_logits': x['student_logits'],
             'sequence_output': x['student_hidden']}
  teacher = {'mlm_logits': x['teacher_logits'],
             'sequence_output': x['teacher_hidden']}
  batch = {k: x[k] for k in ('masked_ids', 'masked_weights',
                             'attention_mask')}
  loss, sums = distillation.distillation_objective(student, teacher, batch,
                                              2.0, 5.0, 2.0, 1.0)
  expected = (5.0 * _numpy_kl(x, 2.0) + 2.0 * _numpy_mlm(x)
              + 1.0 * _numpy_cosine(x))
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  summary = losses.summarize(jax.device_get(sums))
  assert summary['kl_loss'] == pytest.approx(_numpy_kl(x, 2.0), rel=1e-5)
  assert summary['cos_loss'] == pytest.approx(_numpy_cosine(x), rel=1e-5)
  assert summary['mlm_loss'] == pytest.approx(_numpy_mlm(x), rel=1e-4)
  assert {'mlm_accuracy', 'teacher_mlm_loss', 'teacher_mlm_accuracy'} <= set(
      summary)


# ---- A teacher workdir written directly (no training): its config, a
# tokenizer file, and a checkpoint as bertjax.train saves it.

TEACHER_LAYERS = 4


def _teacher_config():
  cfg = _set(config_lib.demo_config(), {**TINY, **TINY_MODEL})
  cfg.model.num_layers = TEACHER_LAYERS
  return cfg


def _write_teacher(workdir, checkpoint=True, tokenizer=b'teacher pieces'):
  return teacher_helpers.write_teacher(workdir, _teacher_config(), checkpoint,
                                       tokenizer)


@pytest.fixture(scope='module')
def teacher(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('teachers') / 'teacher')
  return workdir, _write_teacher(workdir)


def _student_config(teacher_workdir, **fields):
  """The preset for ``teacher_workdir``, prepared as the trainer does."""
  cfg = _set(_load(PRESET), {**TINY,
                             'distillation.teacher_workdir': teacher_workdir})
  return distillation.prepare_config(_set(cfg, fields))


def _batch(cfg):
  spec = {'input_ids': np.int32, 'token_type_ids': np.int32,
          'attention_mask': np.int32, 'masked_positions': np.int32,
          'masked_ids': np.int32, 'masked_weights': np.float32,
          'masked_unit_start': np.int32}
  b, l = 2, cfg.data.max_seq_length
  p = cfg.masking.max_predictions_per_seq
  rng = np.random.default_rng(0)
  batch = {k: np.zeros((b, p if k.startswith('masked') else l), dtype)
           for k, dtype in spec.items()}
  batch['input_ids'] = rng.integers(5, 400, (b, l)).astype(np.int32)
  batch['attention_mask'][:] = 1
  batch['attention_mask'][1, 20:] = 0
  batch['masked_positions'] = np.tile(np.arange(1, p + 1, dtype=np.int32),
                                      (b, 1))
  batch['masked_ids'] = rng.integers(5, 400, (b, p)).astype(np.int32)
  batch['masked_weights'][:] = 1
  return batch


def _task_init(task, cfg):
  """The task's boxed parameters, its teacher passed in as the trainer
  passes it (an argument)."""
  return task.init(jax.random.key(0), _batch(cfg), nn.unbox(task.init_inputs))


def test_student_starts_as_a_copy_of_the_teacher(teacher):
  workdir, teacher_params = teacher
  cfg = _student_config(workdir, **{'distillation.student_layers': 2})
  task = distillation.make_task(cfg, 400)
  params = nn.unbox(_task_init(task, cfg))
  assert set(params) == {'student', 'teacher'}
  student, kept = params['student'], params['teacher']
  # The teacher is restored exactly, without the heads distillation skips.
  assert set(kept) == set(teacher_params) - {'pooler', 'nsp'}
  jax.tree.map(np.testing.assert_array_equal, kept,
               {k: teacher_params[k] for k in kept})
  assert set(student) == {'embeddings', 'layer_0', 'layer_1',
                          'mlm_transform', 'mlm_norm', 'mlm_output_bias'}
  assert set(student['embeddings']) == {'word', 'position', 'layer_norm'}
  for name in student['embeddings']:
    jax.tree.map(np.testing.assert_array_equal, student['embeddings'][name],
                 teacher_params['embeddings'][name])
  # Evenly spaced from the first layer to the last: 0 and 3 of 4.
  for i, source in enumerate((0, 3)):
    jax.tree.map(np.testing.assert_array_equal, student[f'layer_{i}'],
                 teacher_params[f'layer_{source}'])
  for name in ('mlm_transform', 'mlm_norm', 'mlm_output_bias'):
    jax.tree.map(np.testing.assert_array_equal, student[name],
                 teacher_params[name])
  # Every leaf keeps its logical axes, so the trainer shards the teacher.
  boxed = _task_init(task, cfg)
  assert all(isinstance(x, nn.Partitioned) for x in jax.tree.leaves(
      boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)))


def test_student_layers_default_to_half_the_teacher(teacher):
  workdir, _ = teacher
  cfg = _student_config(workdir, **{'distillation.student_layers': 0})
  params = _task_init(distillation.make_task(cfg, 400), cfg)
  assert sorted(k for k in params['student'] if k.startswith('layer_')) == [
      'layer_0', 'layer_1']


def test_teacher_gets_no_gradient_and_is_marked_frozen(teacher):
  workdir, _ = teacher
  cfg = _student_config(workdir, **{'distillation.student_layers': 2})
  task = distillation.make_task(cfg, 400)
  params = nn.unbox(_task_init(task, cfg))
  (loss, sums), grads = jax.jit(
      jax.value_and_grad(task.loss, has_aux=True), static_argnums=3)(
          params, _batch(cfg), jax.random.key(1), False)
  assert math.isfinite(float(loss)) and float(sums['kl_count']) > 0
  assert all(not np.any(g) for g in jax.tree.leaves(grads['teacher']))
  assert any(np.any(g) for g in jax.tree.leaves(grads['student']))
  flags = task.trainable(params)
  assert all(jax.tree.leaves(flags['student']))
  assert not any(jax.tree.leaves(flags['teacher']))
  # Boxed parameters (as the trainer builds its optimizer state from) get
  # one flag per parameter too.
  boxed_flags = task.trainable(_task_init(task, cfg))
  assert jax.tree.structure(boxed_flags) == jax.tree.structure(flags)


# ---- The teacher checks, before anything compiles.


def test_empty_teacher_workdir_fails():
  with pytest.raises(distillation.TeacherError, match='teacher_workdir is empty'):
    distillation.prepare_config(_student_config(''))


def test_missing_teacher_workdir_fails(tmp_path):
  with pytest.raises(distillation.TeacherError, match='is not a directory'):
    distillation.prepare_config(_student_config(str(tmp_path / 'nowhere')))


def test_teacher_workdir_without_a_run_fails(tmp_path):
  with pytest.raises(distillation.TeacherError, match='has no run_meta.json'):
    distillation.prepare_config(_student_config(str(tmp_path)))


def test_teacher_workdir_without_a_checkpoint_fails(tmp_path):
  workdir = str(tmp_path / 'teacher')
  _write_teacher(workdir, checkpoint=False)
  with pytest.raises(distillation.TeacherError, match='has no checkpoint'):
    distillation.make_task(_student_config(workdir), 400)


def test_tokenizer_must_be_the_teachers(teacher, tmp_path):
  workdir, _ = teacher
  other = tmp_path / 'other.model'
  other.write_bytes(b'other pieces')
  cfg = _set(_load(PRESET), {**TINY, 'distillation.teacher_workdir': workdir,
                             'data.tokenizer.model_path': str(other)})
  with pytest.raises(distillation.TeacherError, match='is not the tokenizer'):
    distillation.prepare_config(cfg)
  with pytest.raises(distillation.TeacherError, match='is not the tokenizer'):
    distillation.make_task(cfg, 400)


def test_unset_tokenizer_points_at_the_teachers(teacher):
  workdir, _ = teacher
  cfg = _set(_load(PRESET), {**TINY, 'distillation.teacher_workdir': workdir})
  assert cfg.data.tokenizer.model_path == ''
  prepared = objectives.get(cfg.objective.name).prepare_config(cfg)   # As the trainer does.
  assert prepared.data.tokenizer.model_path == os.path.join(
      workdir, 'tokenizer.model')
  assert cfg.data.tokenizer.model_path == ''      # A copy was changed.
  # Unprepared, the task refuses: the trainer would have loaded another
  # tokenizer.
  with pytest.raises(distillation.TeacherError, match='model_path is ""'):
    distillation.make_task(cfg, 400)


def test_student_deeper_than_teacher_fails(teacher):
  workdir, _ = teacher
  cfg = _student_config(workdir, **{'distillation.student_layers': 5})
  with pytest.raises(distillation.TeacherError, match='student_layers=5'):
    distillation.make_task(cfg, 400)


def test_mobilebert_teacher_fails(tmp_path, monkeypatch):
  """A student copies BERT's layers: a teacher with MobileBERT's options
  (here its embedding) is refused before its checkpoint is read."""
  workdir = tmp_path / 'teacher'
  workdir.mkdir()
  teacher = _set(_teacher_config(), {'model.trigram_input': True,
                                     'model.embedding_size': 16})
  (workdir / distillation.RUN_META).write_text(json.dumps(
      {'config': teacher.to_dict(), 'vocab_size': 400,
       'tokenizer_sha256': ''}))
  monkeypatch.setattr(distillation.checkpoint_lib, 'latest_step',
                      lambda _: 3)
  cfg = _set(_load(PRESET), {'distillation.teacher_workdir': str(workdir)})
  with pytest.raises(distillation.TeacherError,
                     match='MobileBERT-style run.*trigram_input'):
    distillation.read_teacher(cfg)


# ---- The preset.


def test_preset_is_distilberts():
  c = _load(PRESET)
  assert (c.objective.name, c.objective.nsp_weight, c.data.layout) == (
      'distillation', 0.0, 'full_sentences')
  d = c.distillation
  assert (d.student_layers, d.temperature, d.kl_weight, d.mlm_weight,
          d.cosine_weight) == (6, 2.0, 5.0, 2.0, 1.0)
  o = c.optimizer
  assert (o.name, o.schedule, o.learning_rate, o.b1, o.b2, o.eps,
          o.weight_decay, o.grad_clip_norm) == (
              'adamw', 'warmup_linear', 5e-4, 0.9, 0.98, 1e-6, 0.0, 5.0)
  assert (c.batch_size, c.total_steps, o.warmup_steps) == (4096, 6000, 300)
  assert c.masking.dynamic and c.masking.rate == 0.15
  assert config_check.warnings_for(c) == [] and config_check.errors_for(c) == []
  # The warmup stays 5% of the steps; the tokenizer is the teacher's (set
  # by prepare_config, tested above).
  c.total_steps = 1000
  assert c.optimizer.warmup_steps == 50
  assert c.data.tokenizer.model_path == ''
  # Without a teacher the run stops before reading data, naming the field.
  with pytest.raises(distillation.TeacherError, match='teacher_workdir'):
    objectives.get(c.objective.name).prepare_config(c)


# ---- End to end: train a tiny teacher, then distill a student from it.


@pytest.mark.e2e
@pytest.mark.filterwarnings('ignore:Sharding info not provided')
def test_distill_a_tiny_student_end_to_end(tmp_path):
  data_dir = str(tmp_path / 'data')
  teacher_dir = str(tmp_path / 'teacher')
  sys.path.insert(0, os.path.dirname(DEMO))
  try:
    teacher_cfg = _set(_load(DEMO), {
        **TINY, **TINY_MODEL, 'data.data_dir': data_dir,
        'objective.nsp_weight': 0.0, 'model.num_layers': TEACHER_LAYERS,
        'total_steps': 3, 'log_every_steps': 3, 'eval_every_steps': 3,
        'checkpoint_every_steps': 3, 'optimizer.warmup_steps': 1})
  finally:
    sys.path.pop(0)
  train.train_and_evaluate(teacher_cfg, teacher_dir)
  teacher_files = sorted(os.walk(teacher_dir))

  cfg = _student_config(teacher_dir, **{
      'data.data_dir': data_dir, 'data.corpus': teacher_cfg.data.corpus,
      'total_steps': 4, 'log_every_steps': 2, 'eval_every_steps': 4,
      'checkpoint_every_steps': 4, 'distillation.student_layers': 2})
  workdir = str(tmp_path / 'student')
  final = train.train_and_evaluate(cfg, workdir)
  records = _read_jsonl(workdir)
  assert [r['step'] for r in records] == [2, 4]
  for r in records:
    assert all(math.isfinite(r[k]) for k in ('loss', 'kl_loss', 'cos_loss',
                                             'mlm_loss'))
    assert 'nsp_loss' not in r
    # The logged total is 5 x KL + 2 x MLM + 1 x cosine of the same batch.
    assert r['loss'] == pytest.approx(
        5 * r['kl_loss'] + 2 * r['mlm_loss'] + r['cos_loss'], rel=1e-3)
  assert {'eval_kl_loss', 'eval_cos_loss', 'eval_teacher_mlm_accuracy'} <= (
      set(final))
  assert sorted(os.walk(teacher_dir)) == teacher_files   # Only read.

  # The saved state: the teacher exactly as trained, with no optimizer
  # state; the student moved.
  def restore(directory, step):
    with ocp.CheckpointManager(
        os.path.join(directory, 'checkpoints'),
        item_handlers={'state': ocp.PyTreeCheckpointHandler()}) as manager:
      return manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore()))['state']

  trained_teacher = restore(teacher_dir, 3)['params']
  distilled = restore(workdir, 4)
  kept = distilled['params']['teacher']
  assert set(kept) == set(trained_teacher) - {'pooler', 'nsp'}
  jax.tree.map(np.testing.assert_array_equal, kept,
               {k: trained_teacher[k] for k in kept})
  opt_paths = [jax.tree_util.keystr(p) for p, _ in
               jax.tree_util.tree_flatten_with_path(distilled['opt_state'])[0]]
  assert any("'student'" in p for p in opt_paths)
  assert not any("'teacher'" in p for p in opt_paths)
  moved = distilled['params']['student']['layer_1']['ffn']['wo']['kernel']
  assert not np.array_equal(moved,
                            trained_teacher['layer_3']['ffn']['wo']['kernel'])
