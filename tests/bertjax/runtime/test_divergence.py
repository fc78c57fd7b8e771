"""The divergence guard inside the step, and the host's policy."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.runtime import divergence
from bertjax.runtime import preemption

_NAN = float('nan')


def _guard(health, step, loss, grad_norm=1.0, factor=3.0, window=4):
  new, old = {'w': jnp.full(3, 2.0)}, {'w': jnp.full(3, 1.0)}
  return jax.jit(divergence.guard, static_argnums=(6, 7))(
      health, jnp.int32(step), jnp.float32(loss), jnp.float32(grad_norm),
      new, old, factor, window)


def test_a_finite_step_takes_the_update_and_starts_the_mean():
  kept, health = _guard(divergence.init_health(), 0, 2.0)
  np.testing.assert_array_equal(kept['w'], [2.0, 2.0, 2.0])
  assert int(health['skipped_steps']) == 0
  assert int(health['finite_steps']) == 1
  assert float(health['loss_mean']) == 2.0


@pytest.mark.parametrize('loss, grad_norm', [
    (_NAN, 1.0), (float('inf'), 1.0), (1.0, _NAN), (1.0, float('inf'))])
def test_a_non_finite_step_keeps_the_old_state_and_counts(loss, grad_norm):
  _, health = _guard(divergence.init_health(), 0, 2.0)
  kept, health = _guard(health, 1, loss, grad_norm)
  np.testing.assert_array_equal(kept['w'], [1.0, 1.0, 1.0])
  assert int(health['skipped_steps']) == 1
  assert int(health['consecutive_skipped']) == 1
  assert float(health['loss_mean']) == 2.0      # Untouched by the NaN.
  kept, health = _guard(health, 2, _NAN)
  assert int(health['consecutive_skipped']) == 2
  kept, health = _guard(health, 3, 2.0)
  assert int(health['consecutive_skipped']) == 0   # A finite step resets.
  assert int(health['skipped_steps']) == 2


def test_spikes_are_losses_above_factor_times_the_running_mean():
  health = divergence.init_health()
  for step in range(4):
    _, health = _guard(health, step, 1.0)
  _, health = _guard(health, 4, 2.9)              # Below 3x: no spike.
  assert int(health['loss_spikes']) == 0
  mean = float(health['loss_mean'])
  assert mean == pytest.approx(0.75 * 1.0 + 0.25 * 2.9, rel=1e-6)
  _, health = _guard(health, 5, 3.5 * mean)
  assert int(health['loss_spikes']) == 1
  assert int(health['last_spike_step']) == 6      # The step taken: 5 + 1.
  assert float(health['last_spike_ratio']) == pytest.approx(3.5, rel=1e-5)
  _, off = _guard(health, 6, 100 * mean, factor=0.0)
  assert int(off['loss_spikes']) == 1             # spike_factor=0: off.


def test_a_new_stage_restarts_the_mean_instead_of_spiking():
  health = divergence.init_health()
  for step in range(4):
    _, health = _guard(health, step, 0.5)
  restart = jax.jit(divergence.guard, static_argnums=(6, 7))(
      health, jnp.int32(4), jnp.float32(6.0), jnp.float32(1.0),
      {'w': jnp.ones(1)}, {'w': jnp.zeros(1)}, 3.0, 4, jnp.bool_(True))[1]
  assert int(restart['loss_spikes']) == 0         # 12x, but a new loss.
  assert float(restart['loss_mean']) == 6.0       # The new stage's own.
  _, spiked = _guard(health, 4, 6.0)              # Without: a spike.
  assert int(spiked['loss_spikes']) == 1


def _host(**counts):
  health = {k: 0 for k in divergence.init_health()}
  health.update(counts)
  return health


def test_monitor_reports_changes_and_halts_per_policy():
  said = []
  monitor = divergence.Monitor('skip', 3, 3.0, said.append,
                               start=_host(skipped_steps=1))
  monitor.check(10, _host(skipped_steps=1), 'step 8')
  assert not said                                 # Nothing new since start.
  monitor.check(20, _host(skipped_steps=3, consecutive_skipped=2,
                          loss_spikes=1, last_spike_step=17,
                          last_spike_ratio=4.5), 'step 16')
  assert '2 step(s) with a non-finite loss' in said[0]
  assert '3 in all' in said[0]
  assert 'at step 17, 4.50x' in said[1]
  with pytest.raises(divergence.DivergenceError,
                     match='on 3 consecutive.*checkpoint is step 16 in x'):
    monitor.check(21, _host(skipped_steps=4, consecutive_skipped=3,
                            longest_skipped=3), 'step 16 in x')
  halt = divergence.Monitor('halt', 10, 3.0, said.append)
  with pytest.raises(divergence.DivergenceError, match="policy='halt'"):
    halt.check(5, _host(skipped_steps=1, consecutive_skipped=1,
                        longest_skipped=1), 'none')
  # Resumed under 'halt' after a run of 2 that 'skip' let pass: only a
  # new run halts it.
  resumed = divergence.Monitor('halt', 10, 3.0, said.append,
                               start=_host(skipped_steps=2, longest_skipped=2))
  resumed.check(30, _host(skipped_steps=2, longest_skipped=2), 'step 24')
  with pytest.raises(divergence.DivergenceError, match='on 3 consecutive'):
    resumed.check(40, _host(skipped_steps=5, longest_skipped=3), 'step 32')
  # ... and so does a single new skipped step, shorter than that run.
  resumed = divergence.Monitor('halt', 10, 3.0, said.append,
                               start=_host(skipped_steps=2, longest_skipped=2))
  with pytest.raises(divergence.DivergenceError, match='on 1 more step'):
    resumed.check(30, _host(skipped_steps=3, longest_skipped=2), 'step 24')
  # Resumed with halt_after lowered below the history's run of 5: a run of
  # 3 still going at a logged step halts it.
  resumed = divergence.Monitor('skip', 3, 3.0, said.append,
                               start=_host(skipped_steps=5, longest_skipped=5))
  resumed.check(30, _host(skipped_steps=7, consecutive_skipped=2,
                          longest_skipped=5), 'step 24')
  with pytest.raises(divergence.DivergenceError,
                     match='on the last 3 consecutive'):
    resumed.check(31, _host(skipped_steps=8, consecutive_skipped=3,
                            longest_skipped=5), 'step 24')


def test_a_run_of_skipped_steps_between_two_checks_halts_the_run():
  """The host reads the counters at logged steps only: a NaN at step 6
  of 8 (a finite step 7 resets the current run) still halts the run at
  step 8 under policy='halt', as 2 NaNs in a row do under halt_after=2."""
  for policy, halt_after, losses in (('halt', 10, [1, 1, 1, 1, 1, 1, _NAN, 1]),
                                     ('skip', 2, [1, 1, _NAN, _NAN, 1, 1])):
    health = divergence.init_health()
    for step, loss in enumerate(losses):
      _, health = _guard(health, step, loss)
    assert int(health['consecutive_skipped']) == 0
    monitor = divergence.Monitor(policy, halt_after, 3.0, lambda _: None)
    with pytest.raises(divergence.DivergenceError, match='consecutive'):
      monitor.check(len(losses), jax.device_get(health), 'step 4')


def test_sigterm_is_noticed_at_the_next_check_and_the_handler_restored():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.PreemptionWatch() as watch:
    assert not watch.reached(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert watch.reached(2)
  assert signal.getsignal(signal.SIGTERM) is before


def test_the_checks_before_writing_run_under_the_preemption_watch(
    monkeypatch):
  """A notice during the first checks (they may read a bucket) is seen,
  so the run ends with the relaunch status, not SIGTERM's default."""
  from bertjax import train  # pylint: disable=g-import-not-at-top
  seen = []

  def checks(cfg, workdir):
    del cfg, workdir
    seen.append(signal.getsignal(signal.SIGTERM))
    raise RuntimeError('stop here')

  monkeypatch.setattr(train, 'check_before_writing', checks)
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(RuntimeError, match='stop here'):
    train.train_and_evaluate(None, 'unused')
  assert isinstance(getattr(seen[0], '__self__', None),
                    preemption.PreemptionWatch)
  assert signal.getsignal(signal.SIGTERM) == before
