"""ERNIE 2.0's sentence distance layout and task: classes against a direct
computation from the plan and the draws, class shares, fallbacks, the
materialized pairs, determinism and config checks."""

import numpy as np
import pytest

from data_pipelines import counter_rng
from data_pipelines import instances
from data_pipelines import pretokenize
from data_pipelines import tasks
from data_pipelines.counter_rng import Stream
from data_pipelines.tokenizer import NUM_SPECIAL, SEP_ID

from fake_corpus import FakeCorpus, MAX_SEQ_LENGTH, random_corpus

THIRDS = (1 / 3, 1 / 3, 1 / 3)


@pytest.fixture(scope='module')
def corpus():
  # Short documents (1-12 sentences) and some long sentences: every kind of
  # chunk, fallbacks included.
  return random_corpus(300, seed=4, long_prob=0.03)


def builder(corpus, probabilities=THIRDS, seed=0, short_seq_prob=0.1):
  return instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig('sentence_distance', MAX_SEQ_LENGTH,
                               short_seq_prob,
                               distance_probabilities=probabilities), seed)


def drawn_classes(plan, seed, data_epoch, probabilities):
  """The class each chunk draws, from the counters directly: a chunk's
  draw is keyed on (document, its number within the document)."""
  chunk_number = np.zeros(len(plan), np.int64)
  seen = {}
  for k, d in enumerate(plan.document.tolist()):
    chunk_number[k] = seen.get(d, 0)
    seen[d] = chunk_number[k] + 1
  u = counter_rng.uniform(seed, Stream.CHUNK_PLAN, data_epoch, plan.document,
                          chunk_number, num=2)[:, 1]
  _, p1, p2 = probabilities
  return np.where(u < p2, 2, np.where(u < p2 + p1, 1, 0))


def has_far_start(corpus, plan, k):
  """Whether A's document has a sentence that starts a B with at least one
  sentence between it and A."""
  lo, hi = corpus.index.document_offsets[plan.document[k]:][:2]
  return any(s <= plan.start[k] - 2 or s >= plan.a_end[k] + 1
             for s in range(lo, hi))


def distance_class(corpus, plan, k, b_doc, b_start, b_end):
  """0, 1 or 2 by the paper's definition, from where A and B are."""
  offsets = corpus.index.document_offsets
  if b_doc != plan.document[k]:
    return 2
  assert offsets[b_doc] <= b_start < b_end <= offsets[b_doc + 1]
  if b_start == plan.a_end[k]:
    return 0
  # Same document, not touching A and not adjacent to it.
  assert b_end <= plan.start[k] - 1 or b_start >= plan.a_end[k] + 1
  return 1


@pytest.mark.parametrize('probabilities', [THIRDS, (0.2, 0.5, 0.3)])
def test_labels_are_the_draws_less_the_fallbacks(corpus, probabilities):
  plan = builder(corpus, probabilities).plan(1)
  drawn = drawn_classes(plan, 0, 1, probabilities)
  n = plan.end - plan.start
  expected_fallback = np.array([
      (drawn[k] == 0 and n[k] == 1)
      or (drawn[k] == 1 and not has_far_start(corpus, plan, k))
      for k in range(len(plan))])
  np.testing.assert_array_equal(plan.fallback, expected_fallback)
  np.testing.assert_array_equal(plan.label,
                                np.where(expected_fallback, 2, drawn))
  np.testing.assert_array_equal(plan.is_random, plan.label == 2)
  assert plan.label.dtype == np.int32
  # The corpus exercises both fallbacks.
  assert ((drawn == 0) & (n == 1)).sum() > 5
  assert ((drawn == 1) & expected_fallback).sum() > 5


def test_the_class_of_every_pair_is_where_its_b_is(corpus):
  b = builder(corpus)
  plan = b.plan(0)
  ks = np.arange(len(plan))
  b_doc, b_start, b_end = b.pair_b_sentences(plan, ks, 0)
  classes = [distance_class(corpus, plan, k, b_doc[k], b_start[k], b_end[k])
             for k in ks]
  np.testing.assert_array_equal(classes, plan.label)
  own = plan.label == 0
  np.testing.assert_array_equal(b_end[own], plan.end[own])
  # Class-1 Bs come from both sides of A.
  far = plan.label == 1
  assert (b_end[far] < plan.start[far]).sum() > 20
  assert (b_start[far] > plan.a_end[far]).sum() > 20


