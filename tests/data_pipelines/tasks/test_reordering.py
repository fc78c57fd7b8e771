"""ERNIE 2.0's sentence reordering: classes by hand, decoding a label
un-permutes the row, the class distribution, determinism, config check."""

import itertools
import math

import numpy as np
import pytest

from data_pipelines import tasks
from data_pipelines.tasks import reordering
from data_pipelines.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID

VOCAB_SIZE = 1000
SEED = 5


def token_flags(ids):
  """word_starts, unit_labels and capitalized [B, L] as functions of the
  tokens ``ids`` [B, L], so a test can follow the tokens. An ordinary
  token starts a word unless it is a multiple of 3."""
  ordinary = ids >= NUM_SPECIAL
  return {'word_starts': (ids != PAD_ID) & (~ordinary | (ids % 3 != 0)),
          'unit_labels': np.where(ordinary, ids % 2, 0).astype(np.int8),
          'capitalized': ordinary & (ids % 5 == 0)}


def make_batch(rows, seq_len, first_index=0, mask_epoch=0):
  """A full_sentences batch of ``rows``: each a list of documents (ended by
  [SEP]), each a list of sentences, each a list of token ids >=
  NUM_SPECIAL (fields from ``token_flags``)."""
  shape = (len(rows), seq_len)
  ids = np.full(shape, PAD_ID, np.int32)
  sentence_ids = np.full(shape, -1, np.int32)
  for b, documents in enumerate(rows):
    tokens, sentences = [CLS_ID], [-1]
    for document in documents:
      for sentence in document:
        tokens += sentence
        sentences += [max(sentences) + 1] * len(sentence)
      tokens.append(SEP_ID)
      sentences.append(-1)
    ids[b, :len(tokens)] = tokens
    sentence_ids[b, :len(tokens)] = sentences
  return {
      'input_ids': ids,
      'token_type_ids': np.zeros(shape, np.int32),
      'attention_mask': (ids != PAD_ID).astype(np.int32),
      'sentence_ids': sentence_ids,
      **token_flags(ids),
      'example_index': np.arange(first_index, first_index + len(rows),
                                 dtype=np.int64),
      'mask_epoch': np.full(len(rows), mask_epoch, np.int64),
      'next_sentence_label': np.zeros(len(rows), np.int32),
  }


