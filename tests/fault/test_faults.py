"""Fault injection: kills, preemption, corruption, NaNs and a full disk cost
no work and no data (pytest -m fault).

Every test ends by comparing with one uninterrupted run of the same tiny
config: ``metrics.jsonl`` byte for byte and the final parameters bit for
bit (``experiments/kill_resume.compare``).
"""

import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import grain
import numpy as np
import pytest

from bertjax import checkpoint
from bertjax import divergence
from bertjax import preemption
from bertjax import train
from data_pipelines import pipeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tests', 'bertjax'))
sys.path.insert(0, os.path.join(REPO, 'experiments'))
import kill_resume  # pylint: disable=g-import-not-at-top,wrong-import-position
import preset_helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.fault

DEMO = os.path.join(REPO, 'experiments', 'configs', 'demo.py')
DRIVER = os.path.join(REPO, 'tests', 'fault', 'driver.py')
# 16 tiny steps, every one logged, a checkpoint every 4.
RUN = {**preset_helpers.TINY, 'total_steps': 16, 'log_every_steps': 1,
       'eval_every_steps': 8, 'checkpoint_every_steps': 4,
       'keep_checkpoints': 3}


def _config(data_dir, **overrides):
  cfg = preset_helpers.load_preset('demo')
  return preset_helpers.set_fields(
      cfg, {**RUN, 'data.data_dir': str(data_dir), **overrides})


def _flags(data_dir, **overrides) -> list[str]:
  return [f'--config.{k}={v}' for k, v in
          {**RUN, 'data.data_dir': str(data_dir), **overrides}.items()]


def _env() -> dict:
  return dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')


def _run(workdir, data_dir, fault='', check=True, **overrides):
  """The trainer in a process of its own (through the fault driver)."""
  command = [sys.executable, DRIVER, f'--config={DEMO}',
             f'--workdir={workdir}', *_flags(data_dir, **overrides)]
  if fault:
    command.append(f'--fault={fault}')
  result = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True,
                          text=True)
  if check and result.returncode != 0:
    raise AssertionError(f'exit {result.returncode}:\n{result.stdout[-3000:]}'
                         f'\n{result.stderr[-3000:]}')
  return result


