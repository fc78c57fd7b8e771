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


def test_prediction_loss_is_soft_cross_entropy_or_squared_error():
  s = jnp.array([[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]])
  t = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
  p = np.exp(np.asarray(t) / 2)
  p /= p.sum(-1, keepdims=True)
  log_q = np.asarray(s) / 2 - np.log(np.exp(np.asarray(s) / 2).sum(
      -1, keepdims=True))
  assert float(task_distill.prediction_loss('classification', s, t, 2.0)
               ) == pytest.approx(-(p * log_q).sum(-1).mean(), rel=1e-5)
  assert float(task_distill.prediction_loss('regression', s[:, :1], t[:, :1],
                                            2.0)) == pytest.approx(
                                                ((1 - 2) ** 2 + 1) / 2)


def test_bad_configs_fail_before_any_work(pretrained, tasks, teacher,
                                          tmp_path):
  cfg = _config(pretrained, tasks, str(tmp_path), **{
      'distill.temperature': 0.0, 'augment.replace_prob': 2.0,
      'mode': 'frozen', 'optimizer.layerwise_lr_decay': 0.8})
  with pytest.raises(task_distill.DistillError) as e:
    task_distill.distill_task(cfg, str(tmp_path / 'out'))
  for part in ('has no finetune_meta.json', 'distill.temperature=0.0',
               "mode='frozen'", 'replace_prob in [0, 1]',
               'layerwise_lr_decay=0.8'):
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
  with pytest.raises(task_distill.DistillError, match=r"\['distill'\]"):
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
  with pytest.raises(task_distill.DistillError, match=r"\['distill'\]"):
    check(cfg, str(tmp_path))


def test_preset_is_task_distill_pys():
  c = preset_helpers.load_preset('task_distill', 'task=glue/sst2,augment=on')
  d, a, o = c.distill, c.augment, c.optimizer
  assert (d.intermediate_epochs, d.intermediate_learning_rate,
          d.prediction_epochs, d.prediction_learning_rate,
          d.temperature) == (10.0, 5e-5, 3.0, 3e-5, 1.0)
  assert (a.copies, a.replace_prob, a.candidates) == (20, 0.4, 15)
  assert (c.batch_size, o.name, o.schedule, o.grad_clip, o.weight_decay,
          o.warmup_proportion) == (32, 'bert_adamw', 'warmup_linear',
                                   'per_tensor', 0.01, 0.1)
  demo = preset_helpers.load_preset('task_distill')
  assert (demo.task.name, demo.augment.copies) == ('embedded', 0)
  with pytest.raises(ValueError, match='augment='):
    preset_helpers.load_preset('task_distill', 'augment=yes')


@pytest.mark.parametrize('stage, unread', [
    ('intermediate', [('student', 'pooler'), ('student', 'classifier')]),
    ('prediction', [('projection',)])])
def test_a_stage_leaves_what_its_loss_does_not_read(stage, unread):
  # No update and no weight decay where the stage's loss has no gradient,
  # as TinyBERT's BertAdam skips a parameter without one.
  teacher_cfg = test_finetune.SMALL
  student_cfg = dataclasses.replace(teacher_cfg, num_layers=1)
  teacher = heads.DownstreamModel(teacher_cfg, 'classification', 2)
  student = heads.DownstreamModel(student_cfg, 'classification', 2)
  mapping, problems = tinybert.pair(student_cfg, teacher_cfg, (), 1.0)
  assert not problems
  cfg = task_distill.base_config()
  cfg.max_seq_length = 8
  cfg.optimizer.warmup_proportion = 0.0   # A full step from the first.
  steps = task_distill.make_steps(cfg, stage, student, teacher, 10, mapping)
  ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 100 + 5
  teacher_params = teacher.init(jax.random.key(1), ids, ids * 0,
                                ids * 0 + 1)['params']
  state = jax.jit(lambda t: sharding.strip_boxes(steps.init_state(t)))(
      teacher_params)   # As the run's state is born: unboxed.
  batch = {'input_ids': ids, 'token_type_ids': ids * 0,
           'attention_mask': ids * 0 + 1}
  new, _ = jax.jit(steps.train_step)(state, batch)
  before = flax.traverse_util.flatten_dict(state.params)
  after = flax.traverse_util.flatten_dict(new.params)
  moved = {k for k in before
           if not np.array_equal(before[k], after[k])}
  for prefix in unread:
    assert not {k for k in moved if k[:len(prefix)] == prefix}, prefix
  assert any(k[:2] == ('student', 'embeddings') for k in moved)
  assert not {k for k in moved if k[0] == 'teacher'}
