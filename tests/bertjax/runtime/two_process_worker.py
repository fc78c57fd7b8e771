"""One process of a two-process job on loopback, in which process 1 reads
a checkpoint directory differently from process 0, or process 0 fails.

  python two_process_worker.py SCENARIO DIRECTORY PORT PROCESS_ID

Scenario ``checkpoint``: both processes save steps 1 and 2 of a small
sharded state. Then:

1. process 1's listing lags (it sees step 1 only): both ask for the latest
   step, choose one to restore, and restore the latest;
2. process 1's check of step 2 fails: both restore step 2 as saved (which
   must fail on both), then restore the latest (which sets step 2 aside);
3. process 1's read of step 1 fails (an OSError, not damage): both
   restore step 1 as saved, which must fail on both.

Scenario ``process_zero_fails``: process 0 raises inside
``distributed.process_zero_first``.

The last line printed is JSON with what this process got.
``test_checkpoint_multihost.py`` and ``test_distributed.py`` run two.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.runtime import checkpoint
from bertjax.runtime import distributed
# pylint: enable=g-import-not-at-top,wrong-import-position

_verify = checkpoint.verify
_checkpoint_steps = ocp.utils.checkpoint_steps


def _unreadable_step_2(step_dir: str) -> bool:
  if os.path.basename(step_dir) == '2':
    raise checkpoint.CorruptCheckpointError(f'{step_dir}: injected read error')
  return _verify(step_dir)


def _failed_read_of_step_1(step_dir: str) -> bool:
  if os.path.basename(step_dir) == '1':
    raise OSError(116, 'injected: stale file handle')
  return _verify(step_dir)


def _restored(ckpt, abstract) -> dict:
  state, step = ckpt.restore_latest(abstract, None)
  shard = state['w'].addressable_shards[0].data
  return {'step': step, 'shard': np.asarray(shard).tolist()}


def process_zero_fails() -> dict:
  try:
    with distributed.process_zero_first('input data'):
      if jax.process_index() == 0:
        raise ValueError('injected: no usable text')
  except (ValueError, distributed.ProcessZeroFailed) as e:
    return {'raised': type(e).__name__, 'message': str(e)}
  return {'raised': None}


def checkpoint_reads(directory: str) -> dict:
  lagging = jax.process_index() == 1
  mesh = jax.make_mesh((2,), ('data',))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  abstract = {'w': jax.ShapeDtypeStruct((4,), np.float32, sharding=sharded)}

  def state(step):
    return {'w': jax.make_array_from_callback(
        (4,), sharded, lambda i: np.arange(4.0, dtype=np.float32)[i] + step)}

  ckpt = checkpoint.Checkpointer(directory, save_every_steps=1, keep=3,
                                 async_save=False)
  for step in (1, 2):
    ckpt.save(step, state(step))
  got = {}
  if lagging:   # 1. Step 2 not yet in this host's listing.
    ckpt._manager.latest_step = lambda: 1  # pylint: disable=protected-access
    ocp.utils.checkpoint_steps = lambda d: [s for s in _checkpoint_steps(d)
                                            if s != 2]
  got['latest'] = ckpt.latest_step()
  got['chosen'] = checkpoint.choose_step(directory)[0]
  got['lagging'] = _restored(ckpt, abstract)
  if lagging:   # 2. Step 2 listed, but this host cannot read it.
    del ckpt._manager.latest_step  # pylint: disable=protected-access
    ocp.utils.checkpoint_steps = _checkpoint_steps
    checkpoint.verify = _unreadable_step_2
  try:
    checkpoint.restore_as_saved(directory, 2)
    got['as_saved'] = 'restored'
  except checkpoint.CorruptCheckpointError as e:
    got['as_saved'] = str(e)
  got['unreadable'] = _restored(ckpt, abstract)
  if lagging:   # 3. This host's read of step 1 fails (not damage).
    checkpoint.verify = _failed_read_of_step_1
  try:
    checkpoint.restore_as_saved(directory, 1)
    got['failed_read'] = 'restored'
  except OSError as e:
    got['failed_read'] = f'{type(e).__name__}: {e}'
  ckpt.close()
  return got


def main(scenario: str, directory: str, port: str, index: str) -> None:
  distributed.initialize(coordinator_address=f'localhost:{port}',
                         num_processes=2, process_id=int(index))
  got = (process_zero_fails() if scenario == 'process_zero_fails'
         else checkpoint_reads(directory))
  print(json.dumps(got))


if __name__ == '__main__':
  main(*sys.argv[1:])
