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
    index: int [B, L], word number of each maskable token, -1 elsewhere.
    count: int [B], words per row.
    length: int [B, W], tokens per word (0 past ``count``).
    first: int [B, W], position of each word's first token.
    cum: int [B, W + 1], tokens before word w (cum[:, w + 1] - cum[:, w] =
      length[:, w]).
    run_end: int [B, W], the last word of each word's run of adjacent
      maskable tokens: a unit never crosses a special ([SEP]).
  """
  index: np.ndarray
  count: np.ndarray
  length: np.ndarray
  first: np.ndarray
  cum: np.ndarray
  run_end: np.ndarray


def _words(candidates: np.ndarray, word_starts: np.ndarray) -> _Words:
  batch_size, seq_len = candidates.shape
  previous = np.pad(candidates, ((0, 0), (1, 0)))[:, :-1]
  starts = candidates & (word_starts | ~previous)
  index = np.where(candidates, np.cumsum(starts, axis=1) - 1, -1)
  count = starts.sum(axis=1)
  width = max(int(count.max()), 1)
  rows, cols = np.nonzero(candidates)
  flat = rows * width + index[rows, cols]
  length = np.bincount(flat, minlength=batch_size * width).reshape(
      batch_size, width)
  first = np.zeros((batch_size, width), np.int64)
  start_rows, start_cols = np.nonzero(starts)
  start_words = index[start_rows, start_cols]
  first[start_rows, start_words] = start_cols
  cum = np.pad(np.cumsum(length, axis=1), ((0, 0), (1, 0)))
  new_run = np.zeros((batch_size, width), bool)
  new_run[start_rows, start_words] = ~previous[start_rows, start_cols]
  w = np.arange(width)[None, :]
  new_run |= w >= count[:, None]
  following = np.where(new_run, w, width)
  following = np.minimum.accumulate(following[:, ::-1], axis=1)[:, ::-1]
  following = np.pad(following, ((0, 0), (0, 1)), constant_values=width)[:, 1:]
  run_end = np.minimum(following, count[:, None]) - 1
  return _Words(index, count, length, first, cum, run_end)


def _unit_scores(seed, example_index, mask_epoch, width) -> np.ndarray:
  return counter_rng.uniform(seed, Stream.MASK_SELECT, mask_epoch[:, None],
                             example_index[:, None],
                             np.arange(width)[None, :])


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
  order = _random_word_order(words, seed, example_index, mask_epoch)
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
  return _expand(words, taken, np.broadcast_to(np.arange(width), taken.shape))


def _random_word_order(words: _Words, seed, example_index, mask_epoch):
  """int [B, W]: each row's words in random order (absent words last)."""
  width = words.length.shape[1]
  scores = _unit_scores(seed, example_index, mask_epoch, width)
  scores = np.where(np.arange(width)[None, :] < words.count[:, None], scores,
                    np.inf)
  return np.argsort(scores, axis=1)


def _expand(words: _Words, taken, span_start):
  """Word-level choices -> token-level selection and unit keys."""
  batch_size = words.index.shape[0]
  rows = np.arange(batch_size)[:, None]
  index = np.maximum(words.index, 0)
  selected = (words.index >= 0) & taken[rows, index]
  unit_first_word = span_start[rows, index]
  return selected, words.first[rows, unit_first_word]


def _grow_spans(words: _Words, starts, lengths, max_len, remaining,
                covered=None, begins=None, length_per_span: bool = False):
  """Takes spans (start word, length in words) in order where they fit.

  A span overlapping a taken word is skipped; one longer than the remaining
  budget is shrunk to the longest prefix of whole words that fits. The loop
  runs over attempts, vectorized over the rows that still have budget.

  Args:
    words: the batch's words.
    starts: int [B, A], start word of each attempt, in order.
    lengths: int [B, A], wanted length in words (>= 1), per attempt or,
      with ``length_per_span``, per accepted span: a rejected attempt then
      keeps its length for the next start, so overlaps do not bias the
      lengths towards short spans.
    max_len: the largest value in ``lengths``.
    remaining: int [B], budget left (an updated copy is returned).
    covered, begins: state of an earlier call to continue from.

  Returns:
    covered bool [B, W + max_len] (words taken), begins bool [B, W +
    max_len] (words that start a span), remaining int [B].
  """
  batch_size, width = words.length.shape
  if covered is None:
    covered = np.zeros((batch_size, width + max_len), bool)
    begins = np.zeros((batch_size, width + max_len), bool)
  remaining = remaining.copy()
  offsets = np.arange(max_len)
  cum = np.pad(words.cum, ((0, 0), (0, max_len)), mode='edge')
  run_end = np.pad(words.run_end, ((0, 0), (0, 1)))
  accepted = np.zeros(batch_size, np.int64)
  active = np.flatnonzero(remaining > 0)
  for j in range(starts.shape[1]):
    if not active.size:
      break
    s = starts[active, j]
    wanted = lengths[active, np.minimum(accepted[active], lengths.shape[1] - 1)
                     if length_per_span else j]
    # Never past the run of maskable words (a [SEP] or the row's end).
    wanted = np.where(s < words.count[active],
                      np.minimum(wanted, run_end[active, s] + 1 - s), 0)
    window = s[:, None] + offsets                      # [A, K] word numbers
    rows = active[:, None]
    # Tokens in the first k + 1 words from s; increasing in k.
    tokens = cum[rows, window + 1] - cum[active, s][:, None]
    best = np.minimum(wanted, (tokens <= remaining[active, None]).sum(axis=1))
    inside = offsets[None, :] < best[:, None]
    take = (best > 0) & ~(covered[rows, window] & inside).any(axis=1)
    covered[rows, window] |= inside & take[:, None]
    begins[active[take], s[take]] = True
    accepted[active[take]] += 1
    remaining[active] -= np.where(take, tokens[np.arange(len(active)),
                                               np.maximum(best - 1, 0)], 0)
    active = active[remaining[active] > 0]
    if j % 8 == 7 and active.size:
      # Drop rows where no free word fits the budget any more.
      free = ~covered[active, :width] & (
          words.length[active] <= remaining[active, None]) & (
              words.length[active] > 0)
      active = active[free.any(axis=1)]
  return covered, begins, remaining


