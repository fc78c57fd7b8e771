"""Device mesh, logical-axis rules, sharded state and the global batch.

A mesh is always built, one device included, with axes
(``replica``, ``data``, ``fsdp``, ``tensor``). ``replica`` is the slow,
data-parallel axis across TPU slices or GPU nodes (DCN); the other three
span the devices of one slice or node (ICI, NVLink), sizes from
``config.sharding.mesh_shape`` with -1 meaning "the rest". Layers name their
axes logically; ``config.sharding.rules`` maps the logical names to mesh
axes. State is born sharded: ``eval_shape`` -> logical partition specs ->
mesh shardings -> ``jax.jit(init, out_shardings=...)``.

The batch is sharded over (``replica``, ``data``, ``fsdp``). Each process
reads only the rows of a global batch that its devices hold
(``process_batch_rows``) and hands them to ``make_global_batch``
(``jax.make_array_from_process_local_data``), so a
global batch is the same array whatever the number of processes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from bertjax import errors

MESH_AXES = ('replica', 'data', 'fsdp', 'tensor')
BATCH_AXES = ('replica', 'data', 'fsdp')
# Axes that split a parameter rather than copy it.
MODEL_AXES = ('fsdp', 'tensor')
# A leaf this large (bytes) that no model axis splits is reported.
LARGE_LEAF_BYTES = 4 * 2**20


def mesh_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Resolves one -1 in (data, fsdp, tensor) so the product is
  ``num_devices`` (the devices of one replica)."""
  sizes = list(sizes)
  if len(sizes) != len(MESH_AXES) - 1:
    raise ValueError(f'sharding.mesh_shape={tuple(sizes)} needs one size per '
                     f'axis {MESH_AXES[1:]}.')
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


def _granules(devices, replicas: int) -> list[list]:
  """The devices split into ``replicas`` groups joined by the slow network.

  TPU slices (``slice_index``) when there are several; otherwise processes
  (GPU nodes; one process per GPU groups consecutive processes, as SLURM
  numbers the tasks of a node consecutively); within one process (tests),
  consecutive devices.
  """
  key = lambda d: (getattr(d, 'slice_index', 0), d.process_index, d.id)
  devices = sorted(devices, key=key)
  slices = sorted({getattr(d, 'slice_index', 0) for d in devices})
  if len(slices) > 1:
    if len(slices) != replicas:
      raise ValueError(f'sharding.replicas={replicas}, but the devices form '
                       f'{len(slices)} TPU slices: set it to {len(slices)}.')
    return [[d for d in devices if getattr(d, 'slice_index', 0) == s]
            for s in slices]
  processes = sorted({d.process_index for d in devices})
  if len(processes) > 1 and len(processes) % replicas:
    raise ValueError(f'sharding.replicas={replicas} does not divide the '
                     f'{len(processes)} processes: a replica (node) must '
                     'hold whole processes.')
  if len(devices) % replicas:
    raise ValueError(f'sharding.replicas={replicas} does not divide the '
                     f'{len(devices)} devices.')
  n = len(devices) // replicas
  return [devices[i * n:(i + 1) * n] for i in range(replicas)]


def make_mesh(sizes: Sequence[int], replicas: int = 1, devices=None) -> Mesh:
  """The (replica, data, fsdp, tensor) mesh over ``devices`` (all of them).

  Within a replica the device order comes from ``mesh_utils``, so that
  neighbours on the interconnect are neighbours in the mesh.
  """
  devices = jax.devices() if devices is None else list(devices)
  if replicas < 1:
    raise ValueError(f'sharding.replicas={replicas} must be >= 1.')
  groups = _granules(devices, replicas)
  shape = mesh_shape(sizes, len(groups[0]))
  if len(devices) == 1:
    arrays = [np.asarray(devices).reshape(shape)]
  else:
    arrays = [mesh_utils.create_device_mesh(shape, group,
                                            allow_split_physical_axes=True)
              for group in groups]
  return Mesh(np.stack(arrays), MESH_AXES)


