"""Pre-tokenization as an Apache Beam pipeline: the local path's bytes.

For a corpus of files (``corpus.source='files'``) too large for one
machine. The pipeline cuts the corpus into the same shards as
``shards.write_local`` and writes each with the same ``shards.write_shard``:

  files -> count each file's raw documents          (parallel over files)
        -> each file's first document index         (prefix sums, a side input)
        -> (shard, (index, raw document)) per document  (parallel over files)
        -> group by shard -> write_shard            (parallel over shards)
        -> what reading the files skipped, summed   (raw_counts.json)

and ``run`` then merges the shards' summaries (``shards.finish``) as the
local path does, so the directory is the same bytes. A shard already
written (a rerun after a failure) is kept. The runner is Beam's choice:
the DirectRunner in several processes on one machine, or Dataflow, Spark or
Flink by pipeline options (README, "Preparing a large corpus").
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
from typing import Iterator, Sequence

from bertjax import storage
from data_pipelines import corpus as corpus_lib
from data_pipelines import pretokenize
from data_pipelines import shards

RAW_COUNTS = 'raw_counts.json'


def check_corpus(spec: corpus_lib.CorpusSpec) -> None:
  """The corpora the pipeline reads: files, all of them."""
  if spec.source != 'files':
    raise ValueError(
        f'corpus.source={spec.source!r}: the Beam pipeline reads '
        "corpus.source='files'; prepare this corpus locally (--runner=local).")
  if spec.max_documents:
    raise ValueError(
        f'corpus.max_documents={spec.max_documents}: the Beam pipeline '
        'prepares whole corpora; prepare a part of one locally '
        '(--runner=local).')


def count_file(item: tuple[int, str], text_format: str
               ) -> tuple[int, int, dict[str, int]]:
  """(file number, its raw documents, what reading them skipped)."""
  number, file = item
  counts = collections.Counter()
  documents = sum(1 for _ in corpus_lib.file_raw_documents(
      text_format, file, counts))
  return number, documents, dict(counts)


def first_indices(counted: Sequence[tuple[int, int, dict]]) -> list[int]:
  """Per file, in order: the corpus index of its first raw document."""
  sizes = [n for _, n, _ in sorted(counted)]
  return list(itertools.accumulate(sizes, initial=0))[:-1]


def keyed_documents(item: tuple[int, str], text_format: str,
                    docs_per_shard: int, firsts: Sequence[int]
                    ) -> Iterator[tuple[int, tuple[int, tuple]]]:
  """(shard, (corpus index, raw document)) of each document of a file."""
  number, file = item
  index = firsts[number]
  for raw in corpus_lib.file_raw_documents(text_format, file,
                                           collections.Counter()):
    yield index // docs_per_shard, (index, raw)
    index += 1


def write_group(item: tuple[int, Iterator], settings: shards.Settings,
                docs_per_shard: int) -> int:
  """Writes shard ``number`` from its (index, raw document) pairs, unless
  a run before this one did."""
  number, documents = item
  if shards.load_summary(settings.directory, number) is None:
    documents = sorted(documents, key=lambda x: x[0])
    first = number * docs_per_shard
    if [i for i, _ in documents] != list(range(first,
                                              first + len(documents))):
      raise AssertionError(f'shard {number} got documents '
                           f'{[i for i, _ in documents][:5]}...')
    storage.makedirs(os.path.join(settings.directory, 'shards'))
    shards.write_shard(settings, number, first, [r for _, r in documents])
  return number


def write_raw_counts(counted: Sequence[tuple[int, int, dict]],
                     directory: str) -> None:
  total = collections.Counter()
  for _, _, counts in counted:
    total.update(counts)
  storage.write_text(os.path.join(directory, RAW_COUNTS), json.dumps(
      {'documents': sum(n for _, n, _ in counted), 'skipped': dict(total)},
      sort_keys=True))


def build(pipeline, files: Sequence[str], text_format: str,
          settings: shards.Settings, docs_per_shard: int) -> None:
  """Adds the preparation's transforms to ``pipeline``."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  listed = pipeline | 'Files' >> beam.Create(list(enumerate(files)))
  counted = (listed
             | 'SpreadCounting' >> beam.Reshuffle()
             | 'Count' >> beam.Map(count_file, text_format))
  all_counted = counted | 'Gather' >> beam.combiners.ToList()
  firsts = beam.pvalue.AsSingleton(
      all_counted | 'FirstIndices' >> beam.Map(first_indices))
  _ = (listed
       | 'SpreadReading' >> beam.Reshuffle()
       | 'Read' >> beam.FlatMap(keyed_documents, text_format, docs_per_shard,
                                firsts)
       | 'ByShard' >> beam.GroupByKey()
       | 'Write' >> beam.Map(write_group, settings, docs_per_shard))
  _ = all_counted | 'RawCounts' >> beam.Map(write_raw_counts,
                                            settings.directory)


def run(the_plan: pretokenize.Plan, beam_args: Sequence[str] = (),
        workers: int = 0) -> dict:
  """Prepares ``the_plan`` with Beam, under the local path's lock; returns
  the manifest. ``beam_args``: Beam's pipeline options (``--runner=...``);
  with none, the DirectRunner in ``workers`` processes (0 = one per
  core)."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  check_corpus(the_plan.spec)
  files = corpus_lib.files(the_plan.spec)
  if not files:
    raise ValueError(f'{corpus_lib.describe(the_plan.spec)} matches no files.')
  if not beam_args:
    beam_args = ['--runner=DirectRunner',
                 f'--direct_num_workers={workers or os.cpu_count()}',
                 '--direct_running_mode=multi_processing']
  directory = the_plan.directory
  with pretokenize.locked(directory):
    manifest = shards.read_manifest(directory)
    if manifest is not None:
      return manifest
    storage.makedirs(os.path.join(directory, 'shards'))
    shards.remove_partial_files(directory)
    settings = dataclasses.replace(the_plan.settings, threads=1)
    with beam.Pipeline(options=pipeline_options.PipelineOptions(
        list(beam_args))) as pipeline:
      build(pipeline, files, the_plan.spec.text_format, settings,
            the_plan.docs_per_shard)
    path = os.path.join(directory, RAW_COUNTS)
    raw = json.loads(storage.read_text(path))
    num_shards = -(-raw['documents'] // the_plan.docs_per_shard)
    manifest = shards.finish(directory, num_shards, raw['skipped'],
                             the_plan.metadata(), the_plan.check)
    storage.remove(path)
    return manifest
