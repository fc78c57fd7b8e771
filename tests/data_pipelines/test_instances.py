"""Tests for data_pipelines.instances: NSP and packed instance plans."""

import itertools

import numpy as np
import pytest

from data_pipelines import instances
from data_pipelines import masking
from data_pipelines.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID

from fake_corpus import FakeCorpus, MAX_SEQ_LENGTH, random_corpus


@pytest.fixture(scope='module')
def corpus():
  return random_corpus(200, seed=1, long_prob=0.02)


def nsp_builder(corpus, short_seq_prob=0.1, seed=0):
  return instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig('nsp', MAX_SEQ_LENGTH, short_seq_prob), seed)


def packed_builder(corpus, seed=0):
  return instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig('full_sentences', MAX_SEQ_LENGTH), seed)


# ---------------------------------------------------------------------------
# NSP plans.


@pytest.mark.parametrize('data_epoch', [0, 1])
def test_plan_nsp_chunks(corpus, data_epoch):
  plan = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, 0, data_epoch)
  offsets = corpus.index.document_offsets
  max_num_tokens = MAX_SEQ_LENGTH - 3
  assert len(plan) > corpus.index.num_documents
  for k in range(len(plan)):
    d, s, a, e = plan.document[k], plan.start[k], plan.a_end[k], plan.end[k]
    t = plan.target_length[k]
    # Inside one document; A is non-empty; B = [a_end, end) follows A.
    assert offsets[d] <= s < a <= e <= offsets[d + 1]
    assert 2 <= t <= max_num_tokens
    if e - s == 1:
      assert plan.is_random[k]  # One sentence: B must come from elsewhere.
    else:
      assert a < e  # A split leaves at least one sentence for B.
    # Sentences are gathered until the target is reached, not beyond.
    if e < offsets[d + 1]:
      assert corpus.num_tokens(s, e) >= t
    assert corpus.num_tokens(s, e - 1) < t or e - s == 1


def test_plan_nsp_covers_every_sentence_once_in_order(corpus):
  plan = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, 0, 0)
  offsets = corpus.index.document_offsets
  for d in range(corpus.index.num_documents):
    chunks = np.flatnonzero(plan.document == d)
    chunks = chunks[np.argsort(plan.start[chunks], kind='stable')]
    assert len(set(plan.target_length[chunks])) == 1  # One target per doc.
    used = []
    for k in chunks:
      # A random B puts the chunk's B sentences back for the next chunk.
      last = plan.a_end[k] if plan.is_random[k] else plan.end[k]
      assert plan.start[k] == (used[-1] + 1 if used else offsets[d])
      used.extend(range(plan.start[k], last))
    assert used == list(range(offsets[d], offsets[d + 1]))


def test_plan_nsp_is_deterministic_and_varies_by_epoch_and_seed(corpus):
  def plan(seed, epoch):
    p = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, seed, epoch)
    return np.stack([p.start, p.a_end, p.end, p.is_random])

  np.testing.assert_array_equal(plan(0, 0), plan(0, 0))
  for other in (plan(0, 1), plan(1, 0)):
    assert plan(0, 0).shape != other.shape or np.any(plan(0, 0) != other)


def test_plan_a_split_is_uniform():
  # Every chunk of 4 short sentences; A takes 1, 2 or 3 of them equally often.
  corpus = FakeCorpus([[15] * 4] * 3000)
  plan = instances.plan_nsp(corpus.index, 64, 0.0, 0, 0)
  first = plan.start == corpus.index.document_offsets[plan.document]
  a_len = (plan.a_end - plan.start)[first]
  assert set(a_len) == {1, 2, 3}
  fractions = np.bincount(a_len, minlength=4)[1:] / len(a_len)
  np.testing.assert_allclose(fractions, 1 / 3, atol=0.03)


def test_nsp_label_balance():
  corpus = random_corpus(3000, seed=2)
  plan = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, 0, 0)
  multi = plan.end - plan.start >= 2
  assert multi.sum() > 5000
  # Std of the fraction is below 0.007; BERT flips a fair coin.
  assert abs(plan.is_random[multi].mean() - 0.5) < 0.03
  # One-sentence chunks add random pairs, so overall slightly above 0.5.
  assert 0.5 <= plan.is_random.mean() < 0.7


