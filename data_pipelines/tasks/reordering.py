"""ERNIE 2.0's sentence reordering (Sun et al., AAAI 2020, Sec. 4.2.2).

"A given paragraph is randomly split into 1 to m segments and then all of
the combinations are shuffled by a random permuted order"; the model
classifies the permutation among k = sum_{n=1}^{m} n! classes, from [CLS].

Per row (the content between [CLS] and the final [SEP]):

1. n, the number of pieces, uniform in 1..m, capped at 1 + the number of
   word starts after the first content token (so every piece has a word
   start; with the first content token a word start, that is the number of
   word starts in the content).
2. n - 1 distinct cut points, uniform among the sentence starts after the
   first content token when the row has at least n - 1 of them, and
   otherwise among its word starts after the first content token. A piece
   starts at a cut point, so a document-boundary [SEP] ends the piece it
   is in and travels with it.
3. The pieces permuted uniformly. ``new_to_old[s]`` is the original index
   of the piece put in slot s (the permutation maps new -> old); the label
   is ``sum_{j=1}^{n-1} j! + rank(new_to_old)``, with ``rank`` the
   lexicographic rank among the permutations of n (0 = identity): for
   n = 3, new_to_old = (2, 0, 1) is class 1 + 2 + 4 = 7.

The task needs a packed layout (``data.layout='full_sentences'`` or
``'doc_sentences'``): in a pair layout the
pieces would carry their ``token_type_ids`` and show where they were cut.
Draws: ``Counters.uniform`` with the SENTENCE_REORDERING stream: a row's
n with no counter, a cut point's key with its position, a piece's key with
``-1 - piece``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from data_pipelines.counter_rng import Stream
from data_pipelines.masking.draws import Counters
from data_pipelines.tasks import denoise
from data_pipelines.tasks.base import HostTask
from data_pipelines.tasks.base import register

MAX_PIECES = 7   # m = 8 gives 46,233 classes.


def num_classes(m: int) -> int:
  """sum_{n=1}^{m} n!: the permutations of 1 to m pieces."""
  return sum(math.factorial(n) for n in range(1, m + 1))


def permutation_class(new_to_old: np.ndarray, n: np.ndarray) -> np.ndarray:
  """int64 [B]: the class of each row's permutation.

  Args:
    new_to_old: int [B, m], the original piece in each new slot; slots
      >= n hold n, n + 1, ... (unused).
    n: int [B], the number of pieces, 1 <= n <= m.

  Returns:
    ``sum_{j=1}^{n-1} j! + rank``: rank is the lexicographic rank of
    ``new_to_old[:, :n]`` among the permutations of n (its Lehmer code).
  """
  m = new_to_old.shape[1]
  slots = np.arange(m)
  factorials = np.array([math.factorial(k) for k in range(m + 1)], np.int64)
  # Lehmer code: later slots holding a smaller piece, per slot [B, m].
  later_smaller = ((new_to_old[:, None, :] < new_to_old[:, :, None]) &
                   (slots[None, None, :] > slots[None, :, None]) &
                   (slots[None, None, :] < n[:, None, None])).sum(axis=2)
  place_value = np.where(slots[None, :] < n[:, None],
                         factorials[np.maximum(n[:, None] - 1 - slots, 0)], 0)
  offsets = np.cumsum(factorials[1:]) - factorials[1:]   # By n - 1.
  return offsets[n - 1] + (later_smaller * place_value).sum(axis=1)


def _cut_points(batch: dict, n: np.ndarray, keys: np.ndarray) -> np.ndarray:
  """bool [B, L]: each row's n - 1 cut points (the module docstring's rule),
  the candidates with the smallest ``keys`` (uniform [B, L])."""
  positions = denoise.positions_of(batch)
  after_first = denoise.content_span(batch) & (positions > 1)
  sentence_ids = np.asarray(batch['sentence_ids'])
  sentence_cuts = after_first & denoise.sentence_starts(sentence_ids)
  word_cuts = after_first & (sentence_ids >= 0) & np.asarray(
      batch['word_starts'], bool)
  by_sentence = sentence_cuts.sum(axis=1) >= n - 1
  candidates = np.where(by_sentence[:, None], sentence_cuts, word_cuts)
  order = np.argsort(np.where(candidates, keys, 2.0), axis=1, kind='stable')
  rank = np.empty_like(order)
  np.put_along_axis(rank, order, np.broadcast_to(positions, order.shape),
                    axis=1)
  return candidates & (rank < (n - 1)[:, None])


def _num_pieces(batch: dict, m: int, u: np.ndarray) -> np.ndarray:
  """int64 [B]: uniform in 1..m from draws ``u`` [B], capped at 1 + the
  word starts after the first content token."""
  positions = denoise.positions_of(batch)
  cuts = (denoise.content_span(batch) & (positions > 1) &
          (np.asarray(batch['sentence_ids']) >= 0) &
          np.asarray(batch['word_starts'], bool)).sum(axis=1)
  drawn = 1 + np.minimum((u * m).astype(np.int64), m - 1)
  return np.minimum(drawn, 1 + cuts)


def reorder_pieces(batch: dict, params: dict, seed: int) -> dict:
  """Splits each row's content into n pieces and permutes them.

  Returns:
    A new batch with the fields moved (``denoise.gather_tokens``) and
    ``sentence_reordering_label`` int32 [B], the permutation's class
    (``permutation_class``).
  """
  m = params['m']
  counters = Counters.of_batch(batch, seed)
  n = _num_pieces(batch, m, counters.per_row(Stream.SENTENCE_REORDERING))
  cut = _cut_points(batch, n, counters.uniform(
      Stream.SENTENCE_REORDERING, denoise.positions_of(batch)))
  piece = np.cumsum(cut, axis=1)   # [B, L], 0..n-1 on the content.
  piece_keys = counters.uniform(Stream.SENTENCE_REORDERING,
                                -1 - np.arange(m)[None, :])
  slots = np.arange(m)[None, :]
  new_to_old = np.argsort(np.where(slots < n[:, None], piece_keys, 2.0),
                          axis=1, kind='stable')
  slot_of_piece = np.empty_like(new_to_old)
  np.put_along_axis(slot_of_piece, new_to_old,
                    np.broadcast_to(slots, new_to_old.shape), axis=1)
  span = denoise.content_span(batch)
  rank = np.where(span, np.take_along_axis(
      slot_of_piece, np.minimum(piece, m - 1), axis=1), 0)
  source = denoise.order_between_fixed(~span, rank)
  out = dict(batch)
  out.update(denoise.gather_tokens(denoise.token_fields(batch), source))
  out['sentence_reordering_label'] = permutation_class(new_to_old, n).astype(
      np.int32)
  return out


def _check(params: dict, data_cfg, errors: list[str]) -> None:
  del data_cfg
  m = params.get('m')
  if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not (
      1 <= m <= MAX_PIECES):
    errors.append(
        f'tasks.sentence_reordering.m={m!r} must be an int in [1, '
        f'{MAX_PIECES}]: the head has sum_{{n=1}}^{{m}} n! classes (9 for '
        f'm=3, the default; {num_classes(MAX_PIECES):,} for m=7), and m=8 '
        f'gives {num_classes(8):,}, more than any head in the model, a '
        'vocabulary-sized one included.')


SENTENCE_REORDERING = register(HostTask(
    name='sentence_reordering',
    head='sentence',
    num_classes=lambda params, max_seq_length: num_classes(params['m']),
    label_field='sentence_reordering_label',
    weight_field='',
    fields=lambda params, max_seq_length: {
        'sentence_reordering_label': ((), np.int32)},
    apply=reorder_pieces,
    corrupts=True,
    across_documents=True,
    defaults=lambda: {'m': 3},
    check=_check,
    layout='full_sentences',
    description='ERNIE 2.0 sentence reordering: which permutation of 1 to m '
                'pieces.'))
