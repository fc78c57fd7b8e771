"""Two processes agree on which checkpoint step to restore, and on whether
it is intact, when one of them reads the directory differently.

Each process lists and checks a checkpoint directory itself; a lagging
listing or a failed read on one host must not make the processes restore
different steps (a silent mix of two states) or part ways at barriers that
never match (a hang). ``two_process_worker.py checkpoint`` runs as the two
processes of a job on loopback; process 1 is the odd one.
"""

import os

import pytest

import preset_helpers

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'two_process_worker.py')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('two_readers')
  return tmp, preset_helpers.run_two_processes(
      WORKER, 'checkpoint', str(tmp / 'checkpoints'))


def test_a_lagging_listing_does_not_split_the_step(run):
  _, got = run
  assert [g['latest'] for g in got] == [2, 2]
  assert [g['chosen'] for g in got] == [2, 2]
  # Step 2 of the state is arange(4) + 2, half of it on each process.
  assert [g['lagging'] for g in got] == [{'step': 2, 'shard': [2.0, 3.0]},
                                         {'step': 2, 'shard': [4.0, 5.0]}]


def test_a_step_one_process_cannot_read_fails_on_both(run):
  tmp, got = run
  assert 'injected read error' in got[1]['as_saved']
  assert 'failed its check on process(es) [1]' in got[0]['as_saved']
  # restore_latest sets it aside on both and restores step 1 together.
  assert [g['unreadable'] for g in got] == [{'step': 1, 'shard': [1.0, 2.0]},
                                            {'step': 1, 'shard': [3.0, 4.0]}]
  assert os.listdir(tmp / 'checkpoints_corrupt') == ['2']
  assert os.listdir(tmp / 'checkpoints') == ['1']


def test_a_read_that_fails_on_one_process_stops_both(run):
  _, got = run
  assert got[1]['failed_read'] == (
      'OSError: [Errno 116] injected: stale file handle')
  assert got[0]['failed_read'].startswith('OSError: ')
  assert 'could not be read on process(es) [1]' in got[0]['failed_read']
