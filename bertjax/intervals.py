"""95% intervals for comparisons over seeds and held-out examples.

A comparison of two arms (an objective and the random-init control, or two
objectives) has two sources of noise: the seeds (pretraining and fine-tuning
draws) and the held-out examples (a finite sample of the task). Both are
resampled here, paired: arm A and arm B at seed s share the seed, and both
are scored on the same examples, so a resample draws seeds and examples once
and applies them to both arms.

``hierarchical_interval`` adds the two sources of variance of the mean
(difference), since seeds and examples are crossed (every seed is scored on
every example), not nested:

- seeds: the spread of the per-seed values over the seeds,
  ``var(v_s) / S`` (unbiased, ``ddof=1``);
- examples: for a metric that is a mean over examples (accuracy), from
  the two-way random-effects model's mean squares (``_additive_interval``);
  for other metrics (F1, correlations), a paired bootstrap over the
  held-out examples (the same resample for every seed and both arms) of
  the seed-mean, which counts the seed-by-example interaction twice and
  so errs wide, as Owen (2007)'s pigeonhole bootstrap for crossed designs;

and returns ``estimate +- q * sqrt(seeds_var + examples_var)`` with q the
Student t quantile at the Welch-Satterthwaite degrees of freedom
(``S - 1`` when the seed spread dominates, about ``N - 1`` when the
examples' does), never narrower than the t interval of the per-seed
values alone (``_at_least_seeds_t``: with 2 seeds, a seed spread that is
small by chance would otherwise give far too narrow an interval). Why not
one joint
percentile bootstrap over seeds and examples: with 3 seeds a seed resample
has 10 distinct outcomes and its percentile interval covers far less than
95%; the coverage of this one is tested on synthetic data with a known
difference in ``tests/bertjax/test_intervals.py``.

``seed_interval`` is Student's t interval over per-seed values, for
metrics without per-example scores (pretraining losses, F1 of a whole set).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate with its interval; ``seeds`` and ``examples`` are the
  sample sizes it rests on (``examples`` 0: over seeds only)."""
  estimate: float
  low: float
  high: float
  seeds: int
  examples: int = 0

  @property
  def excludes_zero(self) -> bool:
    """Whether the interval lies entirely above or below 0 (a difference
    whose interval holds 0 is no difference)."""
    return bool(self.low > 0 or self.high < 0)

  @property
  def is_claim(self) -> bool:
    """Whether a difference with this interval is reported as one: it
    excludes 0 over two or more seeds. Over one seed's held-out examples an
    interval leaves out the seed spread, so it claims nothing."""
    return self.excludes_zero and self.seeds >= 2

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def _quantile(degrees_of_freedom: float, confidence: float) -> float:
  return float(stats.t.ppf((1 + confidence) / 2, df=degrees_of_freedom))


def seed_interval(values, confidence: float = CONFIDENCE) -> Interval:
  """Student's t interval of the mean of per-seed ``values`` (NaN bounds
  for a single value: one seed says nothing about the seed spread)."""
  values = np.asarray(values, np.float64)
  if values.ndim != 1 or not values.size:
    raise ValueError(f'seed_interval takes a non-empty 1-D list of per-seed '
                     f'values, got shape {values.shape}.')
  mean = float(values.mean())
  if values.size < 2:
    return Interval(mean, math.nan, math.nan, 1)
  half = _quantile(values.size - 1, confidence) * float(
      values.std(ddof=1)) / math.sqrt(values.size)
  return Interval(mean, mean - half, mean + half, int(values.size))


def hierarchical_interval(
    scores_a, scores_b=None, *, labels=None,
    metric: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    num_resamples: int = 2000, seed: int = 0,
    confidence: float = CONFIDENCE) -> Interval:
  """The mean of arm A (minus arm B's, paired) with a 95% interval over
  seeds and held-out examples.

  Args:
    scores_a: [seeds, examples]. Without ``metric``: per-example scores
      whose mean is the metric (1.0/0.0 correctness for accuracy). With
      ``metric``: per-example predictions.
    scores_b: the paired arm, same shape (row s: the same seed as A's row
      s), or None for A alone.
    labels: [examples], for ``metric``.
    metric: ``(predictions [seeds, n], labels [n]) -> [seeds]`` for a metric
      that is not a mean over examples (F1, a correlation); slower, since
      each example resample recomputes it.
    num_resamples: bootstrap resamples of the examples.
    seed: the resampling's own seed (the interval is a function of it).
    confidence: 0.95 for a 95% interval.

  Returns:
    The interval; ``estimate`` is the observed mean (difference) over the
    seeds of the metric on every held-out example.
  """
  a = np.asarray(scores_a)
  b = None if scores_b is None else np.asarray(scores_b)
  if a.ndim != 2 or not a.size:
    raise ValueError(f'scores must be [seeds, examples], got {a.shape}.')
  if b is not None and b.shape != a.shape:
    raise ValueError(f'paired arms need the same [seeds, examples] shape: '
                     f'{a.shape} vs {b.shape}.')
  num_seeds, num_examples = a.shape
  if num_examples < 2:
    raise ValueError('an interval over examples needs at least 2 examples.')
  if metric is None:
    diff = a.astype(np.float64) - (0.0 if b is None else b)
    return _at_least_seeds_t(_additive_interval(diff, confidence),
                             diff.mean(axis=1), confidence)
  labels = np.asarray(labels)
  if labels.shape != (num_examples,):
    raise ValueError(f'labels must be [{num_examples}], got {labels.shape}.')

  def value(rows_a, rows_b, lab) -> np.ndarray:
    out = np.asarray(metric(rows_a, lab), np.float64)
    if rows_b is not None:
      out = out - np.asarray(metric(rows_b, lab), np.float64)
    return out

  per_seed = value(a, b, labels)
  rng = np.random.default_rng(seed)
  resampled = np.empty(num_resamples)
  for r in range(num_resamples):
    ex = rng.integers(0, num_examples, num_examples)
    resampled[r] = value(a[:, ex], None if b is None else b[:, ex],
                         labels[ex]).mean()
  seeds_var = (float(per_seed.var(ddof=1)) / num_seeds if num_seeds > 1
               else 0.0)
  return _at_least_seeds_t(
      _interval(float(per_seed.mean()), confidence, num_seeds, num_examples,
                ((seeds_var, num_seeds - 1),
                 (float(resampled.var(ddof=1)), num_examples - 1))),
      per_seed, confidence)


