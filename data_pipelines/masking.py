"""Masked-LM masking on the fly, vectorized over whole batches.

Masking is a pure function of the batch and the counters each example
carries (``example_index``, ``mask_epoch``) plus the config's seed: dynamic
masking passes the epoch, static masking ``epoch % dupe_factor``.

The selection works on *units* (groups of positions masked together), and a
strategy is a function that assigns positions to units. This issue ships the
``token`` strategy (every token is its own unit); whole-word, n-gram, span and
entity strategies plug in as other unit functions.

BERT's rules (google-research/bert ``create_masked_lm_predictions``):
* number to predict: ``min(max_predictions_per_seq, max(1, round(n * rate)))``
  with ``n`` counting [CLS] and [SEP]; specials and padding are never chosen;
* each chosen token: 80% [MASK], 10% a random token, 10% kept.

Departure: the random replacement is drawn from the real, non-special
vocabulary (the reference draws from the whole vocabulary, specials included).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines import counter_rng
from data_pipelines.counter_rng import Stream
from data_pipelines.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID
from data_pipelines.tokenizer import SEP_ID

STRATEGIES = ('token',)


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """Masking knobs (the config's ``masking`` section).

  Attributes:
    strategy: how positions group into units; see STRATEGIES.
    rate: fraction of tokens (specials included, as BERT counts) to predict.
    max_predictions_per_seq: P, the fixed number of prediction slots.
    mask_token_prob: of the chosen tokens, the fraction set to [MASK].
    random_token_prob: the fraction replaced by a random token; the rest are
      kept as they are.
    vocab_size: the tokenizer's real vocabulary (random tokens come from
      [NUM_SPECIAL, vocab_size)).
  """
  strategy: str = 'token'
  rate: float = 0.15
  max_predictions_per_seq: int = 20
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  vocab_size: int = 0

  def validate(self) -> None:
    if self.strategy not in STRATEGIES:
      raise ValueError(f'masking.strategy={self.strategy!r}; use one of '
                       f'{STRATEGIES}.')
    if not 0 < self.rate < 1:
      raise ValueError(f'masking.rate={self.rate} must be in (0, 1).')
    if self.max_predictions_per_seq < 1:
      raise ValueError('masking.max_predictions_per_seq='
                       f'{self.max_predictions_per_seq} must be >= 1.')
    if (self.mask_token_prob < 0 or self.random_token_prob < 0 or
        self.mask_token_prob + self.random_token_prob > 1):
      raise ValueError(
          f'masking.mask_token_prob={self.mask_token_prob} and '
          f'masking.random_token_prob={self.random_token_prob} must be >= 0 '
          'and sum to at most 1 (the rest is kept unchanged).')


def num_to_predict(lengths: np.ndarray, rate: float,
                   max_predictions: int) -> np.ndarray:
  """BERT's count rule; ``np.round`` rounds half to even like Python's."""
  return np.minimum(max_predictions,
                    np.maximum(1, np.round(lengths * rate))).astype(np.int64)


def maskable(input_ids: np.ndarray) -> np.ndarray:
  """bool [B, L]: positions that may be masked (no specials, no padding)."""
  return (input_ids != PAD_ID) & (input_ids != CLS_ID) & (input_ids != SEP_ID)


def _token_scores(seed, example_index, mask_epoch, seq_len) -> np.ndarray:
  """Random priority per position; the lowest scores are masked first."""
  return counter_rng.uniform(seed, Stream.MASK_SELECT, mask_epoch[:, None],
                             example_index[:, None],
                             np.arange(seq_len)[None, :])


def select_positions(candidates: np.ndarray, scores: np.ndarray,
                     budget: np.ndarray, max_predictions: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Chooses up to ``budget`` candidate positions per row by lowest score.

  Args:
    candidates: bool [B, L].
    scores: float [B, L], random priorities.
    budget: int [B], positions wanted per row.
    max_predictions: P.

  Returns:
    positions int32 [B, P], ascending, 0 where unused; weights float32 [B, P].
  """
  seq_len = candidates.shape[1]
  scores = np.where(candidates, scores, np.inf)
  take = min(max_predictions, seq_len)
  order = np.argpartition(scores, take - 1, axis=1)[:, :take] if (
      take < seq_len) else np.argsort(scores, axis=1)
  count = np.minimum(budget, candidates.sum(axis=1))
  # argpartition leaves the chosen block unordered: rank it by score.
  chosen_scores = np.take_along_axis(scores, order, axis=1)
  order = np.take_along_axis(order, np.argsort(chosen_scores, axis=1), axis=1)
  valid = np.arange(take)[None, :] < count[:, None]
  positions = np.sort(np.where(valid, order, seq_len), axis=1)
  valid = positions < seq_len
  positions = np.where(valid, positions, 0)
  if take < max_predictions:
    extra = max_predictions - take
    positions = np.pad(positions, ((0, 0), (0, extra)))
    valid = np.pad(valid, ((0, 0), (0, extra)))
  return positions.astype(np.int32), valid.astype(np.float32)


