"""Tests for data_pipelines.downstream.embedded: the embedded tasks."""

import collections
import functools
import math

import pytest

from data_pipelines import corpus as corpus_lib
from data_pipelines import downstream
from data_pipelines.downstream import embedded as embedded_lib
from data_pipelines.downstream import TaskError


def test_embedded_task_classes_and_split(task):
  assert task.kind == 'classification'
  assert len(task.label_names) >= 2
  assert list(task.label_names) == sorted(task.label_names)
  assert task.metrics == ('accuracy', 'f1')
  assert task.num_labels == len(task.label_names)
  train_texts = [e['text'] for e in task.train]
  eval_texts = [e['text'] for e in task.eval]
  # Unique texts, disjoint splits, about 80/20.
  assert len(set(train_texts)) == len(train_texts)
  assert len(set(eval_texts)) == len(eval_texts)
  assert not set(train_texts) & set(eval_texts)
  assert 0.12 < len(eval_texts) / (len(train_texts) + len(eval_texts)) < 0.28
  counts = collections.Counter(e['label'] for e in task.train + task.eval)
  assert set(counts) == set(range(len(task.label_names)))
  assert min(counts.values()) >= 40
  for e in task.train[:50]:
    assert e['text_pair'] is None and e['text'] == e['text'].strip()
    assert '\n' not in e['text'] and len(e['text']) >= 20


def test_embedded_task_is_deterministic(task):
  assert downstream.embedded_task() == task


def test_embedded_examples_per_class(task):
  small = downstream.embedded_task(examples_per_class=5, seed=1)
  counts = collections.Counter(e['label'] for e in small.train)
  assert counts == {i: 5 for i in range(len(task.label_names))}
  assert small.eval == task.eval  # Never subsampled.
  train_texts = {e['text'] for e in task.train}
  assert all(e['text'] in train_texts for e in small.train)
  # The choice depends on the seed only.
  assert downstream.embedded_task(examples_per_class=5, seed=1) == small
  other = downstream.embedded_task(examples_per_class=5, seed=2)
  assert other.train != small.train
  # More than a class holds: all of it.
  big = downstream.embedded_task(examples_per_class=10**6)
  assert big.train == task.train
  with pytest.raises(TaskError, match='>= 0'):
    downstream.embedded_task(examples_per_class=-1)


@pytest.mark.parametrize('build', [downstream.embedded_task,
                                   downstream.embedded_pairs_task])
def test_embedded_tasks_on_a_stripped_python(monkeypatch, build):
  # The stdlib parse is cached per process: give this test a fresh cache,
  # so it sees the stripped install and later tests never see its result.
  monkeypatch.setattr(embedded_lib, '_package_paragraphs', functools.cache(
      embedded_lib._package_paragraphs.__wrapped__))
  monkeypatch.setattr(corpus_lib, 'stdlib_files', lambda: [])
  with pytest.raises(TaskError, match='found 0 standard-library packages.*'
                     'needs 2'):
    build()


# ---------------------------------------------------------------------------
# embedded_pairs: do two paragraphs come from the same package?


@pytest.fixture(scope='module')
def pairs():
  return downstream.embedded_pairs_task()


def test_embedded_pairs_sizes_and_labels(task, pairs):
  assert pairs.name == 'embedded_pairs' and pairs.kind == 'classification'
  assert pairs.label_names == ('different', 'same')
  assert pairs.metrics == ('accuracy', 'f1') and pairs.num_labels == 2
  # Four pairs per paragraph of each split: 4x the embedded task's
  # training set, a task of a clearly different size.
  assert len(pairs.train) == 4 * len(task.train)
  assert len(pairs.eval) == 4 * len(task.eval)
  # Labels exactly balanced, and right: 'same' iff the two paragraphs'
  # packages (the embedded task's labels) agree.
  package = {e['text']: e['label'] for e in task.train + task.eval}
  for split in (pairs.train, pairs.eval):
    assert sum(e['label'] for e in split) == len(split) // 2
    assert all(e['label'] == int(package[e['text']] ==
                                 package[e['text_pair']]) for e in split)
    assert all(e['text'] != e['text_pair'] for e in split)
  # A paragraph's two positive partners, and its two negative partners'
  # packages, are distinct.
  for i in range(0, len(pairs.train), 4):
    group = pairs.train[i:i + 4]
    assert len({e['text'] for e in group}) == 1
    assert group[0]['text_pair'] != group[2]['text_pair']
    assert package[group[1]['text_pair']] != package[group[3]['text_pair']]


def test_embedded_pairs_splits_are_disjoint(task, pairs):
  """A training pair joins two training paragraphs of the embedded task,
  an eval pair two eval paragraphs: no eval paragraph is ever trained on,
  in either task."""
  train_texts = {e['text'] for e in task.train}
  eval_texts = {e['text'] for e in task.eval}
  for e in pairs.train:
    assert e['text'] in train_texts and e['text_pair'] in train_texts
  for e in pairs.eval:
    assert e['text'] in eval_texts and e['text_pair'] in eval_texts
  # Every paragraph leads its four pairs.
  assert {e['text'] for e in pairs.train} == train_texts


def test_embedded_pairs_negatives_are_uniform_over_packages(task, pairs):
  """A negative partner's package is drawn uniformly from the other 7: its
  count is within 5 binomial standard deviations of the expectation, so the
  partner's package does not give the label away."""
  package = {e['text']: e['label'] for e in task.train}
  per_package = collections.Counter(package.values())
  others = len(task.label_names) - 1
  drawn = collections.Counter(package[e['text_pair']] for e in pairs.train
                              if e['label'] == 0)
  for label in range(len(task.label_names)):
    trials = 2 * (len(task.train) - per_package[label])
    expected = trials / others
    bound = 5 * math.sqrt(trials * (1 / others) * (1 - 1 / others))
    assert abs(drawn[label] - expected) < bound, (label, drawn[label],
                                                  expected)


def test_embedded_pairs_are_deterministic_and_subsample(pairs):
  assert downstream.embedded_pairs_task() == pairs
  small = downstream.embedded_pairs_task(examples_per_class=50, seed=3)
  assert collections.Counter(e['label'] for e in small.train) == {0: 50,
                                                                  1: 50}
  assert small.eval == pairs.eval   # Never subsampled.
  assert all(e in pairs.train for e in small.train)
  assert downstream.embedded_pairs_task(examples_per_class=50,
                                        seed=3) == small
  assert downstream.embedded_pairs_task(
      examples_per_class=50, seed=4).train != small.train
  with pytest.raises(TaskError, match='>= 0'):
    downstream.embedded_pairs_task(examples_per_class=-1)
