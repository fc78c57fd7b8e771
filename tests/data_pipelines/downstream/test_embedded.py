"""Tests for data_pipelines.downstream.embedded: the embedded task."""

import collections
import functools

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


def test_embedded_task_on_a_stripped_python(monkeypatch):
  # The stdlib parse is cached per process: give this test a fresh cache,
  # so it sees the stripped install and later tests never see its result.
  monkeypatch.setattr(embedded_lib, '_package_paragraphs', functools.cache(
      embedded_lib._package_paragraphs.__wrapped__))
  monkeypatch.setattr(corpus_lib, 'stdlib_files', lambda: [])
  with pytest.raises(TaskError, match='found 0 standard-library packages.*'
                     'needs 2'):
    downstream.embedded_task()
