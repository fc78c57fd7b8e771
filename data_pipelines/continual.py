"""Batch streams, and ERNIE 2.0's continual multi-task schedule over them.

A run reads one or more *streams* of batches. Each stream has its own
instance layout and builds its own tasks (data_pipelines/tasks/), with or
without masked LM:

- a run without ``continual.stage_steps`` has one stream: ``data.layout``,
  every task of ``tasks.*`` with weight > 0, masked LM when
  ``objective.mlm_weight`` > 0;
- ERNIE 2.0's continual multi-task pretraining (Sun et al., AAAI 2020,
  Sec. 3.2 and Fig. 2) has one stream per task (``continual.streams``),
  each with a task id whose embedding is added to the input (Sec. 3.3;
  ``model.task_type_vocab_size``), introduced stage by stage while the
  earlier ones stay in the mix.

The schedule: stage ``k`` runs ``continual.stage_steps[k]`` steps over the
streams introduced by then (``first_stage <= k``). Each gets an exact share
of the stage's steps, ``weight / sum of the stage's weights`` rounded by
largest remainders (its iteration budget), in an order that a permutation
of the stage's slots fixes, drawn by NumPy's Generator seeded with (seed,
stage). So the stream of step ``s``, and which of that stream's batches it
reads, are pure functions of (seed, s): resuming is starting from a step,
as for one stream. Past the last stage the last stage's mix goes on.
(NumPy does not promise a Generator's draws across its releases, as
counter_rng promises its own: resume a run with the NumPy it started
with.)
"""

from __future__ import annotations

import dataclasses
import sys
import threading

import grain
import numpy as np

from data_pipelines import instances as instances_lib
from data_pipelines import mixture as mixture_lib
from data_pipelines.counter_rng import Stream


@dataclasses.dataclass(frozen=True)
class StreamSpec:
  """One stream of batches.

  Attributes:
    name: the stream's name (``continual.streams.<name>``; 'main' alone).
    layout: its instance layout (``data.layout`` values).
    tasks: the tasks it builds (``tasks.<name>`` sections), sorted.
    mlm: whether its batches are masked for MLM.
    task_id: its row of the task embedding; -1 for none.
    weight: its sampling weight in a stage.
    first_stage: the stage that introduces it.
  """
  name: str
  layout: str
  tasks: tuple[str, ...]
  mlm: bool
  task_id: int = -1
  weight: float = 1.0
  first_stage: int = 0


def is_continual(cfg) -> bool:
  return bool(cfg.continual.stage_steps)


def stream_order(cfg) -> list[str]:
  """The continual streams' names in task-id order: by the stage that
  introduces them, then by name. Task 0 is a first stage's stream, trained
  longest, whose embedding row fine-tuning reads (bertjax's, as
  transformers' ErnieModel given no task ids, reads row 0)."""
  c = cfg.continual.streams
  return sorted(c, key=lambda name: (int(c[name].first_stage), name))


def streams(cfg) -> list[StreamSpec]:
  """The run's streams; a task id each (``stream_order``) when
  continual."""
  if not is_continual(cfg):
    names = sorted(n for n in cfg.tasks if cfg.tasks[n].weight > 0)
    return [StreamSpec('main', cfg.data.layout, tuple(names),
                       cfg.objective.mlm_weight > 0)]
  out = []
  for task_id, name in enumerate(stream_order(cfg)):
    s = cfg.continual.streams[name]
    out.append(StreamSpec(name, s.layout or cfg.data.layout,
                          tuple(sorted(s.tasks)), bool(s.mlm), task_id,
                          float(s.weight), int(s.first_stage)))
  return out


def run_tasks(cfg) -> list[str]:
  """Every task some stream builds, sorted."""
  return sorted({t for s in streams(cfg) for t in s.tasks})


