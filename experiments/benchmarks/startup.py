r"""What a process pays before it trains: importing the trainer and starting
its metric writer.

  python experiments/benchmarks/startup.py \
      --out=experiments/benchmarks/results/startup_cpu_2026-11-27b.txt

tensorboardX imports torch wherever torch is installed (as it is with the
test extra, and on most researchers' machines), only to accept torch
tensors; ``bertjax.runtime.metric_writers`` imports it with torch kept out.
Qwix (8-bit training) brings ``flax.nnx`` along; ``bertjax.quantization``
imports it where a model is first quantized. Three forms, each in a fresh
interpreter, alternating within each round:

- ``bertjax``: ``import bertjax.train`` and a ``MetricWriter`` started and
  closed, as every training process does;
- ``with qwix``: the same after ``import qwix``: the trainer as it was
  before Qwix was imported on first use;
- ``with torch``: the same after a plain ``import tensorboardX`` (which
  loads torch) and ``import qwix``: the trainer as it was before both.

For each: the median and range over ``--rounds`` rounds of the wall time
from the child's launch to its writer closed, and its peak resident
memory. Prints the table and writes it, with the machine and the load on
it, to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from experiments.benchmarks import tasks as tasks_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

# The child: argv[1] = workdir, argv[2] = what to import first ('none',
# 'qwix', or 'torch': tensorboardX plainly, and qwix). Prints "seconds
# peak_kib torch_loaded".
_CHILD = """
import resource, sys, time
if sys.argv[2] == 'torch':
  import tensorboardX
if sys.argv[2] in ('qwix', 'torch'):
  import qwix
import bertjax.train
from bertjax.runtime import metric_writers
writer = metric_writers.MetricWriter(sys.argv[1], total_steps=1, first_step=0)
writer.close()
seconds = time.time() - float(sys.argv[3])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f'RESULT {seconds:.4f} {peak} {"torch" in sys.modules}')
"""
FORMS = {'bertjax': 'none', 'with qwix': 'qwix', 'with torch': 'torch'}


def measure(form: str, workdir: str) -> tuple[float, int, bool]:
  """(seconds, peak KiB, torch loaded) of one fresh child."""
  os.makedirs(workdir)
  result = subprocess.run(
      [sys.executable, '-c', _CHILD, workdir, FORMS[form], repr(time.time())],
      capture_output=True, text=True, check=True, cwd=REPO,
      env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'))
  line = next(l for l in result.stdout.splitlines() if l.startswith('RESULT'))
  _, seconds, peak, torch = line.split()
  return float(seconds), int(peak), torch == 'True'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  lines = tasks_bench.machine() + [tasks_bench.load_line('at the start')]
  start = tasks_bench.cpu_seconds()
  seconds = {form: [] for form in FORMS}
  peaks = {form: [] for form in FORMS}
  loaded = {}
  with tempfile.TemporaryDirectory() as root:
    for r in range(args.rounds):
      for form in FORMS:
        s, peak, torch = measure(form, os.path.join(root, f'{form}{r}'))
        seconds[form].append(s)
        peaks[form].append(peak)
        loaded[form] = torch
  lines += [tasks_bench.load_line('at the end'),
            tasks_bench.others_line(start), '',
            f'{"form":<12} {"torch":>6} {"median s":>9} {"range s":>13} '
            f'{"peak MiB":>9}']
  for form in FORMS:
    lines.append(
        f'{form:<12} {str(loaded[form]):>6} '
        f'{statistics.median(seconds[form]):9.2f} '
        f'{min(seconds[form]):6.2f}-{max(seconds[form]):<6.2f} '
        f'{statistics.median(peaks[form]) / 1024:9.0f}')
  lines.append('')
  for form in FORMS:
    if form != 'bertjax':
      saved = {name: statistics.median(values[form])
               - statistics.median(values['bertjax'])
               for name, values in (('s', seconds), ('KiB', peaks))}
      lines.append(f'median saving per process against {form!r}: '
                   f'{saved["s"]:.2f} s and {saved["KiB"] / 1024:.0f} MiB, '
                   f'over {args.rounds} rounds')
  print('\n'.join(lines))
  if args.out:
    with open(args.out, 'w') as f:
      f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
  main()
