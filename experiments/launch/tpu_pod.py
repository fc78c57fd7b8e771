"""Pretrains on a Cloud TPU VM slice: create or reuse it, ship, install, run.

  python experiments/launch/tpu_pod.py --name=bert-base --zone=us-central2-b \
      --accelerator_type=v4-32 --workdir=/mnt/runs/bert-base \
      --workdir_is_shared --config=experiments/configs/bert.py:size=base \
      -- --config.model.dtype=bfloat16

Everything after ``--`` goes to ``bertjax.train`` as it is (any
``--config.FIELD=VALUE``). ``--dry_run`` prints the commands below, in
order and shell-quoted, and runs none of them. Without it each command is
printed as it starts and the launcher stops at the first that fails.

0. ``python -m bertjax.preflight`` here (``--preflight=on``, the default;
   needs ``pip install '.[tpu-aot]'``): the config's train step compiled
   for the accelerator type on this machine, with the ``--config.*``
   overrides; a config that does not compile or fit stops the launch before
   a slice is created or used. ``--preflight=off`` skips it.
1. ``gcloud compute tpus tpu-vm describe``: reuse the slice if it exists
   (it must be READY and of the same accelerator type); otherwise
   ``create`` it (``--spot`` or ``--preemptible`` if asked).
2. The code, on every worker (``--worker=all``): by default a
   ``git archive`` of the committed HEAD (uncommitted changes are not
   shipped: the launcher warns about them, and a config file HEAD does
   not hold stops it before the pre-flight and the slice), copied with
   ``tpu-vm scp`` and unpacked into ``~/bertjax``; with ``--repo_url``
   and ``--commit``, a ``git clone`` and checkout on every worker
   instead.
3. ``pip install -e . 'jax[tpu]'`` on every worker, libtpu from the JAX
   find-links page; the jax version is the one setup.py allows.
4. ``python3 -m bertjax.train --multihost=on ...`` on every worker: one
   process per host, joined by ``jax.distributed.initialize()``, which reads
   the slice's workers from the TPU metadata.
   Logs: by default the ssh session stays in the foreground and streams
   every worker's output; the launcher ends when training does, with its
   exit status, and Ctrl-C ends the ssh session (it prints how to stop the
   processes left on the workers). With ``--detach`` training runs under
   ``nohup`` with its output in ``~/bertjax-train.log`` on each worker, and
   the launcher follows worker 0's log: Ctrl-C stops following, not
   training, and closing the laptop does not stop the run.
5. Relaunch after a preemption (not with ``--detach``, whose launcher never
   sees training end). On a preemption notice the trainers save a
   checkpoint and exit ``EXIT_PREEMPTED`` (75); the launcher then runs
   step 4 again, in the same workdir, so training resumes. If training
   fails otherwise, the launcher describes the slice: a Spot or preemptible
   slice that was preempted is PREEMPTED (or TERMINATED, or gone), and ssh
   to it fails with 255. The launcher then deletes it, creates it again,
   ships and installs the code again (steps 1-3; the archive made in step 2
   is reused) and relaunches training; only for a slice it created itself
   with ``--spot`` or ``--preemptible``, or any slice with
   ``--recreate_preempted`` (created with this launcher's ``create``
   command). At most ``--max_restarts`` relaunches (default 20) in all;
   any other failure stops the launcher at once, with training's status.
   ``gcloud ... ssh --worker=all`` waits for every worker and exits with the
   first non-zero status in worker order (255 where ssh itself failed, after
   gcloud's retries), so the launcher sees one worker's status: the workers
   are assumed to agree, as they do on a preemption (JAX's preemption
   service has them all save the same step and exit 75).
6. With ``--delete_after``: ``gcloud compute tpus tpu-vm delete`` when the
   launcher ends, whether training succeeded or not.

Every worker must see the workdir: a bucket (``--workdir=gs://B/run``, the
usual choice), or a filesystem mounted on every worker at the same absolute
path (Filestore), given with ``--workdir_is_shared``; the trainer checks at
start-up that every process sees the files process 0 wrote there.
The data cache (``BERTJAX_DATA_DIR``, ``--data_dir``) may be a bucket too
(prepared once, e.g. by ``python -m data_pipelines.prepare``), or per
worker: each builds the same bytes. ``ssh --worker=all`` needs your key in the ssh
agent: ``ssh-add ~/.ssh/google_compute_engine``. The slice is one ICI
domain, so ``sharding.replicas`` stays 1; the mesh is the config's
(``sharding.mesh_shape``, ``(-1, 1, 1)``: data parallel over all chips)
unless overridden after ``--``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_common import EXIT_PREEMPTED, LaunchError, REPO  # pylint: disable=g-import-not-at-top,wrong-import-position
from launch_common import check_overrides, split_argv  # pylint: disable=g-import-not-at-top,wrong-import-position

# Runtime (--version) per TPU generation, from Cloud TPU's "TPU software
# versions" page; v2, v3 and v4 share one.
RUNTIMES = {'v6e': 'v2-alpha-tpuv6e', 'v5p': 'v2-alpha-tpuv5',
            'v5litepod': 'v2-alpha-tpuv5-lite', 'v5e': 'v2-alpha-tpuv5-lite',
            'v4': 'tpu-ubuntu2204-base', 'v3': 'tpu-ubuntu2204-base',
            'v2': 'tpu-ubuntu2204-base'}
ACCELERATOR = re.compile(r'v\d+[a-z]*-[1-9]\d*')
TPU_NAME = re.compile(r'[a-z]([-a-z0-9]{0,61}[a-z0-9])?')
LIBTPU_LINKS = ('https://storage.googleapis.com/jax-releases/'
                'libtpu_releases.html')
ARCHIVE_NAME = 'bertjax-src.tar.gz'   # In each worker's home, while unpacked.
LOG_NAME = 'bertjax-train.log'        # In each worker's home (--detach).
MAX_RESTARTS = 20
# States of a slice that was preempted (Spot, preemptible): it must be
# deleted and created again ("Manage Spot/preemptible TPUs", Cloud TPU docs).
PREEMPTED_STATES = ('PREEMPTED', 'TERMINATED')
# What recreating a preempted slice runs again, in the plan's order.
RECREATE_KINDS = ('create', 'copy', 'unpack', 'clone', 'install')


class Step(NamedTuple):
  """One command of the launch. ``kind`` says how ``execute`` treats it."""
  kind: str   # preflight, describe, create, check, archive, copy, unpack,
              # clone, install, train, follow, delete_preempted, delete
  note: str   # What it is for; printed above the command.
  argv: tuple[str, ...]


# Runs a step: the command's status, and for describe its output.
Runner = Callable[[Step], subprocess.CompletedProcess]


class TrainingFailed(LaunchError):
  """Training ended with ``status`` (not 0) and will not be relaunched."""

  def __init__(self, message: str, status: int):
    super().__init__(message)
    self.status = status


def runtime_version(accelerator_type: str) -> str:
  """The default ``--version`` for an accelerator type like ``v4-32``."""
  generation = accelerator_type.rpartition('-')[0]
  if generation in RUNTIMES:
    return RUNTIMES[generation]
  raise LaunchError(f'no default runtime for {accelerator_type}; pass '
                    '--version (gcloud compute tpus tpu-vm versions list).')


def check_args(args, overrides: list[str]) -> None:
  if not TPU_NAME.fullmatch(args.name):
    raise LaunchError(f'--name={args.name!r}: a TPU name is 1-63 lowercase '
                      'letters, digits or hyphens, starting with a letter.')
  if not ACCELERATOR.fullmatch(args.accelerator_type):
    raise LaunchError(f'--accelerator_type={args.accelerator_type!r}: use '
                      'GENERATION-SIZE as gcloud does, e.g. v4-32, '
                      'v5litepod-16, v5p-64, v6e-16.')
  if args.spot and args.preemptible:
    raise LaunchError('--spot and --preemptible: pick one.')
  if bool(args.repo_url) != bool(args.commit):
    raise LaunchError('--repo_url and --commit go together: a clone of '
                      'that commit on every worker (without both, the '
                      "launcher ships this checkout's HEAD).")
  if args.max_restarts < 0:
    raise LaunchError(f'--max_restarts={args.max_restarts}: 0 (never '
                      'relaunch) or more.')
  if args.detach and args.recreate_preempted:
    raise LaunchError('--detach and --recreate_preempted: a detached run '
                      'is not followed to its end, so the launcher cannot '
                      'see a preemption and relaunch.')
  if args.detach and args.delete_after:
    raise LaunchError('--detach and --delete_after: a detached run keeps '
                      'training after the launcher ends, so deleting the '
                      'slice then would kill it.')
  if not (args.workdir.startswith('gs://') or (
      args.workdir_is_shared and os.path.isabs(args.workdir))):
    raise LaunchError(f'--workdir={args.workdir!r}: every worker writes '
                      'the checkpoints, so give a bucket (gs://BUCKET/run) '
                      'or an absolute path on a filesystem mounted on every '
                      'worker (Filestore), with --workdir_is_shared.')
  config_path = args.config.partition(':')[0]
  if os.path.isabs(config_path):
    raise LaunchError(f'--config={args.config!r}: give the path inside the '
                      'repository (experiments/configs/...); the workers '
                      'run from their own copy of it.')
  if not args.repo_url and not os.path.isfile(os.path.join(REPO,
                                                           config_path)):
    raise LaunchError(f'--config={args.config!r}: no file {config_path} in '
                      f'{REPO}.')
  check_overrides(overrides)


def plan(args, overrides: list[str]) -> list[Step]:
  """The launch's commands, in order."""
  check_args(args, overrides)
  name, remote_dir = args.name, args.remote_dir
  where = [f'--zone={args.zone}'] + (
      [f'--project={args.project}'] if args.project else [])
  tpu = ['gcloud', 'compute', 'tpus', 'tpu-vm']

  def on_workers(command: str, worker: str = 'all') -> tuple[str, ...]:
    return (*tpu, 'ssh', name, *where, f'--worker={worker}',
            f'--command={command}')

  version = args.version or runtime_version(args.accelerator_type)
  steps = []
  if not args.repo_url:
    steps.append(Step(
        'committed', 'Check the config is committed (the workers get the '
        'committed HEAD):',
        ('git', '-C', REPO, 'cat-file', '-e',
         f'HEAD:{os.path.normpath(args.config.partition(":")[0])}')))
  if args.preflight == 'on':
    steps.append(Step(
        'preflight', 'Compile the train step for this slice here first (a '
        'config that cannot fit stops the launch before any slice exists):',
        (sys.executable, '-m', 'bertjax.preflight',
         f'--config={os.path.join(REPO, args.config)}',
         f'--topology={args.accelerator_type}',
         f'--out={os.path.join(tempfile.gettempdir(), f"bertjax-preflight-{name}")}',
         *[o for o in overrides if o.startswith('--config.')])))
  steps += [
      Step('describe', 'Reuse the slice if it exists:',
           (*tpu, 'describe', name, *where,
            '--format=value(state,acceleratorType)')),
      Step('create', 'Otherwise create it:',
           (*tpu, 'create', name, *where,
            f'--accelerator-type={args.accelerator_type}',
            f'--version={version}') + (('--spot',) if args.spot else ()) +
           (('--preemptible',) if args.preemptible else ())),
  ]
  quoted_dir = shlex.quote(remote_dir)
  if args.repo_url:
    steps.append(Step(
        'clone', f'Clone {args.commit} on every worker:',
        on_workers(f'rm -rf {quoted_dir} && git clone --quiet '
                   f'{shlex.quote(args.repo_url)} {quoted_dir} && git -C '
                   f'{quoted_dir} checkout --quiet '
                   f'{shlex.quote(args.commit)}')))
  else:
    archive = args.archive or os.path.join(tempfile.gettempdir(),
                                           f'bertjax-{name}.tar.gz')
    steps += [
        Step('check', 'Warn if tracked files differ from HEAD (only '
             'committed code is shipped):',
             ('git', '-C', REPO, 'diff', '--quiet', 'HEAD')),
        Step('archive', 'Pack the committed HEAD:',
             ('git', '-C', REPO, 'archive', '--format=tar.gz',
              f'--output={archive}', 'HEAD')),
        Step('copy', 'Copy it to every worker:',
             (*tpu, 'scp', archive, f'{name}:{ARCHIVE_NAME}', *where,
              '--worker=all')),
        Step('unpack', f'Unpack it into ~/{remote_dir} on every worker:',
             on_workers(f'rm -rf {quoted_dir} && mkdir -p {quoted_dir} && '
                        f'tar -xzf {ARCHIVE_NAME} -C {quoted_dir} && '
                        f'rm {ARCHIVE_NAME}')),
    ]
  steps.append(Step(
      'install', 'Install bertjax and JAX for TPU on every worker:',
      on_workers(f'cd {quoted_dir} && {shlex.quote(args.python)} -m pip '
                 'install -e . '
                 f"'jax[tpu]' -f {LIBTPU_LINKS}")))
  env = f'BERTJAX_DATA_DIR={shlex.quote(args.data_dir)} ' if (
      args.data_dir) else ''
  train = shlex.join([
      args.python, '-m', 'bertjax.train', f'--config={args.config}',
      f'--workdir={args.workdir}', '--multihost=on', *overrides])
  if args.detach:
    steps += [
        Step('train', f'Train on every worker in the background, output '
             f'in ~/{LOG_NAME}:',
             on_workers(f'cd {quoted_dir} && {env}nohup {train} > '
                        f'~/{LOG_NAME} 2>&1 < /dev/null &')),
        Step('follow', "Follow worker 0's log (Ctrl-C stops following, "
             'not training):',
             on_workers(f'tail -n +1 -F ~/{LOG_NAME}', worker='0')),
    ]
  else:
    steps.append(Step('train', 'Train on every worker, streaming the output '
                      f'(after exit {EXIT_PREEMPTED}, a preemption, again: '
                      'it resumes):',
                      on_workers(f'cd {quoted_dir} && {env}{train}')))
    if args.spot or args.preemptible or args.recreate_preempted:
      steps.append(Step(
          'delete_preempted', 'If the slice is found preempted: delete it, '
          'create, ship and install again (the commands above), and train '
          'again:', (*tpu, 'delete', name, *where, '--quiet')))
  if args.delete_after:
    steps.append(Step('delete', 'Delete the slice (when the launcher ends, '
                      'whether training succeeded or not):',
                      (*tpu, 'delete', name, *where, '--quiet')))
  return steps


