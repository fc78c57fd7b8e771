r"""Pre-flight: a config's train and eval steps compiled for a TPU slice on
this machine, before the slice costs anything.

  python -m bertjax.preflight --config=experiments/configs/bert.py:size=base \
      --topology=v5e-16 [--num_slices=2] [--out=DIR] [--config.FIELD=VALUE]

XLA's TPU compiler ships in the ``libtpu`` wheel (``pip install
'.[tpu-aot]'``) and runs on any x86-64 Linux host; jax's
``topologies.get_topology_desc`` describes a slice's devices without the
hardware (MaxText's ``train_compile.py`` does the same). The steps are
bertjax's own (``train.make_steps``), on the config's mesh over those
devices (the replica axis across slices), with the config's shardings: what
the trainer compiles on the pod. Printed, and written to ``DIR/preflight.json``
with the optimized HLO of each step beside it:

* memory per device (arguments, outputs, temporaries) against the chip's
  HBM, with the margin;
* FLOPs per device of the compiled program next to the analytic count
  (``bertjax/flops.py``), and the step time and tokens/s they imply at the
  chip's bf16 peak: a bound, not a measurement;
* the collectives of the compiled train step (all-gather, reduce-scatter,
  all-reduce, all-to-all, collective-permute): count and bytes per step, by
  mesh axis;
* compile time.

A config that does not fit exits with status 1 and what to change.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import time

from absl import app
from absl import flags
from absl import logging
import flax.linen as nn
import jax
import numpy as np

from bertjax import config_lib
from bertjax import errors
from bertjax import flops
from bertjax import objectives
from bertjax import sharding
from bertjax import storage
from bertjax import train
from bertjax import train_flags
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

GIB = 2.0**30
EXTRA = 'tpu-aot'   # setup.py's extra with the TPU compiler (libtpu).


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation, per chip (one JAX device: v4 and v5p run their two
  TensorCores as one, 'megacore'). HBM from Cloud TPU's system
  architecture pages; the bf16 peak is flops.py's."""
  device_kind: str             # What jax reports.
  hbm_bytes: int
  dims: int                    # Of the topology: 2 (a torus per pod slice
                               # row) or 3.
  chip_config: str             # libtpu's name of the per-chip layout.
  cores_per_chip: int          # In the accelerator type's count (v4-8: 4
                               # chips).


CHIPS = {
    'v4': Chip('TPU v4', 32 * 2**30, 3, 'megacore', 2),
    'v5e': Chip('TPU v5 lite', 16 * 2**30, 2, 'default', 1),
    'v5p': Chip('TPU v5', 95 * 2**30, 3, 'megacore', 2),
    'v6e': Chip('TPU v6 lite', 32 * 2**30, 2, 'default', 1),
}
_ALIASES = {'v5litepod': 'v5e', 'v6litepod': 'v6e'}


class PreflightError(errors.UserError, ValueError):
  """The pre-flight cannot run; the message says why."""


class DoesNotFit(PreflightError):
  """The TPU compiler found the step too large for the chip's HBM.
  ``report`` holds what is known (``preflight.json``'s content)."""

  def __init__(self, message: str, report: dict):
    super().__init__(message)
    self.report = report


def _grid(chips: int, dims: int) -> tuple[int, ...]:
  """The chips of a slice as the torus Cloud TPU builds: sides doubling in
  turn (2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...; 2x2, 2x4, 4x4, 4x8, ...)."""
  if chips & (chips - 1):
    raise PreflightError(f'{chips} chips: Cloud TPU slices have a power of '
                         'two.')
  side = [1] * dims
  i = 0
  while math.prod(side) < chips:
    side[(dims - 1 - i) % dims if dims == 2 else i % dims] *= 2
    i += 1
  # 3-D: the longest side last (2x2x4, 4x4x8), as Cloud TPU names them.
  return tuple(sorted(side) if dims == 3 and chips >= 8 else side)


