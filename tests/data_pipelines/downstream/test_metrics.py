"""Tests for data_pipelines.downstream.metrics: the metrics, against
hand-computed values, and evaluate."""

import math

import numpy as np
import pytest
from scipy import stats

from data_pipelines import downstream
from data_pipelines.downstream import Task, TaskError


def test_accuracy_skips_ignored_positions():
  assert downstream.accuracy([1, 0, 2, 2], [1, 1, 2, 0]) == pytest.approx(0.5)
  predictions = np.array([[3, 1, 0], [2, 2, 2]])
  labels = np.array([[3, -1, 1], [2, -1, -1]])
  # 3 scored positions, 2 right.
  assert downstream.accuracy(predictions, labels) == pytest.approx(2 / 3)
  assert downstream.METRICS['token_accuracy'](predictions, labels) == \
      pytest.approx(2 / 3)


def test_accuracy_rejects_mismatched_shapes():
  with pytest.raises(TaskError, match='shape'):
    downstream.accuracy([1, 0], [1, 0, 1])


def test_f1_binary_is_f1_of_class_one():
  # tp=2 (0, 4), fp=1 (3), fn=1 (1): F1 = 2*2 / (2*2 + 1 + 1).
  y = [1, 1, 0, 0, 1]
  p = [1, 0, 0, 1, 1]
  assert downstream.f1(p, y, ('no', 'yes')) == pytest.approx(4 / 6)
  # No positives at all: 0, not NaN.
  assert downstream.f1([0, 0], [0, 0], ('no', 'yes')) == 0.0


def test_f1_macro_over_classes():
  y = [0, 0, 0, 1, 1, 2, 2, 2]
  p = [0, 0, 1, 1, 2, 2, 2, 0]
  # Class 0: tp 2, fp 1, fn 1 -> 4/6. Class 1: tp 1, fp 1, fn 1 -> 2/4.
  # Class 2: tp 2, fp 1, fn 1 -> 4/6.
  expected = (4 / 6 + 2 / 4 + 4 / 6) / 3
  assert downstream.f1(p, y, ('a', 'b', 'c')) == pytest.approx(expected)


def test_f1_classes_absent_from_labels_or_predictions():
  # Binary, class 1 never predicted: tp 0, fn 2 -> 0, not NaN.
  assert downstream.f1([0, 0, 0], [1, 1, 0], ('no', 'yes')) == 0.0
  # A predicted id outside the two names is not class 1: tp 1, fn 1 -> 2/3.
  assert downstream.f1([1, 2, 0], [1, 1, 0], ('no', 'yes')) == \
      pytest.approx(2 / 3)
  # No names: ids 0 and 1 make two classes, so class 1's F1 (tp 1, fn 1),
  # not the macro mean (2/3 + 0) / 2.
  assert downstream.f1([1, 0], [1, 1]) == pytest.approx(2 / 3)
  # Macro: class 2 only predicted (tp 0, fp 1) counts as 0; class 0: tp 1
  # -> 1; class 1: tp 1, fn 1 -> 2/3.
  assert downstream.f1([0, 1, 2], [0, 1, 1], ('a', 'b', 'c')) == \
      pytest.approx((1 + 2 / 3 + 0) / 3)
  # Macro over the classes present only: 'c' occurs in neither. Class 0:
  # tp 1, fn 1 -> 2/3; class 1: tp 1, fp 1 -> 2/3.
  assert downstream.f1([0, 1, 1], [0, 1, 0], ('a', 'b', 'c')) == \
      pytest.approx(2 / 3)


def test_matthews_binary_and_multiclass_by_hand():
  # tp 3, tn 3, fp 1, fn 1: (9 - 1) / sqrt(4 * 4 * 4 * 4) = 0.5.
  y = [1, 1, 1, 0, 0, 0, 0, 1]
  p = [1, 1, 0, 0, 0, 1, 0, 1]
  assert downstream.matthews(p, y) == pytest.approx(0.5)
  # Confusion [[2,1,0],[0,1,1],[1,0,2]]: c=5, s=8, t=p=(3,2,3), t.p=22:
  # (5*8 - 22) / sqrt((64 - 22) * (64 - 22)) = 18 / 42.
  y = [0, 0, 0, 1, 1, 2, 2, 2]
  p = [0, 0, 1, 1, 2, 2, 2, 0]
  assert downstream.matthews(p, y) == pytest.approx(18 / 42)
  assert downstream.matthews([1, 1, 1], [0, 1, 0]) == 0.0  # Undefined.
  assert downstream.matthews(y, y) == pytest.approx(1.0)


def test_pearson_and_spearman_with_ties():
  assert downstream.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.5]) == \
      pytest.approx(stats.pearsonr([1, 2, 3], [2, 4, 6.5])[0], abs=1e-12)
  assert downstream.pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == \
      pytest.approx(-1.0)
  # Ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5).
  p, y = [1.0, 2.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0]
  assert downstream.spearman(p, y) == pytest.approx(4.5 / math.sqrt(22.5),
                                                    abs=1e-12)
  assert downstream.spearman(p, y) == pytest.approx(
      stats.spearmanr(p, y).statistic, abs=1e-12)
  # Constant predictions: 0, not NaN.
  assert downstream.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
  assert downstream.spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0