def dry_run_text(steps: list[Step]) -> str:
  return '\n'.join(f'# {step.note}\n{shlex.join(step.argv)}'
                   for step in steps) + '\n'


def _run(step: Step, **kwargs) -> subprocess.CompletedProcess:
  print(f'+ {shlex.join(step.argv)}', flush=True)
  try:
    return subprocess.run(step.argv, check=False, **kwargs)
  except FileNotFoundError as e:
    raise LaunchError(f'{step.argv[0]} is not installed or not on PATH.'
                      ) from e


def run_step(step: Step) -> subprocess.CompletedProcess:
  """The Runner that runs commands: output goes to the terminal, except
  the describe step's, which is parsed."""
  if step.kind == 'describe':
    return _run(step, capture_output=True, text=True)
  return _run(step)


def _must_run(step: Step, run: Runner) -> None:
  result = run(step)
  if result.returncode:
    raise LaunchError(f'exit status {result.returncode} from '
                      f'{shlex.join(step.argv)}\n({step.note.rstrip(":")})')


def _slice_state(step: Step, run: Runner) -> tuple[str, str] | None:
  """Runs the describe step: the slice's state and accelerator type, or
  None if there is no such slice; anything else is an error."""
  result = run(step)
  if result.returncode:
    if 'NOT_FOUND' in result.stderr or 'not found' in result.stderr.lower():
      return None
    raise LaunchError(f'gcloud could not describe the slice:\n'
                      f'{result.stderr.strip()}')
  state, accelerator_type = (result.stdout.split() + ['', ''])[:2]
  return state, accelerator_type


