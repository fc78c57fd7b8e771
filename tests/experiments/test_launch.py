"""The TPU pod and SLURM launchers: dry-run output, quoting, errors, and
what they run (with subprocess replaced)."""

import importlib.util
import os
import shlex
import subprocess
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _load(name):
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(REPO, 'experiments', 'launch', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


tpu_pod = _load('tpu_pod')
slurm = _load('slurm')
launch_common = _load('launch_common')

# Overrides that need quoting: spaces, parentheses, a glob, a quote.
OVERRIDES = ['--config.model.dtype=bfloat16',
             '--config.sharding.mesh_shape=(4, 2, 2)',
             "--config.data.corpus.path=/data/wiki books/*.txt",
             "--config.data.tokenizer.model_path=/m/it's.model"]
TPU_ARGS = ['--name=bert-base', '--zone=us-central2-b', '--project=my-proj',
            '--accelerator_type=v4-32', '--workdir=/mnt/runs/bert-base',
            '--workdir_is_shared',
            '--config=experiments/configs/bert.py:size=base',
            '--archive=/tmp/src.tar.gz', '--data_dir=/mnt/data',
            '--delete_after', '--preflight=off']
GCLOUD = 'gcloud compute tpus tpu-vm'
WHERE = '--zone=us-central2-b --project=my-proj'
TPU_DRY_RUN = f"""\
# Check the config is committed (the workers get the committed HEAD):
git -C {REPO} cat-file -e HEAD:experiments/configs/bert.py
# Reuse the slice if it exists:
{GCLOUD} describe bert-base {WHERE} '--format=value(state,acceleratorType)'
# Otherwise create it:
{GCLOUD} create bert-base {WHERE} --accelerator-type=v4-32 \
--version=tpu-ubuntu2204-base
# Warn if tracked files differ from HEAD (only committed code is shipped):
git -C {REPO} diff --quiet HEAD
# Pack the committed HEAD:
git -C {REPO} archive --format=tar.gz --output=/tmp/src.tar.gz HEAD
# Copy it to every worker:
{GCLOUD} scp /tmp/src.tar.gz bert-base:bertjax-src.tar.gz {WHERE} \
--worker=all
# Unpack it into ~/bertjax on every worker:
{GCLOUD} ssh bert-base {WHERE} --worker=all '--command=rm -rf bertjax && \
mkdir -p bertjax && tar -xzf bertjax-src.tar.gz -C bertjax && \
rm bertjax-src.tar.gz'
# Install bertjax and JAX for TPU on every worker:
{GCLOUD} ssh bert-base {WHERE} --worker=all '--command=cd bertjax && \
python3 -m pip install -e . '"'"'jax[tpu]'"'"' -f \
https://storage.googleapis.com/jax-releases/libtpu_releases.html'
# Train on every worker, streaming the output (after exit 75, a preemption, \
again: it resumes):
{GCLOUD} ssh bert-base {WHERE} --worker=all '--command=cd bertjax && \
BERTJAX_DATA_DIR=/mnt/data python3 -m bertjax.train \
--config=experiments/configs/bert.py:size=base \
--workdir=/mnt/runs/bert-base --multihost=on \
--config.model.dtype=bfloat16 \
'"'"'--config.sharding.mesh_shape=(4, 2, 2)'"'"' \
'"'"'--config.data.corpus.path=/data/wiki books/*.txt'"'"' \
'"'"'--config.data.tokenizer.model_path=/m/it'"'"'"'"'"'"'"'"'s.model'"'"''
# Delete the slice (when the launcher ends, whether training succeeded or \
not):
{GCLOUD} delete bert-base {WHERE} --quiet
"""


def _main(module, argv, capsys):
  """Runs a launcher's main; returns (exit status, stdout, stderr)."""
  try:
    module.main(argv)
    status = 0
  except SystemExit as e:
    status = e.code
  out, err = capsys.readouterr()
  return status, out, err


@pytest.fixture
def no_subprocess(monkeypatch):
  """Any attempt to run a command fails the test."""
  def refuse(*args, **kwargs):
    raise AssertionError(f'ran a command: {args}')
  for name in ('run', 'Popen', 'call', 'check_call', 'check_output'):
    monkeypatch.setattr(subprocess, name, refuse)
  monkeypatch.setattr(os, 'system', refuse)


class FakeRun:
  """subprocess.run stand-in that records each argv. ``describe`` answers
  the describe command (default: no such slice); the command with the word
  ``fail`` exits 1; the others succeed."""

  def __init__(self, describe=(1, '', 'ERROR: NOT_FOUND: no such node'),
               fail=None):
    self.calls, self.describe, self.fail = [], describe, fail

  def __call__(self, argv, check=False, capture_output=False, text=False,
               **kwargs):
    del check, capture_output, text, kwargs
    self.calls.append(list(argv))
    code, out, err = (self.describe if 'describe' in argv else
                      (1, '', '') if self.fail and self.fail in argv else
                      (0, '', ''))
    return subprocess.CompletedProcess(argv, code, out, err)

  def kinds(self):
    """Each call by name: git's subcommand, gcloud's verb, or for ssh the
    remote command's first word @ the workers."""
    names = []
    for argv in self.calls:
      if argv[0] == 'git':
        names.append(argv[3])
      elif argv[4] == 'ssh':
        names.append(argv[-1].split()[0].partition('=')[2] + '@' +
                     argv[-2].partition('=')[2])
      else:
        names.append(argv[4])
    return names


def test_the_launchers_relaunch_on_the_trainers_preempted_status():
  from bertjax.runtime import preemption  # pylint: disable=g-import-not-at-top
  # A copy (the launchers do not import jax); it must not drift.
  assert launch_common.EXIT_PREEMPTED == preemption.EXIT_PREEMPTED
  assert tpu_pod.EXIT_PREEMPTED == slurm.EXIT_PREEMPTED == 75


# --- TPU pod ---------------------------------------------------------------


def test_tpu_dry_run_prints_every_command_in_order(capsys, no_subprocess):
  status, out, _ = _main(tpu_pod, TPU_ARGS + ['--dry_run', '--'] + OVERRIDES,
                         capsys)
  assert status == 0
  assert out == TPU_DRY_RUN


def test_tpu_dry_run_shows_the_preflight_before_any_slice(capsys,
                                                          no_subprocess):
  args = [a for a in TPU_ARGS if a != '--preflight=off']
  status, out, _ = _main(tpu_pod, args + ['--dry_run', '--'] + OVERRIDES,
                         capsys)
  assert status == 0
  lines = out.splitlines()
  note, command = lines[2:4]
  assert 'cannot fit stops the launch' in note
  assert shlex.split(command)[1:] == [
      '-m', 'bertjax.preflight',
      f'--config={REPO}/experiments/configs/bert.py:size=base',
      '--topology=v4-32',
      f'--out={os.path.join(tempfile.gettempdir(), "bertjax-preflight-bert-base")}',
      *OVERRIDES]
  assert lines[:2] + lines[4:] == TPU_DRY_RUN.splitlines()


def test_tpu_a_failed_preflight_stops_before_any_slice(monkeypatch, capsys):
  fake = FakeRun(fail='bertjax.preflight')
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  args = [a for a in TPU_ARGS if a != '--preflight=off']
  status, _, err = _main(tpu_pod, args, capsys)
  assert status == 1
  assert [argv[1:4] for argv in fake.calls] == [
      ['-C', REPO, 'cat-file'],
      ['-m', 'bertjax.preflight', f'--config={REPO}/experiments/configs/'
       'bert.py:size=base']]
  assert '--preflight=off' in err


def test_tpu_overrides_reach_the_trainer_unchanged(capsys, no_subprocess):
  _, out, _ = _main(tpu_pod, TPU_ARGS + ['--dry_run', '--'] + OVERRIDES,
                    capsys)
  train = out.splitlines()[out.splitlines().index(
      '# Train on every worker, streaming the output (after exit 75, a '
      'preemption, again: it resumes):') + 1]
  # Our shell splits the gcloud command; the worker's shell the --command.
  remote = shlex.split(shlex.split(train)[-1].partition('=')[2])
  assert remote[:6] == ['cd', 'bertjax', '&&', 'BERTJAX_DATA_DIR=/mnt/data',
                        'python3', '-m']
  assert remote[-len(OVERRIDES):] == OVERRIDES


def test_tpu_clone_detach_spot(capsys, no_subprocess):
  status, out, _ = _main(tpu_pod, [
      '--name=b', '--zone=z', '--accelerator_type=v5litepod-16', '--spot',
      '--workdir=/mnt/fs/run', '--workdir_is_shared', '--detach',
      '--config=experiments/configs/bert.py', '--repo_url=https://x/b.git',
      '--commit=abc123', '--preflight=off', '--dry_run'], capsys)
  assert status == 0
  commands = [line for line in out.splitlines() if not line.startswith('#')]
  assert commands == [
      f"{GCLOUD} describe b --zone=z '--format=value(state,acceleratorType)'",
      f'{GCLOUD} create b --zone=z --accelerator-type=v5litepod-16 '
      '--version=v2-alpha-tpuv5-lite --spot',
      f"{GCLOUD} ssh b --zone=z --worker=all '--command=rm -rf bertjax && "
      'git clone --quiet https://x/b.git bertjax && git -C bertjax checkout '
      "--quiet abc123'",
      f"{GCLOUD} ssh b --zone=z --worker=all '--command=cd bertjax && "
      "python3 -m pip install -e . '\"'\"'jax[tpu]'\"'\"' -f "
      "https://storage.googleapis.com/jax-releases/libtpu_releases.html'",
      f"{GCLOUD} ssh b --zone=z --worker=all '--command=cd bertjax && nohup "
      'python3 -m bertjax.train --config=experiments/configs/bert.py '
      '--workdir=/mnt/fs/run --multihost=on > ~/bertjax-train.log 2>&1 '
      "< /dev/null &'",
      f"{GCLOUD} ssh b --zone=z --worker=0 '--command=tail -n +1 -F "
      "~/bertjax-train.log'",
  ]


@pytest.mark.parametrize('runtime_for, accelerator', [
    ('v2-alpha-tpuv6e', 'v6e-16'), ('v2-alpha-tpuv5', 'v5p-8'),
    ('tpu-ubuntu2204-base', 'v3-32'), ('v2-alpha-tpuv5-lite', 'v5e-4')])
def test_tpu_runtime_follows_the_generation(runtime_for, accelerator):
  assert tpu_pod.runtime_version(accelerator) == runtime_for


def test_tpu_a_bucket_workdir_needs_no_shared_filesystem(capsys,
                                                        no_subprocess):
  args = [a for a in TPU_ARGS if a not in (
      '--workdir=/mnt/runs/bert-base', '--workdir_is_shared',
      '--data_dir=/mnt/data')] + ['--workdir=gs://b/runs/bert-base',
                                  '--data_dir=gs://b/data', '--dry_run']
  status, out, _ = _main(tpu_pod, args, capsys)
  assert status == 0
  assert ('BERTJAX_DATA_DIR=gs://b/data python3 -m bertjax.train '
          '--config=experiments/configs/bert.py:size=base '
          '--workdir=gs://b/runs/bert-base --multihost=on') in out


@pytest.mark.parametrize('change, message', [
    (['--accelerator_type=v4'], 'GENERATION-SIZE'),
    (['--accelerator_type=tpu-v4-32'], 'GENERATION-SIZE'),
    (['--accelerator_type=v4-0'], 'GENERATION-SIZE'),
    (['--accelerator_type=V4-32'], 'GENERATION-SIZE'),
    (['--accelerator_type=v9-8'], 'no default runtime'),
    (['--name=Bert_Base'], 'lowercase'),
    (['--spot', '--preemptible'], 'pick one'),
    (['--repo_url=https://x/b.git'], 'go together'),
    (['--detach'], 'kill it'),
    (['--workdir=relative'], 'absolute path'),
    (['--config=/abs/bert.py'], 'inside the repository'),
    (['--config=experiments/configs/nope.py'], 'no file'),
    (['--', 'batch_size=8'], 'FIELD=VALUE'),
    (['--', '--workdir=gs://other'], 'launcher sets --workdir'),
    (['--', '--config=experiments/configs/roberta.py'],
     'launcher sets --config'),
    (['--', '--multihost=off'], 'launcher sets --multihost'),
    (['--max_restarts=-1'], '0 (never relaunch)'),
    (['--detach', '--recreate_preempted'], 'cannot see a preemption'),
])
def test_tpu_bad_arguments_fail_before_running_anything(
    capsys, no_subprocess, change, message):
  status, _, err = _main(tpu_pod, TPU_ARGS + ['--dry_run'] + change, capsys)
  assert status == 1
  assert message in err


def test_tpu_run_creates_a_missing_slice_and_deletes_it(monkeypatch):
  fake = FakeRun()
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  tpu_pod.main(TPU_ARGS)
  assert fake.kinds() == ['cat-file', 'describe', 'create', 'diff',
                          'archive', 'scp', 'rm@all', 'cd@all', 'cd@all',
                          'delete']


def test_tpu_run_reuses_a_ready_slice(monkeypatch):
  fake = FakeRun(describe=(0, 'READY\tv4-32\n', ''))
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  tpu_pod.main(TPU_ARGS)
  assert 'create' not in fake.kinds()


@pytest.mark.parametrize('describe, message', [
    ((0, 'READY\tv4-8\n', ''), 'exists as v4-8'),
    ((0, 'PREEMPTED\tv4-32\n', ''), 'is PREEMPTED'),
    ((1, '', 'ERROR: PERMISSION_DENIED'), 'PERMISSION_DENIED'),
])
def test_tpu_run_refuses_an_unusable_slice(monkeypatch, capsys, describe,
                                           message):
  fake = FakeRun(describe=describe)
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  status, _, err = _main(tpu_pod, TPU_ARGS, capsys)
  assert (status, fake.kinds()) == (1, ['cat-file', 'describe'])
  assert message in err


def test_tpu_run_stops_at_a_failed_command_and_still_deletes(monkeypatch,
                                                             capsys):
  fake = FakeRun(fail='scp')
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  status, _, err = _main(tpu_pod, TPU_ARGS, capsys)
  assert status == 1
  assert 'exit status 1 from gcloud compute tpus tpu-vm scp' in err
  assert fake.kinds() == ['cat-file', 'describe', 'create', 'diff',
                          'archive', 'scp', 'delete']


def test_tpu_an_uncommitted_config_stops_before_preflight_and_slice(
    monkeypatch, capsys):
  fake = FakeRun(fail='cat-file')
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  args = [a for a in TPU_ARGS if a != '--preflight=off']
  status, _, err = _main(tpu_pod, args, capsys)
  assert (status, len(fake.calls)) == (1, 1)
  assert 'experiments/configs/bert.py is not in the committed HEAD' in err


@pytest.mark.parametrize('path, committed', [
    ('experiments/configs/bert.py', True),
    ('experiments/configs/not_committed.py', False)])
def test_tpu_the_committed_check_asks_git(monkeypatch, path, committed):
  """The check's command, run for real on this checkout."""
  args, overrides = tpu_pod.parse(
      [a if not a.startswith('--config=') else f'--config={path}'
       for a in TPU_ARGS] + ['--dry_run'])
  # The argument checks would stop at the missing file first.
  monkeypatch.setattr(tpu_pod, 'check_args', lambda *a: None)
  step = tpu_pod.plan(args, overrides)[0]
  assert step.kind == 'committed'
  result = subprocess.run(step.argv, capture_output=True, check=False)
  assert (result.returncode == 0) == committed, result.stderr


def test_tpu_run_without_gcloud_says_so(monkeypatch, capsys, no_subprocess):
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: None)
  status, _, err = _main(tpu_pod, TPU_ARGS, capsys)
  assert status == 1
  assert 'gcloud is not on PATH' in err