def mask_batch(batch: dict, config: MaskingConfig, seed: int) -> dict:
  """Adds masked-LM fields to a padded batch; corrupts ``input_ids``.

  Args:
    batch: numpy arrays with a leading batch axis: ``input_ids`` [B, L],
      ``attention_mask`` [B, L], ``example_index`` [B], ``mask_epoch`` [B].
    config: masking knobs.
    seed: the data seed.

  Returns:
    A new dict: the batch with corrupted ``input_ids`` and
    ``masked_positions`` int32 [B, P], ``masked_ids`` int32 [B, P] (the
    original tokens), ``masked_weights`` float32 [B, P] (1 for real slots),
    and ``masked_corruption`` int8 [B, P] (0 [MASK], 1 random, 2 kept).
  """
  if config.vocab_size <= NUM_SPECIAL:
    raise ValueError(f'MaskingConfig.vocab_size={config.vocab_size}: set it '
                     'to the tokenizer\'s vocabulary size.')
  ids = batch['input_ids']
  batch_size, seq_len = ids.shape
  example_index = np.asarray(batch['example_index'], np.int64)
  mask_epoch = np.asarray(batch['mask_epoch'], np.int64)
  lengths = batch['attention_mask'].sum(axis=1)
  budget = num_to_predict(lengths, config.rate, config.max_predictions_per_seq)
  candidates = maskable(ids)
  scores = _token_scores(seed, example_index, mask_epoch, seq_len)
  positions, weights = select_positions(
      candidates, scores, budget, config.max_predictions_per_seq)

  rows = np.arange(batch_size)[:, None]
  labels = ids[rows, positions]
  # Corruption is keyed by position, so it does not depend on slot order.
  u = counter_rng.uniform(seed, Stream.MASK_CORRUPT, mask_epoch[:, None],
                          example_index[:, None], positions)
  random_ids = counter_rng.randint(
      NUM_SPECIAL, config.vocab_size, seed, Stream.MASK_REPLACE,
      mask_epoch[:, None], example_index[:, None], positions)
  use_mask = u < config.mask_token_prob
  use_random = ~use_mask & (
      u < config.mask_token_prob + config.random_token_prob)
  corrupted = np.where(use_mask, MASK_ID, np.where(use_random, random_ids,
                                                   labels))
  new_ids = ids.copy()
  real = weights > 0
  new_ids[np.broadcast_to(rows, positions.shape)[real], positions[real]] = (
      corrupted[real])
  out = dict(batch)
  out['input_ids'] = new_ids
  out['masked_positions'] = positions
  out['masked_ids'] = np.where(real, labels, 0).astype(np.int32)
  out['masked_weights'] = weights
  out['masked_corruption'] = np.where(use_mask, 0, np.where(use_random, 1, 2)
                                      ).astype(np.int8)
  return out