def _slice_exists(step: Step, accelerator_type: str, run: Runner) -> bool:
  """Runs the describe step: True for a READY slice of this type, False
  for none; anything else is an error."""
  found = _slice_state(step, run)
  if found is None:
    return False
  state, existing_type = found
  if state != 'READY':
    raise LaunchError(f'the slice exists but is {state or "in no state"}, '
                      'not READY: delete it (gcloud compute tpus tpu-vm '
                      'delete) or choose another --name.')
  if existing_type and existing_type != accelerator_type:
    raise LaunchError(f'the slice exists as {existing_type}, not '
                      f'{accelerator_type}: delete it or choose another '
                      '--name.')
  print('reusing the existing slice', flush=True)
  return True


def train_until_done(steps: list[Step], run: Runner, max_restarts: int,
                     may_recreate: bool) -> None:
  """Runs the train step until training ends, relaunching it after each
  preemption (at most ``max_restarts`` times in all).

  After training's status (one worker's: the module docstring, step 5):

  * 0: training finished.
  * ``EXIT_PREEMPTED``: the checkpoint is written; train again (resumes).
  * any other: the slice is described. If it is PREEMPTED, TERMINATED or
    gone and ``may_recreate``, it is deleted (unless gone) and the steps of
    ``RECREATE_KINDS`` run again before training; otherwise training failed.

  Raises:
    TrainingFailed: a failure, or a preemption past ``max_restarts``.
    LaunchError: a command of the recreation failed.
  """
  train = next(s for s in steps if s.kind == 'train')
  describe = next(s for s in steps if s.kind == 'describe')
  delete = [s for s in steps if s.kind == 'delete_preempted']
  recreate = [s for s in steps if s.kind in RECREATE_KINDS]
  restarts = 0
  while True:
    status = run(train).returncode
    if status == 0:
      return
    found = None
    if status == EXIT_PREEMPTED:
      why = (f'exit status {status}: training was preempted and saved a '
             'checkpoint')
    else:
      found = _slice_state(describe, run)
      state = found[0] if found else 'gone'
      if found and state not in PREEMPTED_STATES:
        raise TrainingFailed(
            f'exit status {status} from {shlex.join(train.argv)}\n(the '
            f'slice is {state or "in no state"}: a failure, not a '
            'preemption, so no relaunch)', status)
      if not may_recreate:
        raise TrainingFailed(
            f'exit status {status} from training: the slice is {state}. The '
            'launcher recreates only a slice it created with --spot or '
            '--preemptible, or any with --recreate_preempted; rerun it so, '
            'or delete the slice and rerun it: training resumes from the '
            'latest checkpoint.', status)
      why = f'exit status {status}: the slice is {state}'
    if restarts == max_restarts:
      raise TrainingFailed(
          f'{why}; relaunched {restarts} time(s) already (--max_restarts='
          f'{max_restarts}), so not again. Rerun the launcher to resume '
          'from the latest checkpoint.', status)
    restarts += 1
    if status == EXIT_PREEMPTED:
      print(f'{why}; relaunch {restarts} of {max_restarts}', flush=True)
    else:
      print(f'{why}; recreating it, then relaunch {restarts} of '
            f'{max_restarts}', flush=True)
      for step in (delete if found else []) + recreate:
        _must_run(step, run)