@pytest.mark.parametrize('short_seq_prob', [0.0, 0.1, 0.5, 1.0])
def test_short_seq_prob(short_seq_prob):
  corpus = FakeCorpus([[10, 10]] * 10_000)
  plan = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, short_seq_prob,
                            3, 0)
  max_num_tokens = MAX_SEQ_LENGTH - 3
  target = np.zeros(corpus.index.num_documents, np.int64)
  target[plan.document] = plan.target_length
  short = target < max_num_tokens
  # A short target is uniform in [2, max_num_tokens]: it equals the maximum
  # with probability 1 / (max_num_tokens - 1).
  expected = short_seq_prob * (1 - 1 / (max_num_tokens - 1))
  assert abs(short.mean() - expected) < 0.015
  if short_seq_prob == 1.0:
    assert target.min() == 2
    assert abs(target.mean() - (2 + max_num_tokens) / 2) < 1.0


# ---------------------------------------------------------------------------
# Truncation.


def _truncate_seq_pair(len_a, len_b, max_num_tokens):
  """google-research/bert's loop, counting instead of popping."""
  remove_a = remove_b = 0
  while len_a + len_b > max_num_tokens:
    if len_a > len_b:
      len_a, remove_a = len_a - 1, remove_a + 1
    else:
      len_b, remove_b = len_b - 1, remove_b + 1
  return remove_a, remove_b


def test_truncation_counts_match_bert():
  for len_a, len_b, max_num_tokens in itertools.product(
      range(0, 25), range(0, 25), range(0, 30)):
    assert instances.truncation_counts(len_a, len_b, max_num_tokens) == (
        _truncate_seq_pair(len_a, len_b, max_num_tokens)), (
            len_a, len_b, max_num_tokens)


def test_truncation_counts_large():
  assert instances.truncation_counts(1000, 3, 125) == (878, 0)
  assert instances.truncation_counts(300, 300, 125) == (237, 238)
  assert instances.truncation_counts(300, 290, 125) == (237, 228)
  for pair in ((1000, 3), (300, 300), (300, 290), (7, 500)):
    assert instances.truncation_counts(*pair, 125) == _truncate_seq_pair(
        *pair, 125)


# ---------------------------------------------------------------------------
# Materialized NSP instances.


def _check_nsp_instance(corpus, plan, k, instance):
  ids = instance['input_ids']
  types = instance['token_type_ids']
  assert ids.dtype == np.int32 and types.dtype == np.int32
  assert len(ids) <= MAX_SEQ_LENGTH
  assert ids[0] == CLS_ID and ids[-1] == SEP_ID
  seps = np.flatnonzero(ids == SEP_ID)
  assert len(seps) == 2
  assert not np.isin(ids, [CLS_ID, PAD_ID])[1:].any()
  a, b = ids[1:seps[0]], ids[seps[0] + 1:-1]
  assert len(a) >= 1 and len(b) >= 1
  assert len(a) + len(b) <= MAX_SEQ_LENGTH - 3
  np.testing.assert_array_equal(types[:seps[0] + 1], 0)  # [CLS] A [SEP]
  np.testing.assert_array_equal(types[seps[0] + 1:], 1)  # B [SEP]
  np.testing.assert_array_equal(
      instance['word_starts'],
      np.where(ids < NUM_SPECIAL, True, ids % 3 == 0))
  assert instance['next_sentence_label'] == plan.is_random[k]
  # Truncation removes tokens at the ends only: A and B stay contiguous.
  assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)
  a_tokens = corpus.tokens(plan.start[k], plan.a_end[k]) + NUM_SPECIAL
  assert set(a) <= set(a_tokens)
  doc = plan.document[k]
  if plan.is_random[k]:
    b_docs = corpus.doc_of_token(b)
    assert len(set(b_docs)) == 1 and b_docs[0] != doc
  else:
    b_tokens = corpus.tokens(plan.a_end[k], plan.end[k]) + NUM_SPECIAL
    assert set(b) <= set(b_tokens)
    if len(a_tokens) + len(b_tokens) <= MAX_SEQ_LENGTH - 3:
      np.testing.assert_array_equal(a, a_tokens)
      np.testing.assert_array_equal(b, b_tokens)
  return b


