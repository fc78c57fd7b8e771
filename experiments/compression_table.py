"""The compression table: each compressed model next to its float source.

  python experiments/compression_table.py --init=runs/demo \\
      --out=runs/compression --results=experiments/results/compression \\
      --seeds=3

From one pretrained run (``--init``), on the fine-tuning config's task
(``--finetune``, default experiments/configs/finetune.py: the embedded
task), with the same seeds for every model:

- ``float``: the source, fine-tuned.
- ``int8``: Q8BERT. Fine-tuned with 8-bit fake quantization
  (``model.quantize=int8``), then served by its int8 weights
  (experiments/compress.py int8): its scores are the int8 model's.
- ``heads50``: half the heads removed by importance
  (experiments/compress.py prune_heads --fraction=0.5), then fine-tuned;
  any ``headsNN`` (NN percent) in ``--models``, e.g. a curve of accuracy
  against heads removed: ``--models=heads25,heads50,heads75``.
- with ``--mobilebert=RUN`` (a finished MobileBERT run, objective
  ``mobilebert``): ``mobilebert``, its student fine-tuned, next to
  ``ib-bert``, its IB-BERT teacher fine-tuned (the uncompressed source
  the student was distilled from).

For each: the parameters, the bytes of its weights on disk (float32, or
int8 with scales, as safetensors), the CPU inference latency per
sequence (batch 1 and batch 8, all models timed in turns in this
process), and the held-out accuracy with its 95% interval over seeds and
examples, and its difference from its source (paired by seed: ``float``
for int8 and headsNN, ``ib-bert`` for mobilebert); a difference whose
interval holds 0 is reported as none.

Resumable: every fine-tuning resumes where it stopped, a finished one is
read back, and each finished (model, seed) is appended to
``RESULTS/rows.jsonl`` at once; ``--report_only`` rewrites the report
from the rows (latency is measured again). Size and latency are measured
on each model's seed-0 fine-tuning in ``--out``; where that is gone (a
fresh machine with the committed rows), it is fine-tuned again first.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import compress
from bertjax import config_lib
from bertjax import errors
from bertjax import finetune
from bertjax import intervals
from bertjax import storage
from bertjax import train
# pylint: enable=g-import-not-at-top,wrong-import-position

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FINETUNE = os.path.join(_ROOT, 'experiments', 'configs',
                                'finetune.py')
MODELS = ('float', 'int8', 'heads50')   # The default --models.
MOBILEBERT = ('ib-bert', 'mobilebert')  # Added by --mobilebert.
ROWS = 'rows.jsonl'
REPORT = 'report.md'
LATENCY_BATCHES = (1, 8)
_INPUTS = ('input_ids', 'token_type_ids', 'attention_mask')


class TableError(ValueError):
  """A bad argument; the message says which and why."""


def heads_removed(model: str) -> float | None:
  """``headsNN`` -> NN / 100 (the fraction of heads pruned); None for
  the models that keep every head."""
  if model in ('float', 'int8') + MOBILEBERT:
    return None
  digits = model.removeprefix('heads')
  if model.startswith('heads') and digits.isdigit() and 0 < int(digits) < 100:
    return int(digits) / 100
  raise TableError(f'model {model!r}: use float, int8 or headsNN (NN '
                   'percent of the heads pruned, e.g. heads50).')


def describe(model: str) -> str:
  fraction = heads_removed(model)
  if fraction is not None:
    return f'{fraction:.0%} of the heads pruned by importance, fine-tuned'
  return {'float': 'the source, fine-tuned',
          'int8': 'Q8BERT: quantization-aware fine-tuning, served in int8',
          'ib-bert': "MobileBERT's IB-BERT teacher, fine-tuned",
          'mobilebert': 'MobileBERT: distilled from ib-bert, fine-tuned',
          }[model]


def compared_with(model: str) -> str | None:
  """The model whose accuracy ``model``'s is compared with: its source
  (None for the sources themselves)."""
  if model in ('float', 'ib-bert'):
    return None
  return 'ib-bert' if model == 'mobilebert' else 'float'


def pretrained_runs(init: str, mobilebert: str | None) -> dict:
  """The pretrained run each source model fine-tunes from: ``float``'s
  is ``init``; with a MobileBERT run, ``mobilebert``'s is that run and
  ``ib-bert``'s its teacher's (its ``mobilebert.teacher_workdir``)."""
  runs = {'float': init}
  if mobilebert:
    meta_path = os.path.join(mobilebert, train.RUN_META)
    if not storage.isfile(meta_path):
      raise TableError(f'--mobilebert={mobilebert!r} has no {train.RUN_META}'
                       ': use the workdir of a MobileBERT pretraining run.')
    cfg = json.loads(storage.read_text(meta_path))['config']
    if cfg['objective']['name'] != 'mobilebert':
      raise TableError(f'--mobilebert={mobilebert!r} is a '
                       f"{cfg['objective']['name']!r} run: use a run of the "
                       'mobilebert objective.')
    runs.update({'mobilebert': mobilebert,
                 'ib-bert': cfg['mobilebert']['teacher_workdir']})
  return runs


def finetune_config(spec: str, seed: int, init: str, quantize: bool):
  cfg = config_lib.load_config_file(spec)
  cfg.seed = seed
  cfg.init = init
  if quantize:
    cfg.model.quantize = 'int8'
  try:
    finetune.validate(cfg, check_init=False)
  except finetune.FinetuneError as e:
    raise TableError(f'--finetune {spec!r}: {e}') from e
  return cfg


def _read_rows(path: str) -> dict:
  if not storage.isfile(path):
    return {}
  rows = [json.loads(line) for line in storage.read_text(path).splitlines()
          if line.strip()]
  return {(r['model'], r['seed']): r for r in rows}


def _append(path: str, row: dict) -> None:
  text = storage.read_text(path) if storage.isfile(path) else ''
  storage.write_text(path, text + json.dumps(row, sort_keys=True) + '\n')


def _record(directory: str) -> dict:
  """What compress.py wrote beside the directory it made."""
  return json.loads(storage.read_text(os.path.join(directory,
                                                   compress.SOURCE_FILE)))


def _made_once(directory: str, make) -> dict:
  """The record of ``directory``, which ``make(directory)`` (a command of
  compress.py) writes unless an earlier run finished it; an unfinished one
  (no record) is removed first."""
  if storage.isfile(os.path.join(directory, compress.SOURCE_FILE)):
    return _record(directory)
  if storage.exists(directory):
    storage.rmtree(directory)
  return make(directory)


def source_of(model: str, runs: dict, out: str) -> str:
  """The pretrained directory ``model`` fine-tunes from (a pruned one made
  once); ``runs`` is ``pretrained_runs``'s."""
  fraction = heads_removed(model)
  if fraction is None:
    return runs.get(model, runs['float'])
  pruned = os.path.join(out, f'{model}-source')
  _made_once(pruned, lambda d: compress.prune_heads(runs['float'], d,
                                                    fraction))
  return pruned