# The TPU relaunch loop, with a scripted Runner in place of gcloud.


class ScriptedRun:
  """A Runner: the train step exits with the next of ``statuses``; the
  describe step answers with the next of ``describes`` (the last one
  repeats); every other step succeeds. ``kinds`` records what ran."""

  def __init__(self, statuses, describes=((0, 'READY\tv4-32\n', ''),)):
    self.statuses, self.describes, self.kinds = list(statuses), list(
        describes), []

  def __call__(self, step):
    self.kinds.append(step.kind)
    if step.kind == 'train':
      code, out, err = self.statuses.pop(0), '', ''
    elif step.kind == 'describe':
      code, out, err = (self.describes.pop(0) if len(self.describes) > 1
                        else self.describes[0])
    else:
      code, out, err = 0, '', ''
    return subprocess.CompletedProcess(step.argv, code, out, err)


PREEMPTED = (0, 'PREEMPTED\tv4-32\n', '')
NOT_FOUND = (1, '', 'ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND')
RECREATE = ['delete_preempted', 'create', 'copy', 'unpack', 'install',
            'train']


def _steps(*extra):
  return tpu_pod.plan(tpu_pod.parse(TPU_ARGS + list(extra))[0], [])


def test_tpu_relaunches_after_each_preemption_until_training_ends():
  run = ScriptedRun([75, 75, 0])
  tpu_pod.train_until_done(_steps(), run, max_restarts=20,
                           may_recreate=False)
  assert run.kinds == ['train', 'train', 'train']


