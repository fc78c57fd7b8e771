"""Where a profiled training step's device time goes.

Reads a JAX profiler trace (``jax.profiler.ProfileData``, the XSpace that
``jax.profiler.start_trace`` writes) and sums the device's kernels by name:
the GPU planes' stream lines hold one event per kernel or copy. Kernels are
also grouped by what their names say they are (cuBLAS/CUTLASS matrix
products, cuDNN attention, copies, XLA's own fusions), and the device's busy
time (the union of its kernels' intervals) is set against the traced span,
so that idle time between kernels shows.
"""

from __future__ import annotations

import collections

# Kernel-name substrings, first match wins (lower case).
CATEGORIES = (
    ('attention (cuDNN)', ('cudnn', 'fmha', 'flash')),
    ('matmul (cuBLAS/CUTLASS)', ('gemm', 'xmma', 'nvjet', 'cutlass', 'cublas',
                                 'gemv')),
    ('copy/memset', ('memcpy', 'memset')),
    ('random bits', ('threefry', 'rng_bit', 'philox')),
)
OTHER = 'XLA fusions and other kernels'


def category(kernel: str) -> str:
  lower = kernel.lower()
  for name, keys in CATEGORIES:
    if any(k in lower for k in keys):
      return name
  return OTHER


def device_events(data) -> list[tuple[str, int, int]]:
  """(name, start_ns, duration_ns) of every kernel or copy on the devices'
  streams (GPU planes); empty when the trace has no device plane (CPU)."""
  events = []
  for plane in data.planes:
    if not plane.name.startswith('/device:GPU'):
      continue
    for line in plane.lines:
      if not line.name.startswith('Stream'):
        continue   # Derived lines ("XLA Ops", ...) repeat the same time.
      events.extend((e.name, int(e.start_ns), int(e.duration_ns))
                    for e in line.events)
  return events


def busy_ns(events) -> int:
  """Length of the union of the events' intervals."""
  total, end = 0, None
  for _, start, duration in sorted(events, key=lambda e: e[1]):
    stop = start + duration
    if end is None or start >= end:
      total += duration
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total


def summarize(data, top: int = 20) -> dict:
  """Kernels by total time, categories, busy time and traced span."""
  events = device_events(data)
  if not events:
    return {'kernels': [], 'categories': {}, 'busy_ns': 0, 'span_ns': 0,
            'total_kernel_ns': 0}
  by_name = collections.defaultdict(lambda: [0, 0])
  by_category = collections.Counter()
  for name, _, duration in events:
    by_name[name][0] += duration
    by_name[name][1] += 1
    by_category[category(name)] += duration
  span = (max(s + d for _, s, d in events) - min(s for _, s, _ in events))
  kernels = sorted(by_name.items(), key=lambda kv: -kv[1][0])
  return {
      'kernels': [{'name': n, 'ns': t, 'count': c, 'category': category(n)}
                  for n, (t, c) in kernels[:top]],
      'categories': dict(by_category.most_common()),
      'busy_ns': busy_ns(events), 'span_ns': span,
      'total_kernel_ns': sum(d for _, _, d in events),
  }


def table(summary: dict, steps: int) -> str:
  """Markdown: categories, then the top kernels, in ms per step."""
  if not summary['kernels']:
    return 'profile: no device kernels in the trace (CPU run).'
  total = summary['total_kernel_ns']
  per_step = lambda ns: f'{ns / steps / 1e6:.2f}'
  lines = [
      f'Device busy {per_step(summary["busy_ns"])} ms of '
      f'{per_step(summary["span_ns"])} ms traced per step '
      f'({summary["busy_ns"] / summary["span_ns"]:.1%}).', '',
      '| kernel category | ms/step | share |', '| --- | --- | --- |']
  lines += [f'| {c} | {per_step(ns)} | {ns / total:.1%} |'
            for c, ns in summary['categories'].items()]
  lines += ['', '| top kernels | ms/step | calls/step | share |',
            '| --- | --- | --- | --- |']
  for k in summary['kernels']:
    name = k['name'] if len(k['name']) <= 70 else k['name'][:67] + '...'
    lines.append(f'| `{name}` | {per_step(k["ns"])} | '
                 f'{k["count"] / steps:g} | {k["ns"] / total:.1%} |')
  return '\n'.join(lines)
