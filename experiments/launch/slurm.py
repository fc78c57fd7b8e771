"""Pretrains on GPU nodes under SLURM: writes an sbatch script and submits it.

  python experiments/launch/slurm.py --nodes=2 --gpus_per_node=8 \
      --partition=gpu --time=24:00:00 --workdir=/shared/runs/bert-base \
      --config=experiments/configs/bert.py:size=base \
      -- --config.model.dtype=bfloat16

Everything after ``--`` goes to ``bertjax.train`` as it is (any
``--config.FIELD=VALUE``). ``--dry_run`` prints the script and the commands
that would write and submit it, and does neither; ``--write_only`` writes
the script and prints the ``sbatch`` command that would submit it.

The script (``WORKDIR/slurm.sbatch``, log ``WORKDIR/slurm-JOBID.out``):

* ``#SBATCH`` resources: ``--nodes``, ``--ntasks-per-node`` (one process
  per GPU by default, or one per node with ``--processes=per_node``),
  ``--gpus-per-node``, ``--cpus-per-task``, ``--time``, and optionally
  ``--partition``, ``--account`` and any ``--sbatch_flag``; then
  ``--requeue``, ``--open-mode=append`` and ``--signal`` (preemption,
  below);
* ``--setup`` lines (``module load ...``, ``source venv/bin/activate``,
  cluster-specific NCCL variables), then ``cd`` to this checkout;
* ``XLA_FLAGS`` for multi-GPU throughput (``GPU_XLA_FLAGS`` below; flags
  already in the job's environment come after them and win),
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` and ``BERTJAX_DATA_DIR``;
* ``srun python -m bertjax.train``: every task calls
  ``jax.distributed.initialize()``, which reads the job from SLURM's
  variables (coordinator on the first node). With one process per GPU, JAX
  gives each process the GPU numbered by its ``SLURM_LOCALID``; with one
  per node, ``JAX_LOCAL_DEVICE_IDS`` gives it all of them. ``srun
  --gpu-bind=none`` keeps every GPU of the node visible to every task for
  this; ``--kill-on-bad-exit`` ends the job when one process dies rather
  than leaving the others waiting in a collective;
* the requeue on preemption.

Preemption: ``#SBATCH --signal=TERM@SECONDS`` (``--signal_seconds``,
default 300; 0: none) has SLURM send SIGTERM that long before the time
limit (up to 60 s earlier, SLURM's resolution) to the tasks of the job
steps, i.e. srun's trainers, and not to the batch shell or srun (which
would answer SIGTERM by killing its tasks with SIGKILL): SLURM's default
without the ``B:`` prefix. The trainers save a checkpoint at the next step
and exit ``EXIT_PREEMPTED`` (75). Each task runs under a small ``bash``
wrapper that turns that 75 into 0 after touching a mark file
(``WORKDIR/preempted-JOBID``), because srun's ``--kill-on-bad-exit`` kills
the other tasks at the first non-zero exit and then reports their signal,
not 75: a task still shutting down would hide the preemption. The wrapper
traps SIGTERM, which reaches every process of a task, to outlive it; the
mark is seen at once by the script, even on NFS, since the first node,
where the script runs, runs tasks too. When srun ends with 0 and the mark
is there, the script runs ``scontrol requeue $SLURM_JOB_ID`` (allowed by
``#SBATCH --requeue``): the job goes back to the queue and, when it starts
again, reruns this script, which resumes from the checkpoint;
``--open-mode=append`` keeps the log of the earlier runs.
``--max_requeues`` (default 20) bounds this: past that many restarts
(``SLURM_RESTART_COUNT``, which also counts SLURM's own requeues, after a
node failure or its preemption) the script exits 75 and says how to
resume. Any other status of srun is a failure: the script exits with it.
SLURM's own preemption signals the tasks only if the cluster sets
``PreemptParameters=send_user_signal`` (with ``PreemptMode=REQUEUE`` SLURM
requeues the job itself).

The mesh: ``sharding.replicas`` = nodes (pure data parallelism between
nodes, over the slower inter-node network) unless given after ``--``;
within a node, the config's ``sharding.mesh_shape`` (``(-1, 1, 1)``, data
parallel, unless the config or an override says otherwise).

The checkout, the Python environment (``pip install -e . 'jax[cuda12]'``),
the workdir and the data cache (``--data_dir``) must be on a filesystem
every node sees; process 0 builds the data cache and the others read it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_common import EXIT_PREEMPTED, LaunchError, REPO  # pylint: disable=g-import-not-at-top,wrong-import-position
from launch_common import check_overrides, split_argv  # pylint: disable=g-import-not-at-top,wrong-import-position

SCRIPT_NAME = 'slurm.sbatch'
LOG_PATTERN = 'slurm-%j.out'   # %j: the job id.
PROCESSES = ('per_gpu', 'per_node')
CPUS_PER_GPU = 12   # Grain threads for the input pipeline, per GPU.
# Flags of XLA's DebugOptions, all present in jaxlib 0.10 (setup.py's
# range); an unknown flag aborts the process, so none is guessed. Sources:
# JAX's "GPU performance tips" (docs.jax.dev/en/latest/
# gpu_performance_tips.html) and NVIDIA JAX-Toolbox's "GPU performance"
# (github.com/NVIDIA/JAX-Toolbox, rosetta/docs/GPU_performance.md).
GPU_XLA_FLAGS = (
    # Overlap collectives (the gradient all-reduce) with compute: JAX's
    # "GPU performance tips" page, and NVIDIA JAX-Toolbox's default.
    '--xla_gpu_enable_latency_hiding_scheduler=true',
    # Collectives on the highest-priority stream so they are not starved by
    # compute kernels: JAX-Toolbox "GPU performance" page.
    '--xla_gpu_enable_highest_priority_async_stream=true',
    # Combine small collectives into ones of up to 128 MiB, at least a
    # BERT-large layer's f32 weights or gradients (~50 MB): JAX's "GPU
    # performance tips" (combine_threshold_bytes).
    '--xla_gpu_all_reduce_combine_threshold_bytes=134217728',
    '--xla_gpu_all_gather_combine_threshold_bytes=134217728',
    '--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728',
    # Let the combiner merge FSDP all-gathers / reduce-scatters of
    # different dimensions: JAX-Toolbox "GPU performance", FSDP section.
    '--xla_gpu_enable_all_gather_combine_by_dim=false',
    '--xla_gpu_enable_reduce_scatter_combine_by_dim=false',
    # Pipeline the collectives of loop iterations (scanned layers) with the
    # compute of the neighbouring ones: JAX-Toolbox "GPU performance". No
    # effect on programs without loops (bertjax unrolls its layers today).
    '--xla_gpu_enable_pipelined_all_gather=true',
    '--xla_gpu_enable_pipelined_reduce_scatter=true',
    '--xla_gpu_enable_pipelined_all_reduce=true',
)
TIME = re.compile(r'(\d+-)?\d+(:\d\d){0,2}')   # SLURM's --time formats.
NAME = re.compile(r'[\w.-]+')
MAX_SIGNAL_SECONDS = 65535   # sbatch --signal's sig_time range.
# The per-task wrapper: the trainer's exit 75 becomes a mark ($1) and 0 (why:
# the module docstring); the trap keeps it alive through the SIGTERM notice.
TASK = ('trap : TERM; mark=$1; shift; "$@"; status=$?; '
        f'if ((status == {EXIT_PREEMPTED})); then touch "$mark"; exit 0; fi; '
        'exit "$status"')


def time_limit_seconds(time: str) -> int:
  """SLURM's ``--time`` in seconds (0: no limit). Formats: minutes,
  minutes:seconds, hours:minutes:seconds, days-hours,
  days-hours:minutes, days-hours:minutes:seconds."""
  days, _, clock = time.rpartition('-')
  parts = [int(part) for part in clock.split(':')]
  if days:   # days-hours[:minutes[:seconds]]
    hours, minutes, seconds = parts + [0] * (3 - len(parts))
    hours += 24 * int(days)
  elif len(parts) == 3:   # hours:minutes:seconds
    hours, minutes, seconds = parts
  else:   # minutes[:seconds]
    hours, (minutes, seconds) = 0, parts + [0] * (2 - len(parts))
  return (hours * 60 + minutes) * 60 + seconds


def _overridden(overrides: list[str], field: str) -> bool:
  flag = f'--config.{field}'
  return any(arg == flag or arg.startswith(flag + '=') for arg in overrides)


def check_args(args, overrides: list[str]) -> None:
  if args.nodes < 1:
    raise LaunchError(f'--nodes={args.nodes}: at least 1.')
  if args.gpus_per_node < 1:
    raise LaunchError(f'--gpus_per_node={args.gpus_per_node}: at least 1.')
  if args.cpus_per_task < 0:
    raise LaunchError(f'--cpus_per_task={args.cpus_per_task}: 0 (= '
                      f'{CPUS_PER_GPU} per GPU of a task) or more.')
  if not TIME.fullmatch(args.time):
    raise LaunchError(f'--time={args.time!r}: use SLURM\'s formats, e.g. '
                      '24:00:00, 2-00:00:00 or 90 (minutes).')
  if not 0 <= args.signal_seconds <= MAX_SIGNAL_SECONDS:
    raise LaunchError(f'--signal_seconds={args.signal_seconds}: 0 (no '
                      f'signal) to {MAX_SIGNAL_SECONDS}.')
  limit = time_limit_seconds(args.time)
  if args.signal_seconds and limit and args.signal_seconds >= limit:
    # The notice would come before the trainer could take it.
    raise LaunchError(f'--signal_seconds={args.signal_seconds}: not less '
                      f'than --time={args.time} ({limit} s).')
  if args.max_requeues < 0:
    raise LaunchError(f'--max_requeues={args.max_requeues}: 0 (never '
                      'requeue) or more.')
  if not 0 < args.mem_fraction <= 1:
    raise LaunchError(f'--mem_fraction={args.mem_fraction}: in (0, 1].')
  for option in ('job_name', 'partition', 'account'):
    value = getattr(args, option)
    if value and not NAME.fullmatch(value):
      raise LaunchError(f'--{option}={value!r}: letters, digits, _ . - '
                        'only.')
  for line in args.setup + args.sbatch_flag:
    if '\n' in line:
      raise LaunchError(f'{line!r}: one line per --setup / --sbatch_flag.')
  for flag in shlex.split(args.xla_flags):
    if not flag.startswith('--xla_'):
      raise LaunchError(f'--xla_flags: {flag!r} is not an XLA flag '
                        '(--xla_...).')
  for flag in args.sbatch_flag:
    if not flag.startswith('--'):
      raise LaunchError(f'--sbatch_flag={flag!r}: an sbatch option such as '
                        '--exclusive or --constraint=h100.')
  if '://' in args.workdir or re.search(r'\s', args.workdir):
    raise LaunchError(f'--workdir={args.workdir!r}: a path (without '
                      'spaces) on a filesystem every node mounts.')
  config_path = args.config.partition(':')[0]
  if not os.path.isfile(os.path.join(REPO, config_path)):
    raise LaunchError(f'--config={args.config!r}: no file {config_path} '
                      f'(relative paths are inside {REPO}).')
  check_overrides(overrides)


def script_path(args) -> str:
  return os.path.abspath(args.script or os.path.join(args.workdir,
                                                     SCRIPT_NAME))


def sbatch_script(args, overrides: list[str]) -> str:
  """The batch script's text."""
  check_args(args, overrides)
  per_gpu = args.processes == 'per_gpu'
  tasks_per_node = args.gpus_per_node if per_gpu else 1
  gpus_per_task = 1 if per_gpu else args.gpus_per_node
  cpus = args.cpus_per_task or CPUS_PER_GPU * gpus_per_task
  workdir = os.path.abspath(args.workdir)
  # One replica per node: data parallelism over the inter-node network.
  mesh = [] if _overridden(overrides, 'sharding.replicas') else [
      f'--config.sharding.replicas={args.nodes}']
  train = [args.python, '-m', 'bertjax.train', f'--config={args.config}',
           f'--workdir={workdir}', *mesh, *overrides]
  processes = (f'one process per GPU ({tasks_per_node} per node)' if per_gpu
               else f'one process per node ({args.gpus_per_node} GPUs each)')
  lines = [
      '#!/bin/bash',
      f'# bertjax pretraining on {args.nodes} node(s) x {args.gpus_per_node} '
      f'GPUs, {processes}.',
      '# Written by experiments/launch/slurm.py.',
      f'#SBATCH --job-name={args.job_name}',
      f'#SBATCH --nodes={args.nodes}',
      f'#SBATCH --ntasks-per-node={tasks_per_node}',
      f'#SBATCH --gpus-per-node={args.gpus_per_node}',
      f'#SBATCH --cpus-per-task={cpus}',
      f'#SBATCH --time={args.time}',
  ]
  if args.partition:
    lines.append(f'#SBATCH --partition={args.partition}')
  if args.account:
    lines.append(f'#SBATCH --account={args.account}')
  lines.append(f'#SBATCH --output={os.path.join(workdir, LOG_PATTERN)}')
  lines += [f'#SBATCH {flag}' for flag in args.sbatch_flag]
  # Preemption (the module docstring): a requeued job appends to its log.
  lines += ['#SBATCH --requeue', '#SBATCH --open-mode=append']
  if args.signal_seconds:
    lines.append(f'#SBATCH --signal=TERM@{args.signal_seconds}')
  lines += ['', 'set -eo pipefail', *args.setup, f'cd {shlex.quote(REPO)}',
            '']
  xla_flags = GPU_XLA_FLAGS + tuple(
      shlex.quote(f) for f in shlex.split(args.xla_flags))
  lines += [
      '# Overlap and combine collectives (why: GPU_XLA_FLAGS in the '
      'launcher);',
      '# flags already in the environment come last and win.',
      'xla_flags=(', *(f'  {flag}' for flag in xla_flags), ')',
      'export XLA_FLAGS="${xla_flags[*]} ${XLA_FLAGS:-}"',
      '# JAX preallocates this fraction of each GPU (its default is 0.75).',
      f'export XLA_PYTHON_CLIENT_MEM_FRACTION={args.mem_fraction}',
  ]
  if args.data_dir:
    lines.append('export BERTJAX_DATA_DIR='
                 f'{shlex.quote(os.path.abspath(args.data_dir))}')
  if not per_gpu:
    lines += ['# One process drives all GPUs of its node.',
              'export JAX_LOCAL_DEVICE_IDS='
              f'{",".join(str(i) for i in range(args.gpus_per_node))}']
  # srun no longer inherits --cpus-per-task from sbatch (SLURM 22.05+).
  srun = ['srun', '--kill-on-bad-exit=1', '--gpu-bind=none',
          f'--cpus-per-task={cpus}']
  mark = shlex.quote(os.path.join(workdir, 'preempted-')) + '"$SLURM_JOB_ID"'
  notice = (f'SLURM sends it {args.signal_seconds} s before the time limit'
            if args.signal_seconds else 'to the tasks')
  comment = (
      f'Preemption: at a SIGTERM ({notice}) the trainers save a checkpoint '
      f'and exit {EXIT_PREEMPTED}. Each task turns that into the mark and '
      'exit 0: srun --kill-on-bad-exit would kill the tasks still exiting '
      'and report their signal instead. Preempted, the job is requeued: it '
      'reruns this script, which resumes from the checkpoint.')
  lines += [
      '', *(f'# {line}' for line in textwrap.wrap(comment, 76)),
      f'mark={mark}',
      'rm -f "$mark"',
      f'task={shlex.quote(TASK)}',
      'status=0',
      ' \\\n    '.join(
          [shlex.join(srun), 'bash -c "$task" bertjax-task "$mark"',
           shlex.join(train[:3])] + [shlex.quote(a) for a in train[3:]] +
          ['|| status=$?']),
      '',
      'preempted=0',
      'if [[ -e $mark ]]; then preempted=1; rm -f "$mark"; fi',
      'if ((status != 0 || !preempted)); then',
      '  exit "$status"   # 0: training finished.',
      'fi',
      'requeues=${SLURM_RESTART_COUNT:-0}',
      f'if ((requeues >= {args.max_requeues})); then',
      '  echo "bertjax: preempted; requeued $requeues time(s) already '
      f'(--max_requeues={args.max_requeues}): not requeueing." >&2',
      '  echo "The checkpoint is written; resume with: sbatch '
      f'{shlex.quote(script_path(args))}" >&2',
      f'  exit {EXIT_PREEMPTED}',
      'fi',
      'echo "bertjax: preempted; requeueing job $SLURM_JOB_ID '
      f'($((requeues + 1)) of {args.max_requeues}) to resume from the '
      'checkpoint."',
      'scontrol requeue "$SLURM_JOB_ID"',
  ]
  return '\n'.join(lines) + '\n'


