"""One process of a two-process job whose check of a checkpoint step
fails on process 1 only (as a transient read on one host's mount would).

  python checkpoint_worker.py DIRECTORY PORT PROCESS_ID

Both processes save steps 1 and 2 of a small sharded state, then restore
the latest; on process 1 ``verify`` raises for step 2. The last line
printed is JSON: the step restored and this process's shard of it.
``test_checkpoint_multihost.py`` runs two of these.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

from bertjax.runtime import checkpoint
from bertjax.runtime import distributed
# pylint: enable=g-import-not-at-top,wrong-import-position

_verify = checkpoint.verify


def _unreadable_step_2(step_dir: str) -> bool:
  if os.path.basename(step_dir) == '2':
    raise checkpoint.CorruptCheckpointError(f'{step_dir}: injected read error')
  return _verify(step_dir)


def main(directory: str, port: str, index: str) -> None:
  distributed.initialize(coordinator_address=f'localhost:{port}',
                         num_processes=2, process_id=int(index))
  mesh = jax.make_mesh((2,), ('data',))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))

  def state(step):
    return {'w': jax.make_array_from_callback(
        (4,), sharded, lambda i: np.arange(4.0, dtype=np.float32)[i] + step)}

  ckpt = checkpoint.Checkpointer(directory, save_every_steps=1, keep=3,
                                 async_save=False)
  for step in (1, 2):
    ckpt.save(step, state(step))
  if jax.process_index() == 1:
    checkpoint.verify = _unreadable_step_2
  abstract = {'w': jax.ShapeDtypeStruct((4,), np.float32, sharding=sharded)}
  restored, step = ckpt.restore_latest(abstract, None)
  ckpt.close()
  shard = restored['w'].addressable_shards[0].data
  print(json.dumps({'step': step, 'shard': np.asarray(shard).tolist()}))


if __name__ == '__main__':
  main(*sys.argv[1:])
