"""Two processes agree on a checkpoint step that fails its check on one.

Each process checks the step itself; when only process 1's read fails, both
must set it aside and restore the older step together (if each went its
own way, their barriers would never match). ``checkpoint_worker.py`` runs
as the two processes of a job on loopback, one fake CPU device each.
"""

import json
import os
import subprocess
import sys

import preset_helpers

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'checkpoint_worker.py')
TIMEOUT = 180


def test_a_step_one_process_cannot_read_is_set_aside_by_both(tmp_path):
  directory = tmp_path / 'checkpoints'
  port = preset_helpers.free_port()
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  procs = [subprocess.Popen(
      [sys.executable, WORKER, str(directory), str(port), str(i)],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], '\n'.join(
      out[-3000:] for out in outs)
  results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
  # Step 1 of the state is arange(4) + 1, half of it on each process.
  assert results == [{'step': 1, 'shard': [1.0, 2.0]},
                     {'step': 1, 'shard': [3.0, 4.0]}]
  assert 'injected read error' in outs[1]
  assert 'failed its check on process(es) [1]' in outs[0]
  assert os.listdir(tmp_path / 'checkpoints_corrupt') == ['2']
  assert os.listdir(directory) == ['1']