def directories(args) -> list[str]:
  """Created before the script is written: the workdir (SLURM cannot open
  the log in a missing directory) and the script's."""
  workdir = os.path.abspath(args.workdir)
  script_dir = os.path.dirname(script_path(args))
  return [workdir] + ([script_dir] if script_dir != workdir else [])


def dry_run_text(args, overrides: list[str]) -> str:
  script = sbatch_script(args, overrides)
  path = script_path(args)
  return (f'# The script, written to {path}:\n{script}'
          f'# (end of the script)\n'
          f'# Create the directories, write the script, submit it:\n'
          f'{shlex.join(["mkdir", "-p", *directories(args)])}\n'
          f'{shlex.join(["sbatch", path])}\n')


def write(args, overrides: list[str]) -> str:
  """Writes the script (creating its directories); returns its path."""
  script = sbatch_script(args, overrides)
  for directory in directories(args):
    os.makedirs(directory, exist_ok=True)
  path = script_path(args)
  with open(path, 'w') as f:
    f.write(script)
  return path


def submit(args, overrides: list[str]) -> None:
  if shutil.which('sbatch') is None:
    raise LaunchError('sbatch is not on PATH: run this on a SLURM login '
                      'node, or use --write_only and submit the script '
                      'there.')
  path = write(args, overrides)
  sbatch = ['sbatch', path]
  print(f'+ {shlex.join(sbatch)}', flush=True)
  result = subprocess.run(sbatch, check=False)
  if result.returncode:
    raise LaunchError(f'exit status {result.returncode} from '
                      f'{shlex.join(sbatch)} (the script is in {path}).')
  print(f'log: {os.path.join(os.path.abspath(args.workdir), LOG_PATTERN)} '
        '(%j: the job id above)', flush=True)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """The launcher's arguments, and the trainer's (those after ``--``)."""
  parser, own, overrides = split_argv(argv, __doc__)
  parser.add_argument('--config', required=True,
                      help='e.g. experiments/configs/bert.py:size=base '
                      '(relative paths are inside this checkout).')
  parser.add_argument('--workdir', required=True,
                      help='on a filesystem every node mounts; holds the '
                      'script and the SLURM log too.')
  parser.add_argument('--nodes', type=int, default=1)
  parser.add_argument('--gpus_per_node', type=int, default=8)
  parser.add_argument('--processes', choices=PROCESSES, default='per_gpu',
                      help='one process per GPU (default) or per node.')
  parser.add_argument('--cpus_per_task', type=int, default=0,
                      help=f'0: {CPUS_PER_GPU} per GPU of a task.')
  parser.add_argument('--time', default='24:00:00',
                      help='wall-clock limit (SLURM format).')
  parser.add_argument('--signal_seconds', type=int, default=300,
                      help='SIGTERM the trainers this many seconds before '
                      'the time limit, so that they save a checkpoint and '
                      'the job is requeued; 0: no signal.')
  parser.add_argument('--max_requeues', type=int, default=20,
                      help='requeue a preempted job at most this many times '
                      '(SLURM_RESTART_COUNT); 0: never.')
  parser.add_argument('--partition', default='')
  parser.add_argument('--account', default='')
  parser.add_argument('--job_name', default='bertjax')
  parser.add_argument('--sbatch_flag', action='append', default=[],
                      help='another #SBATCH option, e.g. --exclusive; '
                      'repeat.')
  parser.add_argument('--setup', action='append', default=[],
                      help='a shell line run before training, e.g. '
                      '"source /shared/venv/bin/activate"; repeat.')
  parser.add_argument('--python', default='python3',
                      help='the Python on the nodes, found after --setup; '
                      'sbatch passes on your environment, so a venv active '
                      'at submission is found too.')
  parser.add_argument('--data_dir', default='',
                      help='BERTJAX_DATA_DIR, on a shared filesystem '
                      '(default: ~/.cache/bertjax).')
  parser.add_argument('--mem_fraction', type=float, default=0.9,
                      help='XLA_PYTHON_CLIENT_MEM_FRACTION.')
  parser.add_argument('--xla_flags', default='',
                      help='more XLA flags, after the launcher\'s.')
  parser.add_argument('--script', default='',
                      help=f'where to write the script (default: '
                      f'WORKDIR/{SCRIPT_NAME}).')
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument('--dry_run', action='store_true',
                    help='print the script and the commands; write and '
                    'submit nothing.')
  mode.add_argument('--write_only', action='store_true',
                    help='write the script; do not submit it.')
  return parser.parse_args(own), overrides


def main(argv=None) -> None:
  args, overrides = parse(sys.argv[1:] if argv is None else list(argv))
  try:
    if args.dry_run:
      print(dry_run_text(args, overrides), end='')
    elif args.write_only:
      path = write(args, overrides)
      print(f'wrote {path}; submit it with: sbatch {shlex.quote(path)}')
    else:
      submit(args, overrides)
  except LaunchError as e:
    print(f'{os.path.basename(__file__)}: error: {e}', file=sys.stderr)
    sys.exit(1)


if __name__ == '__main__':
  main()