def test_tpu_a_failure_stops_at_once_with_its_status():
  run = ScriptedRun([1, 0])
  with pytest.raises(tpu_pod.TrainingFailed, match='slice is READY') as e:
    tpu_pod.train_until_done(_steps(), run, max_restarts=20,
                             may_recreate=True)
  assert e.value.status == 1
  assert run.kinds == ['train', 'describe']


def test_tpu_stops_relaunching_after_max_restarts():
  run = ScriptedRun([75] * 3 + [0])
  with pytest.raises(tpu_pod.TrainingFailed,
                     match=r'relaunched 2 time\(s\) already '
                     r'\(--max_restarts=2\)') as e:
    tpu_pod.train_until_done(_steps(), run, max_restarts=2,
                             may_recreate=False)
  assert e.value.status == 75
  assert run.kinds == ['train'] * 3


def test_tpu_recreates_a_preempted_slice_then_relaunches(capsys):
  steps = _steps('--spot')
  run = ScriptedRun([255, 0], [PREEMPTED])
  tpu_pod.train_until_done(steps, run, max_restarts=20, may_recreate=True)
  assert run.kinds == ['train', 'describe'] + RECREATE
  by_kind = {step.kind: step.argv for step in steps}
  assert by_kind['delete_preempted'][4:6] == ('delete', 'bert-base')
  assert '--spot' in by_kind['create']
  assert 'the slice is PREEMPTED; recreating it, then relaunch 1 of 20' in (
      capsys.readouterr().out)


