"""Tests for data_pipelines.downstream.tasks (and base): the Task type."""

import pytest

from data_pipelines.downstream import Task, TaskError


def test_task_num_labels_per_kind():
  assert Task('c', 'classification', ('a', 'b', 'c'), ('accuracy',), [],
              []).num_labels == 3
  assert Task('t', 'token', ('O', 'B-X', 'I-X'), ('entity_f1',), [],
              []).num_labels == 3
  assert Task('r', 'regression', (), ('pearson',), [], []).num_labels == 1
  assert Task('s', 'span', (), ('exact_match',), [], []).num_labels == 2


@pytest.mark.parametrize('kind, metrics, message', [
    ('ranking', ('accuracy',), r"task kind 'ranking'; use one of"),
    ('classification', ('accuracy', 'bleu'), r"metrics \('accuracy', 'bleu'\)"
     r' must be a non-empty tuple of'),
    ('classification', (), r'metrics \(\) must be a non-empty tuple'),
])
def test_task_rejects_unknown_kind_and_metrics(kind, metrics, message):
  with pytest.raises(TaskError, match=message):
    Task('t', kind, (), metrics, [], [])