def execute(steps: list[Step], accelerator_type: str,
            max_restarts: int = MAX_RESTARTS,
            recreate_preempted: bool = False, run: Runner = run_step) -> None:
  """Runs the steps (with ``run``); deletes the slice at the end if a
  delete step is planned and the slice was reached. A preempted slice is
  recreated if the plan allows it (a delete_preempted step) and the
  launcher created it, or with ``recreate_preempted``."""
  if shutil.which('gcloud') is None:
    raise LaunchError('gcloud is not on PATH: install the Google Cloud CLI '
                      '(https://cloud.google.com/sdk/docs/install) and run '
                      '`gcloud auth login`.')
  delete = [s for s in steps if s.kind == 'delete']
  detached = any(s.kind == 'follow' for s in steps)
  # How to end the training processes the launcher leaves behind.
  train = next(s for s in steps if s.kind == 'train')
  stop = shlex.join(train.argv[:-1] +
                    ("--command=pkill -f '[b]ertjax.train'",))
  slice_up = created = False
  try:
    exists = False
    for step in steps:
      if step.kind == 'preflight':
        if _run(step, cwd=REPO, env=dict(os.environ,
                                         JAX_PLATFORMS='cpu')).returncode:
          raise LaunchError('the pre-flight found that the config does not '
                            'compile or fit on this slice (its output is '
                            'above); fix the config, or skip the check with '
                            '--preflight=off.')
      elif step.kind == 'committed':
        if run(step).returncode:
          raise LaunchError(
              f'{step.argv[-1][len("HEAD:"):]} is not in the committed '
              'HEAD (new, or not a git checkout), and the workers get only '
              'what is committed: commit it, or give --repo_url and '
              '--commit.')
      elif step.kind == 'describe':
        exists = _slice_exists(step, accelerator_type, run)
        slice_up = exists
      elif step.kind == 'create':
        if not exists:
          _must_run(step, run)
          slice_up = created = True
      elif step.kind == 'check':
        if run(step).returncode == 1:
          print('warning: tracked files differ from HEAD; the workers get '
                'the committed HEAD without these changes.',
                file=sys.stderr, flush=True)
      elif step.kind == 'follow':
        try:
          run(step)
        except KeyboardInterrupt:
          print('\nstopped following; training goes on. Follow again: '
                f'{shlex.join(step.argv)}\nStop it: {stop}', flush=True)
      elif step.kind == 'train':
        may_recreate = (created or recreate_preempted) and any(
            s.kind == 'delete_preempted' for s in steps)
        try:
          train_until_done(steps, run, max_restarts, may_recreate)
        except KeyboardInterrupt:
          if not detached:
            print('\nthe ssh session ended; training may still run on the '
                  f'workers. Stop it: {stop}', flush=True)
          raise
      elif step.kind not in ('delete', 'delete_preempted'):
        _must_run(step, run)
  except BaseException:
    if delete and slice_up:   # Keep the first error; report the second.
      if run(delete[0]).returncode:
        print('error: the slice was not deleted; delete it with: '
              f'{shlex.join(delete[0].argv)}', file=sys.stderr, flush=True)
    raise
  if delete:
    _must_run(delete[0], run)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """The launcher's arguments, and the trainer's (those after ``--``)."""
  parser, own, overrides = split_argv(argv, __doc__)
  parser.add_argument('--name', required=True, help='TPU slice name.')
  parser.add_argument('--zone', required=True, help='e.g. us-central2-b.')
  parser.add_argument('--project', default='',
                      help='GCP project (default: gcloud config).')
  parser.add_argument('--accelerator_type', required=True,
                      help='e.g. v4-32, v5litepod-16, v5p-64, v6e-16.')
  parser.add_argument('--version', default='',
                      help='TPU runtime (default: the one Cloud TPU '
                      'recommends for the generation, e.g. '
                      'tpu-ubuntu2204-base for v4).')
  parser.add_argument('--spot', action='store_true',
                      help='create a Spot slice.')
  parser.add_argument('--preemptible', action='store_true',
                      help='create a preemptible slice.')
  parser.add_argument('--recreate_preempted', action='store_true',
                      help='if the slice is found preempted during '
                      'training, delete and recreate it and train again '
                      '(default: only for a slice this launcher created '
                      'with --spot or --preemptible).')
  parser.add_argument('--max_restarts', type=int, default=MAX_RESTARTS,
                      help='relaunch training at most this many times after '
                      'preemptions (exit status '
                      f'{EXIT_PREEMPTED}, or a preempted slice); 0: never.')
  parser.add_argument('--config', required=True,
                      help='config inside the repository, e.g. '
                      'experiments/configs/bert.py:size=base.')
  parser.add_argument('--workdir', required=True,
                      help='an absolute path mounted on every worker '
                      '(with --workdir_is_shared).')
  parser.add_argument('--workdir_is_shared', action='store_true',
                      help='--workdir is a path mounted on every worker.')
  parser.add_argument('--data_dir', default='',
                      help="BERTJAX_DATA_DIR on the workers (default: "
                      "each worker's ~/.cache/bertjax).")
  parser.add_argument('--repo_url', default='',
                      help='clone this repository on the workers instead '
                      'of shipping this checkout (with --commit).')
  parser.add_argument('--commit', default='',
                      help='commit, tag or branch to check out after '
                      'cloning --repo_url.')
  parser.add_argument('--archive', default='',
                      help='local path of the git archive (default: '
                      'TMPDIR/bertjax-NAME.tar.gz).')
  parser.add_argument('--remote_dir', default='bertjax',
                      help="the code's directory in each worker's home.")
  parser.add_argument('--python', default='python3',
                      help='the Python on the workers.')
  parser.add_argument('--detach', action='store_true',
                      help='train under nohup and follow worker 0\'s log.')
  parser.add_argument('--delete_after', action='store_true',
                      help='delete the slice when the launcher ends.')
  parser.add_argument('--preflight', choices=('on', 'off'), default='on',
                      help='compile the train step for the slice on this '
                      "machine first (bertjax.preflight; needs pip install "
                      "'.[tpu-aot]') and stop if it does not fit.")
  parser.add_argument('--dry_run', action='store_true',
                      help='print the commands; run nothing.')
  return parser.parse_args(own), overrides


def main(argv=None) -> None:
  args, overrides = parse(sys.argv[1:] if argv is None else list(argv))
  try:
    steps = plan(args, overrides)
    if args.dry_run:
      print(dry_run_text(steps), end='')
    else:
      execute(steps, args.accelerator_type, args.max_restarts,
              args.recreate_preempted)
  except LaunchError as e:
    print(f'{os.path.basename(__file__)}: error: {e}', file=sys.stderr)
    if isinstance(e, TrainingFailed):   # Killed by signal N: 128 + N.
      sys.exit(e.status if e.status > 0 else 128 - e.status)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.exit(130)


if __name__ == '__main__':
  main()