def test_materialized_nsp_instances(corpus):
  builder = nsp_builder(corpus)
  plan = builder.plan(0)
  random_docs = set()
  truncated = 0
  for k in range(len(plan)):
    instance = builder.materialize(plan, k, 0)
    b = _check_nsp_instance(corpus, plan, k, instance)
    if plan.is_random[k]:
      random_docs.add(int(corpus.doc_of_token(b[0])))
    truncated += corpus.num_tokens(plan.start[k], plan.end[k]) > 61
  assert truncated > 10  # The corpus exercises truncation.
  # Random B's come from all over the corpus.
  assert len(random_docs) > 0.5 * corpus.index.num_documents


def test_random_b_reaches_its_target():
  # 5-token sentences and a fixed target of 61 tokens: B gathers sentences
  # until A + B reaches the target (then truncation cuts the pair to 61), or
  # until its document ends.
  corpus = FakeCorpus([[5] * 20] * 200)
  builder = nsp_builder(corpus, short_seq_prob=0.0)
  plan = builder.plan(0)
  reached = 0
  random_chunks = np.flatnonzero(plan.is_random)
  assert len(random_chunks) > 200
  for k in random_chunks:
    ids = builder.materialize(plan, k, 0)['input_ids']
    sep = np.flatnonzero(ids == SEP_ID)[0]
    a, b = ids[1:sep], ids[sep + 1:-1]
    if len(a) + len(b) == MAX_SEQ_LENGTH - 3:
      reached += 1
    else:
      assert len(a) + len(b) < MAX_SEQ_LENGTH - 3
      doc = corpus.doc_of_token(b[-1])
      assert b[-1] - NUM_SPECIAL == corpus.csum[
          corpus.index.document_offsets[doc + 1]] - 1
      assert (b[0] - NUM_SPECIAL) % 5 == 0  # Starts at a sentence.
  # Most random B's start early enough in their document to reach it.
  assert reached > 0.5 * len(random_chunks)


def test_materialize_is_deterministic(corpus):
  a, b = nsp_builder(corpus), nsp_builder(corpus)
  plan_a, plan_b = a.plan(1), b.plan(1)
  for k in range(0, len(plan_a), 7):
    x, y = a.materialize(plan_a, k, 1), b.materialize(plan_b, k, 1)
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def test_builder_errors(corpus):
  with pytest.raises(ValueError, match='layout'):
    instances.InstanceBuilder(corpus.source, corpus.index,
                              instances.InstanceConfig('pairs'), 0)
  one = FakeCorpus([[5, 5, 5]])
  with pytest.raises(ValueError, match='other'):
    nsp_builder(one)
  packed_builder(one)  # Packing needs no second document.


# ---------------------------------------------------------------------------
# FULL-SENTENCES packing.


def _doc_starts(corpus):
  is_start = np.zeros(len(corpus.index.sentence_lengths) + 1, bool)
  is_start[corpus.index.document_offsets[1:-1]] = True
  return is_start


def test_plan_full_sentences_covers_the_stream(corpus):
  plan = instances.plan_full_sentences(corpus.index, MAX_SEQ_LENGTH)
  order = np.argsort(plan.start)
  start, end = plan.start[order], plan.end[order]
  assert start[0] == 0
  assert end[-1] == len(corpus.index.sentence_lengths)
  np.testing.assert_array_equal(start[1:], end[:-1])  # No gap, no overlap.
  assert np.all(end > start)
  np.testing.assert_array_equal(
      plan.document,
      np.searchsorted(corpus.index.document_offsets, plan.start, 'right') - 1)
  assert not plan.is_random.any()


def test_plan_full_sentences_fits_and_is_greedy():
  corpus = random_corpus(2000, seed=3, max_len=20)
  plan = instances.plan_full_sentences(corpus.index, MAX_SEQ_LENGTH)
  max_num_tokens = MAX_SEQ_LENGTH - 2
  is_start = _doc_starts(corpus)
  lengths = corpus.index.sentence_lengths
  not_full = 0
  for s, e in zip(plan.start, plan.end):
    # Tokens plus one [SEP] at each document boundary inside the instance.
    size = lengths[s:e].sum() + is_start[s + 1:e].sum()
    assert size <= max_num_tokens
    if e < len(lengths):
      not_full += size + lengths[e] + is_start[e] <= max_num_tokens
  # Only the last instance of each packing lane may stop early.
  assert not_full <= len(plan) / 32 + 2
  fill = lengths.sum() / (len(plan) * max_num_tokens)
  assert fill > 0.8


