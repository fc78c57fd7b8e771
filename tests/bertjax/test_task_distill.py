"""Task-specific distillation: MLM augmentation, the checks, and end to end a
fine-tuned teacher distilled into a student in two stages, resumed."""

import dataclasses
import json
import os
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import sharding
from bertjax import task_distill
from bertjax.models import heads
from bertjax.objectives import tinybert
import preset_helpers
import test_finetune


# Fine-tuning's tiny pretrained run and small file tasks (module-scoped
# here too).
pretrained = test_finetune.pretrained
tasks = test_finetune.tasks


@pytest.fixture(scope='module')
def teacher(pretrained, tasks, tmp_path_factory):
  """The tiny pretrained run fully fine-tuned on the classification task,
  less a quarter of its examples held out as a dev split."""
  workdir = tmp_path_factory.mktemp('teacher') / 'cls'
  test_finetune._run(pretrained, tasks, workdir, 'full', num_epochs=2.0,  # pylint: disable=protected-access
                     **{'task.dev_fraction': 0.25})
  return str(workdir)


def _config(pretrained, tasks, teacher, **fields):
  cfg = task_distill.base_config()
  cfg.init, cfg.teacher = pretrained, teacher
  t = cfg.task
  t.name, t.kind = 'files', 'classification'
  t.train_path, t.eval_path = tasks['cls_train'], tasks['cls_eval']
  t.dev_fraction = 0.25   # The teacher's.
  cfg.max_seq_length, cfg.batch_size = 16, 8
  d = cfg.distill
  d.intermediate_epochs, d.prediction_epochs = 1.0, 1.0
  d.intermediate_learning_rate = d.prediction_learning_rate = 1e-3
  cfg.log_every_steps = cfg.checkpoint_every_steps = 4
  for key, value in fields.items():
    *parents, leaf = key.split('.')
    section = cfg
    for part in parents:
      section = section[part]
    section[leaf] = value
  return cfg


def _reference_words(text, tok):
  """data_augmentation.py's MLM words, by its own rules: BERT's basic
  tokens of ``text`` (punctuation split off), valid, no stop word, and of
  one piece."""
  words = re.findall(r'[a-z0-9]+|[^\sa-z0-9]', text.lower())
  return [w for w in words if re.fullmatch('[a-z]+', w) and
          w not in task_distill.STOP_WORDS and len(tok.encode([w])[0]) == 1]


def test_mlm_rewrites_replace_the_references_words_only(pretrained):
  mlm = task_distill.MaskedLM(pretrained, 16)
  tok = mlm.tokenizer
  texts = ['the module returns a string, not a value.',
           'alpha beta gamma delta file']
  rng = np.random.default_rng(0)
  out = task_distill.augment_texts(texts, mlm, 6, 1.0, 3, 4, rng)
  assert [len(r) for r in out] == [6, 6]
  for text, rewrites in zip(texts, out):
    ids = tok.encode([text])[0]
    chosen = task_distill.rewritable_words(ids, tok)
    assert [tok.decode([ids[i]]) for i in chosen] == (
        _reference_words(text, tok))
    for rewrite in rewrites:
      new = tok.encode([rewrite])[0]
      # With probability 1 each chosen word is a candidate: a word, never
      # a special; stop words and punctuation stay.
      assert not set(new.tolist()) & {0, 1, 2, 3, 4}
      if text == texts[0]:
        assert re.search(r'^the .*, not a .*\.$', rewrite), rewrite
    assert any(r != text for r in rewrites) == bool(chosen)
  # Words before punctuation too.
  assert _reference_words(texts[0], tok) == ['module', 'string', 'value']
  # Deterministic in the generator's seed.
  again = task_distill.augment_texts(texts, mlm, 6, 1.0, 3, 4,
                                     np.random.default_rng(0))
  assert again == out
  kept = task_distill.augment_texts(texts, mlm, 2, 0.0, 3, 4, rng)
  assert kept == [[t, t] for t in texts]   # Nothing replaced: the text.
  # An example keeps its distinct rewrites only (the reference's augment).
  cfg = task_distill.base_config()
  a = cfg.augment
  a.copies, a.replace_prob, a.candidates, a.batch_size = 6, 1.0, 3, 4
  examples = [{'text': t, 'label': 0} for t in texts]
  rows = task_distill.augment_examples(cfg, examples, mlm)
  assert [r['text'] for r in rows if r['text'] in texts] == texts
  assert len({r['text'] for r in rows}) == len(rows) > 2


