"""Two processes on loopback train like one, and hand over to another mesh.

Each process is a real ``python -m bertjax.train`` (through
``multihost_worker.py``, which records what it read) with 4 fake CPU
devices; they find each other with ``--coordinator_address`` and reduce over
gloo. The reference is one process with 8 fake devices. All three runs train
the demo config, cut down to a tiny corpus and 6 steps:

1. one process, 8 devices (data=8): steps 1-6, the reference;
2. two processes x 4 devices (data=8): steps 1-3, checkpoint at 3;
3. one process, 8 devices, mesh fsdp=4 x tensor=2, in run 2's workdir:
   resumes at step 3 and trains 4-6.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import preset_helpers

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'multihost_worker.py')
DEMO = os.path.join(preset_helpers.CONFIGS, 'demo.py')
FIELDS = {**preset_helpers.TINY_DATA, 'batch_size': 16, 'total_steps': 6,
          'log_every_steps': 1, 'eval_every_steps': 1000,
          'checkpoint_every_steps': 3, 'optimizer.warmup_steps': 2}
TIMEOUT = 600


def _flags(fields: dict) -> list[str]:
  return [f'--config.{k}={v}' for k, v in fields.items()]


def _start(tmp, name, devices, extra, fields=None):
  env = dict(os.environ,
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
             JAX_PLATFORMS='cpu', BERTJAX_DATA_DIR=str(tmp / 'data'),
             TAP_FILE=str(tmp / f'{name}.tap.json'),
             PYTHONPATH=preset_helpers.REPO)
  log = open(tmp / f'{name}.log', 'w')
  return subprocess.Popen(
      [sys.executable, WORKER, f'--config={DEMO}',
       *_flags({**FIELDS, **(fields or {})}), *extra],
      env=env, stdout=log, stderr=subprocess.STDOUT, cwd=preset_helpers.REPO)


def _wait(tmp, procs: dict) -> None:
  for name, proc in procs.items():
    try:
      code = proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
      for p in procs.values():
        p.kill()
      raise
    log = (tmp / f'{name}.log').read_text()
    assert code == 0, f'{name} exited {code}:\n{log[-4000:]}'


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('multihost')
  reference = tmp / 'reference'
  _wait(tmp, {'reference': _start(tmp, 'reference', 8,
                                   [f'--workdir={reference}'])})
  two = tmp / 'two_processes'
  port = preset_helpers.free_port()
  _wait(tmp, {f'process{i}': _start(
      tmp, f'process{i}', 4,
      [f'--workdir={two}', f'--coordinator_address=localhost:{port}',
       '--num_processes=2', f'--process_id={i}'],
      {'num_train_steps': 3}) for i in range(2)})
  two_metrics = preset_helpers.read_jsonl(str(two))  # Before run 3 appends.
  _wait(tmp, {'resumed': _start(tmp, 'resumed', 8, [f'--workdir={two}'],
                                {'sharding.mesh_shape': '(1,4,2)'})})
  taps = {name: json.loads((tmp / f'{name}.tap.json').read_text())
          for name in ('reference', 'process0', 'process1', 'resumed')}
  logs = {name: (tmp / f'{name}.log').read_text()
          for name in ('reference', 'process0', 'process1', 'resumed')}
  return {'reference': preset_helpers.read_jsonl(str(reference)),
          'two': two_metrics, 'resumed': preset_helpers.read_jsonl(str(two)),
          'taps': taps, 'logs': logs, 'data_dir': tmp / 'data'}


def _losses(metrics, steps):
  by_step = {m['step']: m['loss'] for m in metrics if 'loss' in m}
  return np.array([by_step[s] for s in steps])


@pytest.mark.e2e
def test_the_runs_used_the_meshes_they_were_given(runs):
  taps, logs = runs['taps'], runs['logs']
  assert [(taps[p]['process_index'], taps[p]['process_count'],
           taps[p]['local_devices']) for p in ('process0', 'process1')] == [
               (0, 2, 4), (1, 2, 4)]
  assert "mesh {'replica': 1, 'data': 8, 'fsdp': 1, 'tensor': 1} over 8 " \
         'device(s)' in logs['reference']
  assert 'over 8 device(s)' in logs['process0']
  assert "'fsdp': 4, 'tensor': 2} over 8 device(s)" in logs['resumed']
  assert 'resumed from the checkpoint at step 3' in logs['resumed']


@pytest.mark.e2e
def test_two_processes_match_one_step_for_step(runs):
  np.testing.assert_allclose(_losses(runs['two'], [1, 2, 3]),
                             _losses(runs['reference'], [1, 2, 3]),
                             rtol=1e-5, atol=0)
  # The masking telemetry is the global batch's, summed over both
  # processes' rows: the one-process run's numbers, exactly.
  telemetry = lambda metrics: [
      {k: v for k, v in m.items() if k.startswith('masking_')}
      for m in metrics if m['step'] in (1, 2, 3) and 'loss' in m]
  assert telemetry(runs['two']) == telemetry(runs['reference'])
  assert telemetry(runs['two'])[0]['masking_rate'] > 0


@pytest.mark.e2e
def test_each_process_read_a_disjoint_half(runs):
  p0, p1, ref = (runs['taps'][n]['batches'][:3]
                 for n in ('process0', 'process1', 'reference'))
  seen0, seen1 = set(), set()
  for a, b, whole in zip(p0, p1, ref):
    assert a['rows'] == list(range(8)) and b['rows'] == list(range(8, 16))
    # Together, in place, the rows of the one-process run's global batch.
    assert a['digests'] + b['digests'] == whole['digests']
    seen0.update(a['digests'])
    seen1.update(b['digests'])
  assert len(seen0) == len(seen1) == 24 and not seen0 & seen1


@pytest.mark.e2e
def test_restored_on_another_mesh_training_continues(runs):
  np.testing.assert_allclose(_losses(runs['resumed'], [4, 5, 6]),
                             _losses(runs['reference'], [4, 5, 6]),
                             rtol=1e-5, atol=0)
  # The resumed run read the batches of steps 4-6 of the reference.
  resumed = runs['taps']['resumed']['batches'][:3]
  reference = runs['taps']['reference']['batches'][3:6]
  assert [b['digests'] for b in resumed] == [b['digests'] for b in reference]


@pytest.mark.e2e
def test_a_workdir_that_is_not_shared_is_an_error(runs, tmp_path):
  """Each process given its own directory: they stop before training."""
  data = runs['data_dir']   # Built by the runs above.
  port = preset_helpers.free_port()
  procs = {}
  for i in range(2):
    procs[f'unshared{i}'] = _start(
        tmp_path, f'unshared{i}', 4,
        [f'--workdir={tmp_path / f"own{i}"}',
         f'--coordinator_address=localhost:{port}', '--num_processes=2',
         f'--process_id={i}'], {'data.data_dir': str(data)})
  for name, proc in procs.items():
    assert proc.wait(TIMEOUT) != 0
    log = (tmp_path / f'{name}.log').read_text()
    assert 'is not shared: processes [1] do not see the file process 0 ' \
           'wrote there' in log, log[-3000:]
  assert not (tmp_path / 'own0' / 'checkpoints').exists()
