"""Units: what may be masked, how it groups into words, and each budget.

A unit is a group of contiguous maskable positions, masked together or not
at all: a token, a word (a maskable token whose word-start flag is set, and
the pieces after it), or, for ERNIE, a phrase or an entity merged into one
word. Words never cross a special or padding, so neither do units.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines.tokenizer import CLS_ID, PAD_ID, SEP_ID


def maskable(input_ids: np.ndarray) -> np.ndarray:
  """bool [B, L]: positions that may be masked (no specials, no padding)."""
  return (input_ids != PAD_ID) & (input_ids != CLS_ID) & (input_ids != SEP_ID)


def num_to_predict(lengths: np.ndarray, rate: float,
                   max_predictions: int) -> np.ndarray:
  """int64 [B]: each row's budget in tokens, from its length in tokens.

  BERT's count rule ``min(max_predictions, max(1, round(n * rate)))``;
  ``np.round`` rounds half to even like Python's.
  """
  return np.minimum(max_predictions,
                    np.maximum(1, np.round(lengths * rate))).astype(np.int64)


@dataclasses.dataclass
class Words:
  """Word segmentation of a batch (maskable tokens only).

  Attributes:
    slot: int [B, L], where each token's word sits in a flattened
      [B, W + 1] array: ``row * (W + 1) + word``, or ``row * (W + 1) + W``
      (a padding column) for tokens that are not maskable.
    count: int [B], words per row.
    length: int [B, W], tokens per word (0 past ``count``).
    first: int [B, W], position of each word's first token (0 past
      ``count``).
    cum: int [B, W + 1], tokens before word w (cum[:, w + 1] - cum[:, w] =
      length[:, w]).
    room: int [B, W], words from w to the end of its run of adjacent
      maskable tokens, w included (0 past ``count``): a unit never crosses a
      special ([SEP]).
  """
  slot: np.ndarray
  count: np.ndarray
  length: np.ndarray
  first: np.ndarray
  cum: np.ndarray
  room: np.ndarray


def segment_words(candidates: np.ndarray, word_starts: np.ndarray) -> Words:
  """Segments the maskable tokens (bool [B, L]) into words.

  A word starts at a maskable token whose flag (``word_starts``, bool
  [B, L]) is set or whose left neighbour is not maskable. The batch's words
  are handled as one flat list in row-major order (the ``np.flatnonzero``
  of their first and of their last tokens), and scattered into [B, W]
  through the mask ``w < count``, whose True entries come in the same order.
  """
  batch_size, seq_len = candidates.shape
  previous = np.zeros_like(candidates)   # The left neighbour is maskable.
  previous[:, 1:] = candidates[:, :-1]
  starts = candidates & (word_starts | ~previous)
  ends = candidates.copy()   # The next token starts a word or is special.
  ends[:, :-1] &= starts[:, 1:] | ~candidates[:, 1:]
  # Accumulating bools into int32 is much faster than into int64.
  index = np.cumsum(starts, axis=1, dtype=np.int32).astype(np.int64)
  count = index[:, -1].copy()
  width = max(int(count.max()), 1)
  index -= 1
  index[~candidates] = width
  index += (np.arange(batch_size) * (width + 1))[:, None]
  start_flat = np.flatnonzero(starts)   # [N], N words in the batch.
  end_flat = np.flatnonzero(ends)
  present = np.arange(width)[None, :] < count[:, None]
  length = np.zeros((batch_size, width), np.int64)
  length[present] = end_flat - start_flat + 1
  first = np.zeros((batch_size, width), np.int64)
  first[present] = start_flat % seq_len
  cum = np.zeros((batch_size, width + 1), np.int64)
  np.cumsum(length, axis=1, out=cum[:, 1:])
  room = np.zeros((batch_size, width), np.int64)
  room[present] = _room(~previous.ravel()[start_flat])
  return Words(index, count, length, first, cum, room)


def _room(new_run: np.ndarray) -> np.ndarray:
  """int [N]: for each word of the flat list, the words from it to the end
  of its run of adjacent words, itself included.

  ``new_run`` (bool [N]) marks the words that start a run; a row's first
  word always does, so no run spans two rows.
  """
  last_of_run = np.ones_like(new_run)
  last_of_run[:-1] = new_run[1:]
  run = np.cumsum(new_run, dtype=np.int32) - 1
  run_last = np.flatnonzero(last_of_run)[run]   # [N] flat word numbers.
  return run_last + 1 - np.arange(len(run_last))


def merge_units(word_starts: np.ndarray, unit_labels: np.ndarray,
                candidates: np.ndarray, level: np.ndarray) -> np.ndarray:
  """bool [B, L]: word starts with each row's phrases or entities merged.

  At ``level`` (int [B]) 1 (2) every phrase (entity) of the row, read from
  ``unit_labels`` (int8 [B, L], see gazetteer.py), becomes a single word,
  so whole-word selection masks it whole; at level 0 the words stay.
  """
  begin = np.where(level == 2, gazetteer_lib.ENTITY_BEGIN,
                   gazetteer_lib.PHRASE_BEGIN)[:, None]
  merged = (level > 0)[:, None]
  inside = merged & (unit_labels == begin + 1)
  begins = merged & (unit_labels == begin)
  word_starts = word_starts & ~inside | begins
  # The token after a merged unit starts a new unit.
  in_unit = np.pad(inside | begins, ((0, 0), (1, 0)))[:, :-1]
  return word_starts | (in_unit & ~inside & candidates)


def expand(words: Words, unit_first: np.ndarray):
  """Word-level choices -> token-level selection and unit keys.

  Args:
    words: the batch's words.
    unit_first: int [B, W], for each chosen word the position of its unit's
      first token; -1 for words not chosen.

  Returns:
    selected bool [B, L], unit_key int [B, L] (-1 where not selected).
  """
  batch_size, width = unit_first.shape
  padded = np.full((batch_size, width + 1), -1, np.int64)
  padded[:, :width] = unit_first
  unit_key = padded.ravel()[words.slot]
  return unit_key >= 0, unit_key
