"""ERNIE 2.0's continual preset end to end at a tiny size: every stream
trains, a run stopped mid-schedule resumes to the same bytes, and the export
loads in transformers' ErnieModel with the task embedding."""

import json
import math

import flax
import numpy as np
import pytest
import torch
import transformers

from bertjax import runs
from bertjax import train
from bertjax.interop import hf_convert
import preset_helpers

_TASKS = ('capitalization', 'token_document', 'sentence_reordering',
          'sentence_distance', 'discourse_relation')


def _ernie2(data_dir, **fields):
  """ernie2.py:size=demo at the tiny size: 9 steps in stages of 2, 3, 4
  (a step of each stream in each of its stages), evaluated where a run
  stopped mid-stage at step 4 is (its last step)."""
  cfg = preset_helpers.load_preset('ernie2', 'size=demo')
  return preset_helpers.set_fields(cfg, {
      **preset_helpers.TINY, 'data.data_dir': str(data_dir),
      'total_steps': 9, 'num_train_steps': 0, 'log_every_steps': 1,
      'eval_every_steps': 4, 'checkpoint_every_steps': 2,
      'continual.stage_steps': (2, 3, 4), **fields})


def _params(workdir) -> dict:
  return {k: np.asarray(v) for k, v in flax.traverse_util.flatten_dict(
      runs.load_run(str(workdir)).params).items()}


@pytest.fixture(scope='module')
def ernie2_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('ernie2')
  workdir = root / 'run'
  final = train.train_and_evaluate(_ernie2(root / 'data'), str(workdir))
  return root, workdir, final


@pytest.mark.e2e
def test_every_stream_trains_and_is_evaluated(ernie2_run):
  _, workdir, final = ernie2_run
  for task in _TASKS:
    assert 0 <= final[f'eval_{task}_accuracy'] <= 1, task
  assert 0 <= final['eval_mlm_accuracy'] <= 1
  records = preset_helpers.read_jsonl(str(workdir))
  assert all(math.isfinite(r['loss']) for r in records)
  # Stage 0 is the word stream alone: its tasks' metrics, nobody else's.
  assert 'capitalization_loss' in records[0]
  assert 'discourse_relation_loss' not in records[0]
  for task in _TASKS:   # Each stream trains.
    assert any(f'{task}_loss' in r for r in records), task


@pytest.mark.e2e
def test_a_run_stopped_mid_schedule_resumes_to_the_same_bytes(ernie2_run):
  root, workdir, _ = ernie2_run
  stopped = root / 'stopped'
  train.train_and_evaluate(_ernie2(root / 'data', num_train_steps=4),
                           str(stopped))
  train.train_and_evaluate(_ernie2(root / 'data'), str(stopped))
  with open(workdir / 'metrics.jsonl') as a, open(stopped /
                                                  'metrics.jsonl') as b:
    whole = [{k: v for k, v in json.loads(line).items()
              if k not in preset_helpers.TIMING_FIELDS} for line in a]
    resumed = [{k: v for k, v in json.loads(line).items()
                if k not in preset_helpers.TIMING_FIELDS} for line in b]
  assert resumed == whole
  a, b = _params(workdir), _params(stopped)
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))


@pytest.mark.e2e
def test_export_loads_in_ernie_model_with_the_task_embedding(ernie2_run,
                                                             tmp_path):
  _, workdir, _ = ernie2_run
  out = tmp_path / 'export'
  hf_convert.export_run(str(workdir), str(out))
  model, info = transformers.ErnieModel.from_pretrained(
      str(out), output_loading_info=True)
  assert not info['missing_keys']
  assert model.config.use_task_id and model.config.task_type_vocab_size == 4
  card = (out / 'README.md').read_text()   # Which stream each row is.
  assert ('0 `word` (capitalization, token_document + MLM), 1 `distance` '
          '(sentence_distance)') in card
  table = _params(workdir)[('embeddings', 'task_type', 'embedding')]
  np.testing.assert_array_equal(
      model.embeddings.task_type_embeddings.weight.detach().numpy(), table)
  with torch.no_grad():
    hidden = model(input_ids=torch.tensor([[2, 50, 60, 3]]),
                   task_type_ids=torch.tensor([[3, 3, 3, 3]]))
  assert np.all(np.isfinite(hidden.last_hidden_state.numpy()))


def test_task_ids_follow_the_stages_and_bind_a_resumed_run():
  cfg = preset_helpers.load_preset('ernie2', 'size=demo')
  ids = train.run_identity(cfg)['continual.task_ids']
  # Row 0, which fine-tuning reads, is the first stage's stream.
  assert ids == {'word': 0, 'distance': 1, 'reorder': 2, 'discourse': 3}
  moved = preset_helpers.load_preset('ernie2', 'size=demo')
  moved.continual.streams.discourse.first_stage = 0
  saved = json.loads(json.dumps(train.run_identity(cfg)))   # As written.
  changes = train.identity_changes(saved, train.run_identity(moved), {})
  assert list(changes) == ['continual.task_ids']
