"""The random numbers of one batch's masking, from counters only.

Every draw is ``counter_rng.uniform(seed, stream, mask_epoch, example_index,
counter)``: a function of the data seed, the row's own counters and what is
being drawn (a stream, and a counter such as a position, a word or an
attempt number), never of the batch the row sits in.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines import counter_rng


@dataclasses.dataclass(frozen=True)
class Counters:
  """A batch's counters.

  Attributes:
    seed: the data seed.
    example_index: int64 [B], each row's index in its data epoch's plan.
    mask_epoch: int64 [B], the epoch (dynamic) or ``epoch % dupe_factor``
      (static) each row is masked for.
  """
  seed: int
  example_index: np.ndarray
  mask_epoch: np.ndarray

  @classmethod
  def of_batch(cls, batch: dict, seed: int) -> 'Counters':
    """From the batch's ``example_index`` [B] and ``mask_epoch`` [B]."""
    return cls(seed, np.asarray(batch['example_index'], np.int64),
               np.asarray(batch['mask_epoch'], np.int64))

  def per_row(self, stream) -> np.ndarray:
    """float [B]: one draw per row."""
    return counter_rng.uniform(self.seed, stream, self.mask_epoch,
                               self.example_index)

  def uniform(self, stream, counter) -> np.ndarray:
    """float [B, N]: a draw per row and ``counter`` (int [B, N] or [1, N])."""
    return counter_rng.uniform(self.seed, stream, self.mask_epoch[:, None],
                               self.example_index[:, None], counter)

  def uniforms(self, streams, counter) -> np.ndarray:
    """float [S, B, N]: ``uniform`` of S streams in one call.

    The numbers of one call per stream, for a fraction of the cost (the hash
    is many small numpy operations); ``counter`` is int [B, N], shared, or
    [S, B, N], one per stream.
    """
    return counter_rng.uniform(self.seed, np.array(streams)[:, None, None],
                               self.mask_epoch[:, None],
                               self.example_index[:, None], counter)


def sample(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
  """Inverse-CDF draws: index i with probability cdf[i] - cdf[i - 1]."""
  return np.minimum(np.searchsorted(cdf, u, side='right'), len(cdf) - 1)