def _steps(directory) -> list[int]:
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('data')


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The uninterrupted run every faulty run must end identical to."""
  workdir = str(tmp_path_factory.mktemp('reference') / 'run')
  _run(workdir, data_dir)
  return workdir


def _assert_identical(reference, workdir):
  assert kill_resume.compare(reference, workdir) == []


def test_sigkill_at_random_steps_then_resume_is_identical(
    reference, data_dir, tmp_path):
  problems = kill_resume.kill_and_resume(
      DEMO, str(tmp_path), _flags(data_dir), kills=2,
      seed=random.SystemRandom().randrange(2**31), reference=reference,
      max_delay=0.02, log=lambda _: None)
  assert problems == []


# The most dangerous moment: every file written, the commit not yet made.
# (Kills at random moments, mid-save included, are the test above.)
@pytest.mark.parametrize('fault', ['kill_before_commit'])
def test_sigkill_during_a_save_resumes_from_the_previous(
    reference, data_dir, tmp_path, fault):
  workdir = str(tmp_path / 'run')
  result = _run(workdir, data_dir, fault=f'{fault}:12', check=False)
  assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
  directory = os.path.join(workdir, 'checkpoints')
  # The save of step 12 was cut short: step 8 is the latest checkpoint.
  assert _steps(directory) == [4, 8]
  assert glob.glob(os.path.join(directory, '12.orbax-checkpoint-tmp*'))
  result = _run(workdir, data_dir)
  assert 'resumed from the checkpoint at step 8' in result.stdout
  assert not glob.glob(os.path.join(directory, '*tmp*'))
  _assert_identical(reference, workdir)


def test_sigterm_checkpoints_the_next_step_and_exits_75(
    reference, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  command = [sys.executable, '-m', 'bertjax.train', f'--config={DEMO}',
             f'--workdir={workdir}', *_flags(data_dir)]
  child = subprocess.Popen(command, env=_env(), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  deadline = time.time() + 300
  metrics = os.path.join(workdir, 'metrics.jsonl')
  while time.time() < deadline and child.poll() is None:
    if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 5:
      break
    time.sleep(0.002)
  child.send_signal(signal.SIGTERM)
  out, err = child.communicate(timeout=300)
  assert child.returncode == preemption.EXIT_PREEMPTED, err[-2000:]
  saved = int(out.split('saved the checkpoint at step ')[1].split(';')[0])
  assert 5 <= saved < 16
  assert _steps(os.path.join(workdir, 'checkpoints'))[-1] == saved
  assert checkpoint.verify(os.path.join(workdir, 'checkpoints', str(saved)))
  # Nothing logged beyond the checkpoint: the rerun continues from it.
  assert preset_helpers.read_jsonl(workdir)[-1]['step'] == saved
  result = _run(workdir, data_dir)
  assert f'resumed from the checkpoint at step {saved}' in result.stdout
  _assert_identical(reference, workdir)


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
  assert all(np.isfinite(r['grad_norm']) for s, r in records.items()
             if s not in (6, 7))
  assert 'step(s) with a non-finite loss or gradient' in capsys.readouterr(
      ).out
  params = checkpoint.load_run(workdir).params
  assert all(np.isfinite(np.asarray(x)).all() for x in
             __import__('jax').tree.leaves(params))


@pytest.mark.parametrize('policy, halt_after, nan_steps, halted_at', [
    ('halt', 10, {6}, 6), ('skip', 2, {6, 7}, 7)])
def test_nan_steps_halt_per_policy_naming_the_last_good_checkpoint(
    data_dir, tmp_path, monkeypatch, policy, halt_after, nan_steps,
    halted_at):
  _with_nan_batches(monkeypatch, nan_steps)
  workdir = str(tmp_path / 'run')
  cfg = _config(data_dir, **{'divergence.policy': policy,
                             'divergence.halt_after': halt_after})
  with pytest.raises(divergence.DivergenceError,
                     match=f'halting at step {halted_at}: .* The last good '
                     'checkpoint is step 4 in '):
    train.train_and_evaluate(cfg, workdir)
  directory = os.path.join(workdir, 'checkpoints')
  assert _steps(directory) == [4]
  assert checkpoint.verify(os.path.join(directory, '4'))


def test_full_disk_during_a_save_keeps_the_previous_checkpoint(
    reference, data_dir, tmp_path):
  """In a mount namespace of its own, the workdir on a small tmpfs that the
  driver fills before the save of step 12."""
  if not shutil.which('unshare'):
    pytest.fail('the disk-full test needs unshare (util-linux) to mount a '
                'private tmpfs')
  mount, out = tmp_path / 'disk', tmp_path / 'out'
  mount.mkdir()
  command = [sys.executable, DRIVER, f'--config={DEMO}',
             f'--workdir={mount / "run"}', *_flags(data_dir)]
  script = '\n'.join([
      'set -u',
      f'mount -t tmpfs -o size=64m tmpfs {mount}',
      ' '.join(command) + ' --fault=fill_disk:12 '
      f'>{tmp_path / "full.out"} 2>&1; echo $? >{tmp_path / "full.rc"}',
      f'ls {mount / "run" / "checkpoints"} >{tmp_path / "full.ls"}',
      f'rm {mount / "filler"}',
      ' '.join(command) + f' >{tmp_path / "rerun.out"} 2>&1; '
      f'echo $? >{tmp_path / "rerun.rc"}',
      f'cp -a {mount / "run"} {out}',
  ])
  subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'bash',
                  '-c', script], env=_env(), cwd=REPO, check=True)
  full = (tmp_path / 'full.out').read_text()
  assert (tmp_path / 'full.rc').read_text().strip() == '1', full[-3000:]
  assert 'the checkpoint at step 12' in full and 'was not written' in full
  assert 'No space left on device' in full or 'ENOSPC' in full, full[-3000:]
  assert 'the checkpoint at step 8 is intact' in full
  # The partial step 12 was removed; 4 and 8 are whole.
  assert (tmp_path / 'full.ls').read_text().split() == ['4', '8']
  rerun = (tmp_path / 'rerun.out').read_text()
  assert (tmp_path / 'rerun.rc').read_text().strip() == '0', rerun[-3000:]
  assert 'resumed from the checkpoint at step 8' in rerun
  _assert_identical(reference, str(out))