def topology(accelerator: str) -> tuple[Chip, str, dict]:
  """(chip, libtpu topology name, its options) of an accelerator type such
  as ``v5e-16``, ``v5litepod-16`` or ``v4-32`` (the count is of chips for
  v5e and v6e, of TensorCores for v4 and v5p, as Cloud TPU names them), or
  of a topology name such as ``v5e:4x4``."""
  name, sep, size = accelerator.partition(':')
  if sep:
    generation, shape = _ALIASES.get(name, name), tuple(
        int(x) for x in size.split('x'))
  else:
    generation, _, count = accelerator.rpartition('-')
    generation = _ALIASES.get(generation, generation)
    if not count.isdigit() or generation not in CHIPS:
      raise PreflightError(
          f'--topology={accelerator!r}: give an accelerator type '
          f'GENERATION-SIZE with GENERATION one of {sorted(CHIPS)} (e.g. '
          'v5e-16, v4-32), or a topology such as v5e:4x4.')
    chip = CHIPS[generation]
    chips = int(count) // chip.cores_per_chip
    if not chips:
      raise PreflightError(f'--topology={accelerator!r} has no whole chip.')
    shape = _grid(chips, chip.dims)
  if generation not in CHIPS:
    raise PreflightError(f'--topology={accelerator!r}: unknown generation '
                         f'{generation!r}; known: {sorted(CHIPS)}.')
  chip = CHIPS[generation]
  if len(shape) != chip.dims:
    raise PreflightError(f'--topology={accelerator!r}: a {generation} '
                         f'topology has {chip.dims} sides.')
  chips = math.prod(shape)
  # A host holds 4 chips (2x2), except single-host v5e/v6e slices of 8.
  per_host = ((*shape, 1)[:3] if chip.dims == 2 and chips <= 8
              else (2, 2, 1) if chips >= 4 else (*shape, 1, 1)[:3])
  return chip, f'{generation}:{"x".join(map(str, shape))}', {
      'chip_config_name': chip.chip_config,
      'chips_per_host_bounds': per_host}


def slice_devices(accelerator: str, num_slices: int = 1
                  ) -> tuple[Chip, list]:
  """The chip and the compile-only devices of ``num_slices`` slices."""
  chip, name, options = topology(accelerator)
  if importlib.util.find_spec('libtpu') is None:
    raise PreflightError(
        "the TPU compiler (libtpu) is not installed: pip install "
        f"'.[{EXTRA}]' (or 'bertjax[{EXTRA}]'), which pins the libtpu of "
        'the installed jax.')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # Compiling needs no chip: let several processes load libtpu at once
  # (its lockfile guards the hardware, which a pre-flight never opens).
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  desc = topologies.get_topology_desc(
      topology_name=name, platform='tpu', num_slices=num_slices, **options)
  return chip, list(desc.devices)


# ---------------------------------------------------------------------------
# Collectives in the optimized HLO.

COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all',
               'collective-permute')
_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2,
                'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8,
                'f64': 8, 'c64': 8, 'c128': 16}
_OP = re.compile(r'=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>' + '|'.join(
    COLLECTIVES) + r')(?P<start>-start)?\(')
_SHAPE = re.compile(r'(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')


def _shape_bytes(text: str) -> int:
  """Bytes of an HLO shape (a tuple's: the sum of its arrays')."""
  sizes = [_DTYPE_BYTES.get(m['dtype'], 0) * math.prod(
      int(d) for d in m['dims'].split(',') if d) for m in _SHAPE.finditer(
          text)]
  return sum(sizes)


def _iota(dims: str, perm: str | None) -> np.ndarray:
  """XLA's iota device list ``[dims]T(perm)``: arange, reshaped, transposed."""
  shape = [int(x) for x in dims.split(',')]
  ids = np.arange(math.prod(shape)).reshape(shape)
  return ids.transpose([int(x) for x in perm.split(',')]) if perm else ids


