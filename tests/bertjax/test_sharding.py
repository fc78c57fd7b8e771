"""Mesh construction, logical rules and sharded state creation."""

import collections
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_lib
from bertjax import sharding


@pytest.mark.parametrize('sizes, n, expected', [
    ((-1, 1, 1), 8, (8, 1, 1)), ((2, -1, 2), 8, (2, 2, 2)),
    ((1, 1, -1), 4, (1, 1, 4)), ((2, 2, 2), 8, (2, 2, 2)),
])
def test_mesh_shape_resolves_the_rest(sizes, n, expected):
  assert sharding.mesh_shape(sizes, n) == expected


@pytest.mark.parametrize('sizes, n, message', [
    ((-1, -1, 1), 8, 'at most one -1'), ((3, -1, 1), 8, 'does not divide'),
    ((2, 2, 1), 8, 'there are 8'), ((2, 2), 4, 'one size per axis'),
    ((0, 1, 1), 1, 'positive'),
])
def test_mesh_shape_errors(sizes, n, message):
  with pytest.raises(ValueError, match=message):
    sharding.mesh_shape(sizes, n)


class _Tiny(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param('kernel', nn.with_logical_partitioning(
        nn.initializers.ones_init(), ('embed', 'mlp')), (4, 6))
    return x @ w


def test_state_is_created_with_its_logical_shardings():
  mesh = sharding.make_mesh((-1, 1, 1))
  rules = config_lib.DEFAULT_RULES
  init = lambda: _Tiny().init(jax.random.key(0), jnp.ones((2, 4)))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = sharding.state_shardings(init, mesh, rules)
    state = sharding.create_sharded(init, shardings)
  leaf = state['params']['kernel']
  assert isinstance(leaf, jax.Array) and leaf.shape == (4, 6)
  assert abstract['params']['kernel'].sharding.spec == jax.sharding.PartitionSpec(
      'fsdp', 'tensor')
  assert leaf.sharding == shardings['params']['kernel']
  np.testing.assert_array_equal(leaf, np.ones((4, 6)))


def test_check_divisible_names_the_leaf():
  spec = jax.sharding.PartitionSpec('fsdp', 'tensor')
  leaf = types.SimpleNamespace(shape=(6, 10),
                               sharding=types.SimpleNamespace(spec=spec))
  mesh = types.SimpleNamespace(shape={'data': 1, 'fsdp': 4, 'tensor': 2})
  with pytest.raises(ValueError, match=r"\['kernel'\].*dim 6 over \('fsdp',\)"):
    sharding.check_divisible({'kernel': leaf}, mesh)
  leaf.shape = (8, 10)
  sharding.check_divisible({'kernel': leaf}, mesh)


def test_logical_rules_from_config():
  c = config_lib.base_config()
  rules = dict(sharding.logical_rules(c))
  assert rules['act_batch'] == ('replica', 'data', 'fsdp')
  assert rules['embed'] == 'fsdp' and rules['kv'] is None


def _devices(n, processes=1, slices=1):
  per_process, per_slice = n // processes, n // slices
  return [types.SimpleNamespace(id=i, process_index=i // per_process,
                                slice_index=i // per_slice)
          for i in range(n)]


def test_replicas_group_slices_then_processes():
  # Two TPU slices: each replica is one slice, whatever the id order.
  devices = _devices(8, processes=4, slices=2)[::-1]
  groups = sharding._granules(devices, 2)
  assert [{d.slice_index for d in g} for g in groups] == [{0}, {1}]
  # GPU nodes, one process per GPU: consecutive processes form a node.
  groups = sharding._granules(_devices(16, processes=16), 2)
  assert [sorted({d.process_index for d in g}) for g in groups] == [
      list(range(8)), list(range(8, 16))]


@pytest.mark.parametrize('devices, replicas, message', [
    (_devices(8, processes=4, slices=2), 4, 'form 2 TPU slices'),
    (_devices(6, processes=3), 2, 'must hold whole processes'),
    (_devices(6), 4, 'does not divide the 6 devices'),
])
def test_replicas_errors(devices, replicas, message):
  with pytest.raises(ValueError, match=message):
    sharding._granules(devices, replicas)


def test_one_device_mesh_has_every_axis():
  mesh = sharding.make_mesh((-1, 1, 1))
  assert mesh.axis_names == sharding.MESH_AXES
  assert dict(mesh.shape) == {'replica': 1, 'data': 1, 'fsdp': 1,
                              'tensor': 1}
  with pytest.raises(ValueError, match='replicas=0'):
    sharding.make_mesh((-1, 1, 1), replicas=0)


def test_global_batch_from_this_process_rows():
  mesh = sharding.make_mesh((-1, 1, 1))
  batch_sh = sharding.batch_sharding(mesh)
  rows = sharding.process_batch_rows(batch_sh, 6)
  np.testing.assert_array_equal(rows, np.arange(6))
  local = {'ids': np.arange(12).reshape(6, 2), 'w': np.ones(6, np.float32)}
  out = sharding.make_global_batch(local, batch_sh, 6)
  assert out['ids'].sharding == batch_sh
  np.testing.assert_array_equal(out['ids'], local['ids'])
  np.testing.assert_array_equal(out['w'], local['w'])


class _FakeBatchSharding:
  """A batch sharding over 4 devices, 2 per process: device ``i`` holds
  ``index[i]`` of the rows; ``process`` is the one reading."""
  Device = collections.namedtuple('Device', 'id process_index')

  def __init__(self, index, process):
    self._map = {self.Device(i, i // 2): (s,) for i, s in enumerate(index)}
    self._process = process

  def devices_indices_map(self, shape):
    del shape
    return self._map

  def addressable_devices_indices_map(self, shape):
    del shape
    return {d: s for d, s in self._map.items()
            if d.process_index == self._process}


@pytest.mark.parametrize('index, counted', [
    # Batch axes across processes: each reads and counts its own rows.
    ((slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)),
     {0: [True] * 4, 1: [True] * 4}),
    # A tensor axis across processes: both read rows 0-7; process 0
    # counts them.
    ((slice(0, 4), slice(4, 8), slice(0, 4), slice(4, 8)),
     {0: [True] * 8, 1: [False] * 8}),
])
def test_a_row_read_by_several_processes_counts_once(monkeypatch, index,
                                                     counted):
  for process in (0, 1):
    monkeypatch.setattr(jax, 'process_index', lambda p=process: p)
    sh = _FakeBatchSharding(index, process)
    assert sharding.rows_counted_here(sh, 8).tolist() == counted[process]


def test_batch_must_split_over_the_batch_axes():
  mesh = types.SimpleNamespace(shape={'replica': 2, 'data': 2, 'fsdp': 2,
                                      'tensor': 4})
  sharding.check_batch_divisible(16, mesh)
  with pytest.raises(ValueError, match=r'batch_size=12 .* \(8 ways\)'):
    sharding.check_batch_divisible(12, mesh)


def _leaf(shape, spec, dtype=np.float32):
  return types.SimpleNamespace(
      shape=shape, dtype=dtype,
      sharding=types.SimpleNamespace(spec=jax.sharding.PartitionSpec(*spec)))


def test_sharding_report_flags_large_replicated_leaves():
  params = {'embedding': _leaf((8192, 256), (None, None)),     # 8 MiB
            'kernel': _leaf((1024, 2048), ('fsdp', 'tensor')),  # 8 MiB
            'bias': _leaf((2048,), (None,))}                   # small
  fsdp = types.SimpleNamespace(shape={'replica': 1, 'data': 1, 'fsdp': 4,
                                      'tensor': 2})
  table, warnings = sharding.sharding_report(params, fsdp)
  assert len(warnings) == 1 and "['embedding']" in warnings[0]
  assert 'replicated on every device' in warnings[0]
  # Bytes per device: 8 MiB whole + 8 MiB / 8 + 8 KiB.
  assert table.splitlines()[-1] == 'total 16.0 MiB; 9.0 MiB per device'
  # Pure data parallelism copies every leaf by design: no warning.
  data = types.SimpleNamespace(shape={'replica': 1, 'data': 8, 'fsdp': 1,
                                      'tensor': 1})
  assert sharding.sharding_report(params, data)[1] == []


class _Compiled:
  def __init__(self, **sizes):
    self._sizes = sizes

  def memory_analysis(self):
    return types.SimpleNamespace(**self._sizes)


def test_memory_report_fails_when_the_step_does_not_fit():
  gib = 2**30
  compiled = _Compiled(argument_size_in_bytes=6 * gib,
                       output_size_in_bytes=6 * gib,
                       alias_size_in_bytes=5 * gib,
                       temp_size_in_bytes=3 * gib)
  big = types.SimpleNamespace(device_kind='NVIDIA H100',
                              memory_stats=lambda: {'bytes_limit': 80 * gib})
  text, figures = sharding.memory_report(compiled, big)
  assert figures['total'] == 10 * gib and 'of 80.00 GiB' in text
  small = types.SimpleNamespace(device_kind='TPU v4',
                                memory_stats=lambda: {'bytes_limit': 8 * gib})
  with pytest.raises(sharding.DeviceMemoryError,
                     match=r'needs 10.00 GiB per device but a TPU v4 has '
                     r'8.00 GiB.*Lower batch_size'):
    sharding.memory_report(compiled, small)
  cpu = types.SimpleNamespace(device_kind='cpu', memory_stats=lambda: None)
  text, _ = sharding.memory_report(compiled, cpu)
  assert text.endswith('total 10.000 GiB')