def run_model(model: str, seed: int, spec: str, runs: dict, out: str
              ) -> dict:
  """Fine-tunes (or resumes, or reads back) ``model`` at ``seed``; its
  row. The int8 model's scores are its int8 weights'."""
  workdir = os.path.join(out, model, f'seed{seed}')
  cfg = finetune_config(spec, seed, source_of(model, runs, out),
                        model == 'int8')
  result_path = os.path.join(workdir, finetune.RESULT)
  if storage.isfile(result_path):
    result = json.loads(storage.read_text(result_path))
  else:
    print(f'== {model} seed {seed}: fine-tuning in {workdir}', flush=True)
    result = finetune.finetune(cfg, workdir)
  row = {'model': model, 'seed': seed, 'workdir': workdir,
         'headline': result['headline'], 'metrics': result['metrics'],
         'eval_predictions': result['eval_predictions'],
         'eval_labels': result['eval_labels']}
  if model == 'int8':
    record = _made_once(f'{workdir}-int8',
                        lambda d: compress.int8(workdir, d))
    row.update(metrics=record['int8_metrics'],
               eval_predictions=record['eval_predictions'],
               fake_quantized_metrics=record['fake_quantized_metrics'],
               max_abs_logit_difference=record['max_abs_logit_difference'])
  return row


# ---------------------------------------------------------------------------
# Size and latency, of each model's seed-0 fine-tuning.