def test_tpu_recreates_a_slice_that_is_gone_without_deleting_it():
  run = ScriptedRun([1, 0], [NOT_FOUND])
  tpu_pod.train_until_done(_steps('--recreate_preempted'), run,
                           max_restarts=20, may_recreate=True)
  assert run.kinds == ['train', 'describe'] + RECREATE[1:]


def test_tpu_recreation_counts_against_max_restarts():
  run = ScriptedRun([255, 255], [PREEMPTED])
  with pytest.raises(tpu_pod.TrainingFailed, match='max_restarts=1'):
    tpu_pod.train_until_done(_steps('--spot'), run, max_restarts=1,
                             may_recreate=True)
  assert run.kinds == ['train', 'describe'] + RECREATE + ['describe']


def test_tpu_a_preempted_slice_it_may_not_recreate_is_a_failure():
  run = ScriptedRun([255], [PREEMPTED])
  with pytest.raises(tpu_pod.TrainingFailed,
                     match='--recreate_preempted') as e:
    tpu_pod.train_until_done(_steps(), run, max_restarts=20,
                             may_recreate=False)
  assert e.value.status == 255
  assert run.kinds == ['train', 'describe']


def test_tpu_clone_is_redone_when_recreating():
  steps = _steps('--repo_url=https://x/b.git', '--commit=abc', '--spot')
  run = ScriptedRun([255, 0], [PREEMPTED])
  tpu_pod.train_until_done(steps, run, max_restarts=20, may_recreate=True)
  assert run.kinds == ['train', 'describe', 'delete_preempted', 'create',
                       'clone', 'install', 'train']


