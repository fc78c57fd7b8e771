"""Telemetry: what the masking actually did, summed over batches, and an
audit of it against the configured rates."""

from __future__ import annotations

import numpy as np

from data_pipelines.masking.config import MaskingConfig
from data_pipelines.masking.replace import CORRUPT_KEEP
from data_pipelines.masking.replace import CORRUPT_MASK
from data_pipelines.masking.replace import CORRUPT_RANDOM

HISTOGRAM_BINS = 10   # Unit lengths 1..9 tokens, and 10 or more.
_STAT_TOKENS, _STAT_PREDICTIONS, _STAT_MASK, _STAT_RANDOM, _STAT_KEEP = range(5)
_STAT_UNITS = 5
NUM_STATISTICS = 6 + HISTOGRAM_BINS


def statistics(masked: dict) -> np.ndarray:
  """float64 [NUM_STATISTICS] counts of one masked batch; add to aggregate.

  Real (non-pad) tokens, predictions, [MASK] / random / kept predictions,
  units, and a histogram of unit lengths in tokens.
  """
  weights = masked['masked_weights'] > 0
  corruption = masked['masked_corruption']
  stats = np.zeros(NUM_STATISTICS)
  stats[_STAT_TOKENS] = masked['attention_mask'].sum()
  stats[_STAT_PREDICTIONS] = weights.sum()
  stats[_STAT_MASK] = (weights & (corruption == CORRUPT_MASK)).sum()
  stats[_STAT_RANDOM] = (weights & (corruption == CORRUPT_RANDOM)).sum()
  stats[_STAT_KEEP] = (weights & (corruption == CORRUPT_KEEP)).sum()
  seq_len = masked['input_ids'].shape[1]
  rows = np.broadcast_to(np.arange(len(weights))[:, None], weights.shape)
  keys = (rows * seq_len + masked['masked_unit_start'])[weights]
  lengths = np.bincount(keys)
  lengths = np.minimum(lengths[lengths > 0], HISTOGRAM_BINS)
  stats[_STAT_UNITS] = len(lengths)
  stats[6:] = np.bincount(lengths - 1, minlength=HISTOGRAM_BINS)
  return stats


def summarize_statistics(stats: np.ndarray) -> dict:
  """Rates from summed ``statistics``: the realized masking rate (predictions
  per real token), the [MASK]/random/kept fractions, the mean unit length
  and the unit-length histogram (fractions of units, ``masking_unit_len_10``
  counting 10 or more)."""
  predictions = max(stats[_STAT_PREDICTIONS], 1.0)
  units = max(stats[_STAT_UNITS], 1.0)
  out = {
      'masking_rate': stats[_STAT_PREDICTIONS] / max(stats[_STAT_TOKENS], 1.0),
      'masking_mask_fraction': stats[_STAT_MASK] / predictions,
      'masking_random_fraction': stats[_STAT_RANDOM] / predictions,
      'masking_kept_fraction': stats[_STAT_KEEP] / predictions,
      'masking_unit_length_mean': stats[_STAT_PREDICTIONS] / units,
  }
  for i in range(HISTOGRAM_BINS):
    out[f'masking_unit_len_{i + 1}'] = stats[6 + i] / units
  return out


def audit(summary: dict, config: MaskingConfig, tolerance: float,
          where: str) -> None:
  """Fails when a realized rate is off the configured one by > tolerance.

  The realized masking rate is compared with ``config.rate``; it falls
  short when ``max_predictions_per_seq`` caps the budget (e.g. 20 slots at
  512 tokens), which is the mistake this check exists to catch.
  """
  expected = {
      'masking_rate': config.rate,
      'masking_mask_fraction': config.mask_token_prob,
      'masking_random_fraction': config.random_token_prob,
      'masking_kept_fraction': 1 - config.mask_token_prob
                               - config.random_token_prob,
  }
  off = [f'{name} is {summary[name]:.4f}, configured {value:.4f}'
         for name, value in expected.items()
         if abs(summary[name] - value) > tolerance]
  if off:
    raise ValueError(
        f'masking audit failed {where} (tolerance {tolerance}): '
        + '; '.join(off) + '. Check masking.rate against '
        'masking.max_predictions_per_seq and data.max_seq_length, or raise '
        'masking.audit_tolerance.')