def test_materialized_packed_instances(corpus):
  builder = packed_builder(corpus)
  plan = builder.plan(0)
  is_start = _doc_starts(corpus)
  offsets = corpus.index.document_offsets
  for k in range(len(plan)):
    s, e = plan.start[k], plan.end[k]
    instance = builder.materialize(plan, k, 0)
    ids = instance['input_ids']
    assert len(ids) <= MAX_SEQ_LENGTH
    assert ids[0] == CLS_ID and ids[-1] == SEP_ID
    np.testing.assert_array_equal(instance['token_type_ids'], 0)
    assert instance['next_sentence_label'] == 0
    np.testing.assert_array_equal(
        instance['word_starts'],
        np.where(ids < NUM_SPECIAL, True, ids % 3 == 0))
    body = ids[1:-1]
    tokens = body[body != SEP_ID]
    expected = corpus.tokens(s, e) + NUM_SPECIAL
    if e - s == 1 and corpus.num_tokens(s, e) > MAX_SEQ_LENGTH - 2:
      # A sentence too long alone is cut to fill the sequence.
      assert len(ids) == MAX_SEQ_LENGTH
      np.testing.assert_array_equal(tokens, expected[:MAX_SEQ_LENGTH - 2])
      continue
    np.testing.assert_array_equal(tokens, expected)
    # A [SEP] right before the first token of every document that starts
    # inside the instance, and nowhere else.
    boundaries = [sentence for sentence in range(s + 1, e)
                  if is_start[sentence]]
    sep_next = body[np.flatnonzero(body[:-1] == SEP_ID) + 1]
    np.testing.assert_array_equal(
        sep_next, [corpus.csum[b] + NUM_SPECIAL for b in boundaries])
    assert plan.document[k] == np.searchsorted(offsets, s, 'right') - 1
  assert (plan.end - plan.start == 1).sum() > 0


def test_full_sentences_plan_is_the_same_every_epoch(corpus):
  builder = packed_builder(corpus)
  p0, p3 = builder.plan(0), builder.plan(3)
  np.testing.assert_array_equal(p0.start, p3.start)
  np.testing.assert_array_equal(p0.end, p3.end)


def test_plan_doc_sentences_packs_each_document_greedily():
  """RoBERTa's DOC-SENTENCES: rows cover every document's sentences in
  order, each row within one document, as many whole sentences as fit
  (checked against a plain loop), a long sentence alone."""
  corpus = random_corpus(600, seed=4, max_len=20, long_prob=0.02)
  plan = instances.plan_doc_sentences(corpus.index, MAX_SEQ_LENGTH)
  lengths = corpus.index.sentence_lengths
  offsets = corpus.index.document_offsets
  expected = []   # (document, start, end), greedily, document by document.
  for doc in range(len(offsets) - 1):
    s = offsets[doc]
    while s < offsets[doc + 1]:
      e = s + 1
      while (e < offsets[doc + 1] and
             lengths[s:e + 1].sum() <= MAX_SEQ_LENGTH - 2):
        e += 1
      expected.append((doc, s, e))
      s = e
  assert list(zip(plan.document.tolist(), plan.start.tolist(),
                  plan.end.tolist())) == expected
  np.testing.assert_array_equal(plan.a_end, plan.end)
  assert not plan.is_random.any() and not plan.swapped.any()
  assert (plan.end - plan.start == 1).sum() > 0


def test_materialized_doc_sentences_hold_one_document():
  corpus = random_corpus(200, seed=5, long_prob=0.02)
  builder = instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig('doc_sentences', MAX_SEQ_LENGTH), 0)
  plan = builder.plan(0)
  batch = builder.materialize_batch(plan, np.arange(len(plan)), 0)
  for k in range(len(plan)):
    ids = batch['input_ids'][k][batch['attention_mask'][k] > 0]
    expected = corpus.tokens(plan.start[k], plan.end[k]) + NUM_SPECIAL
    body = expected[:MAX_SEQ_LENGTH - 2]   # A sentence too long is cut.
    np.testing.assert_array_equal(ids, [CLS_ID, *body, SEP_ID])
  # Rows that end with their document are padded, not filled from the next.
  assert (batch['attention_mask'].sum(1) < MAX_SEQ_LENGTH).mean() > 0.5


# ---------------------------------------------------------------------------
# pad_instance and InstanceDataset.


