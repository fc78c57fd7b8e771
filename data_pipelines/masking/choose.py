"""Choose: each strategy's units, in a random order, up to each row's budget.

Every chooser returns (selected bool [B, L], unit_key int [B, L]): the
chosen positions and, for each, the position of its unit's first token.

- token: tokens by a random score, the budget's lowest.
- whole_word and entity: words in a random order, each taken if it still
  fits (entity merges each row's phrases or entities into words first).
- ngram: start words in a random order, n ~ 1/n words there.
- span: Geometric(p) words at uniform start words until the budget is met,
  then single words where fragmentation left room.
"""

from __future__ import annotations

import functools

import numpy as np

from data_pipelines.counter_rng import Stream
from data_pipelines.masking import spans
from data_pipelines.masking import units
from data_pipelines.masking.config import MaskingConfig
from data_pipelines.masking.draws import Counters
from data_pipelines.masking.draws import sample


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


def choose_units(batch: dict, config: MaskingConfig, budget: np.ndarray,
                 counters: Counters):
  """The units of ``config.strategy``, chosen up to ``budget`` (int [B]).

  Reads ``input_ids`` [B, L] and, for word-based strategies,
  ``word_starts`` bool [B, L] (and for 'entity' ``unit_labels`` int8
  [B, L]) from the batch.
  """
  candidates = units.maskable(batch['input_ids'])
  if config.strategy == 'token':
    return choose_tokens(candidates, budget, counters)
  word_starts = np.asarray(batch['word_starts'], bool)
  if config.strategy == 'entity':  # Units: words, phrases or entities.
    level = sample(np.cumsum(config.entity_mixture),
                   counters.per_row(Stream.MASK_LEVEL))
    word_starts = units.merge_units(
        word_starts, np.asarray(batch['unit_labels']), candidates, level)
  words = units.segment_words(candidates, word_starts)
  if config.strategy in ('whole_word', 'entity'):
    return choose_whole_words(words, budget, counters)
  if config.strategy == 'ngram':
    return choose_ngrams(words, budget, counters, config.max_ngram)
  return choose_spans(words, budget, counters, config.span_geometric_p,
                      config.span_lower, config.span_upper,
                      config.max_predictions_per_seq)


def _scores(counters: Counters, width: int) -> np.ndarray:
  """float [B, width]: a random score per token or word, for an order."""
  return counters.uniform(Stream.MASK_SELECT, np.arange(width)[None, :])


def _random_word_order(words: units.Words, scores) -> np.ndarray:
  """int [B, W]: each row's words by ``scores`` (absent words last)."""
  width = words.length.shape[1]
  scores = np.where(np.arange(width)[None, :] < words.count[:, None], scores,
                    np.inf)
  return np.argsort(scores, axis=1)


def choose_tokens(candidates: np.ndarray, budget: np.ndarray,
                  counters: Counters):
  """BERT: the ``budget`` maskable tokens (bool [B, L]) of lowest score."""
  seq_len = candidates.shape[1]
  scores = np.where(candidates, _scores(counters, seq_len), np.inf)
  rank = np.argsort(np.argsort(scores, axis=1), axis=1)
  selected = candidates & (rank < budget[:, None])
  return selected, np.broadcast_to(np.arange(seq_len), selected.shape)


def choose_whole_words(words: units.Words, budget: np.ndarray,
                       counters: Counters):
  """BERT-wwm: words in random order; each is taken if it still fits."""
  order = _random_word_order(words, _scores(counters,
                                            words.length.shape[1]))
  lengths = np.take_along_axis(words.length, order, axis=1)   # 0 = no word
  taken_sorted = _take_while_fits(lengths, budget)
  taken = np.zeros_like(taken_sorted)
  np.put_along_axis(taken, order, taken_sorted, axis=1)
  return units.expand(words, np.where(taken, words.first, -1))


