r"""Does the input pipeline keep up with the train step, task by task?

  python experiments/benchmarks/tasks.py \
      --out=experiments/benchmarks/results/tasks_cpu_2026-11-29.txt
  python experiments/benchmarks/tasks.py --arms=mlm,token_shuffle --batches=30

For each arm of experiments/configs/beyond_masking.py (``ARMS`` but
``electra``, whose masking runs inside the step; or ``--arms``), on that
arm's own config (compare_small's recipe: the embedded corpus, its
2000-piece tokenizer, lower-cased for capitalization and ernie2, 128-token
sequences, batch 32), in one process and back to back:

- pipeline: ``data_pipelines.pipeline.train_dataset`` with one Grain
  thread (``data.num_threads=1``, no worker processes, the config's
  ``data.prefetch_batches``), after ``--warmup`` batches, over
  ``--batches`` batches: batches/s and real (non-pad) tokens/s. It builds
  the instances, runs the arm's host tasks (data_pipelines/tasks/), masks
  and packs, as in training;
- setup: the split's one-time work before its first batch (the instance
  builder, e.g. the discourse layout's scan of the split for marker
  sentences, and epoch 0's plan), summed over a continual run's streams;
- its parts, per batch, over ``--part_batches`` batches built beforehand
  (best of ``--part_repeats`` passes): building the instance batch
  (``InstanceBatches``, i.e. document reads and instance layout), the
  tasks' ``apply(batch, params, seed)`` alone (corrupting task first, as
  the pipeline runs them), and MLM masking (``masking.mask_batch``) of the
  batch the tasks made; '-' where the arm's tasks have no ``apply`` (the
  instance builder makes their fields: counted in the instances) or it
  does no masking;
- step: the trainer's train step (``objectives.get(...).make_task``,
  ``train.make_steps``; ``init_state`` and ``train_step`` jitted, the
  state donated) on compare_small's tiny encoder (L2/H128, FFN 512) fed
  one real batch of the arm's pipeline (``pipeline.STATISTICS`` popped),
  ``--steps`` steps per round after 2 warm-up steps, median of
  ``--rounds`` rounds, each ended by ``jax.block_until_ready``: batches/s.

The pipeline keeps up when pipeline batches/s / step batches/s >= 1. The
step uses every core (XLA's threads), the pipeline one thread; in training
they share the machine, so a ratio near 1 is not enough on a 2-core host.
``ernie2`` (the continual run) is measured from the first step of each
stage (``stage k``: the streams introduced by then, in the schedule's
mix); its parts are each stream's, weighted by the stage's mix.

Data are prepared once per distinct preparation (tokenizer and held-out
fraction) under ``--data_dir`` (default: a temporary directory, so the
preparation is part of the run), and timed in a second table: training the
tokenizer (a lower-casing one for capitalization and ernie2; each is
trained once and cached, so a second preparation with it, at another
held-out fraction, reuses it: 0 s) and pre-tokenizing the corpus into
shards (a lower-casing tokenizer also flags each capitalized word), in
seconds and tokens/s, for the arms that read it. Prints the tables and
writes them, with the date, the machine (CPU model, cores, load average
before and after, and how much CPU the other processes took during the
run: /proc/stat's busy time less this process's) and the jax, numpy and
grain versions, to ``--out`` (default: print only).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import grain
import jax
import numpy as np

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from data_pipelines import continual as continual_lib
from data_pipelines import instances as instances_lib
from data_pipelines import masking as masking_lib
from data_pipelines import pipeline
from data_pipelines import pretokenize
from data_pipelines import tasks as tasks_lib
from experiments.configs import beyond_masking
# pylint: enable=g-import-not-at-top,wrong-import-position

_CONFIG = 'experiments/configs/beyond_masking.py'
# Masking runs inside ELECTRA's step, not on the host.
_SKIPPED = ('electra',)
DEFAULT_ARMS = tuple(a for a in beyond_masking.ARMS if a not in _SKIPPED)
# What pretokenize.prepare's output depends on (the rest of cfg.data is read
# by the pipeline).
_PREPARATION_FIELDS = ('corpus', 'tokenizer', 'eval_fraction', 'split_seed',
                       'gazetteer_path', 'docs_per_shard')


@dataclasses.dataclass
class Preparation:
  """One preparation of the data (``pretokenize.prepare``), timed."""
  arms: list[str]
  tokenizer: str
  eval_fraction: float
  tokenizer_seconds: float
  write_seconds: float
  documents: int
  tokens: int


@dataclasses.dataclass
class Row:
  """One line of the table; times in seconds, rates per second."""
  arm: str
  pipeline_batches: float = float('nan')
  pipeline_tokens: float = float('nan')
  step_batches: float = float('nan')
  setup_seconds: float = float('nan')
  instances_seconds: float = float('nan')
  task_seconds: float | None = None      # None: no task has an apply.
  masking_seconds: float | None = None   # None: no masking.
  error: str = ''

  @property
  def ratio(self) -> float:
    return self.pipeline_batches / self.step_batches


def arm_config(arm: str, data_dir: str):
  """Arm ``arm``'s config, its pipeline on one thread in this process."""
  cfg = config_lib.load_config_file(f'{_CONFIG}:arm={arm}')
  cfg.data.data_dir = data_dir
  cfg.data.num_threads = 1
  cfg.data.num_workers = 0
  return cfg