@pytest.mark.parametrize('extra, describes, recreated', [
    # Created here as Spot: recreated.
    (['--spot'], [NOT_FOUND, PREEMPTED], True),
    # An existing slice is left alone, unless --recreate_preempted.
    (['--spot'], [(0, 'READY\tv4-32\n', ''), PREEMPTED], False),
    (['--recreate_preempted'], [(0, 'READY\tv4-32\n', ''), PREEMPTED],
     True),
    # Not Spot nor preemptible: nothing to recreate.
    ([], [NOT_FOUND, PREEMPTED], False),
])
def test_tpu_execute_recreates_only_what_it_may(monkeypatch, extra,
                                                describes, recreated):
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  run = ScriptedRun([255, 0], describes)
  steps = _steps(*extra)
  args = tpu_pod.parse(TPU_ARGS + extra)[0]
  if recreated:
    tpu_pod.execute(steps, 'v4-32', 20, args.recreate_preempted, run=run)
  else:
    with pytest.raises(tpu_pod.TrainingFailed, match='--recreate_preempted'):
      tpu_pod.execute(steps, 'v4-32', 20, args.recreate_preempted, run=run)
  # The slice is deleted at the end either way (--delete_after).
  after_setup = run.kinds[run.kinds.index('train'):]
  assert after_setup == ['train', 'describe'] + (
      RECREATE if recreated else []) + ['delete']


def test_tpu_dry_run_shows_the_recreation_of_a_spot_slice(capsys,
                                                         no_subprocess):
  status, out, _ = _main(tpu_pod, TPU_ARGS + ['--spot', '--dry_run'], capsys)
  assert status == 0
  assert (f'# If the slice is found preempted: delete it, create, ship and '
          'install again (the commands above), and train again:\n'
          f'{GCLOUD} delete bert-base {WHERE} --quiet\n'
          '# Delete the slice') in out


def test_tpu_launcher_exits_with_the_training_status(monkeypatch, capsys):
  def fake(argv, check=False, capture_output=False, text=False):
    del check, capture_output, text
    if 'describe' in argv:
      return subprocess.CompletedProcess(argv, 0, 'READY\tv4-32\n', '')
    status = 3 if 'bertjax.train' in argv[-1] else 0
    return subprocess.CompletedProcess(argv, status, '', '')
  monkeypatch.setattr(tpu_pod.subprocess, 'run', fake)
  monkeypatch.setattr(tpu_pod.shutil, 'which', lambda name: '/bin/' + name)
  status, _, err = _main(tpu_pod, TPU_ARGS, capsys)
  assert status == 3
  assert 'exit status 3 from gcloud compute tpus tpu-vm ssh' in err


# --- SLURM -----------------------------------------------------------------

SLURM_ARGS = ['--nodes=2', '--gpus_per_node=8', '--partition=gpu',
              '--account=my-lab', '--time=12:00:00',
              '--workdir=/shared/runs/bert-base',
              '--config=experiments/configs/bert.py:size=base',
              '--python=/shared/venv/bin/python',
              '--setup=source /shared/venv/bin/activate',
              '--data_dir=/shared/cache']