def test_the_mlm_sees_the_text_again_as_segment_b(pretrained):
  # data_augmentation.py's _masked_language_model: [CLS] masked [SEP]
  # text [SEP], types 0 then 1; cut to fit the row.
  mlm = task_distill.MaskedLM(pretrained, 8)
  assert (mlm.window, mlm.length, mlm.segments) == (6, 16, True)
  ids = np.arange(10, 19, dtype=np.int32)   # 9 pieces.
  row, types = mlm.row(ids, 2)
  cls, sep, mask = 2, 3, 4
  assert row.tolist() == [cls, 10, 11, mask, 13, 14, 15, sep,
                          10, 11, 12, 13, 14, 15, 16, sep]
  assert types.tolist() == [0] * 8 + [1] * 8
  row, types = mlm.row(ids[:3], 0)
  assert row.tolist() == [cls, mask, 11, 12, sep, 10, 11, 12, sep] + [0] * 7
  assert types.tolist() == [0] * 5 + [1] * 4 + [0] * 7


def test_a_packed_mlm_reads_segment_b_as_type_0(pretrained, monkeypatch):
  # A packed run (RoBERTa's full sentences) never trained type row 1.
  load = task_distill.runs.load_run

  def packed(workdir, step=None):
    run = load(workdir, step)
    run.config.data.layout = 'full_sentences'
    return run

  monkeypatch.setattr(task_distill.runs, 'load_run', packed)
  mlm = task_distill.MaskedLM(pretrained, 8)
  assert not mlm.segments
  row, types = mlm.row(np.arange(10, 13, dtype=np.int32), 0)
  assert row[:9].tolist() == [2, 4, 11, 12, 3, 10, 11, 12, 3]
  assert not types.any()


def test_a_pairs_texts_are_rewritten_in_turn(pretrained):
  # The reference's augment_ids loop: each text of a pair rewritten with
  # the other as given.
  mlm = task_distill.MaskedLM(pretrained, 16)
  cfg = task_distill.base_config()
  a = cfg.augment
  a.copies, a.replace_prob, a.candidates, a.batch_size = 3, 1.0, 3, 4
  example = {'text': 'the module returns a string',
             'text_pair': 'the value is not used', 'label': 1}
  rows = task_distill.augment_examples(cfg, [example], mlm)
  assert rows[0] == example
  firsts = [r for r in rows[1:] if r['text_pair'] == example['text_pair']]
  seconds = [r for r in rows[1:] if r['text'] == example['text']]
  assert firsts and seconds
  assert len(firsts) + len(seconds) == len(rows) - 1 <= 6
  assert all(r['label'] == 1 for r in rows)
  # Every candidate is a word: none deletes the word it replaces.
  for r in rows:
    assert len(r['text'].split()) == 5 and len(r['text_pair'].split()) == 5


def test_a_general_runs_projections_start_stage_one(monkeypatch):
  # The code's task student loads the general run's fit_dense with its
  # encoder; one that does not fit the teacher's width starts fresh.
  fresh = {'hidden': {'kernel': np.zeros((4, 6), np.float32),
                      'bias': np.zeros((6,), np.float32)}}
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), fresh)
  general = {'hidden': {'kernel': np.ones((4, 6), np.float32),
                        'bias': np.full((6,), 2.0, np.float32)}}
  saved = {'projection': general}
  monkeypatch.setattr(task_distill.runs, 'load_run', lambda w, s: (
      dataclasses.make_dataclass('Run', ['params'])(saved)))

  def start(objective):
    run = task_distill.finetune.Pretrained('gen', 7, objective, None, {},
                                           None)
    return task_distill._general_projection(  # pylint: disable=protected-access
        run, fresh, abstract)

  got = start('tinybert')
  np.testing.assert_array_equal(got['hidden']['kernel'], 1.0)
  np.testing.assert_array_equal(got['hidden']['bias'], 2.0)
  assert start('bert') is fresh
  saved['projection'] = {'hidden': {'kernel': np.ones((4, 8), np.float32),
                                    'bias': np.ones((8,), np.float32)}}
  assert start('tinybert') is fresh   # Another teacher width.


def test_prediction_loss_is_soft_cross_entropy_or_error_to_the_gold():
  s = jnp.array([[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]])
  t = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
  p = np.exp(np.asarray(t) / 2)
  p /= p.sum(-1, keepdims=True)
  log_q = np.asarray(s) / 2 - np.log(np.exp(np.asarray(s) / 2).sum(
      -1, keepdims=True))
  labels = jnp.array([4.0, 1.0])
  assert float(task_distill.prediction_loss('classification', s, t, labels,
                                            2.0)
               ) == pytest.approx(-(p * log_q).sum(-1).mean(), rel=1e-5)
  # Regression: the gold score, not the teacher's (task_distill.py's
  # loss_mse(student_logits, label_ids)).
  assert float(task_distill.prediction_loss('regression', s[:, :1], t[:, :1],
                                            labels, 2.0)) == pytest.approx(
                                                ((1 - 4) ** 2 + 1) / 2)


