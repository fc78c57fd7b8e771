"""The masking knobs: ``MaskingConfig``, the config's ``masking`` section."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from data_pipelines.tokenizer import NUM_SPECIAL

STRATEGIES = ('token', 'whole_word', 'ngram', 'span', 'entity')
CORRUPTION_UNITS = ('token', 'unit')
RANDOM_SOURCES = ('uniform', 'unigram')


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
    split_punctuation: word units split at punctuation (``punctuation``:
      bool [vocab_size], the tokenizer's ``punctuation_table``), each
      punctuation piece a word, as BERT's basic tokenizer makes it.
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
  split_punctuation: bool = False
  punctuation: np.ndarray | None = dataclasses.field(
      default=None, compare=False, repr=False)

  @classmethod
  def from_config(cls, m, vocab_size: int = 0, unigram_counts=None,
                  punctuation=None) -> 'MaskingConfig':
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
        vocab_size=vocab_size, unigram_counts=unigram_counts,
        split_punctuation=bool(getattr(m, 'split_punctuation', False)),
        punctuation=punctuation)

  @functools.cached_property
  def unigram_cdf(self) -> np.ndarray:
    """CDF of the non-special unigram distribution (built once, not per
    batch)."""
    counts = np.array(self.unigram_counts, np.float64)[:self.vocab_size]
    counts[:NUM_SPECIAL] = 0
    return np.cumsum(counts) / counts.sum()

  def validate(self) -> None:
    """Fails with a message naming the config field when a knob is out of
    range."""
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