def logical_rules(cfg) -> tuple[tuple[str, Any], ...]:
  """The config's rules as Flax wants them: ((logical, mesh axes), ...)."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in cfg.sharding.rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def check_batch_divisible(batch_size: int, mesh: Mesh) -> None:
  """Fails when the global batch does not split over the batch axes."""
  ways = math.prod(mesh.shape[a] for a in BATCH_AXES)
  if batch_size % ways:
    raise ValueError(
        f'batch_size={batch_size} does not split over the batch axes '
        f'{BATCH_AXES} of sizes {[mesh.shape[a] for a in BATCH_AXES]} '
        f'({ways} ways): use a multiple of {ways}, or move devices to the '
        'tensor axis (sharding.mesh_shape).')


def process_batch_rows(batch_sh: NamedSharding, batch_size: int
                       ) -> np.ndarray:
  """The rows of a global batch that this process's devices hold, sorted.

  Only these are read from the input pipeline on this process.
  """
  rows = set()
  for index in batch_sh.addressable_devices_indices_map(
      (batch_size,)).values():
    rows.update(range(batch_size)[index[0]])
  return np.asarray(sorted(rows), np.int64)


def rows_counted_here(batch_sh: NamedSharding, batch_size: int
                      ) -> np.ndarray:
  """bool [len(process_batch_rows)]: which of this process's rows it counts
  toward a total over processes: those no lower-numbered process holds
  too. Processes whose devices differ only along a non-batch axis (tensor
  parallelism across hosts) read the same rows; each row counts once."""
  first = {}
  for device, index in batch_sh.devices_indices_map((batch_size,)).items():
    for row in range(batch_size)[index[0]]:
      first[row] = min(first.get(row, device.process_index),
                       device.process_index)
  return np.asarray([first[row] == jax.process_index() for row in
                     process_batch_rows(batch_sh, batch_size)], bool)


def make_global_batch(local: dict, batch_sh: NamedSharding,
                      batch_size: int) -> dict:
  """One global ``jax.Array`` per feature from this process's rows.

  ``local[k]`` holds the rows ``process_batch_rows`` gave, in order: JAX
  maps each device's run of rows onto its place in that sorted list.
  """
  return {k: jax.make_array_from_process_local_data(
      batch_sh, np.asarray(v), (batch_size,) + np.shape(v)[1:])
          for k, v in local.items()}


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def state_shardings(init_fn: Callable[..., Any], mesh: Mesh, rules, *args):
  """Abstract (boxed) state and its mesh shardings, from ``init_fn(*args)``.

  ``init_fn`` returns the state with ``nn.Partitioned`` leaves; the returned
  abstract state is unboxed (plain ``ShapeDtypeStruct`` leaves, each with
  its sharding). ``args`` may be shapes (``ShapeDtypeStruct``).
  """
  boxed = jax.eval_shape(init_fn, *args)
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


def create_sharded(init_fn: Callable[..., Any], shardings, *args):
  """Runs ``init_fn(*args)`` under jit so every leaf is created on its
  shards. ``args`` are arguments of that one executable, never constants
  compiled into it (a teacher's parameters: ``place_boxed``); they are
  donated, so a leaf the state keeps as it is reuses its buffer."""
  return jax.jit(lambda *a: strip_boxes(init_fn(*a)), out_shardings=shardings,
                 donate_argnums=tuple(range(len(args))))(*args)


def place_boxed(boxed, mesh: Mesh, rules):
  """Host arrays in ``nn.Partitioned`` boxes, put on ``mesh`` sharded by
  their logical axes: each process builds only its own devices' shards
  from its host copy, so no device holds more than its shard."""
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh,
                                          rules)
  return jax.tree.map(
      lambda x, s: jax.make_array_from_callback(
          x.shape, s, lambda index: x[index]),
      strip_boxes(boxed), shardings)


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


def _mesh_ways(spec_entry, mesh: Mesh) -> int:
  if spec_entry is None:
    return 1
  axes = (spec_entry,) if isinstance(spec_entry, str) else spec_entry
  return math.prod(mesh.shape[a] for a in axes)


def sharding_report(abstract_params, mesh: Mesh
                    ) -> tuple[str, list[str]]:
  """How every parameter is laid out, and the large ones left whole.

  Returns a table (path, shape, partition spec, bytes per device) and a
  warning for each leaf of at least ``LARGE_LEAF_BYTES`` that no model axis
  (``fsdp``, ``tensor``) splits while the mesh has such an axis, i.e. a
  leaf every device holds whole although the config asks for model
  sharding. (With data parallelism alone every leaf is whole by design.)
  """
  lines, warnings = [], []
  total = per_device = 0
  model_ways = math.prod(mesh.shape[a] for a in MODEL_AXES)
  flat = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
  width = max((len(jax.tree_util.keystr(p)) for p, _ in flat), default=0)
  for path, leaf in flat:
    spec = leaf.sharding.spec
    nbytes = math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
    ways = math.prod(_mesh_ways(e, mesh) for e in spec)
    total += nbytes
    per_device += nbytes // ways
    name = jax.tree_util.keystr(path)
    lines.append(f'{name:<{width}}  {str(tuple(leaf.shape)):<16} '
                 f'{str(tuple(spec)):<28} {nbytes / ways / 2**20:10.3f} MiB')
    if model_ways > 1 and nbytes >= LARGE_LEAF_BYTES and not any(
        a in MODEL_AXES and mesh.shape[a] > 1 for e in spec if e is not None
        for a in ((e,) if isinstance(e, str) else e)):
      warnings.append(
          f'{name} {tuple(leaf.shape)} ({nbytes / 2**20:.1f} MiB) is '
          f'replicated on every device although the mesh has '
          f'{dict((a, mesh.shape[a]) for a in MODEL_AXES)}: no rule in '
          'sharding.rules maps its logical axes to fsdp or tensor.')
  lines.append(f'total {total / 2**20:.1f} MiB; {per_device / 2**20:.1f} '
               'MiB per device')
  return '\n'.join(lines), warnings


class DeviceMemoryError(errors.UserError, ValueError):
  """The compiled step needs more memory than a device has."""


def memory_figures(compiled) -> dict | None:
  """The compiled step's bytes per device: arguments, outputs, aliased
  (donated), temporaries and their total; None where the backend has no
  memory analysis."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except  # Not on every backend.
    m = None
  if m is None:
    return None
  figures = {'arguments': m.argument_size_in_bytes,
             'outputs': m.output_size_in_bytes,
             'aliased': m.alias_size_in_bytes,
             'temporaries': m.temp_size_in_bytes}
  figures['total'] = (figures['arguments'] + figures['outputs']
                      - figures['aliased'] + figures['temporaries'])
  return figures


def memory_report(compiled, device) -> tuple[str, dict]:
  """The compiled step's per-device memory, checked against ``device``.

  Returns a one-line report and its figures (bytes); raises
  ``DeviceMemoryError`` when arguments + outputs (less donated buffers) +
  temporaries exceed the device's memory. Backends without a memory
  analysis (or without a known capacity, like the CPU) report what they can.
  """
  figures = memory_figures(compiled)
  if figures is None:
    return 'memory analysis: not available on this backend', {}
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  capacity = (stats or {}).get('bytes_limit')
  gib = 2.0**30
  text = ('memory per device: arguments %.3f GiB, outputs %.3f GiB '
          '(%.3f GiB donated), temporaries %.3f GiB; total %.3f GiB' % (
              figures['arguments'] / gib, figures['outputs'] / gib,
              figures['aliased'] / gib, figures['temporaries'] / gib,
              figures['total'] / gib))
  if capacity:
    figures['capacity'] = capacity
    text += f' of {capacity / gib:.2f} GiB ({device.device_kind})'
    if figures['total'] > capacity:
      raise DeviceMemoryError(
          f'the train step needs {figures["total"] / gib:.2f} GiB per device '
          f'but a {device.device_kind} has {capacity / gib:.2f} GiB ({text}). '
          'Lower batch_size, shard the parameters and optimizer state '
          '(sharding.mesh_shape: more fsdp or tensor), or use '
          'model.dtype=bfloat16.')
  return text, figures
