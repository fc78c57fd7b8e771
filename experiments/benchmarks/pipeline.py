"""Input pipeline throughput: pre-tokenized ArrayRecord -> masked batches.

  python experiments/benchmarks/pipeline.py [--batches 40]

Measures the whole data path of a training run (document reads, instance
creation, masking, batching) on the embedded corpus, in real (non-pad)
tokens/s: for NSP pairs and full-sentence packing at sequence lengths 128
and 512, first in-process on one core (one Grain thread, pinned with
sched_setaffinity), then with 1, 2 and 4 Grain worker processes (on every
core the machine has). One H100 training BERT-base at 40% MFU consumes about
0.7M tokens/s. It first prints the cost of reading one record (a document)
on one core, fixed and per 1,000 tokens (least squares over every record of
the split, read in random order), the floor under instance building, and
the raw read of the same records written uncompressed (as bertjax writes
them) and with TFDS's default zstd compression.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import tempfile
import time

from array_record.python import array_record_module
import numpy as np

from absl import flags

from bertjax import config_lib
from data_pipelines import pipeline
from data_pipelines import pretokenize

LAYOUTS = (('nsp', 128, 20), ('nsp', 512, 80), ('full_sentences', 128, 20),
           ('full_sentences', 512, 80))


def _config(layout: str, seq_len: int, predictions: int, workers: int,
            threads: int):
  c = config_lib.base_config()
  c.data.tokenizer.vocab_size = 8000
  c.data.layout = layout
  c.data.max_seq_length = seq_len
  c.masking.max_predictions_per_seq = predictions
  c.masking.dynamic = True
  c.objective.nsp_weight = 1.0 if layout == 'nsp' else 0.0
  c.batch_size = 64 if seq_len == 128 else 16
  c.data.num_workers = workers
  c.data.num_threads = threads
  return c


def _measure(prepared, cfg, batches: int) -> float:
  iterator = iter(pipeline.train_dataset(prepared, cfg))
  for batch in itertools.islice(iterator, 3):   # Warm-up (workers start).
    pass
  tokens, start = 0, time.perf_counter()
  for batch in itertools.islice(iterator, batches):
    tokens += int(batch['attention_mask'].sum())
  rate = tokens / (time.perf_counter() - start)
  iterator.close()
  return rate


def _read_cost(prepared, repeats: int = 3) -> tuple[float, float]:
  """(us per record, us per 1,000 tokens) of ``DocumentSource`` reads."""
  source = prepared.train_source
  times, lengths = [], []
  for r in range(repeats):
    for i in np.random.default_rng(r).permutation(len(source)):
      start = time.perf_counter()
      record = source[int(i)]
      times.append(time.perf_counter() - start)
      lengths.append(len(record['token_ids']))
  design = np.stack([np.ones(len(lengths)), np.asarray(lengths) / 1000], 1)
  fixed, per_k = np.linalg.lstsq(design, np.asarray(times) * 1e6,
                                 rcond=None)[0]
  return fixed, per_k


def _compression_cost(prepared, repeats: int = 5) -> dict[str, float]:
  """us per raw ArrayRecord read of the split's records, written with
  bertjax's options and with TFDS's own (zstd), read alternately."""
  records = [prepared.train_source._records[i]  # pylint: disable=protected-access
             for i in range(len(prepared.train_source))]
  options = {'bertjax (uncompressed)': pretokenize.ARRAY_RECORD_OPTIONS,
             'TFDS default (zstd)': 'group_size:1'}
  readers, times = {}, {name: [] for name in options}
  with tempfile.TemporaryDirectory() as directory:
    for name, option in options.items():
      path = os.path.join(directory, f'{len(readers)}.array_record')
      writer = array_record_module.ArrayRecordWriter(path, option)
      for record in records:
        writer.write(record)
      writer.close()
      readers[name] = array_record_module.ArrayRecordReader(path, '')
    order = np.random.default_rng(0).permutation(len(records)).tolist()
    for _ in range(repeats):
      for name, reader in readers.items():
        start = time.perf_counter()
        for i in order:
          reader.read([i])
        times[name].append((time.perf_counter() - start) / len(order))
    for reader in readers.values():
      reader.close()
  return {name: 1e6 * min(t) for name, t in times.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batches', type=int, default=40)
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()
  base = _config('nsp', 128, 20, 0, 1)
  prepared = pretokenize.prepare(base.data)
  cores = sorted(os.sched_getaffinity(0))
  print(f'{len(cores)} cores; corpus: {prepared.train_index.num_documents} '
        f'documents, {prepared.train_index.num_tokens} tokens')
  os.sched_setaffinity(0, {cores[0]})
  fixed, per_k = _read_cost(prepared)
  print(f'record read on one core: {fixed:.1f} us + {per_k:.1f} us per 1,000 '
        'tokens')
  for name, cost in _compression_cost(prepared).items():
    print(f'  raw ArrayRecord read, {name}: {cost:.1f} us per record')
  print(f'{"layout":<15} {"seq":>4}  {"setup":<22} {"real tokens/s":>14}')
  for layout, seq_len, predictions in LAYOUTS:
    os.sched_setaffinity(0, {cores[0]})
    cfg = _config(layout, seq_len, predictions, 0, 1)
    rate = _measure(prepared, cfg, args.batches)
    print(f'{layout:<15} {seq_len:>4}  {"1 core, in-process":<22} '
          f'{rate:14,.0f}')
    os.sched_setaffinity(0, set(cores))
    for workers in (1, 2, 4):
      cfg = _config(layout, seq_len, predictions, workers, 1)
      rate = _measure(prepared, copy.deepcopy(cfg), args.batches)
      print(f'{layout:<15} {seq_len:>4}  {f"{workers} worker processes":<22} '
            f'{rate:14,.0f}')


if __name__ == '__main__':
  main()
