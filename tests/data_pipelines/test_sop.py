"""Tests for data_pipelines.instances: ALBERT's sentence-order pairs (SOP),
and that adding them left NSP's bytes as they were."""

import hashlib

import numpy as np
import pytest

from data_pipelines import instances
from data_pipelines.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID

from fake_corpus import FakeCorpus, MAX_SEQ_LENGTH, random_corpus

MAX_NUM_TOKENS = MAX_SEQ_LENGTH - 3
# The batch fields that test_nsp_bytes_are_pinned's digest covers.
_PINNED = ('attention_mask', 'input_ids', 'next_sentence_label',
           'token_type_ids', 'unit_labels', 'word_starts')


@pytest.fixture(scope='module')
def corpus():
  return random_corpus(200, seed=1, long_prob=0.02)


def builder(corpus, layout='sop', seed=0, short_seq_prob=0.1):
  return instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig(layout, MAX_SEQ_LENGTH, short_seq_prob), seed)


def _digest(arrays):
  h = hashlib.sha256()
  for name, value in arrays:
    value = np.ascontiguousarray(value)
    h.update(f'{name}:{value.dtype.str}:{value.shape}'.encode())
    h.update(value.tobytes())
  return h.hexdigest()


def _split(ids):
  """A and B of an unpadded [CLS] A [SEP] B [SEP]."""
  sep = np.flatnonzero(ids == SEP_ID)[0]
  return ids[1:sep], ids[sep + 1:-1]


# ---------------------------------------------------------------------------
# NSP is unchanged.


def test_nsp_bytes_are_pinned(corpus):
  # Digests computed with the code before SOP existed: NSP's plan columns and
  # batches must stay byte for byte the same.
  b = builder(corpus, 'nsp', seed=3)
  plan = b.plan(1)
  assert len(plan) == 552
  assert _digest((k, getattr(plan, k)) for k in (
      'document', 'start', 'a_end', 'end', 'is_random', 'target_length')) == (
          '328903cebdc926291c41b78eb613928bff82cdedeb54f8539e7e541291edd35f')
  batch = b.materialize_batch(plan, np.arange(len(plan))[::-1], 1)
  # The fields of then; later fields (sentence_ids, capitalized) are new.
  assert _digest(sorted((k, v) for k, v in batch.items() if k in _PINNED)) == (
      '3d5f3b9db3521a4c5c2db151a05996d196890a7b9040cdd4fa9df12a66066ddd')


def test_only_sop_swaps(corpus):
  nsp = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, 0, 0)
  packed = instances.plan_full_sentences(corpus.index, MAX_SEQ_LENGTH)
  assert nsp.swapped.dtype == bool and len(nsp.swapped) == len(nsp)
  assert not nsp.swapped.any() and not packed.swapped.any()
  b = builder(corpus, 'nsp')
  plan = b.plan(0)
  labels = b.materialize_batch(plan, np.arange(len(plan)), 0)[
      'next_sentence_label']
  np.testing.assert_array_equal(labels, plan.is_random)


# ---------------------------------------------------------------------------
# SOP plans.


@pytest.mark.parametrize('data_epoch', [0, 1])
def test_plan_sop_chunks(corpus, data_epoch):
  plan = instances.plan_sop(corpus.index, MAX_SEQ_LENGTH, 0.1, 0, data_epoch)
  offsets = corpus.index.document_offsets
  n = plan.end - plan.start
  assert (n == 1).any() and (n >= 2).any()
  # Only a one-sentence chunk takes a random B; a chunk is swapped or not.
  np.testing.assert_array_equal(plan.is_random, n == 1)
  assert not (plan.swapped & plan.is_random).any()
  assert np.all(plan.a_end[n >= 2] < plan.end[n >= 2])
  # Nothing is put back: each document's chunks tile it, in order.
  for d in range(corpus.index.num_documents):
    chunks = np.flatnonzero(plan.document == d)
    chunks = chunks[np.argsort(plan.start[chunks], kind='stable')]
    assert len(set(plan.target_length[chunks])) == 1
    np.testing.assert_array_equal(
        plan.start[chunks], np.append(offsets[d], plan.end[chunks][:-1]))
    assert plan.end[chunks][-1] == offsets[d + 1]


