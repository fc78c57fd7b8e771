r"""The README's pre-flight table: five models compiled for five TPU slices,
on this machine (bertjax/preflight.py; needs pip install '.[tpu-aot]').

  python experiments/preflight_table.py [--out=experiments/results/preflight]
      [--only=MODEL/TOPOLOGY ...]

Each (model, topology) compiles in a process of its own (``python -m
bertjax.preflight``, bf16), one after another; one whose ``preflight.json``
exists is skipped, so an interrupted run resumes where it stopped. Writes
``OUT/MODEL/TOPOLOGY/preflight.json`` and ``report.txt`` (what the command
printed; the HLO is left out, at several MB a step), then ``OUT/table.md``,
which it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'experiments', 'configs')

# name -> (config, overrides): the papers' pretraining shapes.
MODELS = {
    'BERT-base, seq 128, batch 256': (
        'bert.py:size=base', ['--config.batch_size=256']),
    'BERT-base, seq 128, batch 4096': (
        'bert.py:size=base', ['--config.batch_size=4096']),
    'BERT-large, seq 512, batch 256': ('bert.py:size=large,phase=2', []),
    'RoBERTa-large, seq 512, batch 8192': ('roberta.py:size=large', []),
    'ALBERT-xxlarge, seq 512, batch 4096': ('albert.py:size=xxlarge', []),
}
# name -> (accelerator type, slices, overrides).
TOPOLOGIES = {
    'v4-8': ('v4-8', 1, []),
    'v5e-8': ('v5e-8', 1, []),
    'v5e-64, fsdp': ('v5e-64', 1, ['--config.sharding.mesh_shape=(1, -1, 1)']),
    'v5p-8': ('v5p-8', 1, []),
    '2 x v5e-16': ('v5e-16', 2, []),
}


def _slug(name: str) -> str:
  return ''.join(c if c.isalnum() else '-' for c in name.lower()).strip('-')


def run_one(model: str, topology: str, out: str) -> dict | None:
  """The report of one compile (run now, or found); None if it failed."""
  directory = os.path.join(out, _slug(model), _slug(topology))
  path = os.path.join(directory, 'preflight.json')
  if not os.path.exists(path):
    config, overrides = MODELS[model]
    accelerator, slices, more = TOPOLOGIES[topology]
    command = [sys.executable, '-m', 'bertjax.preflight',
               f'--config={os.path.join(CONFIGS, config)}',
               f'--topology={accelerator}', f'--num_slices={slices}',
               f'--out={directory}', '--nosave_hlo',
               '--config.model.dtype=bfloat16', *overrides, *more]
    print(f'== {model} on {topology}', flush=True)
    start = time.time()
    result = subprocess.run(command, capture_output=True, text=True,
                            cwd=REPO, env=dict(os.environ,
                                               JAX_PLATFORMS='cpu'))
    os.makedirs(directory, exist_ok=True)
    said = result.stderr[result.stderr.rfind('preflight:'):] if (
        'preflight:' in result.stderr) else ''
    with open(os.path.join(directory, 'report.txt'), 'w') as f:
      f.write((result.stdout + said).replace(REPO + os.sep, ''))
    print(result.stdout + f'({time.time() - start:.0f} s, exit '
          f'{result.returncode})', flush=True)
    if not os.path.exists(path):
      print(result.stderr[-3000:], flush=True)
      return None
  with open(path) as f:
    return json.load(f)


def dominant(report: dict, n: int = 2) -> str:
  """The ``n`` collectives moving the most bytes: op (axes) MiB, count."""
  items = [(x['bytes'], op, axes, x['count'])
           for op, by_axes in report['collectives'].items()
           for axes, x in by_axes.items()]
  return '; '.join(f'{op} ({axes}) {size / 2**20:,.0f} MiB x{count}'
                   for size, op, axes, count in sorted(items)[::-1][:n])


def table(reports: dict) -> str:
  lines = ['| model | slice | GiB per device (HBM) | fits | FLOPs per device: '
           'compiled / analytic | compile s | dominant collectives |',
           '| --- | --- | --- | --- | --- | --- | --- |']
  for (model, topology), r in reports.items():
    if r is None:
      lines.append(f'| {model} | {topology} | compile failed (see '
                   'report.txt) | | | | |')
      continue
    if 'memory_bytes' not in r:   # The compiler refused it.
      lines.append(
          f'| {model} | {topology} | {r["required_bytes"] / 2**30:.1f} '
          f'({r["available_bytes"] / 2**30:.2f} usable) | no: the compiler '
          f'ran out of HBM | | {r["compile_seconds"]["train_step"]:.0f} '
          '| |')
      continue
    m, f = r['memory_bytes'], r['flops_per_device']
    fits = ('yes' if r['fits'] else 'no') + (
        f' ({r["margin_bytes"] / 2**30:+.1f})')
    lines.append(
        f'| {model} | {topology} | {m["total"] / 2**30:.1f} '
        f'({r["hbm_bytes"] / 2**30:.0f}) | {fits} | {f["compiled"]:.3g} / '
        f'{f["analytic"]:.3g} ({f["compiled_over_analytic"]:.3f}) | '
        f'{r["compile_seconds"]["train_step"]:.0f} | {dominant(r)} |')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default=os.path.join(
      REPO, 'experiments', 'results', 'preflight'))
  parser.add_argument('--only', nargs='*', default=[],
                      help='MODEL/TOPOLOGY slugs to run (default: all).')
  args = parser.parse_args(argv)
  reports = {}
  for model in MODELS:
    for topology in TOPOLOGIES:
      if args.only and f'{_slug(model)}/{_slug(topology)}' not in args.only:
        continue
      reports[(model, topology)] = run_one(model, topology, args.out)
  text = table(reports)
  with open(os.path.join(args.out, 'table.md'), 'w') as f:
    f.write(text)
  print(text)


if __name__ == '__main__':
  main()
