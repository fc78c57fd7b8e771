"""The metrics of downstream tasks (``METRICS``) and ``evaluate``.

Each metric takes (predictions, labels, label_names) and returns a Python
float (not a percentage); where it is undefined (no scored example, a
constant input) it returns 0, not NaN, so model selection and logs stay
numeric.

Accuracy, F1 and Matthews correlation are scikit-learn's, Pearson and
Spearman SciPy's. SQuAD's exact match and answer F1 (evaluate-v1.1.py) and
conlleval's entity F1 are written here: none of our dependencies computes
them.
"""

from __future__ import annotations

import collections
import math
import re
import string
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from scipy import stats
from sklearn import metrics as sklearn_metrics

from data_pipelines.downstream import base

if TYPE_CHECKING:  # Only for annotations: tasks imports this module.
  from data_pipelines.downstream import tasks


def _arrays(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  if predictions.shape != labels.shape:
    raise base.TaskError(f'predictions of shape {predictions.shape} but '
                         f'labels of shape {labels.shape}.')
  return predictions, labels


def _scored(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  """Flat predictions and labels where the label is not -1 (padding)."""
  predictions, labels = _arrays(predictions, labels)
  keep = labels != base.IGNORE
  return predictions[keep].astype(np.int64), labels[keep].astype(np.int64)


def accuracy(predictions, labels, label_names=()) -> float:
  """Fraction of correct predictions; label -1 positions are skipped, so it
  is also token accuracy for token tasks' [N, L] arrays."""
  del label_names
  predictions, labels = _scored(predictions, labels)
  if not labels.size:
    return 0.0
  return float(sklearn_metrics.accuracy_score(labels, predictions))


def f1(predictions, labels, label_names=()) -> float:
  """F1 of class 1 when there are two classes (GLUE's MRPC and QQP), else
  macro-F1 over the classes that occur in labels or predictions.

  The class count is ``len(label_names)``, or the largest id + 1 without.
  A class with no true and no predicted example scores 0, not NaN.
  """
  predictions, labels = _scored(predictions, labels)
  if not labels.size:
    return 0.0
  num_classes = len(label_names) or int(max(predictions.max(),
                                            labels.max())) + 1
  if num_classes == 2:
    # Class 1's own F1 (labels=[1]) rather than average='binary', which
    # rejects a predicted id outside the two classes.
    return float(sklearn_metrics.f1_score(labels, predictions, labels=[1],
                                          average=None, zero_division=0.0)[0])
  # sklearn's default classes are those in labels or predictions.
  return float(sklearn_metrics.f1_score(labels, predictions, average='macro',
                                        zero_division=0.0))


def matthews(predictions, labels, label_names=()) -> float:
  """Matthews correlation, multiclass (Gorodkin's R_K, sklearn's): 0 when
  undefined (a constant prediction or label)."""
  del label_names
  predictions, labels = _scored(predictions, labels)
  # One class in all (or none): undefined. sklearn gives 0 too, but warns
  # about its confusion matrix's shape.
  if np.union1d(labels, predictions).size < 2:
    return 0.0
  return float(sklearn_metrics.matthews_corrcoef(labels, predictions))


def _correlation(kind: str, predictions, labels) -> float:
  predictions, labels = _arrays(predictions, labels)
  predictions = predictions.astype(np.float64).ravel()
  labels = labels.astype(np.float64).ravel()
  # Undefined for constant inputs (an untrained head): 0, not NaN, so model
  # selection and logs stay numeric.
  if labels.size < 2 or np.ptp(predictions) == 0 or np.ptp(labels) == 0:
    return 0.0
  fn = stats.pearsonr if kind == 'pearson' else stats.spearmanr
  value = float(fn(predictions, labels)[0])
  return value if math.isfinite(value) else 0.0


def pearson(predictions, labels, label_names=()) -> float:
  """Pearson correlation (scipy.stats.pearsonr); 0 for constant inputs."""
  del label_names
  return _correlation('pearson', predictions, labels)


def spearman(predictions, labels, label_names=()) -> float:
  """Spearman rank correlation, ties at their mean rank (scipy)."""
  del label_names
  return _correlation('spearman', predictions, labels)


def normalize_answer(text: str) -> str:
  """SQuAD v1.1's normalization: lower case, no punctuation, no articles
  (a, an, the), single spaces."""
  text = text.lower()
  text = ''.join(c for c in text if c not in _PUNCTUATION)
  text = re.sub(r'\b(a|an|the)\b', ' ', text)
  return ' '.join(text.split())


_PUNCTUATION = frozenset(string.punctuation)


def _answer_f1(prediction: str, gold: str) -> float:
  predicted, truth = normalize_answer(prediction).split(), normalize_answer(
      gold).split()
  same = sum((collections.Counter(predicted) &
              collections.Counter(truth)).values())
  if not same:
    return 0.0
  precision, recall = same / len(predicted), same / len(truth)
  return 2 * precision * recall / (precision + recall)


def _span_scores(predictions: dict, examples: list[dict],
                 score: Callable[[str, str], float]) -> float:
  """Mean over examples of the best score against any gold answer; an
  example without a prediction scores 0 (as SQuAD's evaluate-v1.1.py)."""
  if not isinstance(predictions, dict):
    raise base.TaskError('span predictions must be a dict of example id -> '
                         'answer text (span_predictions gives one), not '
                         f'{type(predictions).__name__}.')
  if not examples:
    return 0.0
  total = 0.0
  for ex in examples:
    prediction = predictions.get(ex['id'])
    golds = [a['text'] for a in ex['answers']]
    if prediction is not None and golds:
      total += max(score(prediction, g) for g in golds)
  return total / len(examples)


def exact_match(predictions, labels, label_names=()) -> float:
  """SQuAD v1.1 exact match; ``labels`` are the examples (gold answers)."""
  del label_names
  return _span_scores(predictions, labels, lambda p, g: float(
      normalize_answer(p) == normalize_answer(g)))


def span_f1(predictions, labels, label_names=()) -> float:
  """SQuAD v1.1 token-overlap F1; ``labels`` are the examples."""
  del label_names
  return _span_scores(predictions, labels, _answer_f1)


def _split_tag(tag: str) -> tuple[str, str]:
  if tag[:2] in ('B-', 'I-'):
    return tag[0], tag[2:]
  return 'O', ''  # 'O' and any tag without a B-/I- prefix.


def entity_chunks(tags: Sequence[str]) -> set[tuple[int, int, str]]:
  """(start, end, type) of the entities in one sentence's BIO or IOB1 tags.

  conlleval's rules: an entity starts at B-X, or at I-X after O or after a
  tag of another type; it ends before O, B-, or a tag of another type. Tags
  without a B-/I- prefix count as O (E-/S- schemes are not supported).
  """
  chunks, start = set(), None
  prev_tag, prev_type = 'O', ''
  for i, name in enumerate(list(tags) + ['O']):
    tag, type_ = _split_tag(name)
    if start is not None and (
        tag in ('B', 'O') or (prev_tag != 'O' and prev_type != type_)):
      chunks.add((start, i, prev_type))
      start = None
    if tag == 'B' or (tag == 'I' and (prev_tag == 'O' or prev_type != type_)):
      start = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_f1(predictions, labels, label_names=()) -> float:
  """Entity-level micro F1 as conlleval computes it.

  Args:
    predictions, labels: int [N, L] (or [L]) tag ids into ``label_names``
      (e.g. 'B-PER', 'I-PER', 'O'); positions whose label is -1 are skipped,
      and each row is one sentence. A predicted id outside the names is O.
    label_names: the tags.
  """
  if not label_names:
    raise base.TaskError('entity_f1 needs the tag names (task.label_names).')
  predictions, labels = _arrays(predictions, labels)
  if labels.ndim == 1:
    predictions, labels = predictions[None], labels[None]
  names = list(label_names)

  def tag(i):
    return names[i] if 0 <= i < len(names) else 'O'

  gold, found = set(), set()
  for row, (p, y) in enumerate(zip(predictions.reshape(-1, labels.shape[-1]),
                                   labels.reshape(-1, labels.shape[-1]))):
    keep = y != base.IGNORE
    gold |= {(row,) + c for c in entity_chunks([tag(i) for i in
                                                y[keep].tolist()])}
    found |= {(row,) + c for c in entity_chunks([tag(i) for i in
                                                 p[keep].tolist()])}
  correct = len(gold & found)
  if not correct:
    return 0.0
  precision, recall = correct / len(found), correct / len(gold)
  return 2 * precision * recall / (precision + recall)


METRICS: dict[str, Callable[..., float]] = {
    'accuracy': accuracy,
    'token_accuracy': accuracy,  # accuracy skips the -1 positions already.
    'f1': f1,
    'matthews': matthews,
    'pearson': pearson,
    'spearman': spearman,
    'exact_match': exact_match,
    'span_f1': span_f1,
    'entity_f1': entity_f1,
}


def per_seed(headline: str) -> Callable[[np.ndarray, np.ndarray],
                                        np.ndarray]:
  """``(predictions [seeds, n], labels [n]) -> [seeds]``: the metric
  ``headline`` of each seed's per-example predictions (accuracy
  vectorised), as an interval recomputes it per resample of the held-out
  examples (bertjax/intervals.py ``hierarchical_interval``)."""
  if headline == 'accuracy':
    return lambda predictions, labels: (predictions == labels).mean(-1)
  metric = METRICS[headline]
  return lambda predictions, labels: np.array(
      [metric(p, labels) for p in predictions])


def evaluate(task: tasks.Task, predictions, labels=None) -> dict[str, float]:
  """Every metric of ``task.metrics`` (Python floats, not percentages).

  Args:
    task: the task (its kind, metrics and label names).
    predictions: classification int [N]; regression float [N]; token int
      [N, L]; span a dict example id -> answer text (``span_predictions``).
    labels: like predictions (token: -1 where there is none); span: the
      evaluation examples (default ``task.eval``).
  """
  if labels is None:
    if task.kind != 'span':
      raise base.TaskError(f'evaluate needs labels for a {task.kind} '
                           'task.')
    labels = task.eval
  return {name: float(METRICS[name](predictions, labels, task.label_names))
          for name in task.metrics}
