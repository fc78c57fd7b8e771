"""Preemption: a SIGTERM becomes a checkpoint at the next step boundary.

Preemptible TPUs and shared GPU clusters announce the end of a job with
SIGTERM (a TPU VM's maintenance event or spot preemption; SLURM's
preemption and ``--signal``; Kubernetes' pod deletion) and kill it a grace
period later. The trainer watches from before it builds its input and
compiles, and asks ``PreemptionWatch.reached(step)`` before the first step
(a notice during start-up: it exits at once, with nothing new to save) and
after every step; once it answers True, the trainer saves a checkpoint of
that step, waits for it to be written, and exits with ``EXIT_PREEMPTED``,
which the launchers in ``experiments/launch/`` read as "relaunch me": the
relaunched job resumes from that checkpoint.

One process on its own: a Python handler records the signal, and the
answer is local. Under ``jax.distributed`` (one process or several): a
notice reaches one host first, and the hosts must agree on one step to
save at, or the checkpoint would mix steps. JAX's preemption service
(started by ``jax.distributed.initialize``; it catches SIGTERM itself, a
one-worker slice's too) propagates the notice and picks the step:
``multihost_utils.reached_preemption_sync_point`` answers True on every
host at the same step, without a collective on the steps before the
notice.
"""

from __future__ import annotations

import signal
import threading

from jax.experimental import multihost_utils

# The exit status of a run that stopped for a preemption notice, after its
# checkpoint was written: EX_TEMPFAIL of sysexits.h, "try again later".
# experiments/launch/ relaunches on it; any other non-zero status is a
# failure that a relaunch would only repeat.
EXIT_PREEMPTED = 75


class Preempted(Exception):
  """Training stopped at ``step`` for a preemption notice; the checkpoint
  of that step is written (``saved``), or the notice came before the first
  step, with nothing new to save."""

  def __init__(self, step: int, workdir: str, saved: bool = True):
    super().__init__(
        f'preempted: saved the checkpoint at step {step} in {workdir}; '
        'rerun the same command to resume from it.' if saved else
        f'preempted before step {step + 1} in {workdir}, with nothing new '
        'to save; rerun the same command to resume.')
    self.step = step


def _uses_jax_service() -> bool:
  """Whether JAX's preemption service watches this job: started by
  ``jax.distributed.initialize``, also for one process (a one-worker
  slice), where its own SIGTERM handler takes the notice."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.preemption_sync_manager is not None


class PreemptionWatch:
  """Whether a preemption notice has arrived, asked once per step.

  Use as a context manager: the SIGTERM handler (one process) is installed
  on entry and the previous one restored on exit. Outside the main thread
  no handler can be installed; the watch then never fires (Python's
  restriction: signal handlers belong to the main thread).
  """

  def __init__(self):
    self._notice = threading.Event()
    self._previous = None
    self._service = False

  def __enter__(self) -> 'PreemptionWatch':
    self._service = _uses_jax_service()
    if (not self._service
        and threading.current_thread() is threading.main_thread()):
      self._previous = signal.signal(signal.SIGTERM, self._on_signal)
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _on_signal(self, signum, frame) -> None:  # pylint: disable=unused-argument
    # Only records it: the step in flight finishes, then the trainer saves.
    self._notice.set()

  def reached(self, step: int) -> bool:
    """True at the step where every process should save and stop.

    Every process must call it after every step, with the same steps.
    """
    if self._service:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._notice.is_set()