def preparation_key(data_cfg) -> str:
  return json.dumps({k: (data_cfg[k].to_dict() if hasattr(data_cfg[k],
                                                          'to_dict')
                         else data_cfg[k])
                     for k in _PREPARATION_FIELDS if k in data_cfg},
                    sort_keys=True)


def pipeline_rate(prepared, cfg, warmup: int, batches: int, rounds: int,
                  start: int = 0) -> tuple[float, float, dict]:
  """(batches/s, real tokens/s, the last batch) of ``train_dataset`` from
  global batch ``start``: the median of ``rounds`` consecutive windows of
  ``batches`` batches, after ``warmup``."""
  iterator = iter(pipeline.train_dataset(prepared, cfg))
  if start:
    iterator.set_state({'next_index': start})
  for batch in itertools.islice(iterator, warmup):
    pass
  rates = []
  for _ in range(rounds):
    tokens, t0 = 0, time.perf_counter()
    for batch in itertools.islice(iterator, batches):
      tokens += int(batch['attention_mask'].sum())
    seconds = time.perf_counter() - t0
    rates.append((batches / seconds, tokens / seconds))
  iterator.close()
  rates.sort()
  return rates[len(rates) // 2] + (batch,)


def prepare_timed(data_cfg, arm: str) -> tuple[Preparation,
                                               pretokenize.PreparedData]:
  """``pretokenize.prepare(data_cfg)``, its two parts timed."""
  t0 = time.perf_counter()
  the_plan = pretokenize.plan(data_cfg)
  t1 = time.perf_counter()
  manifest = pretokenize.write(the_plan,
                               pretokenize.prepare_workers(data_cfg))
  t2 = time.perf_counter()
  splits = manifest['splits'].values()
  tok = data_cfg.tokenizer
  return Preparation(
      [arm], f'{tok.vocab_size} pieces'
      f'{", lower-cased" if tok.get("lowercase", False) else ", cased"}',
      data_cfg.eval_fraction, t1 - t0, t2 - t1,
      sum(int(s['records']) for s in splits),
      sum(int(s['tokens']) for s in splits)), pretokenize.load(the_plan)


def part_costs(prepared, cfg, spec: continual_lib.StreamSpec, batches: int,
               repeats: int
               ) -> tuple[float, float, float | None, float | None]:
  """Seconds of stream ``spec``'s setup (once), and per batch of its
  instance building, host tasks (None: none with an ``apply``) and masking
  (None: no MLM), each the best of ``repeats`` passes over ``batches``
  batches."""
  t0 = time.perf_counter()
  ds = instances_lib.InstanceBatches(
      pipeline.split_instances(prepared, cfg, 'train', None, spec),
      cfg.batch_size)
  ds[0]   # Builds the epoch's plan.
  setup = time.perf_counter() - t0
  built, instance_passes = [], []
  for _ in range(repeats):
    t0 = time.perf_counter()
    built = [ds[1 + i] for i in range(batches)]
    instance_passes.append((time.perf_counter() - t0) / batches)
  for batch in built:
    batch['next_sentence_labels'] = batch.pop('next_sentence_label')
  vocab_size = prepared.tokenizer.vocab_size
  applies = [(tasks_lib.get(n).apply, tasks_lib.run_params(cfg, n, vocab_size))
             for n in sorted(spec.tasks,
                             key=lambda n: not tasks_lib.get(n).corrupts)
             if tasks_lib.get(n).apply is not None]
  task_passes, tasked = [], built
  for _ in range(repeats if applies else 0):
    t0 = time.perf_counter()
    out = []
    for batch in built:
      for apply, params in applies:
        batch = apply(batch, params, cfg.seed)
      out.append(batch)
    task_passes.append((time.perf_counter() - t0) / batches)
    tasked = out
  config = pipeline.masking_config(cfg, prepared)
  mask_passes = []
  for _ in range(repeats if spec.mlm else 0):
    t0 = time.perf_counter()
    for batch in tasked:
      masking_lib.mask_batch(batch, config, cfg.seed)
    mask_passes.append((time.perf_counter() - t0) / batches)
  return (setup, min(instance_passes),
          min(task_passes) if task_passes else None,
          min(mask_passes) if mask_passes else None)


def step_rate(cfg, vocab_size: int, batch: dict, steps: int,
              rounds: int) -> float:
  """Train steps per second on ``batch`` (median round)."""
  task = objectives.get(cfg.objective.name).make_task(cfg, vocab_size)
  spec = pipeline.batch_spec(cfg)
  steps_fns = train.make_steps(cfg, task, spec)
  state = jax.jit(steps_fns.init_state)(*train.init_inputs(steps_fns))
  step = jax.jit(steps_fns.train_step, donate_argnums=0)
  batch = jax.device_put({k: batch[k] for k in spec})
  for _ in range(2):   # Compiles, then one more.
    state, metrics = step(state, batch)
  jax.block_until_ready((state, metrics))
  seconds = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    for _ in range(steps):
      state, metrics = step(state, batch)
    jax.block_until_ready((state.step, metrics['loss']))
    seconds.append(time.perf_counter() - t0)
  return steps / statistics.median(seconds)


def stages(cfg) -> list[tuple[str, int, np.ndarray]]:
  """(label, first global batch, each stream's share) of each stage of a
  continual run; one ('', 0, [1.0]) for a run of one stream."""
  if not continual_lib.is_continual(cfg):
    return [('', 0, np.ones(1))]
  specs = continual_lib.streams(cfg)
  counts = continual_lib.stage_counts(cfg.continual.stage_steps, specs)
  starts = continual_lib.stage_starts(cfg.continual.stage_steps)[:-1]
  return [(f' (stage {k})', int(starts[k]), c / c.sum())
          for k, c in enumerate(counts)]


def weighted(values, shares) -> float | None:
  """The mean of the non-None ``values`` under ``shares`` (over all
  streams: a stream without the part counts 0); None when all are None."""
  if all(v is None for v in values):
    return None
  return float(sum(s * (v or 0.0) for v, s in zip(values, shares)))


def measure_arm(arm: str, cfg, prepared, args) -> list[Row]:
  """The rows of arm ``arm`` (one per stage of a continual run)."""
  specs = continual_lib.streams(cfg)
  parts = [part_costs(prepared, cfg, s, args.part_batches, args.part_repeats)
           for s in specs]
  rows, batch = [], None
  for label, start, shares in stages(cfg):
    row = Row(arm + label)
    row.pipeline_batches, row.pipeline_tokens, batch = pipeline_rate(
        prepared, cfg, args.warmup, args.batches, args.pipeline_rounds,
        start)
    row.setup_seconds = sum(p[0] for p in parts)
    row.instances_seconds = weighted([p[1] for p in parts], shares)
    row.task_seconds = weighted([p[2] for p in parts], shares)
    row.masking_seconds = weighted(
        [p[3] if s.mlm else None for p, s in zip(parts, specs)], shares)
    rows.append(row)
  batch.pop(pipeline.STATISTICS)
  rate = step_rate(cfg, prepared.tokenizer.vocab_size, batch, args.steps,
                   args.rounds)
  for row in rows:
    row.step_batches = rate
  return rows


def machine() -> list[str]:
  model = platform.processor() or platform.machine()
  with open('/proc/cpuinfo') as f:
    for line in f:
      if line.startswith('model name'):
        model = line.split(':', 1)[1].strip()
        break
  return [f'date {datetime.date.today().isoformat()}; {model}, '
          f'{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable); '
          f'python {platform.python_version()}, jax {jax.__version__} '
          f'({jax.default_backend()}), numpy {np.__version__}, grain '
          f'{grain.__version__}']


def load_line(when: str) -> str:
  one, five, fifteen = os.getloadavg()
  return (f'load average {when}: {one:.2f} {five:.2f} {fifteen:.2f} '
          f'(1, 5, 15 min) on {os.cpu_count()} cores')


def cpu_seconds() -> tuple[float, float, float]:
  """(wall, the machine's busy CPU seconds, this process's CPU seconds)."""
  with open('/proc/stat') as f:
    ticks = [int(t) for t in f.readline().split()[1:]]
  # user nice system idle iowait irq softirq steal ...: all but idle, iowait.
  busy = sum(ticks[:8]) - ticks[3] - ticks[4]
  own = os.times()
  return (time.perf_counter(), busy / os.sysconf('SC_CLK_TCK'),
          own.user + own.system + own.children_user + own.children_system)


def others_line(start: tuple[float, float, float]) -> str:
  """How busy the rest of the machine was since ``start``
  (``cpu_seconds()``)."""
  end = cpu_seconds()
  wall, busy, own = (e - s for e, s in zip(end, start))
  others = max(0.0, busy - own) / wall
  return (f'other processes used {others:.2f} of the {os.cpu_count()} cores '
          f'on average over the {wall:.0f} s run (this one '
          f'{own / wall:.2f})' + (': the machine was shared.'
                                  if others > 0.1 else '.'))


def _ms(seconds: float | None) -> str:
  return '-' if seconds is None else f'{seconds * 1e3:.2f}'


def table(rows: list[Row]) -> list[str]:
  lines = ['| arm | pipeline batches/s (1 thread) | pipeline real tokens/s '
           '| step batches/s | pipeline / step | keeps up | setup s '
           '| instances ms/batch | task apply ms/batch | masking ms/batch |',
           '| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: '
           '| ---: |']
  for r in rows:
    if r.error:
      lines.append(f'| {r.arm} | failed: {r.error} | | | | | | | | |')
      continue
    lines.append(
        f'| {r.arm} | {r.pipeline_batches:.1f} | {r.pipeline_tokens:,.0f} | '
        f'{r.step_batches:.1f} | {r.ratio:.1f} | '
        f'{"yes" if r.ratio >= 1 else "NO"} | {r.setup_seconds:.2f} | '
        f'{_ms(r.instances_seconds)} | '
        f'{_ms(r.task_seconds)} | {_ms(r.masking_seconds)} |')
  return lines


def preparation_table(preparations: list[Preparation]) -> list[str]:
  lines = ['| arms | tokenizer | held out | tokenizer training s | '
           'pre-tokenizing s | documents | tokens | pre-tokenized tokens/s |',
           '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |']
  for p in preparations:
    lines.append(
        f'| {", ".join(p.arms)} | {p.tokenizer} | {p.eval_fraction:.0%} | '
        f'{p.tokenizer_seconds:.1f} | {p.write_seconds:.1f} | '
        f'{p.documents:,} | {p.tokens:,} | '
        f'{p.tokens / p.write_seconds:,.0f} |')
  return lines


def summary(rows: list[Row]) -> str:
  measured = [r for r in rows if not r.error]
  if not measured:
    return 'no arm measured.'
  slowest = min(measured, key=lambda r: r.ratio)
  behind = [r.arm for r in measured if r.ratio < 1]
  failed = [r.arm for r in rows if r.error]
  return (f'{len(measured) - len(behind)} of {len(measured)} rows keep up '
          f'(pipeline / step >= 1); lowest ratio {slowest.ratio:.1f} '
          f'({slowest.arm}: its pipeline needs {1 / slowest.ratio:.1%} of '
          'one core at the step\'s pace)'
          + (f'; behind: {", ".join(behind)}' if behind else '')
          + (f'; failed: {", ".join(failed)}' if failed else '') + '.')


def run(arms: list[str], data_dir: str, args
        ) -> tuple[list[Row], list[Preparation]]:
  """Every arm's rows, printed as they come, and the preparations (data
  prepared once per key)."""
  prepared_by_key, preparations, rows = {}, {}, []
  for arm in arms:
    t0 = time.perf_counter()
    try:
      cfg = arm_config(arm, data_dir)
      key = preparation_key(cfg.data)
      if key not in prepared_by_key:
        preparations[key], prepared_by_key[key] = prepare_timed(cfg.data,
                                                                 arm)
        print(f'prepared data for {arm} in {time.perf_counter() - t0:.0f}s',
              flush=True)
      else:
        preparations[key].arms.append(arm)
      arm_rows = measure_arm(arm, cfg, prepared_by_key[key], args)
    except Exception as e:  # pylint: disable=broad-except
      # One arm's failure (e.g. an option not there yet) leaves the others.
      traceback.print_exc()
      arm_rows = [Row(arm, error=f'{type(e).__name__}: {e}'.splitlines()[0])]
    rows.extend(arm_rows)
    for line in table(arm_rows)[2:]:
      print(f'{line}   [{time.perf_counter() - t0:.0f}s]', flush=True)
  return rows, list(preparations.values())


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--arms', default=','.join(DEFAULT_ARMS),
                      help='comma-separated arms of beyond_masking.ARMS.')
  parser.add_argument('--batches', type=int, default=60,
                      help='pipeline batches per timed window.')
  parser.add_argument('--pipeline_rounds', type=int, default=3,
                      help='timed windows per arm (and stage); the median '
                      'is reported.')
  parser.add_argument('--warmup', type=int, default=5,
                      help='pipeline batches before the timing.')
  parser.add_argument('--part_batches', type=int, default=20)
  parser.add_argument('--part_repeats', type=int, default=2)
  parser.add_argument('--steps', type=int, default=5,
                      help='train steps per timed round.')
  parser.add_argument('--rounds', type=int, default=5,
                      help='timed rounds of train steps; the median is '
                      'reported.')
  parser.add_argument('--data_dir', default='',
                      help='cfg.data.data_dir (default: a temporary one).')
  parser.add_argument('--out', default='',
                      help='write the table and the machine here.')
  args = parser.parse_args(argv)
  arms = [a for a in args.arms.split(',') if a]
  unknown = sorted(set(arms) - set(beyond_masking.ARMS))
  if unknown:
    parser.error(f'--arms: {unknown} not in {beyond_masking.ARMS}')
  flags.FLAGS.mark_as_parsed()   # Grain reads absl flags.
  header = machine() + [load_line('at the start')]
  print('\n'.join(header), flush=True)
  start = cpu_seconds()
  with tempfile.TemporaryDirectory() as temporary:
    rows, preparations = run(arms, args.data_dir or temporary, args)
  lines = [f'$ python experiments/benchmarks/tasks.py '
           f'{" ".join(argv if argv is not None else sys.argv[1:])}'.rstrip()
           ] + header + [load_line('at the end'), others_line(start), ''
                         ] + table(rows) + ['', summary(rows), '',
                                            'Data preparation:', ''
                                            ] + preparation_table(
                                                preparations)
  print('\n' + '\n'.join(lines[len(header) + 1:]), flush=True)
  if args.out:
    with open(args.out, 'w') as f:
      f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
  main()