def test_bad_configs_fail_before_any_work(pretrained, tasks, teacher,
                                          tmp_path):
  cfg = _config(pretrained, tasks, str(tmp_path), **{
      'distill.temperature': 0.0, 'augment.replace_prob': 2.0,
      'mode': 'frozen', 'optimizer.layerwise_lr_decay': 0.8,
      'distill.prediction_schedule': 'cosine'})
  with pytest.raises(task_distill.DistillError) as e:
    task_distill.distill_task(cfg, str(tmp_path / 'out'))
  for part in ('has no finetune_meta.json', 'WORKDIR/pretrained/seed<N>',
               'distill.temperature=0.0',
               "mode='frozen'", 'replace_prob in [0, 1]',
               'layerwise_lr_decay=0.8', "prediction_schedule='cosine'"):
    assert part in str(e.value)
  other = _config(pretrained, tasks, teacher, **{'task.kind': 'regression',
                                                  'task.train_path':
                                                      tasks['reg_train']})
  with pytest.raises(task_distill.DistillError, match='same task settings'):
    task_distill.distill_task(other, str(tmp_path / 'out'))
  reseeded = _config(pretrained, tasks, teacher, seed=1)
  with pytest.raises(task_distill.DistillError, match=(
      'fine-tuned with seed=0, whose dev split')):
    task_distill.distill_task(reseeded, str(tmp_path / 'out'))
  mapped = _config(pretrained, tasks, teacher,
                   **{'distill.layer_map': (1, 3)})
  with pytest.raises(task_distill.DistillError, match='points past'):
    task_distill.distill_task(mapped, str(tmp_path / 'out'))
  assert not (tmp_path / 'out').exists()


@pytest.mark.e2e
def test_distil_a_fine_tuned_teacher_in_two_stages(pretrained, tasks,
                                                   teacher, tmp_path):
  cfg = _config(pretrained, tasks, teacher, **{'augment.copies': 1})
  workdir = str(tmp_path / 'student')
  result = task_distill.distill_task(cfg, workdir)
  augment = json.load(open(os.path.join(workdir, task_distill.AUGMENT)))
  # One copy each of the 48 training examples left beside the 16 of the
  # dev split, kept where it differs from its example.
  assert augment['examples'] == 48 < augment['with_rewrites'] < 96
  assert result['train_rows'] == augment['with_rewrites']
  assert 0 <= result['metrics']['accuracy'] <= 1
  # As fine-tuning's downstream.json: dev scores, per-example predictions.
  assert result['dev_examples'] == 16
  assert 0 <= result['dev_metrics']['accuracy'] <= 1
  assert len(result['eval_predictions']) == len(result['eval_labels']) == 24
  assert np.mean(np.equal(result['eval_predictions'], result['eval_labels'])
                 ) == pytest.approx(result['metrics']['accuracy'])
  stage1 = preset_helpers.read_jsonl(
      os.path.join(workdir, 'intermediate'))
  stage2 = preset_helpers.read_jsonl(
      os.path.join(workdir, 'prediction'))
  # One epoch of batches of 8 a stage, logged every 4 steps and at the
  # last; the intermediate stage logs its terms.
  steps = result['train_rows'] // 8
  logged = sorted({*range(4, steps + 1, 4), steps})
  assert [r['step'] for r in stage1] == logged
  assert [r['step'] for r in stage2] == logged
  for r in stage1:
    assert r['loss'] == pytest.approx(r['emb_loss'] + r['hidden_loss'] +
                                      r['att_loss'], rel=1e-5)
  assert stage1[-1]['att_loss'] < stage1[0]['att_loss']
  # A rerun finds both stages finished and scores the same student, also
  # when its meta predates a field (that counts at its default); one with
  # other settings is refused before anything is read.
  meta_path = os.path.join(workdir, task_distill.META)
  meta = json.load(open(meta_path))
  del meta['identity']['distill']['temperature']
  with open(meta_path, 'w') as f:
    json.dump(meta, f)
  assert task_distill.distill_task(cfg, workdir)['metrics'] == (
      result['metrics'])
  cfg.distill.temperature = 2.0
  with pytest.raises(task_distill.DistillError, match='whose distill differ'):
    task_distill.distill_task(cfg, workdir)