@pytest.mark.parametrize('layout', ['nsp', 'full_sentences'])
def test_materialize_batch_pads_the_instances(corpus, layout):
  builder = nsp_builder(corpus) if layout == 'nsp' else packed_builder(corpus)
  plan = builder.plan(0)
  ks = np.array([3, 0, len(plan) - 1, 3, 17])
  batch = builder.materialize_batch(plan, ks, 0)
  for key in ('input_ids', 'token_type_ids', 'attention_mask',
              'word_starts', 'unit_labels'):
    assert batch[key].shape == (len(ks), MAX_SEQ_LENGTH)
  for row, k in enumerate(ks):
    raw = builder.materialize(plan, k, 0)
    n = len(raw['input_ids'])
    np.testing.assert_array_equal(batch['attention_mask'][row],
                                  np.arange(MAX_SEQ_LENGTH) < n)
    for key in ('input_ids', 'token_type_ids', 'word_starts', 'unit_labels'):
      np.testing.assert_array_equal(batch[key][row, :n], raw[key])
    np.testing.assert_array_equal(batch['input_ids'][row, n:], PAD_ID)
    np.testing.assert_array_equal(batch['token_type_ids'][row, n:], 0)
    assert not batch['word_starts'][row, n:].any()
    assert batch['next_sentence_label'][row] == raw['next_sentence_label']
  # Specials start a word; rows 0 and 3 are the same instance.
  specials = np.isin(batch['input_ids'], [CLS_ID, SEP_ID])
  assert batch['word_starts'][specials].all()
  for key, value in batch.items():
    np.testing.assert_array_equal(value[0], value[3])


@pytest.fixture(scope='module')
def small_corpus():
  return random_corpus(30, seed=4)


def _dataset(corpus, layout='nsp', dynamic=False, dupe_factor=2, seed=0,
             **kwargs):
  builder = instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig(layout, MAX_SEQ_LENGTH, 0.1), seed)
  return instances.InstanceDataset(builder, seed=seed,
                                   dupe_factor=dupe_factor, dynamic=dynamic,
                                   **kwargs)


def _key(instance):
  return instance['input_ids'].tobytes()


def _epoch(ds, epoch):
  start = sum(ds.epoch_size(e) for e in range(epoch))
  return [ds[i] for i in range(start, start + ds.epoch_size(epoch))]


def test_dataset_is_a_pure_function_of_the_index(small_corpus):
  a, b = _dataset(small_corpus), _dataset(small_corpus)
  indices = [5, 0, 3 * a.epoch_size(0) + 2, 1, 5, a.epoch_size(0)]
  for i in indices:
    x, y = a[i], b[i]
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def test_dataset_element_fields(small_corpus):
  x = _dataset(small_corpus)[3]
  assert set(x) == {'input_ids', 'token_type_ids', 'attention_mask',
                    'word_starts', 'unit_labels', 'capitalized',
                    'sentence_ids', 'next_sentence_label', 'example_index',
                    'mask_epoch'}
  assert x['input_ids'].shape == (MAX_SEQ_LENGTH,)
  # Records without entity/phrase spans give label 0 everywhere.
  assert x['unit_labels'].shape == (MAX_SEQ_LENGTH,)
  assert not x['unit_labels'].any()


def test_an_order_key_reorders_the_same_instances(small_corpus):
  # A continual run's streams of one layout: the same instances, each
  # epoch in an order of the stream's own; () is the plain dataset's.
  plain = _dataset(small_corpus, layout='full_sentences')
  same = [_key(x) for x in _epoch(_dataset(
      small_corpus, layout='full_sentences', order_key=()), 0)]
  assert same == [_key(x) for x in _epoch(plain, 0)]
  a = [_key(x) for x in _epoch(_dataset(
      small_corpus, layout='full_sentences', order_key=(24, 1)), 0)]
  b = [_key(x) for x in _epoch(_dataset(
      small_corpus, layout='full_sentences', order_key=(24, 2)), 0)]
  assert sorted(a) == sorted(b) == sorted(same)
  assert len({tuple(a), tuple(b), tuple(same)}) == 3


def test_epochs_are_shuffled_permutations(small_corpus):
  ds = _dataset(small_corpus, layout='full_sentences')
  plan = ds._builder.plan(0)  # pylint: disable=protected-access
  assert ds.epoch_size(0) == ds.epoch_size(1) == len(plan)
  e0, e1 = _epoch(ds, 0), _epoch(ds, 1)
  expected = sorted(
      ds._builder.materialize_batch(plan, np.array([k]), 0)[  # pylint: disable=protected-access
          'input_ids'][0].tobytes()
      for k in range(len(plan)))
  assert sorted(map(_key, e0)) == expected
  assert sorted(map(_key, e1)) == expected
  assert [_key(x) for x in e0] != [_key(x) for x in e1]


