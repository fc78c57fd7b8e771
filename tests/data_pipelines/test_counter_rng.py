"""Tests for data_pipelines.counter_rng: counter-based uniform and randint."""

import numpy as np
import pytest

from data_pipelines import counter_rng
from data_pipelines.counter_rng import Stream

N = 100_000


def test_hash_is_deterministic():
  a = counter_rng.hash_counters(7, Stream.SHUFFLE, np.arange(1000))
  b = counter_rng.hash_counters(7, Stream.SHUFFLE, np.arange(1000))
  assert a.dtype == np.uint64
  np.testing.assert_array_equal(a, b)


def test_hash_values_are_pinned():
  # The draws are part of the data's identity (a resumed or re-run job must
  # see the same bytes): these values must never change between versions.
  np.testing.assert_array_equal(
      counter_rng.hash_counters(7, 4, np.array([0, 1, -1, 2**62])),
      np.array([13494259471877308273, 4178312700945848947,
                1480103194892660867, 2594603825241817568], np.uint64))
  np.testing.assert_array_equal(
      counter_rng.uniform(123, 3, 5, np.array([0, 1])),
      [0.6861126043175862, 0.8455202587821411])


def test_scalar_and_array_counters_hash_alike():
  # Scalars take a Python-int path, arrays a numpy one; they must agree,
  # whatever the integer dtype or the position of the array.
  idx = np.arange(-3, 3)
  for dtype in (np.int8, np.int32, np.int64, np.uint64):
    arr = idx.astype(dtype)
    by_array = counter_rng.hash_counters(arr, 9, arr[::-1])
    by_scalar = [counter_rng.hash_counters(int(a), 9, int(b))
                 for a, b in zip(arr, arr[::-1])]
    np.testing.assert_array_equal(by_array, np.array(by_scalar, np.uint64))


def test_uniform_same_counters_same_values():
  a = counter_rng.uniform(3, Stream.MASK_SELECT, 5, np.arange(N))
  b = counter_rng.uniform(3, Stream.MASK_SELECT, 5, np.arange(N))
  np.testing.assert_array_equal(a, b)


def test_scalar_counters_give_a_scalar():
  u = counter_rng.uniform(1, 2, 3)
  assert u.shape == ()
  assert u.dtype == np.float64


def test_counters_broadcast():
  rows = np.arange(4)[:, None]
  cols = np.arange(6)[None, :]
  u = counter_rng.uniform(0, Stream.MASK_SELECT, rows, cols)
  assert u.shape == (4, 6)
  # Each element equals the draw for its own scalar counters.
  for i in range(4):
    for j in range(6):
      assert u[i, j] == counter_rng.uniform(0, Stream.MASK_SELECT, i, j)


def test_num_adds_a_trailing_axis():
  u = counter_rng.uniform(0, 1, np.arange(5), num=3)
  assert u.shape == (5, 3)
  # The k-th draw of ``num`` equals the draw with k as a last counter.
  np.testing.assert_array_equal(
      u, counter_rng.uniform(0, 1, np.arange(5)[:, None],
                             np.arange(3)[None, :]))
  assert counter_rng.uniform(0, 1, 2, num=4).shape == (4,)
  r = counter_rng.randint(0, 10, np.arange(2)[:, None], np.arange(7), num=3)
  assert r.shape == (2, 7, 3)


def test_distinct_counters_differ():
  u = counter_rng.uniform(0, Stream.SHUFFLE, np.arange(N))
  # 53-bit floats: a collision among 100k draws is essentially impossible.
  assert len(np.unique(u)) == N


def test_distinct_streams_and_seeds_differ():
  idx = np.arange(10_000)
  by_stream = [counter_rng.uniform(0, s, idx) for s in Stream]
  by_seed = [counter_rng.uniform(seed, Stream.SHUFFLE, idx)
             for seed in range(5)]
  for draws in (by_stream, by_seed):
    for i in range(len(draws)):
      for j in range(i + 1, len(draws)):
        assert np.mean(draws[i] == draws[j]) == 0
        # Not merely different: uncorrelated.
        assert abs(np.corrcoef(draws[i], draws[j])[0, 1]) < 0.05


def test_counter_order_matters():
  a = counter_rng.uniform(1, 2, np.arange(1000))
  b = counter_rng.uniform(2, 1, np.arange(1000))
  assert not np.any(a == b)


def test_negative_and_large_counters():
  u = counter_rng.uniform(-1, 2**62, np.array([-5, 0, 5]))
  assert u.shape == (3,)
  assert np.all((u >= 0) & (u < 1))


def test_uniform_moments():
  u = counter_rng.uniform(123, Stream.CHUNK_PLAN, np.arange(N))
  assert np.all((u >= 0) & (u < 1))
  # Std of the mean is 0.29 / sqrt(1e5) = 9e-4; bounds are > 10 sigma.
  assert abs(u.mean() - 0.5) < 0.01
  assert abs(u.var() - 1 / 12) < 0.005
  # Each tenth of [0, 1) holds about N / 10 draws.
  counts = np.histogram(u, bins=10, range=(0, 1))[0]
  assert np.all(np.abs(counts - N / 10) < 0.05 * N / 10)


def test_consecutive_counters_uncorrelated():
  u = counter_rng.uniform(0, Stream.PAIRING, np.arange(N))
  assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02


def test_randint_bounds():
  r = counter_rng.randint(3, 8, 0, Stream.PAIRING, np.arange(N))
  assert r.dtype == np.int64
  assert r.min() == 3  # low is inclusive,
  assert r.max() == 7  # high exclusive.
  counts = np.bincount(r - 3, minlength=5)
  assert np.all(np.abs(counts - N / 5) < 0.05 * N / 5)


def test_randint_single_value_range():
  r = counter_rng.randint(4, 5, 0, 1, np.arange(1000))
  np.testing.assert_array_equal(r, 4)


def test_randint_array_bounds_broadcast():
  low = np.array([0, 10, 100])
  high = np.array([2, 13, 1000])
  r = counter_rng.randint(low[:, None], high[:, None], 0, 1,
                          np.arange(5000)[None, :])
  assert r.shape == (3, 5000)
  for i in range(3):
    assert r[i].min() == low[i]
    assert r[i].max() == high[i] - 1


@pytest.mark.parametrize('high', [2, 3, 7, 1000])
def test_randint_never_reaches_high(high):
  r = counter_rng.randint(0, high, 9, 9, np.arange(20_000))
  assert np.all((r >= 0) & (r < high))
