"""Tests for the per-token fields of a materialized batch beyond the ids:
``sentence_ids`` and the record flags packed with them (``capitalized``,
``unit_labels``, ``word_starts``)."""

import numpy as np
import pytest

from data_pipelines import instances
from data_pipelines.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID

from fake_corpus import MAX_SEQ_LENGTH, random_corpus

LAYOUTS = ('nsp', 'sop', 'full_sentences', 'sentence_distance')


@pytest.fixture(scope='module')
def corpus():
  # Some sentences longer than an instance: truncation cuts them.
  corpus = random_corpus(60, seed=7, long_prob=0.05)
  # Unit labels 0-4 and capitalization on tokens of every kind, to see
  # that the flags packed into one byte come back apart.
  for record in corpus.source:
    ids = record['token_ids']
    record['unit_labels'] = (ids % 5).astype(np.int8)
    record['capitalized'] = ids % 7 < 3
  return corpus


def _batch(corpus, layout):
  builder = instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig(layout, MAX_SEQ_LENGTH, 0.1), seed=2)
  plan = builder.plan(1)
  return builder.materialize_batch(plan, np.arange(len(plan))[::-1], 1)


def _expected_sentence_ids(corpus, ids):
  """A row's sentence ids by the definition: the sentences in their order
  of first appearance, -1 off the documents' tokens."""
  order, out = {}, []
  for token in ids.tolist():
    if token in (CLS_ID, SEP_ID, PAD_ID):
      out.append(-1)
      continue
    sentence = int(np.searchsorted(corpus.csum, token - NUM_SPECIAL,
                                   'right')) - 1
    out.append(order.setdefault(sentence, len(order)))
  return out


@pytest.mark.parametrize('layout', LAYOUTS)
def test_sentence_ids_number_the_sentences_of_each_row(corpus, layout):
  batch = _batch(corpus, layout)
  sentence_ids = batch['sentence_ids']
  assert sentence_ids.dtype == np.int32
  assert sentence_ids.shape == (len(sentence_ids), MAX_SEQ_LENGTH)
  lengths = np.diff(corpus.csum)
  cut = 0   # Sentences that truncation cut, still numbered.
  for row, ids in enumerate(batch['input_ids']):
    assert sentence_ids[row].tolist() == _expected_sentence_ids(corpus, ids)
    n = int(batch['attention_mask'][row].sum())
    real = sentence_ids[row, :n] >= 0
    sentences = np.searchsorted(corpus.csum, ids[:n][real] - NUM_SPECIAL,
                                'right') - 1
    numbered, count = np.unique(sentences, return_counts=True)
    cut += int((count < lengths[numbered]).sum())
    if layout != 'full_sentences':
      # B's sentences are numbered after A's.
      a_or_b = batch['token_type_ids'][row, :n][real]
      numbers = sentence_ids[row, :n][real]
      assert numbers[a_or_b == 1].min() > numbers[a_or_b == 0].max()
  assert cut > 0 and sentence_ids.max() >= 3


@pytest.mark.parametrize('layout', LAYOUTS)
def test_the_record_flags_come_back_apart(corpus, layout):
  batch = _batch(corpus, layout)
  ids = batch['input_ids']
  real = ids >= NUM_SPECIAL
  np.testing.assert_array_equal(batch['capitalized'], real & (ids % 7 < 3))
  np.testing.assert_array_equal(batch['unit_labels'],
                                np.where(real, ids % 5, 0))
  np.testing.assert_array_equal(batch['word_starts'],
                                np.isin(ids, [CLS_ID, SEP_ID])
                                | (real & (ids % 3 == 0)))
  assert batch['capitalized'].dtype == bool
  assert batch['unit_labels'].dtype == np.int8
