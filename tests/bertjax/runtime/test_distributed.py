"""Start-up of multi-process jobs: what is detected, and bad flags."""

import os

import pytest

from bertjax.runtime import distributed
import preset_helpers


@pytest.mark.parametrize('env, expected', [
    ({}, None),
    ({'SLURM_JOB_ID': '7', 'SLURM_PROCID': '0', 'SLURM_NTASKS': '16'},
     'SLURM'),
    # One task (an interactive allocation, a single-GPU job): no job to join.
    ({'SLURM_JOB_ID': '7', 'SLURM_PROCID': '0', 'SLURM_NTASKS': '1'}, None),
    ({'TPU_WORKER_HOSTNAMES': 'w0,w1,w2,w3'}, 'TPU pod'),
    ({'TPU_WORKER_HOSTNAMES': 'w0'}, None),
    ({'MEGASCALE_COORDINATOR_ADDRESS': 'w0:8080'}, 'TPU multislice'),
])
def test_cluster_detection(monkeypatch, env, expected):
  for name in ('SLURM_JOB_ID', 'SLURM_PROCID', 'SLURM_NTASKS',
               'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS'):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  assert distributed._cluster_detected() == expected


@pytest.mark.parametrize('kwargs, message', [
    (dict(mode='maybe'), "--multihost='maybe'"),
    (dict(coordinator_address='h:1'), '--num_processes, --process_id missing'),
    (dict(num_processes=2, process_id=0), '--coordinator_address missing'),
    (dict(coordinator_address='h:1', num_processes=2, process_id=2),
     r'--process_id=2 must be in \[0, --num_processes=2\)'),
    (dict(mode='off', coordinator_address='h:1', num_processes=2,
          process_id=0), 'contradicts'),
])
def test_bad_flags_fail_before_anything_starts(kwargs, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(**kwargs)


def test_single_process_when_nothing_is_detected(monkeypatch):
  monkeypatch.delenv('SLURM_JOB_ID', raising=False)
  monkeypatch.delenv('TPU_WORKER_HOSTNAMES', raising=False)
  monkeypatch.delenv('MEGASCALE_COORDINATOR_ADDRESS', raising=False)
  assert distributed.initialize('auto') == 'single process'
  assert distributed.initialize('off') == 'single process'


def test_an_error_on_process_zero_stops_the_others_with_its_cause(tmp_path):
  # process_zero_first: process 0 raises while the others wait for it.
  worker = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        'two_process_worker.py')
  got = preset_helpers.run_two_processes(worker, 'process_zero_fails',
                                         str(tmp_path))
  assert got[0] == {'raised': 'ValueError',
                    'message': 'injected: no usable text'}
  assert got[1]['raised'] == 'ProcessZeroFailed'
  assert 'process 0 stopped with an error while preparing the input data' \
      in got[1]['message']