def remake_served(models: list[str], rows: dict, spec: str, runs: dict,
                  out: str, run=None) -> list[str]:
  """Fine-tunes again the seed-0 model of each of ``models`` whose
  fine-tuning is gone from ``out`` (a fresh machine, with the committed
  rows but not the runs), so that its size and latency can be measured;
  the rows keep their scores. ``run`` is ``run_model`` (a test's
  stand-in). Returns a note for each remade model whose predictions
  differ from its row's (another source, or another machine's arithmetic),
  to print."""
  run = run or run_model
  notes = []
  for model in models:
    workdir = os.path.join(out, model, 'seed0')
    finished = (os.path.join(f'{workdir}-int8', compress.SOURCE_FILE)
                if model == 'int8' else os.path.join(workdir, finetune.RESULT))
    if storage.isfile(finished):
      continue
    print(f'== {model} seed 0: its fine-tuning is not in {out}; fine-tuning '
          'it again to measure its size and latency', flush=True)
    again = run(model, 0, spec, runs, out)
    if again['eval_predictions'] != rows[model, 0]['eval_predictions']:
      notes.append(f'{model} seed 0 was fine-tuned again to measure its '
                   'size and latency, and its predictions differ from its '
                   'row\'s: the row, not the new run, is in the table.')
  return notes


def _served(model: str, workdir: str):
  """(model, params, bytes on disk, parameters) as served."""
  if model == 'int8':
    net, params = compress.load_int8(f'{workdir}-int8')
    return (net, params, _record(f'{workdir}-int8')['int8_bytes'],
            _count(params))
  run = finetune.read_run(workdir)
  return (run.model, run.params, compress.float32_bytes(run.params),
          _count(run.params))


def _count(params) -> int:
  """Parameters (an int8 kernel counts its values, not its scales)."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  return sum(int(np.size(x)) for path, x in leaves
             if jax.tree_util.keystr(path[-1:]) != '.scale')


def sizes_and_latency(models: list[str], out: str, seq_length: int,
                      rounds: int = 5, calls: int = 10) -> dict:
  """Per model: parameters, bytes, and the median over ``rounds`` of the
  milliseconds per sequence of ``calls`` jitted forward passes, at each
  batch of ``LATENCY_BATCHES``; the models take turns within each round,
  so they share the machine's state alike."""
  served = {m: _served(m, os.path.join(out, m, 'seed0')) for m in models}
  rng = np.random.default_rng(0)
  timings = {(m, b): [] for m in models for b in LATENCY_BATCHES}
  programs = {}
  for batch in LATENCY_BATCHES:
    ids = jnp.asarray(rng.integers(5, 1000, (batch, seq_length)), jnp.int32)
    inputs = (ids, jnp.zeros_like(ids), jnp.ones_like(ids))
    for m, (net, params, _, _) in served.items():
      apply = jax.jit(lambda p, *x, net=net: net.apply({'params': p}, *x))
      jax.block_until_ready(apply(params, *inputs))   # Compile, warm up.
      programs[m, batch] = (apply, params, inputs)
  for _ in range(rounds):
    for key, (apply, params, inputs) in programs.items():
      start = time.perf_counter()
      for _ in range(calls):
        jax.block_until_ready(apply(params, *inputs))
      timings[key].append((time.perf_counter() - start) / calls / key[1])
  return {m: {'parameters': served[m][3], 'bytes': served[m][2],
              **{f'ms_per_sequence_batch{b}':
                 1e3 * float(np.median(timings[m, b]))
                 for b in LATENCY_BATCHES}}
          for m in models}


# ---------------------------------------------------------------------------
# The report.


def _correct(row: dict) -> np.ndarray:
  return (np.asarray(row['eval_predictions'])
          == np.asarray(row['eval_labels'])).astype(np.float64)


def _iv(iv: intervals.Interval, signed: bool = False) -> str:
  sign = '+' if signed else ''
  return (f'{iv.estimate:{sign}.4f} [{iv.low:{sign}.4f}, '
          f'{iv.high:{sign}.4f}]')


