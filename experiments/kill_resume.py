"""Kills a training run at random moments, resumes it, and checks that it
ends exactly where an uninterrupted run of the same config ends.

  python experiments/kill_resume.py --config=experiments/configs/demo.py \
      --workdir=runs/kill-demo --kills=5 [-- --config.FIELD=VALUE ...]

1. Trains ``WORKDIR/uninterrupted`` to the end (or takes ``--reference``,
   the workdir of a finished run of the same config and overrides). A
   ``WORKDIR`` that already holds ``uninterrupted`` or ``killed`` (an
   earlier attempt's, perhaps itself cut short and resumed, which would hide
   a resume bug on both sides) is refused before anything runs.
2. Trains ``WORKDIR/killed``: ``--kills`` times it starts (or resumes) the
   run and SIGKILLs it once the run has logged a randomly drawn step (of
   the first three quarters of its logged steps), after a further random
   delay, so that kills land anywhere (inside a step, a
   checkpoint save, a metrics write); then it lets the run finish.
3. Compares the two: ``metrics.jsonl`` byte for byte, and every parameter
   of the final checkpoint bit for bit. Prints both final metrics lines and
   the verdict; the exit status is 0 only when both are identical and every
   kill landed before the end of the run.

The draws come from ``--seed``; the moments also depend on the machine's
speed, which is the point: any moment must do.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = 'metrics.jsonl'


def _train_command(config: str, workdir: str, overrides: list[str]
                   ) -> list[str]:
  return [sys.executable, '-m', 'bertjax.train', f'--config={config}',
          f'--workdir={workdir}', *overrides]


def _env() -> dict:
  path = os.environ.get('PYTHONPATH')
  return dict(os.environ,
              PYTHONPATH=REPO + (os.pathsep + path if path else ''))


def _logged_steps(workdir: str) -> list[int]:
  """The steps in ``metrics.jsonl`` so far (a line being written is
  skipped)."""
  from bertjax.runtime import metric_writers  # pylint: disable=g-import-not-at-top
  return [record['step'] for _, record in
          metric_writers.logged_lines(os.path.join(workdir, METRICS))]


def _final_line(workdir: str) -> str:
  from bertjax import storage  # pylint: disable=g-import-not-at-top
  return storage.read_text(os.path.join(workdir, METRICS)).splitlines()[-1]


def check_workdir(workdir: str, reference: str = '') -> None:
  """Raises ValueError when ``workdir`` (local or in a bucket) holds an
  earlier attempt's run this one would resume: its ``killed`` run, or,
  with no ``reference``, its ``uninterrupted`` one, which may have been
  stopped and resumed itself, so that a resume bug would show on both
  sides and cancel out."""
  from bertjax import storage  # pylint: disable=g-import-not-at-top
  names = ['killed'] + ([] if reference else ['uninterrupted'])
  leftovers = [n for n in names if storage.exists(os.path.join(workdir, n))]
  if leftovers:
    raise ValueError(
        f'{workdir} already holds {" and ".join(leftovers)} from an earlier '
        'attempt, which this one would resume rather than start afresh: '
        'give a new --workdir (or pass a reference run that went to the '
        'end in one go as --reference).')


def train_to_end(config: str, workdir: str, overrides: list[str],
                 log=print) -> None:
  result = subprocess.run(_train_command(config, workdir, overrides),
                          env=_env(), cwd=REPO, capture_output=True,
                          text=True)
  if result.returncode != 0:
    raise RuntimeError(f'training in {workdir} exited with '
                       f'{result.returncode}:\n{result.stderr[-4000:]}')
  log(f'{workdir}: trained to the end.')


def kill_at(config: str, workdir: str, overrides: list[str], after_step: int,
            delay: float, timeout: float = 3600) -> int | None:
  """Starts (or resumes) the run and SIGKILLs it ``delay`` seconds after
  it logged ``after_step``; returns the last step logged before the kill,
  or None when the run ended first."""
  child = subprocess.Popen(_train_command(config, workdir, overrides),
                           env=_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  deadline = time.time() + timeout
  while child.poll() is None and time.time() < deadline:
    steps = _logged_steps(workdir)
    if steps and steps[-1] >= after_step:
      break
    time.sleep(0.002)
  time.sleep(delay)
  if child.poll() is not None:
    return None
  child.send_signal(signal.SIGKILL)
  child.wait()
  steps = _logged_steps(workdir)
  return steps[-1] if steps else 0


def compare(reference: str, workdir: str) -> list[str]:
  """What differs between two finished runs (empty: identical); either
  may be in a bucket."""
  from bertjax import runs  # pylint: disable=g-import-not-at-top
  from bertjax import storage  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  problems = []
  expected = storage.read_bytes(os.path.join(reference, METRICS))
  got = storage.read_bytes(os.path.join(workdir, METRICS))
  if got != expected:
    problems.append(f'{METRICS} differs ({len(got)} bytes against '
                    f'{len(expected)})')
  a, b = runs.load_run(reference), runs.load_run(workdir)
  if a.step != b.step:
    problems.append(f'final checkpoints at steps {a.step} and {b.step}')
  leaves_a = dict(jax.tree_util.tree_leaves_with_path(a.params))
  leaves_b = dict(jax.tree_util.tree_leaves_with_path(b.params))
  for path, value in leaves_a.items():
    other = leaves_b.get(path)
    if other is None or not (
        np.asarray(value).dtype == np.asarray(other).dtype
        and np.array_equal(np.asarray(value), np.asarray(other))):
      problems.append(f'parameter {jax.tree_util.keystr(path)} differs')
  for path in sorted(leaves_b.keys() - leaves_a.keys(),
                     key=jax.tree_util.keystr):
    problems.append(f'parameter {jax.tree_util.keystr(path)} is only in '
                    f'{workdir}')
  return problems


def kill_and_resume(config: str, workdir: str, overrides: list[str],
                    kills: int, seed: int, reference: str = '',
                    max_delay: float = 1.0, log=print) -> list[str]:
  """The whole procedure (see the module docstring); returns the problems
  found (empty: the killed run matches the uninterrupted one)."""
  check_workdir(workdir, reference)
  if not reference:
    reference = os.path.join(workdir, 'uninterrupted')
    train_to_end(config, reference, overrides, log)
  # Kills follow logged steps in the first three quarters of the run, so
  # that the delay after the last one still ends before the run does.
  logged = _logged_steps(reference)
  candidates = [s for s in logged if s <= logged[-1] * 3 // 4]
  if kills > len(candidates):
    raise ValueError(f'--kills={kills}: the run logs only '
                     f'{len(candidates)} steps in its first three quarters; '
                     'kill fewer times or log more often.')
  killed = os.path.join(workdir, 'killed')
  rng = random.Random(seed)
  targets = sorted(rng.sample(candidates, kills))
  problems = []
  for i, target in enumerate(targets):
    delay = rng.uniform(0, max_delay)
    last = kill_at(config, killed, overrides, target, delay)
    if last is None:
      problems.append(f'kill {i + 1} came after the run had ended')
      break
    log(f'kill {i + 1}/{kills}: SIGKILL {delay:.2f}s after step {target} '
        f'was logged (last logged step {last}).')
  train_to_end(config, killed, overrides, log)
  log(f'uninterrupted: {_final_line(reference)}')
  log(f'killed {kills}x:  {_final_line(killed)}')
  return problems + compare(reference, killed)


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  overrides = []
  if '--' in argv:
    overrides = argv[argv.index('--') + 1:]
    argv = argv[:argv.index('--')]
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--config', required=True)
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--kills', type=int, default=5)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--max_delay', type=float, default=1.0,
                      help='Seconds, drawn uniformly, between the logged '
                      'step and the kill.')
  parser.add_argument('--reference', default='',
                      help='A finished run of the same config and '
                      'overrides, instead of training one.')
  args = parser.parse_args(argv)
  if args.kills < 1:
    parser.error('--kills must be >= 1.')
  try:
    check_workdir(args.workdir, args.reference)
  except ValueError as e:
    parser.error(str(e))
  problems = kill_and_resume(args.config, args.workdir, overrides,
                             args.kills, args.seed, args.reference,
                             args.max_delay)
  if problems:
    print('DIFFERENT: ' + '; '.join(problems))
    sys.exit(1)
  print(f'IDENTICAL: after {args.kills} SIGKILLs the run ends with the same '
        f'{METRICS} (byte for byte) and the same parameters (bit for bit) '
        'as the uninterrupted run.')


if __name__ == '__main__':
  main()
