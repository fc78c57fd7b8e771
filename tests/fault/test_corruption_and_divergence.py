"""Corrupt checkpoints and non-finite steps, in process (pytest -m fault).

Runs that recover end compared with an uninterrupted run of the same tiny
config (``experiments/kill_resume.compare``): ``metrics.jsonl`` byte for
byte and the final parameters bit for bit.
"""

import glob
import json
import os
import shutil

import grain
import jax
import numpy as np
import pytest

from bertjax.runtime import checkpoint
from bertjax.runtime import divergence
from bertjax import runs
from bertjax import train
from data_pipelines import pipeline
from fault_helpers import assert_identical as _assert_identical
from fault_helpers import config as _config
from fault_helpers import preset_helpers
from fault_helpers import steps as _steps

pytestmark = pytest.mark.fault


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('reference') / 'run')
  train.train_and_evaluate(_config(data_dir), workdir)
  return workdir


def _flip_a_byte(step_dir):
  path = max(glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'),
                       recursive=True), key=os.path.getsize)
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(step_dir):
  path = os.path.join(step_dir, 'state', 'manifest.ocdbt')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def _delete_iterator_state(step_dir):
  os.remove(os.path.join(step_dir, 'data', 'iterator_state.json'))


def _garble_manifest(step_dir):
  with open(os.path.join(step_dir, checkpoint.MANIFEST), 'w') as f:
    f.write('{"files": ')


@pytest.fixture(scope='module')
def stopped_at_12(data_dir, tmp_path_factory):
  """A run stopped at step 12 (checkpoints 4, 8 and 12)."""
  workdir = str(tmp_path_factory.mktemp('stopped') / 'run')
  train.train_and_evaluate(_config(data_dir, num_train_steps=12), workdir)
  return workdir


@pytest.mark.parametrize('corrupt', [_flip_a_byte, _truncate,
                                     _delete_iterator_state, _garble_manifest])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(
    reference, data_dir, stopped_at_12, tmp_path, corrupt, capsys):
  workdir = str(tmp_path / 'run')
  shutil.copytree(stopped_at_12, workdir)
  directory = os.path.join(workdir, 'checkpoints')
  assert _steps(directory) == [4, 8, 12]
  corrupt(os.path.join(directory, '12'))
  with pytest.raises(checkpoint.CorruptCheckpointError):
    checkpoint.verify(os.path.join(directory, '12'))
  capsys.readouterr()
  train.train_and_evaluate(_config(data_dir), workdir)
  out = capsys.readouterr().out
  assert 'checkpoint step 12 is unusable' in out
  assert 'falling back to step 8' in out
  assert 'resumed from the checkpoint at step 8' in out
  # Kept for inspection, never deleted; out of the way of the new step 12.
  assert os.path.isdir(os.path.join(workdir, 'checkpoints_corrupt', '12'))
  _assert_identical(reference, workdir)