SLURM_SCRIPT = f"""\
#!/bin/bash
# bertjax pretraining on 2 node(s) x 8 GPUs, one process per GPU (8 per node).
# Written by experiments/launch/slurm.py.
#SBATCH --job-name=bertjax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=12:00:00
#SBATCH --partition=gpu
#SBATCH --account=my-lab
#SBATCH --output=/shared/runs/bert-base/slurm-%j.out
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=TERM@300

set -eo pipefail
source /shared/venv/bin/activate
cd {REPO}

# Overlap and combine collectives (why: GPU_XLA_FLAGS in the launcher);
# flags already in the environment come last and win.
xla_flags=(
  --xla_gpu_enable_latency_hiding_scheduler=true
  --xla_gpu_enable_highest_priority_async_stream=true
  --xla_gpu_all_reduce_combine_threshold_bytes=134217728
  --xla_gpu_all_gather_combine_threshold_bytes=134217728
  --xla_gpu_reduce_scatter_combine_threshold_bytes=134217728
  --xla_gpu_enable_all_gather_combine_by_dim=false
  --xla_gpu_enable_reduce_scatter_combine_by_dim=false
  --xla_gpu_enable_pipelined_all_gather=true
  --xla_gpu_enable_pipelined_reduce_scatter=true
  --xla_gpu_enable_pipelined_all_reduce=true
)
export XLA_FLAGS="${{xla_flags[*]}} ${{XLA_FLAGS:-}}"
# JAX preallocates this fraction of each GPU (its default is 0.75).
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
export BERTJAX_DATA_DIR=/shared/cache

# Preemption: at a SIGTERM (SLURM sends it 300 s before the time limit) the
# trainers save a checkpoint and exit 75. Each task turns that into the mark
# and exit 0: srun --kill-on-bad-exit would kill the tasks still exiting and
# report their signal instead. Preempted, the job is requeued: it reruns this
# script, which resumes from the checkpoint.
mark=/shared/runs/bert-base/preempted-"$SLURM_JOB_ID"
rm -f "$mark"
task='trap : TERM; mark=$1; shift; "$@"; status=$?; \
if ((status == 75)); then touch "$mark"; exit 0; fi; exit "$status"'
status=0
srun --kill-on-bad-exit=1 --gpu-bind=none --cpus-per-task=12 \\
    bash -c "$task" bertjax-task "$mark" \\
    /shared/venv/bin/python -m bertjax.train \\
    --config=experiments/configs/bert.py:size=base \\
    --workdir=/shared/runs/bert-base \\
    --config.sharding.replicas=2 \\
    --config.model.dtype=bfloat16 \\
    '--config.sharding.mesh_shape=(4, 2, 2)' \\
    '--config.data.corpus.path=/data/wiki books/*.txt' \\
    '--config.data.tokenizer.model_path=/m/it'"'"'s.model' \\
    || status=$?

preempted=0
if [[ -e $mark ]]; then preempted=1; rm -f "$mark"; fi
if ((status != 0 || !preempted)); then
  exit "$status"   # 0: training finished.
fi
requeues=${{SLURM_RESTART_COUNT:-0}}
if ((requeues >= 20)); then
  echo "bertjax: preempted; requeued $requeues time(s) already \
(--max_requeues=20): not requeueing." >&2
  echo "The checkpoint is written; resume with: sbatch \
/shared/runs/bert-base/slurm.sbatch" >&2
  exit 75
fi
echo "bertjax: preempted; requeueing job $SLURM_JOB_ID ($((requeues + 1)) of \
20) to resume from the checkpoint."
scontrol requeue "$SLURM_JOB_ID"
"""


def _script(argv, overrides):
  return slurm.sbatch_script(slurm.parse(argv)[0], overrides)


def test_slurm_dry_run_prints_the_script_and_the_commands(capsys,
                                                          no_subprocess):
  status, out, _ = _main(slurm, SLURM_ARGS + ['--dry_run', '--'] + OVERRIDES,
                         capsys)
  assert status == 0
  assert out == (
      '# The script, written to /shared/runs/bert-base/slurm.sbatch:\n'
      f'{SLURM_SCRIPT}# (end of the script)\n'
      '# Create the directories, write the script, submit it:\n'
      'mkdir -p /shared/runs/bert-base\n'
      'sbatch /shared/runs/bert-base/slurm.sbatch\n')


def test_slurm_replicas_default_to_the_nodes_unless_given():
  assert '--config.sharding.replicas=2 \\\n' in _script(SLURM_ARGS, [])
  script = _script(SLURM_ARGS, ['--config.sharding.replicas=1'])
  assert 'replicas=2' not in script
  assert '--config.sharding.replicas=1 \\\n' in script


def test_slurm_script_is_valid_bash_and_keeps_the_overrides(tmp_path):
  script = _script(SLURM_ARGS, OVERRIDES)
  path = tmp_path / 's.sbatch'
  path.write_text(script)
  subprocess.run(['bash', '-n', str(path)], check=True)
  srun = script[script.index('srun '):script.index(' \\\n    || status')]
  assert shlex.split(srun.replace('\\\n', ' '))[-len(OVERRIDES):] == OVERRIDES


def test_slurm_one_process_per_node_sees_all_its_gpus():
  script = _script(SLURM_ARGS + ['--processes=per_node', '--nodes=4'], [])
  assert '#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=1\n' in script
  assert '#SBATCH --cpus-per-task=96\n' in script
  assert 'export JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7\n' in script
  assert '--config.sharding.replicas=4' in script


