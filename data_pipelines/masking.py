"""Masked-LM masking on the fly, vectorized over whole batches.

Masking is a pure function of the batch and the counters each example
carries (``example_index``, ``mask_epoch``) plus the config's seed: dynamic
masking passes the epoch, static masking ``epoch % dupe_factor``. Nothing
depends on batch composition, worker count or host count.

Every strategy chooses *units*, groups of contiguous positions that are
masked together or not at all, until the row's budget is met:

============  ==============================================================
strategy      unit
============  ==============================================================
token         one token (BERT; google-research/bert)
whole_word    one word (BERT-wwm; Cui et al. 2019): a word starts at a token
              whose word-start flag is set (SentencePiece's "▁", or the
              user's own segmentation stored with the data)
ngram         n consecutive words, P(n) proportional to 1/n for n <= max_n
              (ALBERT; Lan et al. 2020, google-research/albert)
span          L consecutive words, L ~ Geometric(p) clipped to
              [lower, upper], uniform start (SpanBERT; Joshi et al. 2020)
entity        per row, one of ERNIE 1.0's levels (Sun et al. 2019), drawn
              with ``entity_mixture`` = (word, phrase, entity) weights: a
              word, or a word with every phrase (resp. entity) of the row
              merged into one unit; units from ``unit_labels`` (gazetteer)
============  ==============================================================

The budget is BERT's: ``min(max_predictions_per_seq, max(1, round(n * rate)))``
with ``n`` counting [CLS] and [SEP]. Specials and padding are never chosen.
A unit that would overshoot the budget is shrunk (ngram, span: fewer words)
or skipped (whole_word), so the count never exceeds the budget and gets as
close as the units allow.

Each chosen token is replaced by [MASK] with ``mask_token_prob``, by a random
token with ``random_token_prob``, and otherwise kept (80/10/10; ELECTRA's
85/15/0 is ``mask_token_prob=0.85, random_token_prob=0``). The decision is
made per token or, with ``corruption_unit='unit'``, once per unit (SpanBERT).
Random tokens come uniformly from the non-special vocabulary, or from the
corpus unigram distribution (``random_source='unigram'``, SpanBERT).

Departures: random tokens never include specials (the BERT reference draws
from the whole vocabulary); SpanBERT's anchors are uniform over tokens and
its last span may end mid-word, ours start uniformly over words and never
split one.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from data_pipelines import counter_rng
from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines.counter_rng import Stream
from data_pipelines.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID
from data_pipelines.tokenizer import SEP_ID

STRATEGIES = ('token', 'whole_word', 'ngram', 'span', 'entity')
CORRUPTION_UNITS = ('token', 'unit')
RANDOM_SOURCES = ('uniform', 'unigram')
# Corruption codes in ``masked_corruption``.
CORRUPT_MASK, CORRUPT_RANDOM, CORRUPT_KEEP = 0, 1, 2


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
    corruption_unit: 'token' decides the corruption per token, 'unit' once
      per unit (word, n-gram, span).
    random_source: 'uniform' over the non-special vocabulary, or 'unigram'
      (the corpus token distribution, ``unigram_counts``).
    max_ngram: ngram: the longest n-gram, in words.
    span_geometric_p: span: the geometric distribution's p.
    span_lower: span: the shortest span, in words.
    span_upper: span: the longest span, in words.
    entity_mixture: entity: probabilities of the (word, phrase, entity)
      levels per row. ERNIE's stages are runs with (1, 0, 0), (0, 1, 0),
      (0, 0, 1); a mixture trains all levels at once.
    vocab_size: the tokenizer's real vocabulary (random tokens come from
      [NUM_SPECIAL, vocab_size)).
    unigram_counts: int [vocab_size] token counts, for 'unigram'.
  """
  strategy: str = 'token'
  rate: float = 0.15
  max_predictions_per_seq: int = 20
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  corruption_unit: str = 'token'
  random_source: str = 'uniform'
  max_ngram: int = 3
  span_geometric_p: float = 0.2
  span_lower: int = 1
  span_upper: int = 10
  entity_mixture: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
  vocab_size: int = 0
  unigram_counts: np.ndarray | None = dataclasses.field(
      default=None, compare=False, repr=False)

  @classmethod
  def from_config(cls, m, vocab_size: int = 0, unigram_counts=None
                  ) -> 'MaskingConfig':
    """From the config's ``masking`` section and the tokenizer's data."""
    return cls(
        strategy=m.strategy, rate=m.rate,
        max_predictions_per_seq=m.max_predictions_per_seq,
        mask_token_prob=m.mask_token_prob,
        random_token_prob=m.random_token_prob,
        corruption_unit=m.corruption_unit, random_source=m.random_source,
        max_ngram=m.max_ngram, span_geometric_p=m.span_geometric_p,
        span_lower=m.span_lower, span_upper=m.span_upper,
        entity_mixture=tuple(m.entity_mixture),
        vocab_size=vocab_size, unigram_counts=unigram_counts)

  @functools.cached_property
  def unigram_cdf(self) -> np.ndarray:
    """CDF of the non-special unigram distribution (built once, not per
    batch)."""
    counts = np.array(self.unigram_counts, np.float64)[:self.vocab_size]
    counts[:NUM_SPECIAL] = 0
    return np.cumsum(counts) / counts.sum()

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
    if self.corruption_unit not in CORRUPTION_UNITS:
      raise ValueError(f'masking.corruption_unit={self.corruption_unit!r}; '
                       f'use one of {CORRUPTION_UNITS}.')
    if self.random_source not in RANDOM_SOURCES:
      raise ValueError(f'masking.random_source={self.random_source!r}; use '
                       f'one of {RANDOM_SOURCES}.')
    if self.max_ngram < 1:
      raise ValueError(f'masking.max_ngram={self.max_ngram} must be >= 1.')
    if not 0 < self.span_geometric_p <= 1:
      raise ValueError(f'masking.span_geometric_p={self.span_geometric_p} '
                       'must be in (0, 1].')
    mixture = tuple(self.entity_mixture)
    if (len(mixture) != 3 or min(mixture) < 0
        or abs(sum(mixture) - 1) > 1e-6):
      raise ValueError(f'masking.entity_mixture={mixture} must be three '
                       'probabilities (word, phrase, entity) summing to 1.')
    if not 1 <= self.span_lower <= self.span_upper:
      raise ValueError(f'masking.span_lower={self.span_lower} and '
                       f'masking.span_upper={self.span_upper} must satisfy '
                       '1 <= lower <= upper.')


