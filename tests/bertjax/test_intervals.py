"""Intervals over seeds and examples: known answers and coverage."""

import math

import numpy as np
import pytest
from scipy import stats

from bertjax import intervals


def _arms(rng, num_seeds, num_examples, difference, seed_sd):
  """Paired 0/1 correctness of two arms: each example has its own
  difficulty (shared by the arms), each arm and seed its own offset; arm A
  is better by ``difference`` in expectation."""
  difficulty = rng.uniform(0.2, 0.8, num_examples)
  offset_a = rng.normal(0, seed_sd, (num_seeds, 1))
  offset_b = rng.normal(0, seed_sd, (num_seeds, 1))
  a = rng.random((num_seeds, num_examples)) < difficulty + difference + offset_a
  b = rng.random((num_seeds, num_examples)) < difficulty + offset_b
  return a.astype(np.float64), b.astype(np.float64)


def _coverage(num_seeds, seed_sd, truth=0.05, trials=400, **kwargs):
  rng = np.random.default_rng(num_seeds)
  covered = 0
  for _ in range(trials):
    iv = intervals.hierarchical_interval(
        *_arms(rng, num_seeds, 300, truth, seed_sd), **kwargs)
    covered += iv.low <= truth <= iv.high
  return covered / trials


@pytest.mark.parametrize('num_seeds', [2, 3, 10])
def test_paired_interval_covers_the_true_difference(num_seeds):
  # 95% nominal; the binomial sd of a rate over 400 trials is 1.1%. (2
  # seeds: 0.90 without the per-seed t floor.)
  assert 0.92 <= _coverage(num_seeds, seed_sd=0.05) <= 0.98


def test_without_a_seed_effect_few_seeds_are_conservative_not_anticonservative():
  # 3 seeds cannot rule a seed effect out, so the interval allows for one.
  assert _coverage(3, seed_sd=0.0) >= 0.95


def test_one_arm_interval_covers_its_mean():
  rng = np.random.default_rng(7)
  covered = 0
  for _ in range(300):
    a, _ = _arms(rng, 5, 200, 0.0, 0.03)
    iv = intervals.hierarchical_interval(a)
    covered += iv.low <= 0.5 <= iv.high   # difficulty ~ U(0.2, 0.8)
  assert 0.92 <= covered / 300 <= 1.0


def test_known_answers_exactly():
  # A constant difference has no spread at all.
  a = np.ones((3, 50))
  b = np.zeros((3, 50))
  iv = intervals.hierarchical_interval(a, b)
  assert (iv.estimate, iv.low, iv.high) == (1.0, 1.0, 1.0)
  assert iv.excludes_zero and (iv.seeds, iv.examples) == (3, 50)
  # Identical arms: difference 0, interval [0, 0], not a difference.
  rng = np.random.default_rng(1)
  same = (rng.random((4, 80)) < 0.6).astype(float)
  iv = intervals.hierarchical_interval(same, same.copy())
  assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
  assert not iv.excludes_zero


def test_one_seed_is_the_examples_t_interval():
  rng = np.random.default_rng(2)
  scores = rng.normal(0.3, 1.0, (1, 400))
  iv = intervals.hierarchical_interval(scores)
  low, high = stats.t.interval(0.95, 399, loc=scores.mean(),
                               scale=stats.sem(scores[0]))
  np.testing.assert_allclose([iv.low, iv.high], [low, high], rtol=1e-12)
  # It excludes 0, but over one seed's examples: no claim.
  assert iv.excludes_zero and not iv.is_claim
  assert intervals.Interval(0.3, 0.1, 0.5, seeds=2).is_claim
  assert not intervals.Interval(0.3, -0.1, 0.5, seeds=3).is_claim


def test_seed_effect_only_gives_the_seeds_t_interval():
  # Every example of a seed scores the same: only the seeds vary, so the
  # interval is Student's t over the per-seed values.
  per_seed = np.array([0.26, 0.23, 0.04])
  diff = np.repeat(per_seed[:, None], 40, axis=1)
  iv = intervals.hierarchical_interval(diff)
  expected = intervals.seed_interval(per_seed)
  np.testing.assert_allclose([iv.estimate, iv.low, iv.high],
                             [expected.estimate, expected.low, expected.high],
                             rtol=1e-9)


def test_seed_interval_is_students_t():
  values = [0.78, 0.77, 0.76, 0.81]
  iv = intervals.seed_interval(values)
  low, high = stats.t.interval(0.95, 3, loc=np.mean(values),
                               scale=stats.sem(values))
  np.testing.assert_allclose([iv.low, iv.high], [low, high], rtol=1e-12)
  single = intervals.seed_interval([0.5])
  assert single.estimate == 0.5 and np.isnan(single.low)
  with pytest.raises(ValueError, match='1-D'):
    intervals.seed_interval([])


def test_a_metric_callable_agrees_with_the_additive_path():
  # Accuracy through the bootstrap path: same estimate, a close interval.
  rng = np.random.default_rng(3)
  labels = rng.integers(0, 4, 300)
  pred_a = np.where(rng.random((5, 300)) < 0.7, labels, (labels + 1) % 4)
  pred_b = np.where(rng.random((5, 300)) < 0.6, labels, (labels + 1) % 4)

  def accuracy(predictions, lab):
    return (predictions == lab).mean(axis=-1)

  fast = intervals.hierarchical_interval((pred_a == labels).astype(float),
                                         (pred_b == labels).astype(float))
  slow = intervals.hierarchical_interval(pred_a, pred_b, labels=labels,
                                         metric=accuracy, num_resamples=3000)
  assert slow.estimate == pytest.approx(fast.estimate, abs=1e-12)
  # The bootstrap counts the seed-by-example interaction twice: a little
  # wider, never narrower by more than resampling noise.
  width = lambda iv: iv.high - iv.low
  assert 0.95 * width(fast) <= width(slow) <= 1.3 * width(fast)


def test_seeds_predicting_opposite_constants_get_a_finite_interval():
  """Two seeds, each predicting one class of a balanced binary task: every
  example is right under one seed and wrong under the other. No seed or
  example effect shows, only their interaction; the unbiased estimate
  would be 0 (a zero-width interval) or a sliver with no degrees of
  freedom (an enormous one)."""
  right = np.tile([1.0, 0.0], 100)
  a = np.stack([right, 1 - right])
  iv = intervals.hierarchical_interval(a)
  assert iv.estimate == 0.5
  # The residuals are all +-0.5: 400 of them over (2-1)(200-1) dof.
  half = stats.t.ppf(0.975, 199) * math.sqrt(400 * 0.25 / 199 / 400)
  np.testing.assert_allclose([iv.low, iv.high], [0.5 - half, 0.5 + half],
                             rtol=1e-9)
  # Against an arm that is always right: a finite interval, excluding 0.
  diff = intervals.hierarchical_interval(a, np.ones_like(a))
  assert diff.estimate == -0.5 and diff.excludes_zero
  assert -0.6 < diff.low < diff.high < -0.4


def test_bad_shapes_are_errors():
  with pytest.raises(ValueError, match='seeds, examples'):
    intervals.hierarchical_interval(np.zeros(5))
  with pytest.raises(ValueError, match='same'):
    intervals.hierarchical_interval(np.zeros((2, 5)), np.zeros((3, 5)))
  with pytest.raises(ValueError, match='labels'):
    intervals.hierarchical_interval(np.zeros((2, 5)), labels=np.zeros(4),
                                    metric=lambda p, l: p.mean(-1))