def test_slurm_extra_flags_and_sbatch_options():
  script = _script(SLURM_ARGS + [
      '--sbatch_flag=--exclusive', '--cpus_per_task=16',
      '--xla_flags=--xla_gpu_enable_command_buffer= --xla_dump_to=/tmp/d',
      '--mem_fraction=0.8'], [])
  assert '#SBATCH --output=/shared/runs/bert-base/slurm-%j.out\n' \
         '#SBATCH --exclusive\n' in script
  assert '#SBATCH --cpus-per-task=16\n' in script
  assert '--cpus-per-task=16 \\\n    bash -c' in script
  assert ('  --xla_gpu_enable_pipelined_all_reduce=true\n'
          '  --xla_gpu_enable_command_buffer=\n'
          '  --xla_dump_to=/tmp/d\n)\n') in script
  assert 'XLA_PYTHON_CLIENT_MEM_FRACTION=0.8\n' in script


@pytest.mark.parametrize('change, message', [
    (['--nodes=0'], '--nodes=0: at least 1'),
    (['--gpus_per_node=0'], 'at least 1'),
    (['--cpus_per_task=-1'], '--cpus_per_task=-1'),
    (['--time=1 day'], "SLURM's formats"),
    (['--mem_fraction=1.5'], 'in (0, 1]'),
    (['--partition=gpu; rm'], 'letters, digits'),
    (['--xla_flags=--gpu_thing=1'], 'not an XLA flag'),
    (['--sbatch_flag=exclusive'], 'an sbatch option'),
    (['--workdir=gs://bucket/run'], 'every node mounts'),
    (['--workdir=/shared/my runs'], 'without spaces'),
    (['--config=experiments/configs/nope.py'], 'no file'),
    (['--', 'batch_size=8'], 'FIELD=VALUE'),
    (['--', '--workdir=/other'], 'launcher sets --workdir'),
    (['--', '--coordinator_address=h:1'], 'sets --coordinator_address'),
    (['--signal_seconds=-1'], '0 (no signal) to 65535'),
    (['--signal_seconds=65536'], '0 (no signal) to 65535'),
    (['--time=5', '--signal_seconds=300'], 'not less than --time=5 (300 s)'),
    (['--max_requeues=-1'], '0 (never requeue)'),
])
def test_slurm_bad_arguments_fail_before_writing_anything(
    capsys, no_subprocess, tmp_path, change, message):
  status, _, err = _main(slurm, SLURM_ARGS + ['--dry_run'] + change, capsys)
  assert status == 1
  assert message in err


def test_slurm_dry_run_writes_nothing(capsys, no_subprocess, tmp_path):
  workdir = tmp_path / 'run'
  status, _, _ = _main(slurm, SLURM_ARGS + [f'--workdir={workdir}',
                                            '--dry_run'], capsys)
  assert status == 0
  assert not workdir.exists()


def test_slurm_write_only_writes_the_script_and_submits_nothing(
    capsys, no_subprocess, tmp_path):
  workdir = tmp_path / 'run'
  status, out, _ = _main(slurm, SLURM_ARGS + [f'--workdir={workdir}',
                                              '--write_only'], capsys)
  assert status == 0
  script = (workdir / 'slurm.sbatch').read_text()
  assert script.startswith('#!/bin/bash\n')
  assert f'--workdir={workdir} ' in script
  assert out == (f'wrote {workdir}/slurm.sbatch; submit it with: sbatch '
                 f'{workdir}/slurm.sbatch\n')


def test_slurm_submits_the_written_script(monkeypatch, capsys, tmp_path):
  calls = []
  monkeypatch.setattr(slurm.shutil, 'which', lambda name: '/bin/' + name)
  monkeypatch.setattr(slurm.subprocess, 'run', lambda argv, check: (
      calls.append(argv) or subprocess.CompletedProcess(argv, 0)))
  script = tmp_path / 'scripts' / 'job.sbatch'
  status, _, _ = _main(slurm, SLURM_ARGS + [
      f'--workdir={tmp_path / "run"}', f'--script={script}'], capsys)
  assert status == 0
  assert calls == [['sbatch', str(script)]]
  assert script.exists() and (tmp_path / 'run').is_dir()


def test_slurm_without_sbatch_says_so(monkeypatch, capsys, no_subprocess,
                                      tmp_path):
  monkeypatch.setattr(slurm.shutil, 'which', lambda name: None)
  status, _, err = _main(slurm, SLURM_ARGS + [f'--workdir={tmp_path}'],
                         capsys)
  assert status == 1
  assert 'sbatch is not on PATH' in err


def test_slurm_requeues_by_default_and_signals_before_the_limit():
  script = _script(SLURM_ARGS, [])
  assert ('#SBATCH --requeue\n#SBATCH --open-mode=append\n'
          '#SBATCH --signal=TERM@300\n') in script
  assert 'if ((requeues >= 20)); then\n' in script
  script = _script(SLURM_ARGS + ['--signal_seconds=0', '--max_requeues=3'],
                   [])
  assert '--signal' not in script
  assert '#SBATCH --requeue\n' in script
  assert 'if ((requeues >= 3)); then\n' in script