def scaled_stages(stage_steps, total_steps: int) -> tuple[int, ...]:
  """``stage_steps`` rescaled to sum to ``total_steps``, each stage's
  fraction kept (largest remainders; every stage keeps >= 1 step when
  there are enough). () stays ()."""
  stage_steps = np.asarray(tuple(stage_steps), np.float64)
  if not len(stage_steps):
    return ()
  share = stage_steps / stage_steps.sum() * total_steps
  out = np.maximum(np.floor(share).astype(np.int64),
                   1 if total_steps >= len(share) else 0)
  while out.sum() > total_steps:
    out[np.argmax(out)] -= 1
  rest = int(total_steps - out.sum())
  order = np.lexsort((np.arange(len(share)), -(share - out)))
  out[order[:rest]] += 1
  return tuple(int(n) for n in out)


def stage_starts(stage_steps) -> np.ndarray:
  """int64 [stages + 1]: the first step of each stage, then the end of
  the last."""
  return np.concatenate([[0], np.cumsum(np.asarray(stage_steps, np.int64))
                         ]).astype(np.int64)


def stage_counts(stage_steps, specs) -> np.ndarray:
  """int64 [stages, streams]: each stream's steps in each stage, exact
  shares by largest remainders (0 before its first stage)."""
  counts = np.zeros((len(stage_steps), len(specs)), np.int64)
  for k, steps in enumerate(stage_steps):
    w = np.array([s.weight if s.first_stage <= k else 0.0 for s in specs])
    if not w.sum():
      continue
    counts[k] = mixture_lib.apportion(w, steps)
  return counts


class Schedule(instances_lib.TransientAttributes):
  """Which stream step ``s`` reads, and which of its batches.

  Stage ``k`` is a permutation of its streams' slots, drawn from
  (seed, k); a stage is built when a step of it is first asked for.
  """
  _TRANSIENT = {'_lock': threading.Lock, '_stages': dict}

  def __init__(self, stage_steps, specs, seed: int):
    self._steps = np.asarray(stage_steps, np.int64)
    self._starts = stage_starts(self._steps)
    self._counts = stage_counts(stage_steps, specs)
    # Batches of each stream read before each stage.
    self._before = np.concatenate(
        [np.zeros((1, len(specs)), np.int64),
         np.cumsum(self._counts, axis=0)])
    self._seed = seed
    self._stages: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    self._lock = threading.Lock()

  def _stage(self, k: int):
    """(stream of each step, its batch number in its stream) of stage k."""
    with self._lock:
      if k not in self._stages:
        labels = np.repeat(np.arange(self._counts.shape[1]), self._counts[k])
        rng = np.random.default_rng([self._seed, Stream.CONTINUAL, k])
        labels = labels[rng.permutation(len(labels))]
        rank = np.zeros(len(labels), np.int64)
        for j in range(self._counts.shape[1]):
          mine = labels == j
          rank[mine] = np.arange(int(mine.sum()))
        self._stages[k] = (labels, rank)
      return self._stages[k]

  def locate(self, step: int) -> tuple[int, int]:
    """(stream, batch number in that stream) of step ``step``."""
    last = len(self._steps) - 1
    k = int(np.searchsorted(self._starts, step, 'right') - 1)
    if k <= last:
      labels, rank = self._stage(k)
      r = step - int(self._starts[k])
      j = int(labels[r])
      return j, int(self._before[k, j] + rank[r])
    # Past the schedule: the last stage's mix, cycled.
    over = step - int(self._starts[-1])
    cycle, r = divmod(over, int(self._steps[last]))
    labels, rank = self._stage(last)
    j = int(labels[r])
    return j, int(self._before[-1, j] + (cycle * self._counts[last, j])
                  + rank[r])


class ScheduledBatches(grain.MapDataset):
  """Global batch ``s`` of a continual run: batch ``n`` of stream ``j``
  where ``(j, n) = schedule.locate(s)``; each stream a random-access
  dataset of whole (masked) batches."""

  def __init__(self, stream_batches, schedule: Schedule):
    super().__init__()
    self._streams = list(stream_batches)
    self._schedule = schedule

  def __len__(self) -> int:
    return sys.maxsize

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    j, n = self._schedule.locate(int(index))
    return self._streams[j][n]

  def __str__(self) -> str:
    return f'ScheduledBatches({len(self._streams)} streams)'
