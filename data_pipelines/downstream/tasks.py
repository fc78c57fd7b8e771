"""The ``Task`` type: a downstream task's examples and how to score them."""

from __future__ import annotations

import dataclasses

from data_pipelines.downstream import base
from data_pipelines.downstream import metrics as metrics_lib


@dataclasses.dataclass(frozen=True)
class Task:
  """A downstream task: examples and how to score them.

  Attributes:
    name: e.g. 'embedded', 'glue/sst2', 'files:train.jsonl'.
    kind: one of ``KINDS``.
    label_names: classes of classification, tags of token tasks (id = index);
      () for regression and span.
    metrics: names of ``METRICS``; the first is the headline metric.
    train: training examples (formats in the package docstring).
    eval: evaluation examples.
  """
  name: str
  kind: str
  label_names: tuple[str, ...]
  metrics: tuple[str, ...]
  train: list[dict]
  eval: list[dict]

  def __post_init__(self):
    base.check_kind(self.kind)
    known = metrics_lib.METRICS
    unknown = [m for m in self.metrics if m not in known]
    if not self.metrics or unknown:
      raise base.TaskError(f'task {self.name!r}: metrics {self.metrics!r} '
                           f'must be a non-empty tuple of {sorted(known)}.')

  @property
  def num_labels(self) -> int:
    """Outputs of the task's head: classes, 1 (regression), 2 (start, end)."""
    if self.kind == 'regression':
      return 1
    if self.kind == 'span':
      return 2
    return len(self.label_names)