def report(rows: dict, measured: dict, seeds: list[int], command: str,
           models=MODELS) -> str:
  lines = ['# Compression table', '', f'Command: `{command}`', '',
           f'Seeds: {seeds} (the same for every model; a difference is '
           'paired by seed). Intervals: 95%, over seeds and held-out '
           'examples (bertjax/intervals.py). Latency: CPU, per sequence, '
           'median of 5 rounds in which the models take turns; measured '
           'in this run.', '',
           '| model | what | parameters | bytes on disk | ms/seq (batch 1)'
           ' | ms/seq (batch 8) | accuracy | vs source |',
           '| --- | --- | ---: | ---: | ---: | ---: | --- | --- |']
  for model in models:
    mine = {s: rows[(model, s)] for s in seeds if (model, s) in rows}
    if not mine:
      continue
    done = sorted(mine)
    acc = intervals.hierarchical_interval(
        np.stack([_correct(mine[s]) for s in done]))
    source = compared_with(model)
    base = {s: rows[(source, s)] for s in seeds if (source, s) in rows}
    paired = [s for s in done if s in base]
    if not paired:
      versus = ''
    else:
      diff = intervals.hierarchical_interval(
          np.stack([_correct(mine[s]) for s in paired]),
          np.stack([_correct(base[s]) for s in paired]))
      verdict = ('no claim (one seed)' if diff.seeds < 2
                 else 'no difference' if not diff.excludes_zero
                 else 'lower' if diff.high < 0 else 'higher')
      versus = f'{source} {_iv(diff, True)}: {verdict}'
    m = measured.get(model, {})
    size = (f'{m["parameters"]:,}', f'{m["bytes"]:,}',
            f'{m["ms_per_sequence_batch1"]:.2f}',
            f'{m["ms_per_sequence_batch8"]:.2f}') if m else ('',) * 4
    note = '' if len(done) == len(seeds) else f' ({len(done)} seeds)'
    lines.append(f'| {model} | {describe(model)} | ' + ' | '.join(size)
                 + f' | {_iv(acc)}{note} | {versus} |')
  int8 = [rows[k] for k in sorted(rows) if k[0] == 'int8']
  if int8:
    worst = max(r['max_abs_logit_difference'] for r in int8)
    lines += ['', 'int8: the largest difference between the int8 model\'s '
              'held-out logits and its fake-quantized training forward\'s, '
              f'over its seeds: {worst:.3g}.']
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--init', required=True,
                      help='the pretrained run (bert objective).')
  parser.add_argument('--out', required=True,
                      help='where the fine-tunings go (resumed there).')
  parser.add_argument('--results', required=True,
                      help=f'where {ROWS} and {REPORT} go.')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--models', default=','.join(MODELS),
                      help='float (always), int8, headsNN (NN%% of the '
                      'heads pruned), separated by commas.')
  parser.add_argument('--mobilebert', default=None,
                      help='a MobileBERT run: adds its student and its '
                      'IB-BERT teacher (mobilebert, ib-bert).')
  parser.add_argument('--finetune', default=DEFAULT_FINETUNE,
                      help='the fine-tuning config (path.py[:arg]).')
  parser.add_argument('--report_only', action='store_true',
                      help='write the report from the rows; fine-tune '
                      'nothing but a seed-0 model gone from --out.')
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.exit(2, f'--seeds={args.seeds}: use at least 1.\n')
  seeds = list(range(args.seeds))
  models = ['float'] + [m for m in args.models.split(',')
                        if m not in ('float',) + MOBILEBERT]
  try:
    runs = pretrained_runs(args.init, args.mobilebert)
    models += [m for m in MOBILEBERT if m in runs]
    for model in models:
      heads_removed(model)
    for s in seeds:   # Every config is checked before anything trains.
      for model in models:
        finetune_config(args.finetune, s, runs.get(model, args.init),
                        model == 'int8')
  except (TableError, errors.UserError) as e:
    parser.exit(2, f'compression_table: {e}\n')
  storage.makedirs(args.results)
  rows_path = os.path.join(args.results, ROWS)
  rows = _read_rows(rows_path)
  if not args.report_only:
    for s in seeds:
      for model in models:
        if (model, s) not in rows:
          rows[model, s] = run_model(model, s, args.finetune, runs,
                                     args.out)
          _append(rows_path, rows[model, s])
  done = [m for m in models if (m, 0) in rows]
  for note in remake_served(done, rows, args.finetune, runs, args.out):
    print(f'note: {note}', flush=True)
  seq_length = finetune_config(args.finetune, 0, args.init,
                               False).max_seq_length
  measured = sizes_and_latency(done, args.out, seq_length)
  command = 'python experiments/compression_table.py ' + ' '.join(
      a for a in (argv if argv is not None else sys.argv[1:])
      if a != '--report_only')
  text = report(rows, measured, seeds, command, models)
  storage.write_text(os.path.join(args.results, REPORT), text)
  storage.write_text(os.path.join(args.results, 'measured.json'),
                     json.dumps(measured, indent=2, sort_keys=True))
  print(text)


if __name__ == '__main__':
  main()
