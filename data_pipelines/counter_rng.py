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

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_SEED = 0x243F6A8885A308D3
_MASK64 = (1 << 64) - 1
_U64 = {k: np.uint64(k) for k in (11, 27, 30, 31, _GOLDEN, _M1, _M2)}


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
  TOKENIZER_SAMPLE = 14
  # Self-supervised tasks beyond masking (data_pipelines/tasks/).
  TOKEN_DELETION = 15
  TOKEN_INSERTION = 16
  TOKEN_REPLACEMENT = 17
  TOKEN_SHUFFLE = 18
  SENTENCE_PERMUTATION = 19
  DOCUMENT_ROTATION = 20
  SENTENCE_REORDERING = 21
  SENTENCE_DISTANCE = 22
  DISCOURSE = 23
  CONTINUAL = 24


def _mix_int(x: int) -> int:
  """SplitMix64's finalizer on a Python int in [0, 2**64)."""
  x = ((x ^ (x >> 30)) * _M1) & _MASK64
  x = ((x ^ (x >> 27)) * _M2) & _MASK64
  return x ^ (x >> 31)


def _mix_(x: np.ndarray) -> np.ndarray:
  """``_mix_int`` elementwise on a uint64 array, in place (it is returned)."""
  shifted = x >> _U64[30]
  x ^= shifted
  x *= _U64[_M1]
  np.right_shift(x, _U64[27], out=shifted)
  x ^= shifted
  x *= _U64[_M2]
  np.right_shift(x, _U64[31], out=shifted)
  x ^= shifted
  return x


def hash_counters(*counters) -> np.ndarray:
  """Mixes integer counters (scalars or broadcastable arrays) into uint64.

  ``h = mix(h + GOLDEN + mix(c + GOLDEN))`` for each counter ``c`` in turn
  (as its 64-bit two's complement), from a fixed ``h``. Scalar counters are
  mixed as Python ints and arrays in place: the pipeline draws a few
  thousand numbers at a time, where numpy's per-operation cost dominates.
  """
  h = _SEED   # A Python int until the first array counter.
  for c in counters:
    c = np.asarray(c)
    if c.ndim == 0:
      c = int(c.astype(np.int64)) & _MASK64
      term = (_GOLDEN + _mix_int((c + _GOLDEN) & _MASK64)) & _MASK64
      if isinstance(h, int):
        h = _mix_int((h + term) & _MASK64)
      else:
        h += np.uint64(term)
        _mix_(h)
      continue
    x = c.astype(np.int64, copy=False).astype(np.uint64)
    x += _U64[_GOLDEN]
    _mix_(x)
    if isinstance(h, int):
      x += np.uint64((h + _GOLDEN) & _MASK64)
    else:
      x = x + h   # Broadcast to the shape of both.
      x += _U64[_GOLDEN]
    h = _mix_(x)
  return np.asarray(h, np.uint64)


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
  bits >>= _U64[11]
  u = bits.astype(np.float64)
  u *= 1.0 / (1 << 53)
  return u


def randint(low, high, *counters, num: int | None = None) -> np.ndarray:
  """Integers uniform in [low, high) (``high`` exclusive), like numpy."""
  u = uniform(*counters, num=num)
  low = np.asarray(low)
  span = np.asarray(high) - low
  return low + np.minimum((u * span).astype(np.int64), span - 1)