def _groups(line: str) -> list[tuple[int, ...]] | None:
  """The device groups of a collective (positions in the program's device
  assignment), from any of XLA's spellings of its replica groups, or a
  permute's source-target pairs; None when the line has none."""
  m = re.search(r'replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}', line)
  if m:   # {{0,1},{2,3}}
    return [tuple(int(x) for x in g.split(',') if x)
            for g in re.findall(r'\{([\d,]*)\}', m[1])]
  m = re.search(r'replica_groups=\[([\d,]+)\]<=\[([\d,]+)\]'
                r'(?:T\(([\d,]+)\))?', line)
  if m:   # [groups,size]<=[dims]T(perm)
    rows = int(m[1].split(',')[0])
    return [tuple(g) for g in _iota(m[2], m[3]).reshape(rows, -1).tolist()]
  m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)"
                r"\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}", line)
  if m:   # mesh['axis_0'=4,'axis_1'=2][, device_ids=([dims]T(perm))]
    # {'axis_1'}: groups along the named axes of that arrangement.
    axes = re.findall(r"'([^']+)'=(\d+)", m[1])
    sizes = [int(n) for _, n in axes]
    ids = (_iota(m[2], m[3]) if m[2] else np.arange(math.prod(sizes))
           ).reshape(sizes)
    inside = [i for i, (name, _) in enumerate(axes) if f"'{name}'" in m[4]]
    outside = [i for i in range(len(axes)) if i not in inside]
    size = math.prod(sizes[i] for i in inside)
    return [tuple(g) for g in ids.transpose(outside + inside).reshape(
        -1, size).tolist()]
  m = re.search(r'source_target_pairs=\{(.*?)\}\}', line)
  if m:   # {{0,1},{1,0}}
    return [tuple(int(x) for x in p.split(','))
            for p in re.findall(r'\{(\d+,\d+)', m[1] + '}')]
  return None


def _axes_of(groups, shape: tuple[int, ...], names: tuple[str, ...]) -> str:
  """The mesh axes (of ``names``, sizes ``shape``) along which a
  collective's groups of device positions vary; '?' without groups."""
  if not groups:
    return '?'
  coords = np.array(np.unravel_index(np.arange(math.prod(shape)), shape)).T
  varying = set()
  for group in groups:
    c = coords[list(group)]
    varying |= {names[i] for i in range(len(shape))
                if len(set(c[:, i])) > 1}
  return ','.join(a for a in names if a in varying) or 'none'


# Collectives between slices (over the data-center network) are compiled
# as host transfers to libtpu's Megascale runtime: a send (and a recv) per
# collective, tagged with its kind.
_DCN = re.compile(r'=\s*\((?P<shape>[a-z]+\d*\[[\d,]*\]).*?\bsend\(.*'
                  r'_xla_megascale_transfer_type="(?P<kind>[A-Z_]+)"')


def collectives(hlo_text: str, mesh, num_slices: int = 1) -> dict:
  """{op: {axes: {'count': n, 'bytes': result bytes per device}}} of one
  execution of the program (collectives inside loops counted once). With
  several slices the program is one slice's: its device positions are
  that slice's, and the collectives between slices are on 'replica'."""
  found = collections.defaultdict(lambda: collections.defaultdict(
      lambda: {'count': 0, 'bytes': 0}))
  shape, names = mesh.devices.shape, mesh.axis_names
  if num_slices > 1:   # The replica axis is the first.
    shape, names = shape[1:], names[1:]
  for line in hlo_text.splitlines():
    m, dcn = _OP.search(line), _DCN.search(line)
    if dcn:
      entry = found[dcn['kind'].lower().replace('_', '-')]['replica']
      size = _shape_bytes(dcn['shape'])
    elif m:
      size = _shape_bytes(m['shape'])
      if m['start'] and m['shape'].startswith('('):
        size //= 2   # An async start's tuple: its operands, then results.
      entry = found[m['op']][_axes_of(_groups(line), shape, names)]
    else:
      continue
    entry['count'] += 1
    entry['bytes'] += size
  return {op: dict(by_axes) for op, by_axes in found.items()}


# ---------------------------------------------------------------------------
# The compile.