def test_unshuffled_dataset_follows_the_plan(small_corpus):
  ds = _dataset(small_corpus, shuffle=False, num_epochs=1)
  plan = ds._builder.plan(0)  # pylint: disable=protected-access
  assert len(ds) == len(plan)
  for k in range(len(plan)):
    raw = ds._builder.materialize(plan, k, 0)  # pylint: disable=protected-access
    np.testing.assert_array_equal(ds[k]['input_ids'][:len(raw['input_ids'])],
                                  raw['input_ids'])


def test_static_dataset_cycles_dupe_factor(small_corpus):
  ds = _dataset(small_corpus, dynamic=False, dupe_factor=2)
  epochs = [_epoch(ds, e) for e in range(4)]
  assert [int(e[0]['mask_epoch']) for e in epochs] == [0, 1, 0, 1]
  for e, elements in enumerate(epochs):
    assert {int(x['mask_epoch']) for x in elements} == {e % 2}
  keys = [[_key(x) for x in elements] for elements in epochs]
  # Data epochs 0 and 1 differ (another NSP plan); epoch 2 repeats epoch 0's
  # instances, in a new order.
  assert sorted(keys[0]) == sorted(keys[2])
  assert sorted(keys[1]) == sorted(keys[3])
  assert sorted(keys[0]) != sorted(keys[1])
  assert keys[0] != keys[2]


def test_dynamic_dataset_has_a_new_plan_every_epoch(small_corpus):
  ds = _dataset(small_corpus, dynamic=True, dupe_factor=2)
  epochs = [_epoch(ds, e) for e in range(3)]
  assert [int(e[0]['mask_epoch']) for e in epochs] == [0, 1, 2]
  keys = [sorted(_key(x) for x in elements) for elements in epochs]
  assert keys[0] != keys[2]


def test_static_masking_repeats_masks_across_cycles(small_corpus):
  # Static masking (BERT's dupe_factor): when data epoch 0 comes round again
  # in epoch 2, each instance must carry the same masking counters, so it is
  # masked exactly as in epoch 0.
  ds = _dataset(small_corpus, dynamic=False, dupe_factor=2)
  config = masking.MaskingConfig(vocab_size=1000)

  def masked(elements):
    batch = {k: np.stack([x[k] for x in elements]) for k in elements[0]}
    out = masking.mask_batch(batch, config, seed=0)
    return {_key(x): (out['input_ids'][i], out['masked_positions'][i])
            for i, x in enumerate(elements)}

  first, third = masked(_epoch(ds, 0)), masked(_epoch(ds, 2))
  assert first.keys() == third.keys()
  for key, (ids, positions) in first.items():
    np.testing.assert_array_equal(third[key][1], positions)
    np.testing.assert_array_equal(third[key][0], ids)


def test_grain_slicing(small_corpus):
  ds = _dataset(small_corpus)
  sliced = ds[1::2]
  for j in range(5):
    x, y = sliced[j], ds[1 + 2 * j]
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def test_get_batch_across_an_epoch_boundary(small_corpus):
  ds = _dataset(small_corpus, dynamic=True)
  boundary = ds.epoch_size(0)
  indices = np.arange(boundary - 3, boundary + 3)[::-1]
  batch = ds.get_batch(indices)
  assert list(batch['mask_epoch']) == [1, 1, 1, 0, 0, 0]
  for row, i in enumerate(indices):
    element = ds[int(i)]
    for key in element:
      np.testing.assert_array_equal(batch[key][row], element[key])


@pytest.mark.parametrize('process_count', [1, 2, 4])
def test_instance_batches_split_the_global_batch(small_corpus,
                                                 process_count):
  ds = _dataset(small_corpus)
  global_batch = 8
  for b in (0, 5):
    hosts = [instances.InstanceBatches(
        ds, global_batch, instances.host_rows(global_batch, p,
                                              process_count))[b]
             for p in range(process_count)]
    for j in range(global_batch):
      p, r = divmod(j, global_batch // process_count)
      element = ds[b * global_batch + j]
      for key in element:
        np.testing.assert_array_equal(hosts[p][key][r], element[key])