def _take_while_fits(lengths: np.ndarray, budget: np.ndarray) -> np.ndarray:
  """bool [B, W]: a greedy scan over ``lengths`` (int [B, W] tokens, in
  scan order, 0 = no word) taking each word that fits what is left.

  The scan in closed form: every word before the first one that does not
  fit is taken (a prefix of the cumulative lengths); after it, each step
  takes the next word short enough for what is left, so the steps are
  bounded by the budget left after the prefix, not by the number of words.
  """
  batch_size, width = lengths.shape
  rows = np.arange(batch_size)
  cum = np.cumsum(lengths, axis=1)
  taken = (cum <= budget[:, None]) & (lengths > 0)
  remaining = budget - np.where(taken, lengths, 0).sum(axis=1)
  position = taken.sum(axis=1)   # The first word that did not fit.
  columns = np.arange(width)[None, :]
  while True:
    fits = ((columns > position[:, None]) & (lengths > 0)
            & (lengths <= remaining[:, None]))
    found = fits.any(axis=1)
    if not found.any():
      return taken
    position = np.where(found, fits.argmax(axis=1), width)
    hit = rows[found]
    taken[hit, position[found]] = True
    remaining[hit] -= lengths[hit, position[found]]


def choose_ngrams(words: units.Words, budget: np.ndarray, counters: Counters,
                  max_n: int):
  """ALBERT: start words in random order, n ~ 1/n over the n-grams there."""
  width = words.length.shape[1]
  order = _random_word_order(words, _scores(counters, width))
  attempts = functools.partial(_ngram_attempts, order,
                               np.cumsum(ngram_probabilities(max_n)),
                               counters)
  taken, begins, _ = spans.grow_spans(words, attempts, width, max_n, budget)
  return units.expand(words, spans.unit_first(words, taken, begins))


def _ngram_attempts(order, cdf, counters: Counters, begin: int, end: int):
  """Attempts begin..end - 1: start words [B, N] and n ~ 1/n over 1..max_n.

  An n-gram reaching past the end of its run of words is cut there. ALBERT
  slices its candidate list, which skips [CLS] and [SEP], so its n-grams
  are cut only at the sequence's end and may run from one segment into
  the next; here they stop at [SEP] (a departure).
  """
  starts = order[:, begin:end]
  u = counters.uniform(Stream.MASK_UNIT_LENGTH, starts)
  return starts, 1 + sample(cdf, u)


def choose_spans(words: units.Words, budget: np.ndarray, counters: Counters,
                 p: float, lower: int, upper: int, max_predictions: int):
  """SpanBERT: spans of Geometric(p) words in [lower, upper] at uniform
  start words until the budget is met.

  Rows get ``4 * max_predictions + 8`` attempts; a row whose free words are
  too fragmented for them is completed with single words.
  """
  width = words.length.shape[1]
  attempts = functools.partial(
      _span_attempts, words.count,
      np.cumsum(span_length_probabilities(p, lower, upper)), lower, counters)
  taken, begins, remaining = spans.grow_spans(
      words, attempts, 4 * max_predictions + 8, upper, budget,
      length_per_span=True)
  if remaining.any():  # Fill what fragmentation left with single words.
    order = _random_word_order(words, _scores(counters, width))
    taken, begins, _ = spans.grow_spans(
        words, lambda begin, end: (order[:, begin:end], 1), width, 1,
        remaining, (taken, begins))
  return units.expand(words, spans.unit_first(words, taken, begins))


def _span_attempts(count, cdf, lower: int, counters: Counters, begin: int,
                   end: int):
  """Attempts begin..end - 1: start words uniform over each row's ``count``
  words (int [B]), [B, N], and lengths ``lower`` + (index drawn from
  ``cdf``), one per accepted span."""
  u_len, u_start = counters.uniforms(
      (Stream.MASK_UNIT_LENGTH, Stream.MASK_UNIT_START),
      np.arange(begin, end)[None, :])
  starts = np.minimum((u_start * count[:, None]).astype(np.int64),
                      np.maximum(count[:, None] - 1, 0))
  return starts, lower + sample(cdf, u_len)
