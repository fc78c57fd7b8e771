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

``mask_batch`` is three steps, one module each:

  units.py      units: what may be masked, words (with ERNIE's phrases or
                entities merged), each row's budget
  choose.py     choose: each strategy samples its units in a random order
                and takes them up to the budget (spans.py: ngram and span
                attempts, taken in order where they fit)
  replace.py    replace: the chosen positions in P slots, corrupted

draws.py holds the counter-based random numbers they all use, config.py the
knobs and telemetry.py the counts of what the masking did.
"""

from __future__ import annotations

import numpy as np

from data_pipelines.masking import choose
from data_pipelines.masking import replace
from data_pipelines.masking.choose import ngram_probabilities
from data_pipelines.masking.choose import span_length_probabilities
from data_pipelines.masking.config import CORRUPTION_UNITS
from data_pipelines.masking.config import MaskingConfig
from data_pipelines.masking.config import RANDOM_SOURCES
from data_pipelines.masking.config import STRATEGIES
from data_pipelines.masking.draws import Counters
from data_pipelines.masking.replace import CORRUPT_KEEP
from data_pipelines.masking.replace import CORRUPT_MASK
from data_pipelines.masking.replace import CORRUPT_RANDOM
from data_pipelines.masking.telemetry import audit
from data_pipelines.masking.telemetry import HISTOGRAM_BINS
from data_pipelines.masking.telemetry import NUM_STATISTICS
from data_pipelines.masking.telemetry import statistics
from data_pipelines.masking.telemetry import summarize_statistics
from data_pipelines.masking.units import maskable
from data_pipelines.masking.units import num_to_predict

__all__ = [
    'CORRUPT_KEEP', 'CORRUPT_MASK', 'CORRUPT_RANDOM', 'CORRUPTION_UNITS',
    'HISTOGRAM_BINS', 'MaskingConfig', 'NUM_STATISTICS', 'RANDOM_SOURCES',
    'STRATEGIES', 'audit', 'mask_batch', 'maskable', 'ngram_probabilities',
    'num_to_predict', 'span_length_probabilities', 'statistics',
    'summarize_statistics',
]


def split_at_punctuation(word_starts: np.ndarray, ids: np.ndarray,
                         attention_mask: np.ndarray,
                         punctuation: np.ndarray) -> np.ndarray:
  """``word_starts`` [B, L] with a word starting at every punctuation piece
  and at the real token after one: BERT's basic tokenizer's words
  (``committee,`` is two words)."""
  punct = punctuation[ids]
  after = np.zeros_like(punct)
  after[:, 1:] = punct[:, :-1]
  return (word_starts | punct | after) & (attention_mask > 0)


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
  replace.check_vocabulary(config)
  if config.split_punctuation:
    batch = dict(batch, word_starts=split_at_punctuation(
        batch['word_starts'], batch['input_ids'], batch['attention_mask'],
        config.punctuation))
  counters = Counters.of_batch(batch, seed)
  budget = num_to_predict(batch['attention_mask'].sum(axis=1), config.rate,
                          config.max_predictions_per_seq)    # Tokens, [B].
  # Sample units and choose them up to the budget: [B, L] each.
  selected, unit_key = choose.choose_units(batch, config, budget, counters)
  # Replace: the chosen positions in [B, P] slots, corrupted.
  slots = replace.pack(selected, unit_key, config.max_predictions_per_seq)
  return replace.corrupt(batch, slots, config, counters)