def vocab_size(cfg) -> int:
  """The tokenizer's size: its model's when the config names one that this
  machine can read, else the size the config trains."""
  path = cfg.data.tokenizer.model_path
  if path and storage.exists(path):
    return tokenizer_lib.Tokenizer.load(path).vocab_size
  if path:
    print(f'warning: data.tokenizer.model_path={path!r} is not readable '
          'here; compiling for data.tokenizer.vocab_size='
          f'{cfg.data.tokenizer.vocab_size}.', file=sys.stderr)
  return cfg.data.tokenizer.vocab_size


def _cost(compiled) -> dict:
  """XLA's cost analysis of the compiled program (per device)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):   # One per program on older jax.
    cost = cost[0]
  return dict(cost or {})


# Long: one report, assembled in the order it is printed.
def preflight(cfg, accelerator: str, num_slices: int = 1) -> dict:
  """Compiles ``cfg``'s steps for ``num_slices`` slices of ``accelerator``
  and returns the report (``preflight.json``'s content, plus the two
  steps' optimized HLO under '_hlo')."""
  cfg = objectives.get(cfg.objective.name).prepare_config(cfg)
  config_lib.validate(cfg)
  chip, devices = slice_devices(accelerator, num_slices)
  replicas = cfg.sharding.replicas
  if num_slices > 1 and replicas != num_slices:
    # The trainer refuses it on the pod (sharding._granules).
    raise PreflightError(f'sharding.replicas={replicas} with '
                         f'--num_slices={num_slices}: the replica axis spans '
                         'the slices, one each; set '
                         f'--config.sharding.replicas={num_slices}.')
  mesh = sharding.make_mesh(cfg.sharding.mesh_shape, replicas, devices)
  rules = sharding.logical_rules(cfg)
  batch_sh = sharding.batch_sharding(mesh)
  sharding.check_batch_divisible(cfg.batch_size, mesh)
  task = objectives.get(cfg.objective.name).make_task(cfg, vocab_size(cfg))
  spec = pipeline.batch_spec(cfg)
  steps = train.make_steps(cfg, task, spec)
  report = {
      'config': cfg.get('name', '') or cfg.objective.name,
      'topology': accelerator, 'num_slices': num_slices,
      'devices': mesh.size, 'device_kind': devices[0].device_kind,
      'mesh': dict(mesh.shape), 'batch_size': cfg.batch_size,
      'seq_length': cfg.data.max_seq_length, 'dtype': cfg.model.dtype,
      'hbm_bytes': chip.hbm_bytes, 'jax': jax.__version__}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract_state, state_sh = sharding.state_shardings(
        steps.init_state, mesh, rules, *train.init_inputs(steps))
    sharding.check_divisible(abstract_state, mesh)
    batch = train.abstract_batch(spec, batch_sh)
    start = time.time()
    try:
      train_step = train.compile_train_step(steps, mesh, state_sh, batch_sh,
                                            abstract_state, batch)
    except jax.errors.JaxRuntimeError as e:
      _refuse_if_out_of_memory(e, report, time.time() - start)
      raise
    train_seconds = time.time() - start
    start = time.time()
    eval_step = train.jit_eval_step(steps, mesh, state_sh, batch_sh).lower(
        abstract_state.params, batch).compile()
    eval_seconds = time.time() - start
  memory = sharding.memory_figures(train_step)
  tokens = cfg.batch_size * cfg.data.max_seq_length
  cost = _cost(train_step)
  compiled_flops = float(cost.get('flops', 0.0))
  analytic = task.flops_per_token * tokens / mesh.size
  peak = flops.peak_flops(devices[0].device_kind)
  bound = compiled_flops / peak
  train_hlo = train_step.as_text()   # Several MB for BERT-base: once.
  report.update({
      'memory_bytes': memory,
      'eval_memory_bytes': sharding.memory_figures(eval_step),
      'fits': memory['total'] <= chip.hbm_bytes,
      'margin_bytes': chip.hbm_bytes - memory['total'],
      'flops_per_device': {'compiled': compiled_flops, 'analytic': analytic,
                           'compiled_over_analytic': (
                               compiled_flops / analytic if analytic
                               else None)},
      'bound_at_peak': {
          'peak_bf16_flops_per_chip': peak,
          'min_step_seconds': bound,
          'max_tokens_per_second': tokens / bound if bound else None},
      # The compiler's own whole-program time estimate (seconds), kept as
      # it reports it: README, "Pre-flight", says what it is worth.
      'compiler_optimal_seconds': cost.get('optimal_seconds'),
      'collectives': collectives(train_hlo, mesh, num_slices),
      'compile_seconds': {'train_step': train_seconds,
                          'eval_step': eval_seconds},
      '_hlo': {'train_step': train_hlo,
               'eval_step': eval_step.as_text()},
  })
  return report


def _refuse_if_out_of_memory(error: Exception, report: dict,
                             seconds: float) -> None:
  """Raises DoesNotFit when the TPU compiler stopped because the step's
  buffers exceed the HBM (it says so itself: RESOURCE_EXHAUSTED)."""
  text = str(error)
  if 'RESOURCE_EXHAUSTED' not in text:
    return
  m = re.search(r'\(([\d.]+)([TGMK])\) exceeds available HBM \(([\d.]+)'
                r'([TGMK])\)', text)
  unit = {'T': 2.0**40, 'G': GIB, 'M': 2.0**20, 'K': 2.0**10}
  if m:
    report['required_bytes'] = float(m[1]) * unit[m[2]]
    report['available_bytes'] = float(m[3]) * unit[m[4]]
  report.update(fits=False, compile_seconds={'train_step': seconds},
                compiler_message=text.strip().splitlines()[-1])
  raise DoesNotFit(report['compiler_message'], report)


def advice(cfg, report: dict) -> list[str]:
  """What would make a config that does not fit fit, most direct first."""
  mesh = report['mesh']
  per_chip = cfg.batch_size / report['devices']
  over = (report['memory_bytes']['total'] / report['hbm_bytes']
          if 'memory_bytes' in report else
          report.get('required_bytes', 2.0) / report.get('available_bytes', 1))
  out = [f'lower the batch per chip ({per_chip:g} rows now; batch_size '
         f'{cfg.batch_size} over {report["devices"]} chips): about '
         f'{max(1, int(per_chip / over))} rows fit if activations dominate']
  if cfg.model.remat == 'none':
    out.append("recompute activations: --config.model.remat=full (or dots)")
  if mesh['fsdp'] < report['devices']:
    out.append('shard parameters and optimizer state over more chips: '
               'more fsdp in sharding.mesh_shape, e.g. '
               f'--config.sharding.mesh_shape="(1, -1, 1)" (fsdp '
               f'{mesh["fsdp"]} now)')
  if not cfg.model.scan_layers and cfg.objective.name == 'bert':
    out.append('--config.model.scan_layers=True (one layer compiled, its '
               'buffers reused)')
  if cfg.model.dtype != 'bfloat16':
    out.append('--config.model.dtype=bfloat16')
  return out


def _estimate(report: dict) -> str:
  """The compiler's own step-time estimate, when it is one (this libtpu's
  is negative, so meaningless, on v4 and v5e: README, "Pre-flight")."""
  seconds = report.get('compiler_optimal_seconds')
  if seconds is None or seconds <= 0:
    return ("the compiler's step-time estimate: none usable "
            f'(optimal_seconds {seconds})')
  return (f"the compiler's step-time estimate (compiler-estimated, not a "
          f'measurement): {seconds * 1e3:.1f} ms')


def format_report(report: dict) -> str:
  m, f = report['memory_bytes'], report['flops_per_device']
  b = report['bound_at_peak']
  lines = [
      f'{report["config"]} on {report["num_slices"]} x {report["topology"]} '
      f'({report["devices"]} x {report["device_kind"]}), mesh '
      f'{report["mesh"]}, batch {report["batch_size"]} x seq '
      f'{report["seq_length"]} ({report["dtype"]})',
      f'memory per device: arguments {m["arguments"] / GIB:.2f} GiB, '
      f'outputs {m["outputs"] / GIB:.2f} GiB ({m["aliased"] / GIB:.2f} '
      f'donated), temporaries {m["temporaries"] / GIB:.2f} GiB; total '
      f'{m["total"] / GIB:.2f} of {report["hbm_bytes"] / GIB:.0f} GiB HBM: '
      + (f'fits, {report["margin_bytes"] / GIB:.2f} GiB to spare'
         if report['fits'] else
         f'DOES NOT FIT by {-report["margin_bytes"] / GIB:.2f} GiB'),
      f'FLOPs per device per step: compiled {f["compiled"]:.3e}, analytic '
      f'{f["analytic"]:.3e} (x{f["compiled_over_analytic"]:.3f})',
      f'bound at the bf16 peak ({b["peak_bf16_flops_per_chip"] / 1e12:.0f} '
      f'TFLOP/s per chip; not a measurement): step >= '
      f'{b["min_step_seconds"] * 1e3:.1f} ms, <= '
      f'{b["max_tokens_per_second"]:,.0f} tokens/s',
      _estimate(report),
      'collectives per train step (count, result bytes per device, by mesh '
      'axes):']
  for op, by_axes in sorted(report['collectives'].items()):
    for axes, x in sorted(by_axes.items()):
      lines.append(f'  {op:18s} {axes:22s} {x["count"]:5d}  '
                   f'{x["bytes"] / 2**20:10.1f} MiB')
  c = report['compile_seconds']
  lines.append(f'compile: train step {c["train_step"]:.1f} s, eval step '
               f'{c["eval_step"]:.1f} s')
  return '\n'.join(lines)


def write(report: dict, out: str, save_hlo: bool = True) -> str:
  """``out/preflight.json`` and (``save_hlo``) the steps' HLO texts;
  returns the JSON's path."""
  storage.makedirs(out)
  for name, text in report['_hlo'].items() if save_hlo else ():
    storage.write_text(os.path.join(out, f'{name}.hlo.txt'), text)
  path = os.path.join(out, 'preflight.json')
  storage.write_text(path, json.dumps(
      {k: v for k, v in report.items() if k != '_hlo'}, indent=1,
      sort_keys=True))
  return path


# ---------------------------------------------------------------------------
# Command line.

# --config is bertjax.train's flag (the same configs and overrides).
FLAGS = flags.FLAGS
flags.declare_key_flag(train_flags.CONFIG.name)   # Listed by --help.
_TOPOLOGY = flags.DEFINE_string(
    'topology', None, 'Accelerator type (v5e-16, v4-32, v5p-8, v6e-8) or '
    'topology (v5e:4x4).')
_NUM_SLICES = flags.DEFINE_integer('num_slices', 1, 'Slices (multislice).')
_OUT = flags.DEFINE_string(
    'out', '', 'Where the report and HLO go (default: '
    'preflight/TOPOLOGY[xSLICES]); local or gs://.')
_SAVE_HLO = flags.DEFINE_bool(
    'save_hlo', True, 'Write the optimized HLO of both steps beside the '
    'report.')


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.config is None or not _TOPOLOGY.value:
    raise app.UsageError('--config and --topology are required.')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  cfg = FLAGS.config
  out = _OUT.value or os.path.join('preflight', _TOPOLOGY.value + (
      f'x{_NUM_SLICES.value}' if _NUM_SLICES.value > 1 else ''))
  try:
    report = preflight(cfg, _TOPOLOGY.value, _NUM_SLICES.value)
  except DoesNotFit as e:
    report = e.report
    print(f'{report["config"]} on {report["num_slices"]} x '
          f'{report["topology"]}: DOES NOT FIT; the TPU compiler: {e}')
    print(f'report: {write({**report, "_hlo": {}}, out)}')
  except (errors.UserError, ValueError) as e:
    sys.exit(f'preflight: {e}')
  else:
    print(format_report(report))
    print(f'report: {write(report, out, _SAVE_HLO.value)}')
  if not report['fits']:
    sys.exit('preflight: the train step does not fit. To fit, any of:\n  '
             + '\n  '.join(advice(cfg, report)))


if __name__ == '__main__':
  app.run(main, flags_parser=errors.flags_parser('preflight'))
