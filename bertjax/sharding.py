"""Device mesh, logical-axis rules and sharded state creation.

A mesh is always built, one device included, with axes
(``data``, ``fsdp``, ``tensor``); sizes come from the config, -1 meaning "the
rest". Layers name their axes logically; ``config.sharding.rules`` maps the
logical names to mesh axes. State is born sharded:
``eval_shape`` -> logical partition specs -> mesh shardings ->
``jax.jit(init, out_shardings=...)``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')


def mesh_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Resolves one -1 in ``sizes`` so the product is ``num_devices``."""
  sizes = list(sizes)
  if len(sizes) != len(MESH_AXES):
    raise ValueError(f'sharding.mesh_shape={tuple(sizes)} needs one size per '
                     f'axis {MESH_AXES}.')
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'sharding.mesh_shape={tuple(sizes)}: sizes must be '
                     'positive, with at most one -1 ("the rest").')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'sharding.mesh_shape={tuple(sizes)} does not divide '
                       f'the {num_devices} devices.')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f'sharding.mesh_shape={tuple(sizes)} has '
                     f'{math.prod(sizes)} devices; there are {num_devices}.')
  return tuple(sizes)


def make_mesh(sizes: Sequence[int], devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(sizes, len(devices))
  device_array = np.asarray(devices).reshape(shape) if len(devices) == 1 else (
      mesh_utils.create_device_mesh(shape, devices))
  return Mesh(device_array, MESH_AXES)


def logical_rules(cfg) -> tuple[tuple[str, Any], ...]:
  """The config's rules as Flax wants them: ((logical, mesh axes), ...)."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in cfg.sharding.rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def state_shardings(init_fn: Callable[[], Any], mesh: Mesh, rules):
  """Abstract (boxed) state and its mesh shardings, from ``init_fn``.

  ``init_fn`` returns the state with ``nn.Partitioned`` leaves; the returned
  abstract state is unboxed (plain ``ShapeDtypeStruct`` leaves, each with
  its sharding).
  """
  boxed = jax.eval_shape(init_fn)
  specs = nn.get_partition_spec(boxed)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      strip_boxes(boxed), shardings)
  return abstract, shardings


def strip_boxes(tree):
  """Replaces ``nn.Partitioned`` leaves by their values (no constraints)."""
  return jax.tree.map(
      lambda x: x.value if isinstance(x, nn.Partitioned) else x, tree,
      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def create_sharded(init_fn: Callable[[], Any], shardings):
  """Runs ``init_fn`` under jit so every leaf is created on its shards."""
  return jax.jit(lambda: strip_boxes(init_fn()), out_shardings=shardings)()


def check_divisible(abstract_state, mesh: Mesh) -> None:
  """Fails before compiling when a dimension does not split evenly."""
  problems = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
    spec = leaf.sharding.spec
    for dim, axes in zip(leaf.shape, spec):
      if axes is None:
        continue
      axes = (axes,) if isinstance(axes, str) else axes
      size = math.prod(mesh.shape[a] for a in axes)
      if dim % size:
        problems.append(f'{jax.tree_util.keystr(path)} {leaf.shape} dim '
                        f'{dim} over {axes} (size {size})')
  if problems:
    raise ValueError('these dimensions do not divide their mesh axes; change '
                     'sharding.mesh_shape or sharding.rules:\n  ' +
                     '\n  '.join(problems))
