"""ERNIE 2.0's continual schedule: exact budgets, stages, pure functions of
the step."""

import collections
import pickle

import numpy as np
import pytest

from data_pipelines import continual

_SPECS = [
    continual.StreamSpec('a', 'full_sentences', (), True, 0, 1.0, 0),
    continual.StreamSpec('b', 'full_sentences', (), True, 1, 2.0, 1),
    continual.StreamSpec('c', 'full_sentences', (), True, 2, 1.0, 2),
]
_STAGES = (10, 30, 41)


def _walk(schedule, steps):
  return [schedule.locate(s) for s in range(steps)]


def test_stage_counts_are_exact_shares_of_the_streams_introduced():
  counts = continual.stage_counts(_STAGES, _SPECS)
  np.testing.assert_array_equal(counts, [[10, 0, 0], [10, 20, 0],
                                         [10, 21, 10]])
  # Largest remainders: 41 * (1, 2, 1) / 4 = (10.25, 20.5, 10.25).
  assert counts.sum(axis=1).tolist() == list(_STAGES)


def test_each_stage_reads_its_budget_and_streams_in_order():
  schedule = continual.Schedule(_STAGES, _SPECS, seed=3)
  walk = _walk(schedule, sum(_STAGES))
  start = 0
  for k, steps in enumerate(_STAGES):
    stage = walk[start:start + steps]
    got = collections.Counter(j for j, _ in stage)
    assert [got[j] for j in range(3)] == continual.stage_counts(
        _STAGES, _SPECS)[k].tolist()
    start += steps
  # Each stream reads its batches 0, 1, 2, ... in order, none twice.
  for j in range(3):
    numbers = [n for i, n in walk if i == j]
    assert numbers == list(range(len(numbers)))


def test_schedule_is_a_pure_function_of_seed_and_step():
  a = continual.Schedule(_STAGES, _SPECS, seed=3)
  b = continual.Schedule(_STAGES, _SPECS, seed=3)
  # Asked out of order (a resumed run starts mid-stage) and after pickling
  # (Grain's workers), the answers are the same.
  steps = [77, 3, 45, 12, 200, 0]
  c = pickle.loads(pickle.dumps(b))
  assert [a.locate(s) for s in steps] == [c.locate(s) for s in steps]
  assert _walk(a, 81) != _walk(continual.Schedule(_STAGES, _SPECS, 4), 81)


def test_past_the_last_stage_its_mix_goes_on():
  schedule = continual.Schedule(_STAGES, _SPECS, seed=0)
  walk = _walk(schedule, sum(_STAGES) + 2 * _STAGES[-1])
  tail = collections.Counter(j for j, _ in walk[sum(_STAGES):])
  assert [tail[j] for j in range(3)] == [20, 42, 20]
  for j in range(3):
    numbers = [n for i, n in walk if i == j]
    assert numbers == list(range(len(numbers)))


@pytest.mark.parametrize('stages, total, expected', [
    ((400, 400, 400), 6000, (2000, 2000, 2000)),
    ((1, 1, 1), 10, (4, 3, 3)),
    ((10, 30, 41), 8, (1, 3, 4)),
    ((), 100, ()),
])
def test_scaled_stages_keep_fractions_and_cover_the_run(stages, total,
                                                        expected):
  assert continual.scaled_stages(stages, total) == expected