@pytest.mark.parametrize('time, seconds', [
    ('90', 5400), ('90:30', 5430), ('12:00:00', 43200), ('2-0', 172800),
    ('1-2:30', 95400), ('1-02:30:15', 95415), ('0', 0)])
def test_slurm_time_limit_in_seconds(time, seconds):
  assert slurm.time_limit_seconds(time) == seconds


# The generated script's preemption logic, run by bash with fake srun,
# scontrol and python on PATH (bash reads #SBATCH lines as comments).

FAKES = {
    # Records its arguments, drops its options, runs the task command.
    'srun': 'echo "srun $*" >> "$CALLS"\n'
            'while [[ $1 == --* ]]; do shift; done\n"$@"\n',
    'scontrol': 'echo "scontrol $*" >> "$CALLS"\n',
    # The trainer: exits FAKE_STATUS; with FAKE_TERM it first sends its
    # wrapper the SIGTERM that SLURM sends every process of the task.
    'python': 'echo "python $*" >> "$CALLS"\n'
              'if [[ -n $FAKE_TERM ]]; then kill -TERM "$PPID"; sleep 0.1; '
              'fi\nexit "$FAKE_STATUS"\n',
}


def _run_sbatch(tmp_path, status, term=False, restarts=None):
  """Runs the script as SLURM job 42; returns (exit status, calls,
  stderr + stdout, workdir)."""
  bin_dir, workdir = tmp_path / 'bin', tmp_path / 'run'
  bin_dir.mkdir()
  workdir.mkdir(exist_ok=True)
  for name, body in FAKES.items():
    (bin_dir / name).write_text('#!/bin/bash\n' + body)
    (bin_dir / name).chmod(0o755)
  script = tmp_path / 'job.sbatch'
  script.write_text(_script([
      f'--workdir={workdir}', '--config=experiments/configs/bert.py',
      f'--python={bin_dir / "python"}', '--max_requeues=2',
      f'--script={script}'], ['--config.total_steps=8']))
  env = {'PATH': f'{bin_dir}:{os.environ["PATH"]}', 'SLURM_JOB_ID': '42',
         'CALLS': str(tmp_path / 'calls'), 'FAKE_STATUS': str(status),
         'FAKE_TERM': 'yes' if term else ''}
  if restarts is not None:
    env['SLURM_RESTART_COUNT'] = str(restarts)
  result = subprocess.run(['bash', str(script)], env=env, capture_output=True,
                          text=True, timeout=10, check=False)
  calls = (tmp_path / 'calls').read_text().splitlines()
  return result.returncode, calls, result.stderr + result.stdout, workdir


@pytest.mark.parametrize('term', [False, True])
def test_slurm_script_requeues_a_preempted_job(tmp_path, term):
  status, calls, out, workdir = _run_sbatch(tmp_path, 75, term=term)
  assert status == 0
  assert calls[0].startswith('srun --kill-on-bad-exit=1 ')
  assert calls[1] == (f'python -m bertjax.train '
                      f'--config=experiments/configs/bert.py '
                      f'--workdir={workdir} --config.sharding.replicas=1 '
                      '--config.total_steps=8')
  assert calls[2:] == ['scontrol requeue 42']
  assert 'requeueing job 42 (1 of 2)' in out
  assert not list(workdir.iterdir())   # The mark is gone.


def test_slurm_script_exits_with_a_failed_status_and_no_requeue(tmp_path):
  status, calls, _, _ = _run_sbatch(tmp_path, 3)
  assert status == 3
  assert [c.split()[0] for c in calls] == ['srun', 'python']


def test_slurm_script_ends_a_finished_run_despite_a_stale_mark(tmp_path):
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'preempted-42').touch()   # From an earlier run.
  status, calls, _, workdir = _run_sbatch(tmp_path, 0)
  assert status == 0
  assert [c.split()[0] for c in calls] == ['srun', 'python']
  assert not list(workdir.iterdir())


def test_slurm_script_stops_requeueing_past_max_requeues(tmp_path):
  status, calls, out, _ = _run_sbatch(tmp_path, 75, restarts=2)
  assert status == 75
  assert [c.split()[0] for c in calls] == ['srun', 'python']
  assert ('requeued 2 time(s) already (--max_requeues=2): not requeueing'
          in out)
  assert f'resume with: sbatch {tmp_path / "job.sbatch"}' in out


def test_slurm_script_requeues_below_max_requeues(tmp_path):
  status, calls, out, _ = _run_sbatch(tmp_path, 75, restarts=1)
  assert status == 0
  assert calls[-1] == 'scontrol requeue 42'
  assert 'requeueing job 42 (2 of 2)' in out