def random_rows(rng, num_rows, max_tokens, num_documents=2):
  """Rows of unique tokens, sentences of 1-6 tokens, at most
  ``max_tokens`` tokens and [SEP]s between [CLS] and the final [SEP]."""
  rows = []
  for _ in range(num_rows):
    pool = iter(rng.permutation(np.arange(NUM_SPECIAL, VOCAB_SIZE)).tolist())
    budget = int(rng.integers(max_tokens // 2, max_tokens + 1))
    documents = []
    for _ in range(num_documents):
      share, sentences = budget // num_documents - 1, []
      while share > 0 or not sentences:
        n = max(1, min(share, int(rng.integers(1, 7))))
        sentences.append([next(pool) for _ in range(n)])
        share -= n
      documents.append(sentences)
    rows.append(documents)
  return rows


def apply(batch, m=3):
  task = tasks.get('sentence_reordering')
  params = dict(task.defaults(), weight=1.0, m=m, vocab_size=VOCAB_SIZE,
                max_seq_length=batch['input_ids'].shape[1])
  return task.apply(batch, params, SEED)


def real_tokens(batch, row):
  return batch['input_ids'][row][batch['attention_mask'][row] > 0].tolist()


def decoded(label):
  """(n, new_to_old) of a class, by counting permutations in
  lexicographic order (itertools' order)."""
  n = 1
  while label >= math.factorial(n):
    label -= math.factorial(n)
    n += 1
  return n, list(itertools.permutations(range(n)))[label]


def unpermutes(new_content, old_content, new_to_old):
  """Whether some cut of ``new_content`` into len(new_to_old) non-empty
  pieces (slot s holding original piece new_to_old[s]) gives
  ``old_content`` when the pieces are put back in their original order."""
  n = len(new_to_old)
  for cuts in itertools.combinations(range(1, len(new_content)), n - 1):
    bounds = (0,) + cuts + (len(new_content),)
    pieces = [new_content[a:b] for a, b in zip(bounds, bounds[1:])]
    slot_of = {old: slot for slot, old in enumerate(new_to_old)}
    if [t for old in range(n) for t in pieces[slot_of[old]]] == old_content:
      return True
  return False


# ---------------------------------------------------------------------------
# Classes.


@pytest.mark.parametrize('new_to_old, expected', [
    ((0,), 0),
    ((0, 1), 1),            # 1! + 0.
    ((1, 0), 2),            # 1! + 1.
    ((0, 1, 2), 3),         # 1! + 2! + 0.
    ((2, 0, 1), 7),         # 1! + 2! + 4: 012 021 102 120 [201] 210.
    ((2, 1, 0), 8),
    ((3, 2, 1, 0), 32),     # 1! + 2! + 3! + 23.
    ((1, 0, 3, 2), 16),     # 9 + 1 * 3! + 0 * 2! + 1 * 1!.
])
def test_class_of_a_known_permutation(new_to_old, expected):
  n = len(new_to_old)
  padded = np.array([list(new_to_old) + list(range(n, 4))])
  assert reordering.permutation_class(padded, np.array([n])).tolist() == [
      expected]


def test_classes_count_permutations_in_lexicographic_order():
  rows, ns = [], []
  for n in range(1, 6):
    for p in itertools.permutations(range(n)):
      rows.append(list(p) + list(range(n, 5)))
      ns.append(n)
  classes = reordering.permutation_class(np.array(rows), np.array(ns))
  assert classes.tolist() == list(range(reordering.num_classes(5)))
  assert [reordering.num_classes(m) for m in (1, 3, 7, 8)] == [
      1, 9, 5913, 46233]


# ---------------------------------------------------------------------------
# The task on rows.


def test_decoding_the_label_and_unpermuting_gives_the_original():
  rng = np.random.default_rng(0)
  before = make_batch(random_rows(rng, 150, 14), 20)
  after = apply(before, m=4)
  seen = set()
  for row in range(150):
    old, new = real_tokens(before, row), real_tokens(after, row)
    assert new[0] == CLS_ID and new[-1] == SEP_ID and len(new) == len(old)
    n, new_to_old = decoded(int(after['sentence_reordering_label'][row]))
    assert unpermutes(new[1:-1], old[1:-1], new_to_old)
    seen.add(n)
  assert seen == {1, 2, 3, 4}
  for name, values in token_flags(after['input_ids']).items():
    assert np.array_equal(after[name], values), name
  assert np.array_equal(after['attention_mask'], after['input_ids'] != PAD_ID)


def orders_of(blocks):
  """Every concatenation of ``blocks`` (lists of tokens) in some order."""
  return [sum(p, []) for p in itertools.permutations(blocks)]


def test_cuts_at_sentence_starts_keep_sentences_whole():
  # Three sentences: n - 1 <= 2 cuts, all at sentence starts; the document
  # [SEP] stays with the sentence before it.
  row = [[[10, 11, 12], [13, 14]], [[16, 17]]]
  before = make_batch([row] * 300, 12)
  after = apply(before)
  contents = orders_of([[10, 11, 12], [13, 14, SEP_ID], [16, 17]])
  seen = set()
  for r in range(300):
    new = real_tokens(after, r)
    assert new[1:-1] in contents and new[0] == CLS_ID and new[-1] == SEP_ID
    assert after['sentence_ids'][r].max() == 2   # No sentence was split.
    seen.add(tuple(new))
  assert len(seen) == 6


def test_cuts_at_word_starts_and_n_capped_by_them():
  # One sentence of three words: [10], [11, 12], [14, 15].
  three_words = [[[10, 11, 12, 14, 15]]]
  one_word = [[[10, 12]]]
  before = make_batch([three_words] * 200 + [one_word] * 20, 8)
  after = apply(before, m=5)
  labels = after['sentence_reordering_label']
  assert set(labels[200:].tolist()) == {0}
  assert set(labels[:200].tolist()) == set(range(reordering.num_classes(3)))
  contents = orders_of([[10], [11, 12], [14, 15]])
  for r in range(200):
    assert real_tokens(after, r)[1:-1] in contents


def test_class_distribution_is_uniform_in_n_then_in_permutations():
  rng = np.random.default_rng(1)
  num_rows = 3000
  before = make_batch(random_rows(rng, num_rows, 24, num_documents=3), 28)
  assert np.all(before['sentence_ids'].max(axis=1) >= 2)   # n is never capped.
  counts = np.bincount(apply(before)['sentence_reordering_label'],
                       minlength=9)
  expected = num_rows * np.array([1 / 3] + [1 / 6] * 2 + [1 / 18] * 6)
  chi_square = ((counts - expected) ** 2 / expected).sum()
  assert len(counts) == 9 and chi_square < 30   # 8 degrees of freedom.


def test_rows_get_the_same_bytes_wherever_they_sit():
  rng = np.random.default_rng(2)
  before = make_batch(random_rows(rng, 40, 20), 24, first_index=7,
                      mask_epoch=1)
  copies = {k: v.copy() for k, v in before.items()}
  after = apply(before)
  order = rng.permutation(40)
  after_shuffled = apply({k: v[order] for k, v in before.items()})
  for field, values in after.items():
    assert np.array_equal(values[order], after_shuffled[field]), field
    assert values.tobytes() == apply(before)[field].tobytes()
  for field, values in copies.items():
    assert np.array_equal(before[field], values)
  other_epoch = dict(before, mask_epoch=before['mask_epoch'] + 1)
  assert not np.array_equal(
      apply(other_epoch)['sentence_reordering_label'],
      after['sentence_reordering_label'])


def test_declaration():
  task = tasks.get('sentence_reordering')
  params = dict(task.defaults(), weight=1.0)
  assert task.head == 'sentence' and task.corrupts and not task.weight_field
  assert task.layout == 'full_sentences'
  assert task.num_classes(params, 128) == 9
  assert task.fields(params, 128) == {
      'sentence_reordering_label': ((), np.int32)}


@pytest.mark.parametrize('m', [0, 8, 3.0, '3', True, None])
def test_check_rejects_a_bad_m(m):
  errors = []
  tasks.get('sentence_reordering').check({'weight': 1.0, 'm': m}, None,
                                         errors)
  assert errors == [
      f'tasks.sentence_reordering.m={m!r} must be an int in [1, 7]: the head '
      'has sum_{n=1}^{m} n! classes (9 for m=3, the default; 5,913 for m=7), '
      'and m=8 gives 46,233, more than any head in the model, a '
      'vocabulary-sized one included.']


def test_check_accepts_m_from_1_to_7():
  errors = []
  for m in range(1, 8):
    tasks.get('sentence_reordering').check({'weight': 1.0, 'm': m}, None,
                                           errors)
  assert not errors