def _at_least_seeds_t(crossed: Interval, per_seed: np.ndarray,
                      confidence: float) -> Interval:
  """``crossed``, widened where needed to the t interval of the per-seed
  values themselves (S - 1 degrees of freedom).

  Welch-Satterthwaite's degrees of freedom trust each variance term's
  estimate: with 2 seeds the seeds' term rests on 1 degree of freedom, and
  when it comes out small by chance the sum's degrees of freedom are the
  examples' and the interval is far too narrow (coverage 0.90 at 2 seeds
  with seed spreads like compare.py's, in 2,000 simulated comparisons;
  0.96 with this floor). With 3 or more seeds the floor moves the width by
  a few percent at most (tests/bertjax/test_intervals.py)."""
  if len(per_seed) < 2:
    return crossed
  own = seed_interval(per_seed, confidence)
  if own.high - own.low <= crossed.high - crossed.low:
    return crossed
  return dataclasses.replace(crossed, low=crossed.estimate - (
      own.high - own.low) / 2, high=crossed.estimate + (own.high - own.low) / 2)


def _additive_interval(diff: np.ndarray, confidence: float) -> Interval:
  """The crossed two-way random-effects model of d[s, n] = mu + seed_s +
  example_n + residual_sn: the grand mean's variance is
  var_seed / S + var_example / N + var_residual / (S N), estimated
  unbiasedly from the mean squares as
  MS_seeds / (S N) + MS_examples / (S N) - MS_residual / (S N).

  The variance is at least its last term, var_residual / (S N), estimated
  by MS_residual / (S N): the unbiased estimate is floored there. Where the
  data show no seed or example effect beyond the interaction (seeds that
  each predict one constant class: every example right under one seed and
  wrong under another) the subtraction would otherwise leave 0 or a sliver,
  a zero-width interval or, through Welch-Satterthwaite's degrees of
  freedom of a near-cancelling sum, an enormous one. The degrees of
  freedom are Welch-Satterthwaite's over the positive terms (the seeds'
  and the examples'), the residual's where both are 0."""
  num_seeds, num_examples = diff.shape
  grand = float(diff.mean())
  rows, cols = diff.mean(axis=1), diff.mean(axis=0)
  cols_var = float(cols.var(ddof=1)) / num_examples
  if num_seeds == 1:
    return _interval(grand, confidence, 1, num_examples,
                     ((cols_var, num_examples - 1),))
  rows_var = float(rows.var(ddof=1)) / num_seeds
  residual = diff - rows[:, None] - cols[None, :] + grand
  residual_dof = (num_seeds - 1) * (num_examples - 1)
  residual_var = float(np.sum(residual ** 2)) / residual_dof / (
      num_seeds * num_examples)
  total = max(rows_var + cols_var - residual_var, residual_var)
  positive = [(v, d) for v, d in ((rows_var, num_seeds - 1),
                                  (cols_var, num_examples - 1)) if v > 0]
  dof = (total ** 2 / sum(v ** 2 / d for v, d in positive) if positive
         else residual_dof)
  return _t_interval(grand, total, dof, confidence, num_seeds, num_examples)


def _interval(estimate: float, confidence: float, num_seeds: int,
              num_examples: int, components) -> Interval:
  """``estimate +- t * sqrt(sum of components)``; ``components`` are
  (variance term, its degrees of freedom), a term negative where it is
  subtracted. Degrees of freedom by Welch-Satterthwaite."""
  # An unbiased estimate can fall below 0 by chance: read that as 0.
  total = max(sum(v for v, _ in components), 0.0)
  if total == 0.0:
    return Interval(estimate, estimate, estimate, num_seeds, num_examples)
  dof = total ** 2 / sum(v ** 2 / d for v, d in components if d > 0)
  return _t_interval(estimate, total, dof, confidence, num_seeds,
                     num_examples)


def _t_interval(estimate: float, variance: float, dof: float,
                confidence: float, num_seeds: int, num_examples: int
                ) -> Interval:
  """``estimate +- t(dof) * sqrt(variance)`` (a point where it is 0)."""
  if variance == 0.0:
    return Interval(estimate, estimate, estimate, num_seeds, num_examples)
  half = _quantile(dof, confidence) * math.sqrt(variance)
  return Interval(estimate, estimate - half, estimate + half, num_seeds,
                  num_examples)