def test_class_1_starts_are_uniform_among_the_valid_ones():
  # Documents of 9 sentences of 20 tokens: a target of 61 makes chunks of
  # 4 sentences (A 1-3 of them), so a class-1 B has few valid starts,
  # each equally likely.
  corpus = FakeCorpus([[20] * 9] * 2000)
  b = builder(corpus, probabilities=(0.0, 1.0, 0.0), short_seq_prob=0.0)
  plan = b.plan(0)
  first = np.flatnonzero((plan.start == corpus.index.document_offsets[
      plan.document]) & (plan.a_end - plan.start == 1))
  assert len(first) > 400
  _, b_start, _ = b.pair_b_sentences(plan, first, 0)
  # A is the document's sentence 0: valid starts are sentences 2..8.
  offset = b_start - plan.start[first]
  counts = np.bincount(offset, minlength=9)
  assert counts[:2].sum() == 0
  expected = len(first) / 7
  sigma = np.sqrt(len(first) * (1 / 7) * (6 / 7))
  assert np.all(np.abs(counts[2:] - expected) < 4.5 * sigma), counts


@pytest.mark.parametrize('probabilities', [THIRDS, (0.2, 0.5, 0.3)])
def test_class_shares_on_long_documents(probabilities):
  # 100 sentences of 3-12 tokens per document and no short targets: every
  # A leaves room for a class-1 B, and only a document's last chunk may be
  # a one-sentence chunk (a fallback if it draws class 0).
  rng = np.random.default_rng(0)
  corpus = FakeCorpus(rng.integers(3, 13, size=(250, 100)))
  plan = instances.plan_sentence_distance(corpus.index, MAX_SEQ_LENGTH, 0.0,
                                          5, 0, probabilities)
  count = len(plan)
  assert count > 4000
  fallback_share = plan.fallback.mean()
  assert fallback_share < 0.02
  n = plan.end - plan.start
  assert set(np.flatnonzero(plan.fallback)) <= set(np.flatnonzero(n == 1))
  sigma = np.sqrt(np.multiply(probabilities, 1 - np.array(probabilities))
                  / count)
  drawn = drawn_classes(plan, 5, 0, probabilities)
  drawn_shares = np.bincount(drawn, minlength=3) / count
  assert np.all(np.abs(drawn_shares - probabilities) < 4.5 * sigma)
  # The labels: the draws, the fallbacks moved from class 0 to class 2.
  shares = np.bincount(plan.label, minlength=3) / count
  np.testing.assert_allclose(
      shares, drawn_shares + np.array([-1, 0, 1]) * fallback_share,
      atol=1e-12)
  assert np.all(np.abs(shares - probabilities)
                < 4.5 * sigma + fallback_share), shares


def test_fallbacks_are_counted_into_class_2(corpus):
  plan = builder(corpus).plan(0)
  drawn = drawn_classes(plan, 0, 0, THIRDS)
  counts = np.bincount(plan.label, minlength=3)
  assert counts[2] == (drawn == 2).sum() + plan.fallback.sum()
  assert counts[1] == (drawn == 1).sum() - (plan.fallback
                                             & (drawn == 1)).sum()
  assert counts[0] == (drawn == 0).sum() - (plan.fallback
                                             & (drawn == 0)).sum()


def test_nsp_probabilities_give_nsp_plan(corpus):
  nsp = instances.plan_nsp(corpus.index, MAX_SEQ_LENGTH, 0.1, 3, 2)
  plan = instances.plan_sentence_distance(corpus.index, MAX_SEQ_LENGTH, 0.1,
                                          3, 2, (0.5, 0.0, 0.5))
  for name in ('document', 'start', 'a_end', 'end', 'is_random',
               'target_length'):
    np.testing.assert_array_equal(getattr(plan, name), getattr(nsp, name))
  np.testing.assert_array_equal(plan.label, 2 * nsp.is_random)


def test_unused_sentences_are_put_back(corpus):
  plan = builder(corpus).plan(0)
  offsets = corpus.index.document_offsets
  for d in range(corpus.index.num_documents):
    used = []
    for k in np.flatnonzero(plan.document == d):
      last = plan.end[k] if plan.label[k] == 0 else plan.a_end[k]
      assert plan.start[k] == (used[-1] + 1 if used else offsets[d])
      used.extend(range(plan.start[k], last))
    assert used == list(range(offsets[d], offsets[d + 1]))