def test_pearson_by_hand():
  # Deviations from the means: (-1, 0, 1) and (-13/6, -1/6, 14/6).
  # Sxy = 27/6 = 4.5, Sxx = 2, Syy = (169 + 1 + 196) / 36.
  assert downstream.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.5]) == \
      pytest.approx(4.5 / math.sqrt(2 * 366 / 36), abs=1e-12)


def test_metrics_are_zero_where_undefined():
  for name in ('accuracy', 'f1', 'matthews', 'pearson', 'spearman'):
    metric = downstream.METRICS[name]
    assert metric([], []) == 0.0  # No examples.
  for name in ('accuracy', 'f1', 'matthews'):
    assert downstream.METRICS[name]([1, 0], [-1, -1]) == 0.0  # None scored.
  # One class in labels and predictions alike.
  assert downstream.matthews([2, 2, 2], [2, 2, 2]) == 0.0
  assert downstream.matthews([0, 1, 1], [1, 1, 1]) == 0.0  # Constant labels.
  # Fewer than two points; a non-finite prediction.
  assert downstream.pearson([1.0], [2.0]) == 0.0
  assert downstream.spearman([1.0], [2.0]) == 0.0
  assert downstream.pearson([1.0, math.nan, 3.0], [1.0, 2.0, 3.0]) == 0.0


def test_squad_exact_match_and_f1():
  examples = [
      {'id': 'q1', 'answers': [{'text': 'Denver Broncos', 'start': 0}]},
      {'id': 'q2', 'answers': [{'text': 'Carolina Panthers', 'start': 0},
                               {'text': 'the Panthers', 'start': 0}]},
      {'id': 'q3', 'answers': [{'text': '1990s.', 'start': 0}]},
      {'id': 'q4', 'answers': [{'text': 'Santa Clara', 'start': 0}]},
  ]
  predictions = {'q1': 'The  Denver, Broncos!', 'q2': 'Carolina',
                 'q3': 'in 1990s'}  # q4 is missing: it scores 0.
  # q1: exact after normalization. q2: P 1, R 1/2 vs gold 1 -> 2/3 (gold 2
  # 'panthers' shares nothing). q3: P 1/2, R 1 -> 2/3.
  assert downstream.exact_match(predictions, examples) == pytest.approx(0.25)
  assert downstream.span_f1(predictions, examples) == pytest.approx(
      (1 + 2 / 3 + 2 / 3 + 0) / 4)
  assert downstream.normalize_answer('An  Apple, a day.') == 'apple day'


def test_entity_f1_conlleval_style():
  names = ('O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC')
  o, bp, ip, bl, il = range(5)
  labels = np.array([[bp, ip, o, bl, o],
                     [bl, -1, il, -1, -1]])
  predictions = np.array([[bp, o, o, bl, o],      # PER cut short: wrong.
                          [bl, bp, il, o, ip]])   # -1 positions ignored.
  # Gold: PER(0,2), LOC(3,4); LOC(0,2). Found: PER(0,1), LOC(3,4); LOC(0,2).
  # 2 of 3 right both ways: P = R = F1 = 2/3.
  assert downstream.entity_f1(predictions, labels, names) == pytest.approx(
      2 / 3)
  assert downstream.accuracy(predictions, labels) == pytest.approx(6 / 7)
  assert downstream.entity_f1(labels, labels, names) == pytest.approx(1.0)
  with pytest.raises(TaskError, match='tag names'):
    downstream.entity_f1(labels, labels, ())


def test_entity_chunks_bio_and_iob1():
  chunks = downstream.entity_chunks
  # IOB1: I- starts an entity; B- only separates two of the same type.
  assert chunks(['I-PER', 'I-PER', 'B-PER', 'O']) == {(0, 2, 'PER'),
                                                      (2, 3, 'PER')}
  # A type change ends one entity and starts another.
  assert chunks(['B-PER', 'I-LOC', 'I-LOC']) == {(0, 1, 'PER'),
                                                 (1, 3, 'LOC')}
  assert chunks(['O', 'B-ORG', 'I-ORG', 'I-ORG']) == {(1, 4, 'ORG')}
  assert chunks(['O', 'MISC', 'O']) == set()  # Unprefixed tags are O.


def test_evaluate_returns_every_metric_as_float(task):
  labels = np.array([e['label'] for e in task.eval])
  result = downstream.evaluate(task, labels, labels)
  assert set(result) == set(task.metrics) == {'accuracy', 'f1'}
  assert all(type(v) is float and v == pytest.approx(1.0)
             for v in result.values())
  span_task = Task('s', 'span', (), ('exact_match', 'span_f1'), [], [
      {'id': 'a', 'question': 'q', 'context': 'x y',
       'answers': [{'text': 'y', 'start': 2}]}])
  assert downstream.evaluate(span_task, {'a': 'y'}) == {
      'exact_match': 1.0, 'span_f1': 1.0}
  assert span_task.num_labels == 2
