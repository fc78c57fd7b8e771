"""experiments/task_baselines.py: constant guesses counted as the loss
weighs the labels."""

import collections

import numpy as np
import pytest

from data_pipelines import tasks as tasks_lib
from experiments import compare
from experiments import task_baselines


def _row_batch(labels, present):
  return {'next_sentence_labels': np.asarray(labels, np.int32),
          'sentence_distance_present': np.asarray(present, np.float32)}


def test_row_task_counts_only_the_rows_that_carry_it():
  task = tasks_lib.get('sentence_distance')
  counts = task_baselines.class_counts(
      [_row_batch([0, 1, 1, 2], [1, 1, 0, 1]),
       _row_batch([2, 2, 0, 1], [1, 1, 1, 0])], task)
  assert counts == collections.Counter({0: 2.0, 1: 1.0, 2: 3.0})


def test_token_task_weighs_each_token_and_its_row():
  task = tasks_lib.get('token_document')
  batch = {'token_document_labels': np.array([[1, 0, 1], [1, 1, 0]]),
           'token_document_weights': np.array([[1, 1, 0], [1, 1, 1]],
                                              np.float32),
           'token_document_present': np.array([1, 0], np.float32)}
  counts = task_baselines.class_counts([batch], task)
  assert counts == collections.Counter({1: 1.0, 0: 1.0})


def test_the_guess_is_trainings_most_frequent_class_scored_held_out():
  # Training says class 2; held out, class 0 is the most frequent, and
  # the guess scores class 2's share there, not class 0's.
  train = collections.Counter({0: 10.0, 2: 30.0})
  held_out = collections.Counter({0: 5.0, 1: 3.0, 2: 2.0})
  assert task_baselines.constant_guess(train, held_out) == (2, 0.2)
  # A tie goes to the smallest class; a class never held out scores 0.
  assert task_baselines.constant_guess(
      collections.Counter({3: 4.0, 1: 4.0}), held_out) == (1, 0.3)
  assert task_baselines.constant_guess(
      collections.Counter({7: 1.0}), held_out) == (7, 0.0)
  with pytest.raises(ValueError, match='no labelled'):
    task_baselines.constant_guess(train, collections.Counter())


def test_the_table_lists_each_seed_and_the_mean():
  rows = [{'task': 't', 'seed': s, 'class': 1, 'held_out': 64.0,
           'accuracy': a} for s, a in ((0, 0.25), (1, 0.5))]
  (line,) = [l for l in task_baselines.table({'arm': rows}).split('\n')
             if l.startswith('| arm | t |')]
  assert line == '| arm | t | 0, 1 | 64, 64 | 1, 1 | 0.250, 0.500 | 0.375 |'
  # A seed whose counted batches had none of the task's labels: '-'.
  rows[1].update({'class': None, 'accuracy': None})
  (line,) = [l for l in task_baselines.table({'arm': rows}).split('\n')
             if l.startswith('| arm | t |')]
  assert line == '| arm | t | 0, 1 | 64, 64 | 1, - | 0.250, - | 0.250 |'


def test_bad_arguments_exit_with_a_message():
  with pytest.raises(SystemExit, match='--run NAME=path.py'):
    task_baselines.main(['--seeds=0', '--run', 'a=x.py'])


class _Batches:
  """A train iterator whose batch is its global index."""

  def __init__(self):
    self.next_index = 0

  def set_state(self, state):
    self.next_index = state['next_index']

  def __iter__(self):
    return self

  def __next__(self):
    self.next_index += 1
    return self.next_index - 1


def test_a_continual_run_is_counted_from_each_stage_start():
  cfg = compare.load_config('experiments/configs/ernie2.py:size=demo')
  first, second, _ = cfg.continual.stage_steps
  starts = task_baselines.stage_starts(cfg)
  assert starts == [0, first, first + second]
  assert task_baselines.counted_batches(_Batches(), starts, 2) == [
      0, 1, first, first + 1, first + second, first + second + 1]
  one = compare.load_config('experiments/configs/beyond_masking.py:arm=mlm')
  assert task_baselines.stage_starts(one) == [0]