def _span_starts(begins: np.ndarray) -> np.ndarray:
  """For each word, the word where its span begins (latest begin <= it)."""
  index = np.where(begins, np.arange(begins.shape[1])[None, :], 0)
  return np.maximum.accumulate(index, axis=1)


def _select_ngram(words: _Words, budget, seed, example_index, mask_epoch,
                  max_n: int):
  """ALBERT: start words in random order, n ~ 1/n over the n-grams there."""
  width = words.length.shape[1]
  starts = _random_word_order(words, seed, example_index, mask_epoch)
  # n ~ 1/n over 1..max_n; an n-gram reaching past the end of its run of
  # words is cut there (ALBERT's slice of the candidate list, shortened).
  u = counter_rng.uniform(seed, Stream.MASK_UNIT_LENGTH, mask_epoch[:, None],
                          example_index[:, None], starts)
  n = 1 + _sample(np.cumsum(ngram_probabilities(max_n)), u)
  covered, begins, _ = _grow_spans(words, starts, n, max_n, budget)
  return _expand(words, covered[:, :width], _span_starts(begins[:, :width]))


def _select_span(words: _Words, budget, seed, example_index, mask_epoch,
                 config: MaskingConfig):
  """SpanBERT: spans of Geometric(p) words at uniform starts until covered.

  Attempts are drawn until the budget is met; a row whose free words are too
  fragmented for the remaining attempts is completed with single words.
  """
  probs = span_length_probabilities(config.span_geometric_p,
                                    config.span_lower, config.span_upper)
  attempts = 4 * config.max_predictions_per_seq + 8
  a = np.arange(attempts)[None, :]
  u_len = counter_rng.uniform(seed, Stream.MASK_UNIT_LENGTH,
                              mask_epoch[:, None], example_index[:, None], a)
  lengths = config.span_lower + _sample(np.cumsum(probs), u_len)
  u_start = counter_rng.uniform(seed, Stream.MASK_UNIT_START,
                                mask_epoch[:, None], example_index[:, None], a)
  starts = np.minimum((u_start * words.count[:, None]).astype(np.int64),
                      np.maximum(words.count[:, None] - 1, 0))
  covered, begins, remaining = _grow_spans(
      words, starts, lengths, config.span_upper, budget,
      length_per_span=True)
  width = words.length.shape[1]
  if remaining.any():  # Fill what fragmentation left with single words.
    fill = _random_word_order(words, seed, example_index, mask_epoch)
    covered, begins, _ = _grow_spans(
        words, fill, np.ones_like(fill), config.span_upper, remaining,
        covered, begins)
  return _expand(words, covered[:, :width], _span_starts(begins[:, :width]))


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
    words = _words(candidates, np.asarray(batch['word_starts'], bool))
    if config.strategy == 'whole_word':
      selected, unit_key = _select_whole_word(words, budget, *counters)
    elif config.strategy == 'entity':
      words = _words(candidates, _entity_word_starts(
          batch, candidates, config, *counters))
      selected, unit_key = _select_whole_word(words, budget, *counters)
    elif config.strategy == 'ngram':
      selected, unit_key = _select_ngram(words, budget, *counters,
                                         config.max_ngram)
    else:
      selected, unit_key = _select_span(words, budget, *counters, config)

  # Selected positions first, ascending; the budget keeps them <= P.
  order = np.argsort(~selected, axis=1, kind='stable')
  if seq_len < max_predictions:
    order = np.pad(order, ((0, 0), (0, max_predictions - seq_len)))
  positions = order[:, :max_predictions]
  rows = np.arange(batch_size)[:, None]
  real = np.arange(max_predictions)[None, :] < selected.sum(1)[:, None]
  positions = np.where(real, positions, 0)
  labels = ids[rows, positions]
  unit_start = np.where(real, unit_key[rows, positions], 0)

  # Corruption, keyed by position or by the unit's first position.
  key = unit_start if config.corruption_unit == 'unit' else positions
  key_counters = (mask_epoch[:, None], example_index[:, None], key)
  u = counter_rng.uniform(seed, Stream.MASK_CORRUPT, *key_counters)
  replacement = _replacement_ids(config, counter_rng.uniform(
      seed, Stream.MASK_REPLACE, mask_epoch[:, None], example_index[:, None],
      positions))
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