def test_a_finished_run_with_a_damaged_last_step_trains_again(
    data_dir, stopped_at_12, tmp_path):
  """Run to the end (what the compare tool skips), but its last step is
  damaged: trained again from step 8, not taken as finished."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(stopped_at_12, workdir)
  cfg = _config(data_dir, total_steps=12)
  _flip_a_byte(os.path.join(workdir, 'checkpoints', '12'))
  with pytest.raises(ValueError, match='step 12 is corrupt'):   # Export's.
    runs.load_run(workdir)
  assert train.train_unless_finished(cfg, workdir)
  assert checkpoint.verify(os.path.join(workdir, 'checkpoints', '12'))
  assert not train.train_unless_finished(cfg, workdir)


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(data_dir,
                                                            tmp_path):
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(
      _config(data_dir, num_train_steps=4, keep_checkpoints=1), workdir)
  _flip_a_byte(os.path.join(workdir, 'checkpoints', '4'))
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match='no intact checkpoint'):
    train.train_and_evaluate(_config(data_dir), workdir)
  assert os.path.isdir(os.path.join(workdir, 'checkpoints_corrupt', '4'))
  # Rerun: the step is set aside already, and still no fresh start.
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match='steps 4 were unusable'):
    train.train_and_evaluate(_config(data_dir), workdir)
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == []
  # The steps set aside still hold the workdir to its run: another config
  # is refused before it rewrites the run's files (they say how to repair).
  meta = open(os.path.join(workdir, train.RUN_META)).read()
  with pytest.raises(train.ResumeError, match='seed'):
    train.train_and_evaluate(_config(data_dir, seed=7), workdir)
  assert open(os.path.join(workdir, train.RUN_META)).read() == meta


def _with_nan_batches(monkeypatch, steps):
  """The training stream with NaN masked_weights at the given (1-based)
  steps: their loss and gradients are NaN."""
  make = pipeline.train_dataset

  class NanBatches(grain.DatasetIterator):

    def __init__(self, inner):
      super().__init__()
      self._inner, self._taken = inner, 0

    def __next__(self):
      batch = dict(next(self._inner))
      self._taken += 1
      if self._taken in steps:
        batch['masked_weights'] = np.full_like(batch['masked_weights'],
                                               np.nan)
      return batch

    def get_state(self):
      return self._inner.get_state()

    def set_state(self, state):
      self._inner.set_state(state)

    def close(self):
      self._inner.close()

  class Dataset:

    def __init__(self, ds):
      self._ds = ds

    def __iter__(self):
      return NanBatches(iter(self._ds))

  monkeypatch.setattr(pipeline, 'train_dataset',
                      lambda *a, **k: Dataset(make(*a, **k)))


def test_nan_steps_are_skipped_and_counted(data_dir, tmp_path, monkeypatch,
                                           capsys):
  _with_nan_batches(monkeypatch, {6, 7})
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(
      _config(data_dir, total_steps=12, checkpoint_every_steps=12,
              **{'divergence.halt_after': 3}), workdir)
  records = {r['step']: r for r in preset_helpers.read_jsonl(workdir)}
  assert [records[s]['skipped_steps'] for s in (5, 6, 7, 8, 12)] == [
      0, 1, 2, 2, 2]
  assert np.isnan(records[6]['loss']) and np.isfinite(records[8]['loss'])
  # The schedule waits with the optimizer: steps 6-8 each log the rate
  # step 6 would have applied, and the decay goes on from there.
  lr = [records[s]['learning_rate'] for s in range(5, 10)]
  assert lr[0] > lr[1] == lr[2] == lr[3] > lr[4]
  assert all(np.isfinite(r['grad_norm']) for s, r in records.items()
             if s not in (6, 7))
  assert 'step(s) with a non-finite loss or gradient' in capsys.readouterr(
      ).out
  params = runs.load_run(workdir).params
  assert all(np.isfinite(np.asarray(x)).all() for x in
             jax.tree.leaves(params))


@pytest.mark.parametrize('policy, halt_after, nan_steps, halted_at, log', [
    ('halt', 10, {6}, 6, 1), ('skip', 2, {6, 7}, 7, 1),
    # Logged every 4 steps: step 7 is finite again by the check at 8.
    ('halt', 10, {6}, 8, 4)])
def test_nan_steps_halt_per_policy_naming_the_last_good_checkpoint(
    data_dir, tmp_path, monkeypatch, policy, halt_after, nan_steps,
    halted_at, log):
  _with_nan_batches(monkeypatch, nan_steps)
  workdir = str(tmp_path / 'run')
  cfg = _config(data_dir, **{'divergence.policy': policy,
                             'divergence.halt_after': halt_after,
                             'log_every_steps': log})
  with pytest.raises(divergence.DivergenceError,
                     match=f'halting at step {halted_at}: .* The last good '
                     'checkpoint is step 4 in '):
    train.train_and_evaluate(cfg, workdir)
  directory = os.path.join(workdir, 'checkpoints')
  assert _steps(directory) == [4]
  assert checkpoint.verify(os.path.join(directory, '4'))


def test_a_halt_in_a_bucket_keeps_the_lines_that_show_it(
    data_dir, gcs_bucket, monkeypatch):
  """The metrics reach a bucket workdir only at uploads (checkpoints, every
  30 s, the end): a halt still uploads the lines logged before it, here
  step 5's after the checkpoint at step 4."""
  from bertjax import storage  # pylint: disable=g-import-not-at-top
  _with_nan_batches(monkeypatch, {6})
  workdir = f'{gcs_bucket}/fault/halted'
  cfg = _config(data_dir, **{'divergence.policy': 'halt'})
  with pytest.raises(divergence.DivergenceError, match='halting at step 6'):
    train.train_and_evaluate(cfg, workdir)
  lines = storage.read_text(f'{workdir}/metrics.jsonl').splitlines()
  assert [json.loads(line)['step'] for line in lines] == [1, 2, 3, 4, 5]
