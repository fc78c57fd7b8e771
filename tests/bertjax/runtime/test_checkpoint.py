"""Checkpoint round trip: state and data iterator come back exactly."""

import errno
import json
import os
import time

import flax
import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.runtime import checkpoint
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


class _FailingWrite:
  """A write future of a full disk: fails after a moment."""

  def result(self, timeout=None):
    del timeout
    time.sleep(0.02)
    raise OSError(errno.ENOSPC, 'No space left on device (injected)')


def test_a_failed_background_save_keeps_the_only_checkpoint(tmp_path,
                                                             monkeypatch):
  """keep=1, the next save fails in the background while the trainer asks
  ``check`` after every step: the error is reported, and the step kept is
  still there (asked before orbax's finalize thread saw it, the error was
  taken from that thread, which then deleted the step: 6 times in 10)."""
  save = checkpoint.ocp.StandardCheckpointHandler.async_save
  failing = {'on': False}

  async def async_save(self, *args, **kwargs):
    futures = await save(self, *args, **kwargs)
    return list(futures or []) + [_FailingWrite()] * failing['on']

  monkeypatch.setattr(checkpoint.ocp.StandardCheckpointHandler, 'async_save',
                      async_save)
  for trial in range(5):
    directory = str(tmp_path / str(trial))
    ckpt = checkpoint.Checkpointer(directory, save_every_steps=4, keep=1)
    failing['on'] = False
    ckpt.save(4, {'w': jnp.arange(4.0)}, _iterator())
    ckpt.wait()
    failing['on'] = True
    ckpt.save(8, {'w': jnp.arange(4.0) + 1}, _iterator())
    with pytest.raises(checkpoint.CheckpointSaveError,
                       match='step 4 is intact'):
      deadline = time.monotonic() + 5
      while time.monotonic() < deadline:   # A step's worth of work each.
        ckpt.check()
        time.sleep(0.0005)
    ckpt.close()
    assert checkpoint.latest_step(directory) == 4
    assert checkpoint.verify(os.path.join(directory, '4'))


def test_latest_step_of_missing_directory_is_none(tmp_path):
  assert checkpoint.latest_step(str(tmp_path / 'nothing')) is None
  assert not (tmp_path / 'nothing').exists()


def test_one_iterator_state_for_any_number_of_hosts(tmp_path):
  """Process 0 writes one state file that any process count restores."""
  ckpt = checkpoint.Checkpointer(str(tmp_path / 'ckpt'), save_every_steps=1,
                                 keep=1)
  it = _skip(_iterator(), 5)
  ckpt.save(1, {'w': jnp.zeros(2)}, it)
  ckpt.wait()
  ckpt.close()
  files = [p.name for p in (tmp_path / 'ckpt' / '1' / 'data').iterdir()]
  assert 'iterator_state.json' in files
  assert not [f for f in files if f.startswith('process_')], files