def test_sop_uses_the_nsp_chunk_draws(corpus):
  # A document's first chunk comes before any put-back, so NSP and SOP
  # build it alike from the same draws, and NSP's random-B coin is SOP's
  # swap coin.
  nsp = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, 5, 2)
  sop = instances.plan_sop(corpus.index, MAX_SEQ_LENGTH, 0.1, 5, 2)
  offsets = corpus.index.document_offsets

  def first_chunks(plan):
    first = np.flatnonzero(plan.start == offsets[plan.document])
    return first[np.argsort(plan.document[first])]

  a, b = first_chunks(nsp), first_chunks(sop)
  np.testing.assert_array_equal(nsp.document[a], sop.document[b])
  for column in ('start', 'a_end', 'end', 'target_length'):
    np.testing.assert_array_equal(getattr(nsp, column)[a],
                                  getattr(sop, column)[b])
  multi = sop.end[b] - sop.start[b] >= 2
  np.testing.assert_array_equal(nsp.is_random[a][multi],
                                sop.swapped[b][multi])


def test_sop_swaps_half_of_the_chunks():
  corpus = random_corpus(3000, seed=2)
  plan = instances.plan_sop(corpus.index, MAX_SEQ_LENGTH, 0.1, 0, 0)
  multi = plan.end - plan.start >= 2
  count = int(multi.sum())
  assert count > 4000
  # ALBERT flips a fair coin: within 5 binomial standard deviations.
  assert abs(plan.swapped[multi].mean() - 0.5) < 5 * np.sqrt(0.25 / count)


# ---------------------------------------------------------------------------
# Materialized SOP instances.


def _check_pair(full_a, full_b, a, b):
  """``a`` and ``b`` are ``full_a`` and ``full_b`` after BERT's truncation:
  contiguous pieces, cut by ``truncation_counts`` of the shown order."""
  remove_a, remove_b = instances.truncation_counts(
      len(full_a), len(full_b), MAX_NUM_TOKENS)
  assert (len(a), len(b)) == (len(full_a) - remove_a, len(full_b) - remove_b)
  for piece, full in ((a, full_a), (b, full_b)):
    front = np.searchsorted(full, piece[0])
    np.testing.assert_array_equal(piece, full[front:front + len(piece)])


def test_materialized_sop_instances(corpus):
  b = builder(corpus)
  plan = b.plan(0)
  batch = b.materialize_batch(plan, np.arange(len(plan)), 0)
  counts = {'in_order': 0, 'swapped': 0, 'random': 0, 'cut': 0}
  for k in range(len(plan)):
    n = int(batch['attention_mask'][k].sum())
    ids, types = batch['input_ids'][k, :n], batch['token_type_ids'][k, :n]
    np.testing.assert_array_equal(batch['input_ids'][k, n:], PAD_ID)
    assert ids[0] == CLS_ID and ids[-1] == SEP_ID
    assert (ids == SEP_ID).sum() == 2 and (ids == CLS_ID).sum() == 1
    a, b_ = _split(ids)
    assert len(a) >= 1 and len(b_) >= 1
    np.testing.assert_array_equal(types, np.arange(n) > len(a) + 1)
    np.testing.assert_array_equal(
        batch['word_starts'][k, :n],
        np.where(ids < NUM_SPECIAL, True, ids % 3 == 0))
    first = corpus.tokens(plan.start[k], plan.a_end[k]) + NUM_SPECIAL
    second = corpus.tokens(plan.a_end[k], plan.end[k]) + NUM_SPECIAL
    label = batch['next_sentence_label'][k]
    if plan.is_random[k]:
      # A one-sentence chunk: B from another document, label 1.
      assert plan.end[k] - plan.start[k] == 1 and label == 1
      b_docs = corpus.doc_of_token(b_)
      assert len(set(b_docs)) == 1 and b_docs[0] != plan.document[k]
      assert set(a) <= set(first)
      counts['random'] += 1
    elif plan.swapped[k]:
      # Wrong order: the chunk's B, then its A, truncated in that order;
      # B's tokens come right before A's in the document.
      assert label == 1
      _check_pair(second, first, a, b_)
      assert b_[-1] < a[0]
      counts['swapped'] += 1
    else:
      assert label == 0
      _check_pair(first, second, a, b_)
      assert a[-1] < b_[0]
      counts['in_order'] += 1
    if not plan.is_random[k]:
      consecutive = len(first) + len(second) <= MAX_NUM_TOKENS
      counts['cut'] += not consecutive
      if consecutive:
        earlier, later = (b_, a) if plan.swapped[k] else (a, b_)
        assert later[0] == earlier[-1] + 1
  assert min(counts.values()) > 10, counts


