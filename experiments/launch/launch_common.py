"""What the TPU pod and SLURM launchers share: the trainer flags they own,
the check of pass-through flags, the split at ``--``, and the exit status
that asks for a relaunch."""

from __future__ import annotations

import argparse
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# Trainer flags the launchers set themselves (or leave to SLURM and JAX).
OWNED_FLAGS = ('config', 'workdir', 'multihost', 'coordinator_address',
               'num_processes', 'process_id')
# bertjax.runtime.preemption.EXIT_PREEMPTED: the trainer stopped for a preemption
# notice after writing a checkpoint, so rerunning it resumes. A copy, not an
# import: that module imports jax, which a login node or laptop running the
# launcher may lack (tests/experiments/test_launch.py checks they agree).
EXIT_PREEMPTED = 75


class LaunchError(ValueError):
  """A bad argument or a failed command; the message says which and why."""


def check_overrides(overrides: list[str], who_sets: str = 'the launcher'
                    ) -> None:
  """Pass-through arguments are trainer flags the launcher does not own."""
  for arg in overrides:
    if not arg.startswith('--'):
      raise LaunchError(f'{arg!r} after "--": pass trainer flags, e.g. '
                        '--config.batch_size=512 (FIELD=VALUE in one '
                        'argument).')
    name = arg[2:].partition('=')[0]
    if name in OWNED_FLAGS:
      raise LaunchError(f'{arg!r} after "--": {who_sets} sets --{name}; '
                        'use its own option.')


def split_argv(argv: list[str], doc: str
               ) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
  """A parser described by ``doc``'s first line; the launcher's own
  arguments; the trainer's (those after ``--``)."""
  split = argv.index('--') if '--' in argv else len(argv)
  parser = argparse.ArgumentParser(
      description=doc.split('\n')[0],
      epilog='Arguments after "--" go to bertjax.train (--config.FIELD='
      'VALUE).')
  return parser, argv[:split], argv[split + 1:]