def test_restores_a_checkpoint_of_grains_own_handler(tmp_path):
  """Checkpoints written before (one Grain state file per process)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  directory = str(tmp_path / 'ckpt')
  it = _skip(_iterator(), 6)
  with ocp.CheckpointManager(
      directory, item_handlers={
          'state': ocp.StandardCheckpointHandler(),
          'data': grain.checkpoint.CheckpointHandler()}) as manager:
    manager.save(3, args=ocp.args.Composite(
        state=ocp.args.StandardSave({'w': jnp.arange(2.0)}),
        data=grain.checkpoint.CheckpointSave(it)))
  ckpt = checkpoint.Checkpointer(directory, save_every_steps=1, keep=1)
  fresh = _iterator()
  abstract = {'w': jax.ShapeDtypeStruct((2,), jnp.float32, sharding=(
      sharding.replicated(sharding.make_mesh((-1, 1, 1)))))}
  restored = ckpt.restore(3, abstract, fresh)
  ckpt.close()
  np.testing.assert_array_equal(restored['w'], [0.0, 1.0])
  np.testing.assert_array_equal(next(fresh)['x'], next(it)['x'])


# A workdir's name may hold glob characters (lr*, a[b), but for a [...]
# pair, which orbax's merge of a step's parts takes as a character class.
@pytest.mark.parametrize('name', ['ckpt', 'lr*3e-4?', 'a[b'])
def test_every_saved_step_is_sealed_and_verifies(tmp_path, name):
  ckpt = checkpoint.Checkpointer(str(tmp_path / name), save_every_steps=1,
                                 keep=3)
  it = _iterator()
  for step in (1, 2):
    ckpt.save(step, {'w': jnp.full(4, step)}, it)
  ckpt.close()
  for step in (1, 2):
    step_dir = str(tmp_path / name / str(step))
    assert checkpoint.verify(step_dir)
    with open(os.path.join(step_dir, checkpoint.MANIFEST)) as f:
      files = json.load(f)['files']
    assert 'data/iterator_state.json' in files
    assert any(f.startswith('state/') for f in files)
  with open(tmp_path / name / '2' / 'data' / 'iterator_state.json',
            'a') as f:
    f.write(' ')
  with pytest.raises(checkpoint.CorruptCheckpointError, match='has 2'):
    checkpoint.verify(str(tmp_path / name / '2'))
  # Read as saved (fine-tuning, export): checked first.
  with pytest.raises(checkpoint.CorruptCheckpointError, match='has 2'):
    checkpoint.restore_as_saved(str(tmp_path / name), 2)
  np.testing.assert_array_equal(
      checkpoint.restore_as_saved(str(tmp_path / name), 1)['w'], [1] * 4)
  # A sealed step without its manifest is damaged, not an old checkpoint.
  os.remove(tmp_path / name / '1' / checkpoint.MANIFEST)
  with pytest.raises(checkpoint.CorruptCheckpointError, match='is gone'):
    checkpoint.verify(str(tmp_path / name / '1'))


def test_a_directory_orbax_would_write_unreadable_is_refused(tmp_path):
  with pytest.raises(ValueError, match=r'\[\.\.\.\] pair'):
    checkpoint.Checkpointer(str(tmp_path / 'lr[3e-4]' / 'checkpoints'),
                            save_every_steps=1, keep=1)
  assert not (tmp_path / 'lr[3e-4]').exists()


def test_a_state_saved_before_a_field_existed_restores_with_its_default(
    tmp_path):
  @flax.struct.dataclass
  class Before:
    step: jax.Array
    params: dict

  @flax.struct.dataclass
  class After:
    step: jax.Array
    params: dict
    health: dict = None

  replicated = sharding.replicated(sharding.make_mesh((-1, 1, 1)))
  ckpt = checkpoint.Checkpointer(str(tmp_path / 'ckpt'), save_every_steps=1,
                                 keep=1)
  ckpt.save(3, Before(jnp.int32(3), {'w': jnp.arange(3.0)}), _iterator())
  ckpt.wait()
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype,  # pylint: disable=g-long-lambda
                                                   sharding=replicated)
  abstract = After(spec((), jnp.int32), {'w': spec((3,), jnp.float32)},
                   {'n': spec((), jnp.int32)})
  restored, step = ckpt.restore_latest(
      abstract, _iterator(), defaults=lambda: {'health': {'n': jnp.int32(7)}})
  ckpt.close()
  assert step == 3 and isinstance(restored, After)
  np.testing.assert_array_equal(restored.params['w'], [0.0, 1.0, 2.0])
  assert int(restored.health['n']) == 7


def test_a_counter_added_to_a_dict_field_restores_with_its_default(
    tmp_path):
  """A checkpoint written before ``health`` had a counter: the saved
  counters come back, the new one takes its default; a key that the
  defaults do not give (another model's parameters) is not filled in."""
  @flax.struct.dataclass
  class State:
    step: jax.Array
    health: dict

  replicated = sharding.replicated(sharding.make_mesh((-1, 1, 1)))
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype,  # pylint: disable=g-long-lambda
                                                   sharding=replicated)
  ckpt = checkpoint.Checkpointer(str(tmp_path / 'ckpt'), save_every_steps=1,
                                 keep=1)
  ckpt.save(3, State(jnp.int32(3), {'old': jnp.int32(5)}), _iterator())
  ckpt.wait()
  abstract = State(spec((), jnp.int32), {'old': spec((), jnp.int32),
                                         'new': spec((), jnp.int32)})
  defaults = lambda: {'health': {'old': jnp.int32(0), 'new': jnp.int32(7)}}
  restored, _ = ckpt.restore_latest(abstract, _iterator(), defaults=defaults)
  assert isinstance(restored, State)
  assert (int(restored.health['old']), int(restored.health['new'])) == (5, 7)
  with pytest.raises(ValueError, match='other'):   # Not ours to fill.
    ckpt.restore(3, State(spec((), jnp.int32), {'old': spec(
        (), jnp.int32), 'other': spec((), jnp.int32)}), _iterator(),
                 defaults=defaults)
  ckpt.close()


def test_imported_parameters_round_trip_and_another_shape_is_named(
    tmp_path):
  mesh = sharding.make_mesh((-1, 1, 1))
  params = {'layer': {'kernel': np.arange(12.0, dtype=np.float32).reshape(
      3, 4), 'bias': np.ones(4, np.float32)}}
  checkpoint.save_params(str(tmp_path), params, 'a test')
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=sharding.replicated(mesh)), params)
  restored = checkpoint.restore_params(str(tmp_path), abstract)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), b)
  wider = dict(abstract, layer={
      'kernel': jax.ShapeDtypeStruct((3, 8), np.float32),
      'bias': abstract['layer']['bias']}, extra=abstract['layer']['bias'])
  with pytest.raises(ValueError, match=(
      r"2 parameter\(s\) differ \(\['extra'\]: missing there, \(4,\) here; "
      r"\['layer'\]\['kernel'\]: \(3, 4\) there, \(3, 8\) here\)")):
    checkpoint.restore_params(str(tmp_path), wider)