def test_one_sentence_documents_pair_with_other_documents():
  corpus = FakeCorpus([[10]] * 50)
  b = builder(corpus)
  plan = b.plan(0)
  assert len(plan) == 50 and plan.is_random.all()
  assert not plan.swapped.any()
  batch = b.materialize_batch(plan, np.arange(50), 0)
  np.testing.assert_array_equal(batch['next_sentence_label'], 1)
  for k in range(50):
    n = int(batch['attention_mask'][k].sum())
    a, b_ = _split(batch['input_ids'][k, :n])
    assert corpus.doc_of_token(a[0]) == plan.document[k]
    assert corpus.doc_of_token(b_[0]) != plan.document[k]


def test_sop_needs_two_documents():
  assert 'sop' in instances.LAYOUTS
  with pytest.raises(ValueError, match='other'):
    builder(FakeCorpus([[5, 5, 5]]))


# ---------------------------------------------------------------------------
# Determinism.


def _first_chunk_swaps(corpus, plan):
  """bool [num_documents]: whether each document's first chunk is swapped;
  and whether it has two sentences or more (so it could be)."""
  first = plan.start == corpus.index.document_offsets[plan.document]
  swapped = np.zeros(corpus.index.num_documents, bool)
  multi = np.zeros(corpus.index.num_documents, bool)
  swapped[plan.document[first]] = plan.swapped[first]
  multi[plan.document[first]] = (plan.end - plan.start)[first] >= 2
  return swapped, multi


def test_sop_is_deterministic_and_varies_by_epoch(corpus):
  x, y = builder(corpus), builder(corpus)
  plan = x.plan(1)
  ks = np.arange(len(plan))
  bx = x.materialize_batch(plan, ks, 1)
  by = y.materialize_batch(y.plan(1), ks, 1)
  for key in bx:
    assert bx[key].tobytes() == by[key].tobytes(), key
  # Another data epoch flips other coins: the first chunks' swaps disagree
  # about half the time.
  s1, m1 = _first_chunk_swaps(corpus, plan)
  s2, m2 = _first_chunk_swaps(corpus, x.plan(2))
  both = m1 & m2
  assert both.sum() > 100
  assert 0.3 < np.mean(s1[both] != s2[both]) < 0.7


def test_sop_batches_do_not_depend_on_grouping(corpus):
  b = builder(corpus)
  plan = b.plan(0)
  ks = np.random.default_rng(0).permutation(len(plan))[:200]
  whole = b.materialize_batch(plan, ks, 0)
  halves = [b.materialize_batch(plan, part, 0)
            for part in np.array_split(ks, [37])]
  for row, k in enumerate(ks):
    alone = b.materialize_batch(plan, np.array([k]), 0)
    for key in whole:
      assert whole[key][row].tobytes() == alone[key][0].tobytes(), key
  for key in whole:
    assert whole[key].tobytes() == np.concatenate(
        [h[key] for h in halves]).tobytes(), key


@pytest.mark.parametrize('process_count', [1, 2])
def test_sop_dataset_is_a_pure_function_of_the_index(process_count):
  corpus = random_corpus(30, seed=4)
  ds = instances.InstanceDataset(builder(corpus), seed=0, dupe_factor=2,
                                 dynamic=True)
  global_batch = 8
  boundary = ds.epoch_size(0)
  # The batch at the end of epoch 0, spanning into epoch 1 if it can.
  b = boundary // global_batch
  hosts = [instances.InstanceBatches(
      ds, global_batch, instances.host_rows(global_batch, p, process_count))[b]
           for p in range(process_count)]
  per_host = global_batch // process_count
  for j in range(global_batch):
    p, r = divmod(j, per_host)
    element = ds[b * global_batch + j]
    for key in element:
      assert hosts[p][key][r].tobytes() == element[key].tobytes(), key
