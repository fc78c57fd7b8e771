"""Counter-based random numbers for the input pipeline.

Every random choice in the pipeline is a pure function of integer counters,
typically ``(seed, stream, epoch, example_index, ...)``, so the same config
produces the same bytes on any number of hosts and workers, and a resumed run
sees the draws the uninterrupted run would have seen. Draws are vectorized:
counters may be numpy arrays and broadcast against each other, which lets the
masking code draw for a whole batch at once.

The mixing function is SplitMix64's finalizer (Steele et al., 2014), applied
once per counter; it passes BigCrush as a generator and is cheap in numpy.
"""

from __future__ import annotations

import enum

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


class Stream(enum.IntEnum):
  """Independent streams, so that two uses of one seed never correlate."""
  EVAL_SPLIT = 1
  DOCUMENT_PLAN = 2
  CHUNK_PLAN = 3
  SHUFFLE = 4
  PAIRING = 5
  TRUNCATION = 6
  MASK_SELECT = 7
  MASK_CORRUPT = 8
  MASK_REPLACE = 9
  MASK_UNIT_LENGTH = 10
  MASK_UNIT_START = 11
  MASK_LEVEL = 12
  MIXTURE = 13


def _mix(x: np.ndarray) -> np.ndarray:
  x = (x ^ (x >> np.uint64(30))) * _M1
  x = (x ^ (x >> np.uint64(27))) * _M2
  return x ^ (x >> np.uint64(31))


def hash_counters(*counters) -> np.ndarray:
  """Mixes integer counters (scalars or broadcastable arrays) into uint64."""
  with np.errstate(over='ignore'):
    h = np.uint64(0x243F6A8885A308D3)
    for c in counters:
      c = np.asarray(c).astype(np.int64).astype(np.uint64)
      h = _mix(h + _GOLDEN + _mix(c + _GOLDEN))
    return np.asarray(h)


def uniform(*counters, num: int | None = None) -> np.ndarray:
  """Uniform floats in [0, 1) determined by the counters.

  Args:
    *counters: integers or integer arrays, broadcast together to shape S.
    num: if given, ``num`` independent draws per counter tuple are returned in
      a trailing axis, shape ``S + (num,)``; otherwise shape ``S``.

  Returns:
    float64 array.
  """
  if num is not None:
    counters = [np.asarray(c)[..., None] for c in counters]
    counters.append(np.arange(num, dtype=np.int64))
  bits = hash_counters(*counters)
  return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def randint(low, high, *counters, num: int | None = None) -> np.ndarray:
  """Integers uniform in [low, high) (``high`` exclusive), like numpy."""
  u = uniform(*counters, num=num)
  low = np.asarray(low)
  span = np.asarray(high) - low
  return low + np.minimum((u * span).astype(np.int64), span - 1)
