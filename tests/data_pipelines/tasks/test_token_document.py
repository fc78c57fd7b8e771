"""Tests for ERNIE 2.0's token-document relation: the builder's labels
against a loop over the documents, and the task's weights."""

import numpy as np
import pytest

from data_pipelines import instances
from data_pipelines import tasks
from data_pipelines.tasks import token_document
from data_pipelines.tokenizer import NUM_SPECIAL

from fake_corpus import MAX_SEQ_LENGTH, random_corpus

LAYOUTS = ('nsp', 'sop', 'full_sentences', 'sentence_distance')
VOCAB = 150   # Distinct words: ids repeat within a document.


@pytest.fixture(scope='module')
def corpus():
  return random_corpus(40, seed=3, long_prob=0.05)


def _words(corpus):
  """The corpus's records with ids from a small vocabulary; each token's
  global position t (``corpus``'s id - NUM_SPECIAL) maps to id
  ``NUM_SPECIAL + hash(t) % VOCAB``, so the original ids still say where
  a token of the other source came from."""
  source = []
  for record in corpus.source:
    t = record['token_ids'].astype(np.int64) - NUM_SPECIAL
    source.append(dict(record, token_ids=(
        NUM_SPECIAL + (t * 2654435761 % 104729) % VOCAB).astype(np.int32)))
  return source


def _builders(corpus, layout):
  """Builders of the same instances: of ``corpus`` (ids that say where a
  token is) and of ``_words(corpus)`` with the labels."""
  config = instances.InstanceConfig(layout, MAX_SEQ_LENGTH, 0.1)
  with_labels = instances.InstanceConfig(layout, MAX_SEQ_LENGTH, 0.1,
                                         token_document=True)
  return (instances.InstanceBuilder(corpus.source, corpus.index, config, 5),
          instances.InstanceBuilder(_words(corpus), corpus.index,
                                    with_labels, 5))


def _expected(corpus, words, positions):
  """One row's labels by the definition, from the global positions of its
  tokens (-1 off the documents): 1 where the token's word occurs at a
  position of its document that the row does not hold."""
  document = corpus.doc_of_token(np.maximum(positions, 0) + NUM_SPECIAL)
  offsets = corpus.index.document_offsets
  used = set(positions.tolist())
  outside = {}   # Per document: the words at the positions not in the row.
  out = []
  for p, d in zip(positions.tolist(), document.tolist()):
    if p < 0:
      out.append(0)
      continue
    if d not in outside:
      outside[d] = {words[q] for q in range(corpus.csum[offsets[d]],
                                            corpus.csum[offsets[d + 1]])
                    if q not in used}
    out.append(int(words[p] in outside[d]))
  return out


@pytest.mark.parametrize('layout', LAYOUTS)
def test_labels_are_the_words_found_elsewhere_in_the_document(corpus,
                                                              layout):
  positions_builder, words_builder = _builders(corpus, layout)
  words = np.concatenate([r['token_ids'] for r in words_builder.source])
  plan = positions_builder.plan(0)
  ks = np.arange(len(plan))[::-1][:80]
  positions = positions_builder.materialize_batch(plan, ks, 0)['input_ids']
  batch = words_builder.materialize_batch(plan, ks, 0)
  labels = batch['token_document_labels']
  assert labels.dtype == np.int32 and labels.shape == positions.shape
  positions = np.where(positions >= NUM_SPECIAL,
                       positions.astype(np.int64) - NUM_SPECIAL, -1)
  for row in range(len(ks)):
    assert labels[row].tolist() == _expected(corpus, words, positions[row])
  # Both answers are common.
  real = positions >= 0
  assert 0.1 < labels[real].mean() < 0.95


def test_labels_only_when_asked(corpus):
  builder = instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig('nsp', MAX_SEQ_LENGTH), 0)
  batch = builder.materialize_batch(builder.plan(0), np.arange(4), 0)
  assert 'token_document_labels' not in batch


def test_the_task_weighs_every_real_token_that_is_not_a_special(corpus):
  _, words_builder = _builders(corpus, 'full_sentences')
  batch = words_builder.materialize_batch(words_builder.plan(0),
                                          np.arange(6), 0)
  out = token_document.token_document_fields(batch, {}, seed=0)
  np.testing.assert_array_equal(out['token_document_weights'],
                                batch['input_ids'] >= NUM_SPECIAL)
  assert out['token_document_weights'].dtype == np.float32
  assert out['token_document_labels'] is batch['token_document_labels']
  with pytest.raises(ValueError, match='token_document=True'):
    token_document.token_document_fields(
        {'sentence_ids': batch['sentence_ids']}, {}, seed=0)


def test_the_task_is_registered():
  task = tasks.get('token_document')
  assert (task.head, task.num_classes({}, 128), task.label_field,
          task.weight_field, task.instance_flags, task.corrupts) == (
              'token', 2, 'token_document_labels', 'token_document_weights',
              ('token_document',), False)
  assert task.fields({}, 128) == {
      'token_document_labels': ((128,), np.int32),
      'token_document_weights': ((128,), np.float32)}
