"""Tests for data_pipelines.downstream.embedded: the embedded tasks."""

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


@pytest.mark.parametrize('build', [downstream.embedded_task,
                                   downstream.embedded_top4_task])
def test_embedded_tasks_on_a_stripped_python(monkeypatch, build):
  # The stdlib parse is cached per process: give this test a fresh cache,
  # so it sees the stripped install and later tests never see its result.
  monkeypatch.setattr(embedded_lib, '_package_paragraphs', functools.cache(
      embedded_lib._package_paragraphs.__wrapped__))
  monkeypatch.setattr(corpus_lib, 'stdlib_files', lambda: [])
  with pytest.raises(TaskError, match='found 0 standard-library packages.*'
                     'need 2'):
    build()


# ---------------------------------------------------------------------------
# embedded_top4: the package, over the four largest packages.


@pytest.fixture(scope='module')
def top4():
  return downstream.embedded_top4_task()


def test_embedded_top4_is_the_embedded_task_of_its_largest_packages(task,
                                                                     top4):
  assert top4.name == 'embedded_top4' and top4.kind == 'classification'
  assert top4.metrics == ('accuracy', 'f1') and top4.num_labels == 4
  assert list(top4.label_names) == sorted(top4.label_names)
  # Its classes: the 4 of the embedded task's with the most examples (a
  # tie broken by name).
  package = {e['text']: task.label_names[e['label']]
             for e in task.train + task.eval}
  sizes = collections.Counter(package.values())
  assert set(top4.label_names) <= set(task.label_names)
  smallest = min(sizes[name] for name in top4.label_names)
  assert all(sizes[name] <= smallest for name in task.label_names
             if name not in top4.label_names)
  # Labels right, and the embedded task's examples of those packages, in
  # the same (hash) order and split.
  for mine, theirs in ((top4.train, task.train), (top4.eval, task.eval)):
    assert all(top4.label_names[e['label']] == package[e['text']]
               and e['text_pair'] is None for e in mine)
    assert [e['text'] for e in mine] == [
        e['text'] for e in theirs if package[e['text']] in top4.label_names]
  # Every class in both splits.
  for split in (top4.train, top4.eval):
    assert set(e['label'] for e in split) == set(range(4))


def test_embedded_top4_splits_are_disjoint_across_the_tasks(task, top4):
  """No eval paragraph of either task is in either task's training set, so
  multi-task training on both never trains on an eval example."""
  train = {e['text'] for e in task.train + top4.train}
  evaluated = {e['text'] for e in task.eval + top4.eval}
  assert not train & evaluated
  assert 0.12 < len(top4.eval) / (len(top4.train) + len(top4.eval)) < 0.28


def test_embedded_top4_is_clearly_larger_than_the_low_resource_embedded():
  """At the multi-task table's settings (experiments/configs/multitask.py:
  embedded with 32 examples per class, embedded_top4 whole) the two
  training sets differ by a factor over 3: tasks of different sizes."""
  small = downstream.embedded_task(examples_per_class=32)
  assert len(small.train) == 32 * small.num_labels
  assert len(downstream.embedded_top4_task().train) > 3 * len(small.train)


def test_embedded_top4_is_deterministic_and_subsamples(top4):
  assert downstream.embedded_top4_task() == top4
  small = downstream.embedded_top4_task(examples_per_class=50, seed=3)
  assert collections.Counter(e['label'] for e in small.train) == {
      i: 50 for i in range(4)}
  assert small.eval == top4.eval   # Never subsampled.
  assert all(e in top4.train for e in small.train)
  assert downstream.embedded_top4_task(examples_per_class=50,
                                       seed=3) == small
  assert downstream.embedded_top4_task(
      examples_per_class=50, seed=4).train != small.train
  with pytest.raises(TaskError, match='>= 0'):
    downstream.embedded_top4_task(examples_per_class=-1)
