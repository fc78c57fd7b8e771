"""Mesh construction, logical rules and sharded state creation."""

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
  assert rules['act_batch'] == ('data', 'fsdp')
  assert rules['embed'] == 'fsdp' and rules['kv'] is None
