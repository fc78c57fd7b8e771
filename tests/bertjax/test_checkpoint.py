"""Checkpoint round trip: state and data iterator come back exactly."""

import grain
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import checkpoint
from bertjax import sharding


def _iterator():
  ds = grain.MapDataset.range(100).map(lambda i: {'x': np.int64(i)})
  return iter(ds.batch(4).to_iter_dataset())


def test_round_trip_restores_state_and_iterator(tmp_path):
  mesh = sharding.make_mesh((-1, 1, 1))
  replicated = sharding.replicated(mesh)
  state = {'step': jnp.array(7, jnp.int32),
           'params': {'w': jnp.arange(12.0).reshape(3, 4),
                      'b': jnp.ones(4, jnp.bfloat16)}}
  it = _iterator()
  for _ in range(3):
    next(it)
  expected_next = next(_skip(_iterator(), 3))

  ckpt = checkpoint.Checkpointer(str(tmp_path / 'ckpt'), save_every_steps=5,
                                 keep=2)
  assert ckpt.save(10, state, it)
  ckpt.wait()
  assert ckpt.latest_step() == 10
  assert checkpoint.latest_step(str(tmp_path / 'ckpt')) == 10

  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      state)
  fresh = _iterator()
  restored = ckpt.restore(10, abstract, fresh)
  ckpt.close()
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(next(fresh)['x'], expected_next['x'])


def _skip(it, n):
  for _ in range(n):
    next(it)
  return it


def test_keeps_only_the_newest(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / 'ckpt'), save_every_steps=1,
                                 keep=2)
  it = _iterator()
  for step in (1, 2, 3, 4):
    ckpt.save(step, {'w': jnp.full(2, step)}, it)
  ckpt.wait()
  ckpt.close()
  assert sorted(int(s.name) for s in (tmp_path / 'ckpt').iterdir()
                if s.name.isdigit()) == [3, 4]


def test_latest_step_of_missing_directory_is_none(tmp_path):
  assert checkpoint.latest_step(str(tmp_path / 'nothing')) is None
  assert not (tmp_path / 'nothing').exists()
