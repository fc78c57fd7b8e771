"""Replace: the chosen positions packed into P slots, then corrupted.

Each chosen token is replaced by [MASK] with ``mask_token_prob``, by a random
token with ``random_token_prob``, and otherwise kept; the decision is drawn
per position or, with ``corruption_unit='unit'``, per unit (keyed by the
unit's first position). Random tokens are uniform over the non-special
vocabulary or follow the corpus unigram counts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines.counter_rng import Stream
from data_pipelines.masking.config import MaskingConfig
from data_pipelines.masking.draws import Counters
from data_pipelines.masking.draws import sample
from data_pipelines.tokenizer import MASK_ID, NUM_SPECIAL

# Corruption codes in ``masked_corruption``.
CORRUPT_MASK, CORRUPT_RANDOM, CORRUPT_KEEP = 0, 1, 2


def check_vocabulary(config: MaskingConfig) -> None:
  """Fails unless ``config`` can draw random tokens."""
  if config.vocab_size <= NUM_SPECIAL:
    raise ValueError(f'MaskingConfig.vocab_size={config.vocab_size}: set it '
                     'to the tokenizer\'s vocabulary size.')
  if config.random_source == 'unigram' and config.unigram_counts is None:
    raise ValueError('masking.random_source="unigram" needs the corpus '
                     'unigram_counts.')


@dataclasses.dataclass(frozen=True)
class Slots:
  """The chosen positions in P fixed slots per row, used slots first.

  Attributes:
    positions: int64 [B, P], ascending; 0 in unused slots.
    real: bool [B, P], the slot is used.
    unit_start: int64 [B, P], where each position's unit begins; 0 in
      unused slots.
  """
  positions: np.ndarray
  real: np.ndarray
  unit_start: np.ndarray


def pack(selected: np.ndarray, unit_key: np.ndarray,
         max_predictions: int) -> Slots:
  """Selected positions (bool [B, L]) and their units' first positions
  (int [B, L]) -> ``Slots`` of P = ``max_predictions``.

  The budget keeps a row's selection within P; a row with more would keep
  its first P.
  """
  batch_size, seq_len = selected.shape
  count = selected.sum(axis=1)
  real = np.arange(max_predictions)[None, :] < count[:, None]
  chosen = np.flatnonzero(selected)   # Row after row, ascending.
  slot = np.arange(chosen.size) - np.repeat(np.cumsum(count) - count, count)
  positions = np.zeros((batch_size, max_predictions), np.int64)
  positions[real] = chosen[slot < max_predictions] % seq_len
  rows = np.arange(batch_size)[:, None]
  unit_start = np.where(real, unit_key[rows, positions], 0)
  return Slots(positions, real, unit_start)


def corrupt(batch: dict, slots: Slots, config: MaskingConfig,
            counters: Counters) -> dict:
  """The batch with its chosen tokens corrupted and the masked-LM fields.

  Returns:
    A new dict: the batch with corrupted ``input_ids`` [B, L] and
    ``masked_positions`` int32 [B, P]; ``masked_ids`` int32 [B, P], the
    original tokens (0 in unused slots); ``masked_weights`` float32 [B, P],
    1 for used slots; ``masked_corruption`` int8 [B, P] (CORRUPT_*;
    CORRUPT_KEEP in unused slots); ``masked_unit_start`` int32 [B, P].
  """
  ids = batch['input_ids']
  rows = np.arange(len(ids))[:, None]
  labels = ids[rows, slots.positions]
  # Corruption, keyed by position or by the unit's first position.
  key = (slots.unit_start if config.corruption_unit == 'unit'
         else slots.positions)
  u, u_replace = counters.uniforms((Stream.MASK_CORRUPT, Stream.MASK_REPLACE),
                                   np.stack([key, slots.positions]))
  corruption = corruption_codes(u, slots.real, config.mask_token_prob,
                                config.random_token_prob)
  corrupted = np.where(
      corruption == CORRUPT_MASK, MASK_ID,
      np.where(corruption == CORRUPT_RANDOM,
               replacement_ids(u_replace, config), labels))
  real = slots.real
  new_ids = ids.copy()
  new_ids[np.broadcast_to(rows, real.shape)[real],
          slots.positions[real]] = corrupted[real]
  out = dict(batch)
  out['input_ids'] = new_ids
  out['masked_positions'] = slots.positions.astype(np.int32)
  out['masked_ids'] = np.where(real, labels, 0).astype(np.int32)
  out['masked_weights'] = real.astype(np.float32)
  out['masked_corruption'] = corruption
  out['masked_unit_start'] = slots.unit_start.astype(np.int32)
  return out


def corruption_codes(u: np.ndarray, real: np.ndarray, mask_token_prob: float,
                     random_token_prob: float) -> np.ndarray:
  """int8 [B, P]: CORRUPT_MASK, CORRUPT_RANDOM or CORRUPT_KEEP per slot,
  from uniform draws ``u`` [B, P]; CORRUPT_KEEP where not ``real``."""
  use_mask = real & (u < mask_token_prob)
  use_random = real & ~use_mask & (u < mask_token_prob + random_token_prob)
  return np.where(use_mask, CORRUPT_MASK, np.where(
      use_random, CORRUPT_RANDOM, CORRUPT_KEEP)).astype(np.int8)


def replacement_ids(u: np.ndarray, config: MaskingConfig) -> np.ndarray:
  """int [B, P]: random tokens for uniform draws ``u`` [B, P], never
  specials: uniform over the vocabulary or by the unigram counts."""
  if config.random_source == 'unigram':
    return sample(config.unigram_cdf, u)
  span = config.vocab_size - NUM_SPECIAL
  return NUM_SPECIAL + np.minimum((u * span).astype(np.int64), span - 1)