def test_only_a_stage_checkpoint_binds_the_settings(tmp_path):
  check = task_distill._check_resume  # pylint: disable=protected-access
  cfg = task_distill.base_config()
  identity = check(cfg, str(tmp_path))   # A new workdir.
  with open(tmp_path / task_distill.META, 'w') as f:
    json.dump({'identity': identity}, f)
  cfg.distill.temperature += 1.0
  check(cfg, str(tmp_path))   # A start that left no checkpoint.
  (tmp_path / task_distill.STAGES[1] / 'checkpoints' / '3').mkdir(
      parents=True)
  with pytest.raises(task_distill.DistillError, match='whose distill differ'):
    check(cfg, str(tmp_path))


def test_preset_is_task_distill_pys():
  c = preset_helpers.load_preset('task_distill', 'task=glue/sst2,augment=on')
  d, a, o = c.distill, c.augment, c.optimizer
  assert (d.intermediate_epochs, d.intermediate_learning_rate,
          d.prediction_epochs, d.prediction_learning_rate,
          d.temperature) == (10.0, 5e-5, 3.0, 3e-5, 1.0)
  assert (a.copies, a.replace_prob, a.candidates) == (20, 0.4, 15)
  assert (d.intermediate_schedule, d.prediction_schedule) == (
      'constant', 'warmup_linear')   # BertAdam: 'none' w/o --pred_distill.
  assert (c.batch_size, o.name, o.grad_clip, o.weight_decay,
          o.warmup_proportion) == (32, 'bert_adamw', 'per_tensor', 0.01,
                                   0.1)
  demo = preset_helpers.load_preset('task_distill')
  assert (demo.task.name, demo.augment.copies) == ('embedded', 0)
  with pytest.raises(ValueError, match='augment='):
    preset_helpers.load_preset('task_distill', 'augment=yes')


def _tiny_stage(stage, cfg=None):
  """``stage``'s steps for a 1-layer student of a 2-layer teacher, its
  initial state and a batch of 2 x 8 tokens."""
  teacher_cfg = test_finetune.SMALL
  student_cfg = dataclasses.replace(teacher_cfg, num_layers=1)
  teacher = heads.DownstreamModel(teacher_cfg, 'classification', 2)
  student = heads.DownstreamModel(student_cfg, 'classification', 2)
  mapping, problems = tinybert.pair(student_cfg, teacher_cfg, (), 1.0)
  assert not problems
  if cfg is None:
    cfg = task_distill.base_config()
    cfg.optimizer.warmup_proportion = 0.0   # A full step from the first.
  cfg.max_seq_length = 8
  steps = task_distill.make_steps(cfg, stage, student, teacher, 10, mapping)
  ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 100 + 5
  teacher_params = teacher.init(jax.random.key(1), ids, ids * 0,
                                ids * 0 + 1)['params']
  state = jax.jit(lambda t: sharding.strip_boxes(steps.init_state(t)))(
      teacher_params)   # As the run's state is born: unboxed.
  batch = {'input_ids': ids, 'token_type_ids': ids * 0,
           'attention_mask': ids * 0 + 1, 'label': jnp.array([0, 1])}
  return steps, state, batch


def test_each_stage_runs_at_the_references_schedule():
  # task_distill.py's BertAdam: 'none' (constant, no warmup) in stage 1,
  # warmup_linear in stage 2; here over 10 updates with 20% warmup.
  rates = {}
  for stage in task_distill.STAGES:
    cfg = task_distill.base_config()
    cfg.optimizer.warmup_proportion = 0.2
    steps, state, batch = _tiny_stage(stage, cfg)
    step = jax.jit(steps.train_step)
    rates[stage] = []
    for _ in range(4):
      state, metrics = step(state, batch)
      rates[stage].append(float(metrics['learning_rate']))
  np.testing.assert_allclose(rates['intermediate'], [5e-5] * 4, rtol=1e-6)
  np.testing.assert_allclose(rates['prediction'],
                             [0.0, 1.5e-5, 3e-5, 3e-5 * 7 / 8], rtol=1e-6)


@pytest.mark.parametrize('stage, unread', [
    ('intermediate', [('student', 'pooler'), ('student', 'classifier')]),
    ('prediction', [('projection',)])])
def test_a_stage_leaves_what_its_loss_does_not_read(stage, unread):
  # No update and no weight decay where the stage's loss has no gradient,
  # as TinyBERT's BertAdam skips a parameter without one.
  steps, state, batch = _tiny_stage(stage)
  new, _ = jax.jit(steps.train_step)(state, batch)
  before = flax.traverse_util.flatten_dict(state.params)
  after = flax.traverse_util.flatten_dict(new.params)
  moved = {k for k in before
           if not np.array_equal(before[k], after[k])}
  for prefix in unread:
    assert not {k for k in moved if k[:len(prefix)] == prefix}, prefix
  assert any(k[:2] == ('student', 'embeddings') for k in moved)
  assert not {k for k in moved if k[0] == 'teacher'}
