"""A hand-built pre-tokenized corpus for the instance tests.

Token ``t`` of the global token stream has id ``NUM_SPECIAL + t``, so an id
says exactly which document and sentence it came from.
"""

import numpy as np

from data_pipelines import pretokenize
from data_pipelines.tokenizer import NUM_SPECIAL

MAX_SEQ_LENGTH = 64


class FakeCorpus:
  """A DocumentIndex and a random-access source built by hand.

  Token ``t`` of the global token stream has id ``NUM_SPECIAL + t``, so an id
  says exactly which document and sentence it came from.
  """

  def __init__(self, doc_lengths):
    self.doc_lengths = [list(map(int, d)) for d in doc_lengths]
    lengths = np.array([n for d in self.doc_lengths for n in d], np.int32)
    offsets = np.cumsum([0] + [len(d) for d in self.doc_lengths])
    self.index = pretokenize.DocumentIndex(
        lengths, offsets.astype(np.int64), np.zeros(8, np.int64))
    self.csum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    self.source = []
    for d in range(len(self.doc_lengths)):
      t0, t1 = self.csum[offsets[d]], self.csum[offsets[d + 1]]
      ids = np.arange(t0, t1, dtype=np.int32) + NUM_SPECIAL
      self.source.append({
          'token_ids': ids,
          'sentence_lengths': np.array(self.doc_lengths[d], np.int32),
          'word_starts': ids % 3 == 0,
          'unit_labels': np.zeros(len(ids), np.int8),
          'capitalized': ids % 5 == 0,
      })

  def tokens(self, start, end):
    """Global token positions of global sentences [start, end)."""
    return np.arange(self.csum[start], self.csum[end])

  def num_tokens(self, start, end):
    return int(self.csum[end] - self.csum[start])

  def doc_of_token(self, ids):
    sentence = np.searchsorted(self.csum, np.asarray(ids) - NUM_SPECIAL,
                               'right') - 1
    return np.searchsorted(self.index.document_offsets, sentence, 'right') - 1


def random_corpus(num_docs, seed, max_sentences=12, max_len=30,
                  long_prob=0.0):
  rng = np.random.default_rng(seed)
  docs = []
  for _ in range(num_docs):
    n = rng.integers(1, max_sentences + 1)
    lengths = rng.integers(1, max_len + 1, size=n)
    lengths[rng.random(n) < long_prob] = 3 * MAX_SEQ_LENGTH
    docs.append(lengths)
  return FakeCorpus(docs)
