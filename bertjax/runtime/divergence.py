"""Divergence: non-finite steps skipped on the device, loss spikes counted.

Inside the jitted step (``guard``): a step whose loss or gradient norm is
not finite keeps the parameters and optimizer state it started with (the
schedule's count too), and the counters in ``TrainState.health`` say so; a
finite loss above ``spike_factor`` times its running mean is a spike. None
of this waits for the host.

On the host (``Monitor``): the counters are read where the trainer already
fetches the step's results (logged steps, checkpoints), so detection costs
no extra synchronization. Skipped steps and spikes are reported; the run
halts once ``halt_after`` consecutive steps were skipped (``policy='skip'``)
or at the first (``policy='halt'``), at the first check after them (the
device keeps the longest such run, so one that ended between two checks is
seen), naming the last checkpoint, which holds no non-finite value because
no skipped update ever reached the state.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from bertjax import errors


class DivergenceError(errors.UserError, FloatingPointError):
  """Training halted: too many consecutive non-finite steps."""


def init_health() -> dict:
  """The counters (int32 and float32 scalars) of a run that has not begun."""
  i, f = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
  return {'skipped_steps': i, 'consecutive_skipped': i,
          'longest_skipped': i, 'finite_steps': i, 'loss_mean': f,
          'loss_spikes': i, 'last_spike_step': i, 'last_spike_ratio': f}


def guard(health: dict, step: jax.Array, loss: jax.Array,
          grad_norm: jax.Array, new: Any, old: Any, spike_factor: float,
          spike_window: int, restart=False) -> tuple[Any, dict]:
  """``new`` (the updated parameters and optimizer state) if this step is
  finite, else ``old``; and the counters after it.

  ``step`` is the step being taken (its number before the update);
  ``restart`` (a traced bool) starts the running mean afresh at this step,
  where the loss changes what it measures (a staged task's next stage).
  """
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  kept = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  loss = loss.astype(jnp.float32)
  mean, seen = health['loss_mean'], health['finite_steps']
  known = (seen > 0) & jnp.logical_not(restart)   # A mean to compare with.
  ratio = jnp.where(mean > 0, loss / jnp.where(mean > 0, mean, 1.0), 0.0)
  spike = finite & known & (spike_factor > 0) & (ratio > spike_factor)
  decay = 1.0 - 1.0 / spike_window
  new_mean = jnp.where(known, decay * mean + (1 - decay) * loss, loss)
  one = jnp.ones((), jnp.int32)
  consecutive = jnp.where(finite, 0, health['consecutive_skipped'] + 1)
  health = {
      'skipped_steps': health['skipped_steps'] + (~finite) * one,
      'consecutive_skipped': consecutive,
      # The longest run of skipped steps so far: the host, which reads the
      # counters only at logged steps, sees one that ended in between.
      'longest_skipped': jnp.maximum(health['longest_skipped'], consecutive),
      'finite_steps': seen + finite * one,
      'loss_mean': jnp.where(finite, new_mean, mean),
      'loss_spikes': health['loss_spikes'] + spike * one,
      'last_spike_step': jnp.where(spike, step + 1,
                                   health['last_spike_step']),
      'last_spike_ratio': jnp.where(spike, ratio,
                                    health['last_spike_ratio']),
  }
  return kept, health


# The counters written with every logged step's metrics.
LOGGED = ('skipped_steps', 'loss_spikes')


class Monitor:
  """Reports and enforces the policy from counters fetched on the host."""

  def __init__(self, policy: str, halt_after: int, spike_factor: float,
               say: Callable[[str], None], start: dict | None = None):
    """``start``: the counters the run starts from (a resumed run's), so
    only what happens from there is reported."""
    self._halt_after = 1 if policy == 'halt' else halt_after
    self._policy = policy
    self._spike_factor = spike_factor
    self._say = say
    start = start or {}
    self._skipped = int(start.get('skipped_steps', 0))
    self._spikes = int(start.get('loss_spikes', 0))
    # A run resumed under a stricter policy halts on new skips only: under
    # 'halt', any; under 'skip', a run of halt_after that is the longest
    # yet or still going at a logged step. (The device's counter is the
    # longest over the whole run, so a new run no longer than the resumed
    # history's, ended between logged steps, goes unseen.)
    self._longest = int(start.get('longest_skipped', 0))

  def check(self, step: int, health: dict, last_checkpoint: str) -> None:
    """Reports what changed since the last check; raises
    ``DivergenceError`` when the run must halt.

    ``health`` holds host values of ``init_health``'s counters at ``step``.
    """
    skipped, spikes = int(health['skipped_steps']), int(health['loss_spikes'])
    longest = int(health['longest_skipped'])
    consecutive = int(health['consecutive_skipped'])
    new = skipped - self._skipped
    if new > 0:
      self._say(f'warning: {new} step(s) with a '
                f'non-finite loss or gradient up to step {step} were '
                f'skipped (their updates dropped); {skipped} in all.')
    if spikes > self._spikes:
      self._say(f'warning: {spikes - self._spikes} loss spike(s) above '
                f'{self._spike_factor:g}x the running mean up to step '
                f'{step}; the latest at step {int(health["last_spike_step"])}'
                f', {float(health["last_spike_ratio"]):.2f}x.')
    self._skipped, self._spikes = skipped, spikes
    if longest > self._longest and longest >= self._halt_after:
      what = f'{longest} consecutive step(s)'
    elif consecutive >= self._halt_after:
      what = f'the last {consecutive} consecutive step(s)'
    elif self._policy == 'halt' and new > 0:
      what = f'{new} more step(s)'
    else:
      what = ''
    if what:
      raise DivergenceError(
          f'halting at step {step}: the loss or gradients were not finite '
          f'on {what} up to it (divergence.policy'
          f'={self._policy!r}, halt_after={self._halt_after}); their updates'
          f' were skipped. The last good checkpoint is {last_checkpoint}. '
          'Resume from it with a lower optimizer.learning_rate or a larger '
          'optimizer.warmup_steps (a fresh --workdir with init_from=that '
          'workdir), or look for bad batches after it.')