def num_to_predict(lengths: np.ndarray, rate: float,
                   max_predictions: int) -> np.ndarray:
  """BERT's count rule; ``np.round`` rounds half to even like Python's."""
  return np.minimum(max_predictions,
                    np.maximum(1, np.round(lengths * rate))).astype(np.int64)


def maskable(input_ids: np.ndarray) -> np.ndarray:
  """bool [B, L]: positions that may be masked (no specials, no padding)."""
  return (input_ids != PAD_ID) & (input_ids != CLS_ID) & (input_ids != SEP_ID)


def ngram_probabilities(max_n: int) -> np.ndarray:
  """ALBERT's P(n) proportional to 1/n, n = 1..max_n."""
  p = 1.0 / np.arange(1, max_n + 1)
  return p / p.sum()


def span_length_probabilities(p: float, lower: int, upper: int) -> np.ndarray:
  """SpanBERT's Geometric(p) restricted to [lower, upper], renormalized.

  Index i holds P(length = lower + i).
  """
  lengths = np.arange(lower, upper + 1)
  probs = (1 - p) ** (lengths - lower)  # Memoryless: finite for p = 1.
  return probs / probs.sum()


def _sample(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
  """Inverse-CDF draws: index i with probability cdf[i] - cdf[i - 1]."""
  return np.minimum(np.searchsorted(cdf, u, side='right'), len(cdf) - 1)


# ---------------------------------------------------------------------------
# Words: contiguous groups of maskable tokens.


@dataclasses.dataclass
class _Words:
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


def _words(candidates: np.ndarray, word_starts: np.ndarray) -> _Words:
  """Segments the maskable tokens into words.

  The batch's words are handled as one flat list in row-major order (the
  ``np.flatnonzero`` of their first and of their last tokens), and
  scattered into [B, W] through the mask ``w < count``, whose True entries
  come in the same order.
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
  # Runs of adjacent words, numbered over the flat list: a row's first word
  # always starts a run, so no run spans two rows.
  new_run = ~previous.ravel()[start_flat]
  last_of_run = np.ones_like(new_run)
  last_of_run[:-1] = new_run[1:]
  run = np.cumsum(new_run, dtype=np.int32) - 1
  run_last = np.flatnonzero(last_of_run)[run]   # [N] flat word numbers.
  room = np.zeros((batch_size, width), np.int64)
  room[present] = run_last + 1 - np.arange(len(run_last))
  return _Words(index, count, length, first, cum, room)


def _unit_scores(seed, example_index, mask_epoch, width) -> np.ndarray:
  return counter_rng.uniform(seed, Stream.MASK_SELECT, mask_epoch[:, None],
                             example_index[:, None],
                             np.arange(width)[None, :])


def _uniforms(streams, seed, example_index, mask_epoch, counter):
  """float [S, B, N]: ``counter_rng.uniform`` of S streams in one call.

  The numbers of one call per stream, for a fraction of the cost (the hash
  is many small numpy operations); ``counter`` is int [B, N], shared, or
  [S, B, N], one per stream.
  """
  return counter_rng.uniform(seed, np.array(streams)[:, None, None],
                             mask_epoch[:, None], example_index[:, None],
                             counter)


# ---------------------------------------------------------------------------
# Strategies. Each returns (selected bool [B, L], unit_key int [B, L]): the
# chosen positions and, for each, the position of its unit's first token.


def _select_token(candidates, budget, seed, example_index, mask_epoch):
  seq_len = candidates.shape[1]
  scores = _unit_scores(seed, example_index, mask_epoch, seq_len)
  scores = np.where(candidates, scores, np.inf)
  rank = np.argsort(np.argsort(scores, axis=1), axis=1)
  selected = candidates & (rank < budget[:, None])
  return selected, np.broadcast_to(np.arange(seq_len), selected.shape)


def _select_whole_word(words: _Words, budget, seed, example_index,
                       mask_epoch):
  """Words in random order; each is taken if it still fits (BERT's wwm).

  The greedy scan in closed form: every word before the first one that does
  not fit is taken (a prefix of the cumulative lengths); after it, each step
  takes the next word short enough for what is left, so the steps are
  bounded by the budget left after the prefix, not by the number of words.
  """
  batch_size, width = words.length.shape
  rows = np.arange(batch_size)
  order = _random_word_order(words, _unit_scores(seed, example_index,
                                                 mask_epoch, width))
  lengths = np.take_along_axis(words.length, order, axis=1)   # 0 = no word
  cum = np.cumsum(lengths, axis=1)
  taken_sorted = (cum <= budget[:, None]) & (lengths > 0)
  remaining = budget - np.where(taken_sorted, lengths, 0).sum(axis=1)
  position = taken_sorted.sum(axis=1)   # The first word that did not fit.
  columns = np.arange(width)[None, :]
  while True:
    fits = ((columns > position[:, None]) & (lengths > 0)
            & (lengths <= remaining[:, None]))
    found = fits.any(axis=1)
    if not found.any():
      break
    position = np.where(found, fits.argmax(axis=1), width)
    hit = rows[found]
    taken_sorted[hit, position[found]] = True
    remaining[hit] -= lengths[hit, position[found]]
  taken = np.zeros_like(taken_sorted)
  np.put_along_axis(taken, order, taken_sorted, axis=1)
  return _expand(words, np.where(taken, words.first, -1))


def _random_word_order(words: _Words, scores: np.ndarray) -> np.ndarray:
  """int [B, W]: each row's words by ``_unit_scores`` (absent words last)."""
  width = words.length.shape[1]
  scores = np.where(np.arange(width)[None, :] < words.count[:, None], scores,
                    np.inf)
  return np.argsort(scores, axis=1)


def _expand(words: _Words, unit_first: np.ndarray):
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


# Attempts per row that one step of _grow_spans judges together: at most
# this many (fewer for spans, where a rejected attempt ends the step), and
# fewer when many rows take the pairwise overlap test, so that a step judges
# about _PAIR_BUDGET attempts in all.
_MAX_ATTEMPTS_PER_STEP = 16
_MAX_SPAN_ATTEMPTS_PER_STEP = 8
_MIN_ATTEMPTS_PER_STEP = 8
_PAIR_BUDGET = 512


def _grow_spans(words: _Words, attempts, num_attempts: int, max_len: int,
                remaining, state=None, length_per_span: bool = False):
  """Takes spans (start word, length in words) in order where they fit.

  A span overlapping a taken word is skipped; one longer than the remaining
  budget is shrunk to the longest prefix of whole words that fits.

  The result is that of trying each row's attempts one at a time, in order.
  To need fewer numpy steps, a step judges the next K attempts of every row
  that still has budget at once (rows advance at their own pace): each
  against the words taken before the step and a guess of what the earlier
  attempts of the block take. The step decides the longest prefix of the
  block over which the guess is exact.

  In a row's bulk, the guess is that an attempt of the block takes its
  whole window if that is free (no word taken before the step) and overlaps
  no earlier free window of the block, and nothing otherwise. The step
  decides attempts up to

  - (excluded) the first that overlaps an earlier window of the block which
    itself overlaps an earlier one: one that overlaps only windows that
    overlap nothing earlier is rejected, as those are taken;
  - (included) the first that does not fit the budget left whole, if it
    takes something or the guess counted it as taken;
  - (included) with ``length_per_span``, the first that is rejected: the
    next attempt wants the rejected length, not the one the guess gave it.

  Once the budget has cut a span short (the row's tail), most attempts fail,
  so the guess is that none takes anything: the step decides attempts up to
  the first that takes something (included).

  Args:
    words: the batch's words.
    attempts: ``attempts(begin, end)`` returns (starts, lengths), int
      [B, end - begin] each (or broadcastable), for attempts begin..end - 1:
      the start word and the wanted length in words (>= 1), per attempt or,
      with ``length_per_span``, per accepted span: a rejected attempt then
      keeps its length for the next start, so overlaps do not bias the
      lengths towards short spans. Drawn as the rows reach them.
    num_attempts: how many attempts each row has.
    max_len: the largest wanted length.
    remaining: int [B], budget left (an updated copy is returned).
    state: (taken, begins) of an earlier call to continue from.

  Returns:
    taken bool [B, S] (words taken; S >= W + max_len + 1), begins bool
    [B, S] (words that start a span) and remaining int [B].
  """
  batch_size, width = words.length.shape
  max_block = (_MAX_SPAN_ATTEMPTS_PER_STEP if length_per_span
               else _MAX_ATTEMPTS_PER_STEP)
  if state is None:
    state = (np.zeros((batch_size, width + max_len + 1), bool),
             np.zeros((batch_size, width + max_len + 1), bool))
  taken, begins = state
  # Word tables of `stride` columns per row, flattened: a window of max_len
  # words from any start word <= W stays in its row (no words past W).
  stride = taken.shape[1]
  row_start = np.arange(batch_size)[:, None] * stride
  cum = np.empty((batch_size, stride), np.int64)
  cum[:, :width + 1] = words.cum
  cum[:, width + 1:] = words.cum[:, -1:]
  # Offset per row: the flat table is sorted, for np.searchsorted.
  cum_sorted = (cum + row_start // stride * (
      int(words.cum[:, -1].max()) + 1)).ravel()
  cum = cum.ravel()
  room = np.zeros((batch_size, stride), np.int64)
  room[:, :width] = words.room
  room = room.ravel()
  flat_taken, flat_begins = taken.reshape(-1), begins.reshape(-1)

  # Attempt tables [B, drawn + max_block], flattened: the flat start word
  # and the wanted length of each attempt drawn so far, then padding (start
  # word W, which has no room; with ``length_per_span``, the last length,
  # which stands for the lengths past the last attempt).
  start_table = length_table = np.zeros((batch_size, 0), np.int64)

  def draw(begin, end):
    nonlocal start_table, length_table
    shape = (batch_size, end - begin)
    starts, lengths = attempts(begin, end)
    starts = np.broadcast_to(starts + row_start, shape)
    lengths = np.broadcast_to(lengths, shape)
    if length_per_span:
      padding = lengths[:, -1:]
    else:
      lengths = np.minimum(lengths, room[starts])   # Never past the run.
      padding = 0
    pad = (batch_size, max_block)
    start_table = np.concatenate(
        [start_table[:, :begin], starts, np.broadcast_to(row_start + width,
                                                         pad)], axis=1)
    length_table = np.concatenate(
        [length_table[:, :begin], lengths, np.broadcast_to(padding, pad)],
        axis=1)
    return end

  # Rows seldom need more than one attempt per two predictions.
  drawn = draw(0, min(num_attempts, int(remaining.max()) // 2 + 8))
  all_k = np.arange(max_block)[:, None]
  all_earlier = all_k.T < all_k               # [k, k']: k' is before k.
  window = np.arange(max_len)[:, None, None]
  # The active rows: row, budget left, next attempt, spans taken, in tail.
  remaining = remaining.copy()
  rows = np.flatnonzero(remaining > 0)
  budget = remaining[rows]
  pointer = np.zeros(rows.size, np.int64)
  accepted = np.zeros(rows.size, np.int64)
  tail = np.zeros(rows.size, bool)
  while rows.size:
    # Block arrays are [K, A] (attempt k of the block, active row a) and
    # [M, K, A] (word m of the attempt's window).
    num_bulk = rows.size - np.count_nonzero(tail)
    block = max_block
    if num_bulk:
      block = min(max_block, max(_MIN_ATTEMPTS_PER_STEP,
                                 _PAIR_BUDGET // num_bulk))
    k = all_k[:block]
    if pointer.max() >= drawn:
      drawn = draw(drawn, min(num_attempts, max(2 * drawn,
                                                pointer.max() + max_block)))
    table_row = rows * start_table.shape[1]
    attempt = table_row + pointer + k
    start = start_table.ravel()[attempt]           # Flat start word.
    if length_per_span:   # In the tail, nothing is accepted before k.
      want = np.minimum(
          length_table.ravel()[table_row + accepted + k * ~tail],
          room[start])                               # Never past the run.
    else:
      want = length_table.ravel()[attempt]
    end = start + want
    tokens = cum[end] - cum[start]                   # In the whole window.
    cells = start + window
    hit = flat_taken[cells]                          # Taken before the step.
    free = (want > 0) & ~(hit & (window < want)).any(axis=0)

    # The guess: what each attempt takes if it fits the budget, and the
    # budget left before it.
    if num_bulk:
      # meets[k, k', a]: the windows of k and of an earlier free k' overlap.
      meets = ((start[:, None] < end[None]) & (start[None] < end[:, None])
               & all_earlier[:block, :block, None] & (free & ~tail)[None])
      contested = meets.any(axis=1)
      unsure = (meets & contested[None]).any(axis=1)
      taken_whole = free & ~contested
      counted = np.where(taken_whole & ~tail, tokens, 0)
      left = budget + counted - np.cumsum(counted, axis=0)
    else:
      taken_whole = free
      left = budget
    # An attempt that does not fit whole takes the longest prefix of whole
    # words that fits, if that is free.
    short = tokens > left
    best = want.copy()                               # Words taken.
    short_at = np.flatnonzero(short)
    if short_at.size:
      short_start = start.ravel()[short_at]
      fit = np.searchsorted(
          cum_sorted, cum_sorted[short_start]
          + np.broadcast_to(left, short.shape).ravel()[short_at],
          side='right') - short_start - 1
      best.ravel()[short_at] = np.maximum(
          np.minimum(want.ravel()[short_at], fit), 0)
    inside = window < best
    take = np.where(short, (best > 0) & ~(hit & inside).any(axis=0),
                    taken_whole)

    # Decide up to the first unsure attempt (excluded) or the first after
    # which the guess no longer holds (included).
    last = short & (take | taken_whole)
    if length_per_span:
      last |= ~take
    last = np.where(tail, take, last)
    if num_bulk:
      # A short attempt is judged against the words taken before the step.
      unsure |= short & contested
      decided = np.where(unsure, k, np.where(last, k + 1, block)).min(axis=0)
    else:
      decided = np.where(last, k + 1, block).min(axis=0)
    if drawn < num_attempts:   # Attempts not drawn yet wait for the next.
      decided = np.minimum(decided, drawn - pointer)
    decided_mask = k < decided
    take &= decided_mask

    flat_taken[cells[inside & take]] = True
    flat_begins[start[take]] = True
    budget -= np.where(take, cum[start + best] - cum[start], 0).sum(axis=0)
    accepted += take.sum(axis=0)
    pointer += decided
    tail |= (short & decided_mask).any(axis=0)
    keep = (budget > 0) & (pointer < num_attempts)
    stalled = np.flatnonzero(keep & ~take.any(axis=0))
    if stalled.size:
      # A row that took nothing goes on only while a free word fits.
      length = words.length[rows[stalled]]
      keep[stalled] = (~taken[rows[stalled], :width] & (length > 0) & (
          length <= budget[stalled, None])).any(axis=1)
    if not keep.all():
      remaining[rows] = budget
      rows, budget, pointer, accepted, tail = (
          rows[keep], budget[keep], pointer[keep], accepted[keep],
          tail[keep])
  return taken, begins, remaining


def _unit_first(words: _Words, taken, begins) -> np.ndarray:
  """int [B, W]: for each taken word, the first token of its span; else -1.

  A taken word's span begins at the latest begin at or before it, which is
  in its row: spans are numbered over the flattened [B, S] arrays.
  """
  width = words.length.shape[1]
  begin_at = np.flatnonzero(begins)
  span_first = np.concatenate([[-1], words.first.ravel()[
      begin_at // taken.shape[1] * width + begin_at % taken.shape[1]]])
  span = np.cumsum(begins.ravel(), dtype=np.int32) * taken.ravel()
  return span_first[span].reshape(taken.shape)[:, :width]


def _select_ngram(words: _Words, budget, seed, example_index, mask_epoch,
                  max_n: int):
  """ALBERT: start words in random order, n ~ 1/n over the n-grams there."""
  width = words.length.shape[1]
  order = _random_word_order(words, _unit_scores(seed, example_index,
                                                 mask_epoch, width))
  cdf = np.cumsum(ngram_probabilities(max_n))

  def attempts(begin, end):
    # n ~ 1/n over 1..max_n; an n-gram reaching past the end of its run of
    # words is cut there (ALBERT's slice of the candidate list, shortened).
    starts = order[:, begin:end]
    u = counter_rng.uniform(seed, Stream.MASK_UNIT_LENGTH,
                            mask_epoch[:, None], example_index[:, None],
                            starts)
    return starts, 1 + _sample(cdf, u)

  taken, begins, _ = _grow_spans(words, attempts, width, max_n, budget)
  return _expand(words, _unit_first(words, taken, begins))


def _select_span(words: _Words, budget, seed, example_index, mask_epoch,
                 config: MaskingConfig):
  """SpanBERT: spans of Geometric(p) words at uniform starts until covered.

  Attempts are drawn until the budget is met; a row whose free words are too
  fragmented for the remaining attempts is completed with single words.
  """
  cdf = np.cumsum(span_length_probabilities(
      config.span_geometric_p, config.span_lower, config.span_upper))
  last_word = np.maximum(words.count[:, None] - 1, 0)

  def attempts(begin, end):
    u_len, u_start = _uniforms(
        (Stream.MASK_UNIT_LENGTH, Stream.MASK_UNIT_START), seed,
        example_index, mask_epoch, np.arange(begin, end)[None, :])
    starts = np.minimum((u_start * words.count[:, None]).astype(np.int64),
                        last_word)
    return starts, config.span_lower + _sample(cdf, u_len)

  taken, begins, remaining = _grow_spans(
      words, attempts, 4 * config.max_predictions_per_seq + 8,
      config.span_upper, budget, length_per_span=True)
  if remaining.any():  # Fill what fragmentation left with single words.
    order = _random_word_order(words, _unit_scores(
        seed, example_index, mask_epoch, words.length.shape[1]))
    taken, begins, _ = _grow_spans(
        words, lambda begin, end: (order[:, begin:end], 1),
        words.length.shape[1], 1, remaining, (taken, begins))
  return _expand(words, _unit_first(words, taken, begins))


def _entity_word_starts(batch, candidates, config: MaskingConfig, seed,
                        example_index, mask_epoch) -> np.ndarray:
  """Word starts with each row's phrases or entities merged into one word.

  The row's level (0 word, 1 phrase, 2 entity) is drawn from
  ``entity_mixture``; at level 1 (2) every phrase (entity) of the row
  becomes a single unit, so whole-word selection masks it whole.
  """
  labels = np.asarray(batch['unit_labels'])
  u = counter_rng.uniform(seed, Stream.MASK_LEVEL, mask_epoch,
                          example_index)
  level = _sample(np.cumsum(config.entity_mixture), u)
  begin = np.where(level == 2, gazetteer_lib.ENTITY_BEGIN,
                   gazetteer_lib.PHRASE_BEGIN)[:, None]
  merged = (level > 0)[:, None]
  inside = merged & (labels == begin + 1)
  begins = merged & (labels == begin)
  word_starts = np.asarray(batch['word_starts'], bool) & ~inside | begins
  # The token after a merged unit starts a new unit.
  in_unit = np.pad(inside | begins, ((0, 0), (1, 0)))[:, :-1]
  return word_starts | (in_unit & ~inside & candidates)


# ---------------------------------------------------------------------------


def _replacement_ids(config: MaskingConfig, u: np.ndarray) -> np.ndarray:
  if config.random_source == 'unigram':
    return _sample(config.unigram_cdf, u)
  span = config.vocab_size - NUM_SPECIAL
  return NUM_SPECIAL + np.minimum((u * span).astype(np.int64), span - 1)


def mask_batch(batch: dict, config: MaskingConfig, seed: int) -> dict:
  """Adds masked-LM fields to a padded batch; corrupts ``input_ids``.

  Args:
    batch: numpy arrays with a leading batch axis: ``input_ids`` [B, L],
      ``attention_mask`` [B, L], ``example_index`` [B], ``mask_epoch`` [B],
      for word-based strategies ``word_starts`` bool [B, L], and for
      'entity' ``unit_labels`` int8 [B, L] (see gazetteer.py).
    config: masking knobs.
    seed: the data seed.

  Returns:
    A new dict: the batch with corrupted ``input_ids`` and
    ``masked_positions`` int32 [B, P], ascending, 0 in unused slots;
    ``masked_ids`` int32 [B, P], the original tokens; ``masked_weights``
    float32 [B, P], 1 for used slots; ``masked_corruption`` int8 [B, P]
    (0 [MASK], 1 random, 2 kept; 2 in unused slots); ``masked_unit_start``
    int32 [B, P], the position where each prediction's unit begins.
  """
  if config.vocab_size <= NUM_SPECIAL:
    raise ValueError(f'MaskingConfig.vocab_size={config.vocab_size}: set it '
                     'to the tokenizer\'s vocabulary size.')
  if config.random_source == 'unigram' and config.unigram_counts is None:
    raise ValueError('masking.random_source="unigram" needs the corpus '
                     'unigram_counts.')
  ids = batch['input_ids']
  batch_size, seq_len = ids.shape
  max_predictions = config.max_predictions_per_seq
  example_index = np.asarray(batch['example_index'], np.int64)
  mask_epoch = np.asarray(batch['mask_epoch'], np.int64)
  lengths = batch['attention_mask'].sum(axis=1)
  budget = num_to_predict(lengths, config.rate, max_predictions)
  candidates = maskable(ids)
  counters = (seed, example_index, mask_epoch)
  if config.strategy == 'token':
    selected, unit_key = _select_token(candidates, budget, *counters)
  else:
    if config.strategy == 'entity':  # Units: words, phrases or entities.
      word_starts = _entity_word_starts(batch, candidates, config, *counters)
    else:
      word_starts = np.asarray(batch['word_starts'], bool)
    words = _words(candidates, word_starts)
    if config.strategy in ('whole_word', 'entity'):
      selected, unit_key = _select_whole_word(words, budget, *counters)
    elif config.strategy == 'ngram':
      selected, unit_key = _select_ngram(words, budget, *counters,
                                         config.max_ngram)
    else:
      selected, unit_key = _select_span(words, budget, *counters, config)

  # Selected positions first, ascending; the budget keeps them <= P (a row
  # with more would keep its first P).
  count = selected.sum(axis=1)
  real = np.arange(max_predictions)[None, :] < count[:, None]
  chosen = np.flatnonzero(selected)   # Row after row, ascending.
  slot = np.arange(chosen.size) - np.repeat(np.cumsum(count) - count, count)
  positions = np.zeros((batch_size, max_predictions), np.int64)
  positions[real] = chosen[slot < max_predictions] % seq_len
  rows = np.arange(batch_size)[:, None]
  labels = ids[rows, positions]
  unit_start = np.where(real, unit_key[rows, positions], 0)

  # Corruption, keyed by position or by the unit's first position.
  key = unit_start if config.corruption_unit == 'unit' else positions
  u, u_replace = _uniforms((Stream.MASK_CORRUPT, Stream.MASK_REPLACE), seed,
                           example_index, mask_epoch,
                           np.stack([key, positions]))
  replacement = _replacement_ids(config, u_replace)
  use_mask = real & (u < config.mask_token_prob)
  use_random = real & ~use_mask & (
      u < config.mask_token_prob + config.random_token_prob)
  corrupted = np.where(use_mask, MASK_ID,
                       np.where(use_random, replacement, labels))
  new_ids = ids.copy()
  new_ids[np.broadcast_to(rows, positions.shape)[real], positions[real]] = (
      corrupted[real])
  out = dict(batch)
  out['input_ids'] = new_ids
  out['masked_positions'] = positions.astype(np.int32)
  out['masked_ids'] = np.where(real, labels, 0).astype(np.int32)
  out['masked_weights'] = real.astype(np.float32)
  out['masked_corruption'] = np.where(
      use_mask, CORRUPT_MASK, np.where(use_random, CORRUPT_RANDOM,
                                       CORRUPT_KEEP)).astype(np.int8)
  out['masked_unit_start'] = unit_start.astype(np.int32)
  return out


# ---------------------------------------------------------------------------
# Telemetry: what the masking actually did, summed over batches.

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