def test_materialized_pairs(corpus):
  b = builder(corpus)
  plan = b.plan(0)
  ks = np.arange(len(plan))
  batch = b.materialize_batch(plan, ks, 0)
  np.testing.assert_array_equal(batch['next_sentence_label'], plan.label)
  assert batch['next_sentence_label'].dtype == np.int32
  b_doc, b_start, b_end = b.pair_b_sentences(plan, ks, 0)
  sentence_of = np.searchsorted(corpus.csum, np.arange(corpus.csum[-1]),
                                'right') - 1
  for k in ks:
    ids = batch['input_ids'][k][batch['attention_mask'][k] > 0]
    types = batch['token_type_ids'][k][batch['attention_mask'][k] > 0]
    sep = np.flatnonzero(ids == SEP_ID)
    assert len(sep) == 2 and sep[1] == len(ids) - 1
    np.testing.assert_array_equal(types, np.arange(len(ids)) > sep[0])
    a, b_ = ids[1:sep[0]] - NUM_SPECIAL, ids[sep[0] + 1:-1] - NUM_SPECIAL
    assert 1 <= len(b_) and len(a) + len(b_) <= MAX_SEQ_LENGTH - 3
    # A's and B's tokens: contiguous runs of their sentences.
    assert np.all(np.diff(a) == 1) and np.all(np.diff(b_) == 1)
    assert plan.start[k] <= sentence_of[a[0]] <= sentence_of[a[-1]] < (
        plan.a_end[k])
    assert b_start[k] <= sentence_of[b_[0]] <= sentence_of[b_[-1]] < (
        b_end[k])
    b_docs = corpus.doc_of_token(b_ + NUM_SPECIAL)
    assert (b_docs == plan.document[k]).all() == (plan.label[k] != 2)
    # Truncation cuts A's front and B's back only: A ends with its last
    # sentence and B opens with its first, so the class is what the model
    # sees (a class-0 B follows A's last shown sentence).
    assert a[-1] == corpus.csum[plan.a_end[k]] - 1
    assert b_[0] == corpus.csum[b_start[k]]
    follows = b_docs[0] == plan.document[k] and (
        sentence_of[b_[0]] == sentence_of[a[-1]] + 1)
    assert follows == (plan.label[k] == 0)
  # The corpus's long sentences make truncation cut many pairs of each
  # class (so the cuts above are tested).
  full = batch['attention_mask'].sum(1) == MAX_SEQ_LENGTH
  assert np.bincount(plan.label[full], minlength=3).min() > 20


def test_same_seed_same_bytes_and_other_seeds_differ(corpus):
  def batch(seed):
    ds = instances.InstanceDataset(builder(corpus, seed=seed), seed=seed,
                                   dupe_factor=1, dynamic=True)
    return ds.get_batch(np.arange(0, 3000, 7))

  first, again, other = batch(0), batch(0), batch(1)
  for key in first:
    assert first[key].tobytes() == again[key].tobytes(), key
  assert first['input_ids'].tobytes() != other['input_ids'].tobytes()


def test_builder_checks(corpus):
  with pytest.raises(ValueError, match='distance_probabilities'):
    builder(corpus, probabilities=(0.5, 0.5, 0.5))
  with pytest.raises(ValueError, match='distance_probabilities'):
    builder(corpus, probabilities=(1.2, -0.2, 0.0))
  with pytest.raises(pretokenize.DataError, match='other documents'):
    builder(FakeCorpus([[5, 5, 5, 5]]))


def test_task_declaration_and_checks():
  task = tasks.get('sentence_distance')
  assert (task.head, task.label_field, task.weight_field, task.layout) == (
      'sentence', 'next_sentence_labels', '', 'sentence_distance')
  assert task.apply is None and not task.corrupts
  params = task.defaults()
  assert task.num_classes(params, 128) == 3
  assert task.fields(params, 128) == {}
  errors = []
  task.check(params, None, errors)
  assert not errors
  for bad in ((0.5, 0.5), (0.5, 0.6, -0.1), (0.4, 0.4, 0.4), 'thirds'):
    errors = []
    task.check({'probabilities': bad}, None, errors)
    assert len(errors) == 1
    assert 'tasks.sentence_distance.probabilities' in errors[0]
    assert '(1/3, 1/3, 1/3)' in errors[0]
