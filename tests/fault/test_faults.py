"""Fault injection in processes of their own: kills, preemption and a full
disk cost no work and no data (pytest -m fault).

Every test ends by comparing with one uninterrupted run of the same tiny
config: ``metrics.jsonl`` byte for byte and the final parameters bit for
bit (``experiments/kill_resume.compare``). In-process faults (corruption,
NaNs) are in test_corruption_and_divergence.py.
"""

import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bertjax import storage
from bertjax.interop import hf_convert
from bertjax.runtime import checkpoint
from bertjax.runtime import preemption
import fault_helpers
from fault_helpers import DEMO, DRIVER, REPO
from fault_helpers import assert_identical as _assert_identical
from fault_helpers import env as _env
from fault_helpers import flags as _flags
from fault_helpers import steps as _steps

pytestmark = pytest.mark.fault


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


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The uninterrupted run every faulty run must end identical to."""
  workdir = str(tmp_path_factory.mktemp('reference') / 'run')
  _run(workdir, data_dir)
  return workdir


def test_sigkill_at_a_random_step_then_resume_is_identical(
    reference, data_dir, tmp_path):
  # A new moment every run (the seed is in the message to replay it).
  seed = random.SystemRandom().randrange(2**31)
  said = []
  problems = fault_helpers.kill_resume.kill_and_resume(
      DEMO, str(tmp_path), _flags(data_dir), kills=1, seed=seed,
      reference=reference, max_delay=0.02, log=said.append)
  assert problems == [], f'seed {seed}: {said}'


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


def test_a_run_in_a_bucket_is_killed_resumed_and_exported(
    reference, data_dir, gcs_bucket, tmp_path):
  """Workdir and data in a bucket (a Cloud Storage API on localhost):
  killed while saving step 12 (every file written, the commit file not),
  the resumed run ends identical to the local one, and its export into the
  bucket is the local run's export."""
  workdir, data = f'{gcs_bucket}/fault/run', f'{gcs_bucket}/fault/data'
  result = _run(workdir, data, fault='kill_before_commit:12', check=False)
  assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
  directory = f'{workdir}/checkpoints'
  assert checkpoint.latest_step(directory) == 8
  assert storage.exists(f'{directory}/12/{checkpoint.MANIFEST}')
  result = _run(workdir, data)
  assert 'resumed from the checkpoint at step 8' in result.stdout
  assert not storage.exists(f'{directory}/12/{checkpoint.MANIFEST}') or (
      storage.exists(f'{directory}/12/commit_success.txt'))
  assert fault_helpers.kill_resume.compare(reference, workdir) == []
  assert storage.read_bytes(f'{workdir}/metrics.jsonl') == open(
      os.path.join(reference, 'metrics.jsonl'), 'rb').read()
  hf_convert.export_run(workdir, f'{gcs_bucket}/fault/export')
  hf_convert.export_run(reference, str(tmp_path / 'export'))
  for name in ('model.safetensors', 'config.json', 'tokenizer.json'):
    assert storage.read_bytes(f'{gcs_bucket}/fault/export/{name}') == (
        tmp_path / 'export' / name).read_bytes(), name


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
  assert fault_helpers.preset_helpers.read_jsonl(workdir)[-1]['step'] == saved
  result = _run(workdir, data_dir)
  assert f'resumed from the checkpoint at step {saved}' in result.stdout
  _assert_identical(reference, workdir)


def _preempted(workdir, data_dir, fault):
  """The run with ``fault``, which must exit 75; its output."""
  result = _run(workdir, data_dir, fault=fault, check=False)
  assert result.returncode == preemption.EXIT_PREEMPTED, (
      result.returncode, result.stderr[-2000:])
  return result.stdout + result.stderr


def test_a_notice_during_start_up_exits_75_before_any_step(
    reference, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  output = _preempted(workdir, data_dir, 'notice_at_compile:0')
  assert 'preempted before step 1' in output
  assert _steps(os.path.join(workdir, 'checkpoints')) == []
  _run(workdir, data_dir)
  _assert_identical(reference, workdir)


def test_a_second_notice_during_the_preemption_save_is_absorbed(
    reference, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  _preempted(workdir, data_dir, 'notice_twice:4')
  # The notice after step 4's save stops the run at step 5, saved whole.
  assert _steps(os.path.join(workdir, 'checkpoints'))[-1] == 5
  assert checkpoint.verify(os.path.join(workdir, 'checkpoints', '5'))
  _run(workdir, data_dir)
  _assert_identical(reference, workdir)


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
