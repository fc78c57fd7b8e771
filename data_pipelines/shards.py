"""Pre-tokenized documents written as numbered shards, in parallel.

A corpus is cut into shards of ``docs_per_shard`` raw documents
(``corpus.raw_documents``) in corpus order: shard ``k`` holds documents
``[k * docs_per_shard, (k + 1) * docs_per_shard)``, whatever the number of
processes that write them. Each shard is written by ``write_shard``, in
any process: it parses and tokenizes its documents, splits them into the
train and eval splits by the counter-based RNG of their index, and writes

  <directory>/pretokenized_corpus-<split>.array_record-<k>   (5+ digits)
      one record per document, in document order (``FEATURES``);
  <directory>/shards/<k>.npz
      its summary: per split, each document's sentence lengths, the unigram
      counts, the records' number, size and SHA-256; and what parsing and
      tokenizing it skipped.

The record files are written under temporary names and renamed; the
summary is renamed last, so a shard with a summary is whole, and a
preparation that is killed resumes from the shards it finished
(``write_local``). ``finish`` merges the summaries, without reading a
record back, into the index of each split (``index-<split>/``), TFDS's
``dataset_info.json`` (so ``tfds.builder_from_directory`` reads the
directory) and ``manifest.json``, written last: a directory with a
manifest is complete.

Nothing here holds the corpus: the writer holds ``docs_per_shard``
documents per shard in flight, the merge one shard's summary.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import glob
import hashlib
import heapq
import io
import json
import multiprocessing
import os
import zipfile
from typing import Callable, Iterable, Iterator, Sequence

from array_record.python import array_record_module
import numpy as np

from bertjax import errors
from bertjax import storage
from data_pipelines import annotations
from data_pipelines import corpus as corpus_lib
from data_pipelines import counter_rng
from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines import tokenizer as tokenizer_lib

SPLITS = ('train', 'eval')
DATASET_NAME = 'pretokenized_corpus'
# TFDS's name for the files: {DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}.
FILENAME_TEMPLATE = '{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}'
MANIFEST = 'manifest.json'
# The features of a record. Each is stored as raw little-endian bytes
# (TFDS's ``Encoding.BYTES``), so reading one is a view, not a parse.
FEATURES = {
    'token_ids': np.dtype('<i4'),
    'sentence_lengths': np.dtype('<i4'),
    'word_starts': np.dtype(np.bool_),
    'unit_labels': np.dtype(np.int8),
    'capitalized': np.dtype(np.bool_),
}
# ArrayRecord chunks are written uncompressed: decompressing a record costs
# more than the rest of reading it (experiments/benchmarks/pipeline.py
# measures both), for about 2.8x the disk space.
ARRAY_RECORD_OPTIONS = 'group_size:1,uncompressed'
_DOCS_PER_ENCODE_BATCH = 512


@dataclasses.dataclass(frozen=True)
class DocumentIndex:
  """Sentence lengths of every document in one split, in record order.

  Attributes:
    sentence_lengths: int32 [total_sentences], all documents concatenated.
    document_offsets: int64 [num_documents + 1], sentence offsets.
    unigram_counts: int64 [vocab_size], token frequencies of the split.
  """
  sentence_lengths: np.ndarray
  document_offsets: np.ndarray
  unigram_counts: np.ndarray

  @property
  def num_documents(self) -> int:
    return len(self.document_offsets) - 1

  @property
  def num_tokens(self) -> int:
    return int(self.sentence_lengths.sum())

  @classmethod
  def load(cls, path: str) -> 'DocumentIndex':
    """From directory ``path``: a .npy file per array (``_merge_indices``)."""
    return cls(*(_load_npy(os.path.join(path, f'{name}.npy')) for name in (
        'sentence_lengths', 'document_offsets', 'unigram_counts')))


def _load_npy(path: str) -> np.ndarray:
  with storage.open(path, 'rb') as f:
    return np.load(f)


class ShardError(errors.UserError, ValueError):
  """A shard is missing, truncated or corrupt; the message names it."""


def shard_path(directory: str, split: str, number: int) -> str:
  return os.path.join(directory,
                      f'{DATASET_NAME}-{split}.array_record-{number:05d}')


def summary_path(directory: str, number: int) -> str:
  return os.path.join(directory, 'shards', f'{number:05d}.npz')


@dataclasses.dataclass(frozen=True)
class Settings:
  """What writing a shard needs; it pickles into worker processes.

  Attributes:
    directory: where the shards go.
    tokenizer_proto: the SentencePiece model, serialized.
    eval_fraction, split_seed: the split of documents (data config).
    gazetteer_path: entity/phrase units from a gazetteer, if any.
    threads: SentencePiece's threads in each writing process.
  """
  directory: str
  tokenizer_proto: bytes
  eval_fraction: float
  split_seed: int
  gazetteer_path: str | None = None
  threads: int = 1


_LOADED: dict = {}   # Per process: the tokenizer and gazetteer of Settings.


def load_tools(settings: Settings):
  """(tokenizer, gazetteer or None) of ``settings``, loaded once per
  process."""
  key = (hashlib.sha256(settings.tokenizer_proto).hexdigest(),
         settings.gazetteer_path)
  if key not in _LOADED:
    _LOADED.clear()
    tokenizer = tokenizer_lib.Tokenizer(settings.tokenizer_proto)
    gazetteer = (gazetteer_lib.Gazetteer.load(settings.gazetteer_path,
                                              tokenizer)
                 if settings.gazetteer_path else None)
    _LOADED[key] = tokenizer, gazetteer
  return _LOADED[key]


def tokenize_documents(documents: Iterable[tuple[int, list[str]]],
                       tokenizer: tokenizer_lib.Tokenizer,
                       num_threads: int,
                       gazetteer: gazetteer_lib.Gazetteer | None = None,
                       counts: collections.Counter | None = None
                       ) -> Iterator[tuple[int, dict]]:
  """(index, record) of each (index, document); SentencePiece encodes a
  batch of documents at a time, on ``num_threads`` threads.

  Annotated documents (``corpus.Document.spans``) take their word starts
  and, if they mark any entity/phrase, their unit labels from the spans
  (annotations.py); the others take word starts from the tokenizer and
  units from the gazetteer, if any. Sentences with no token, and documents
  left with no sentence, are dropped and counted in ``counts``
  ('empty_sentences', 'empty_documents'). A tokenizer that lowercases
  gives each token its ``capitalized`` flag from the original text
  (``tokenizer.capitalized_words``); any other, all False.
  """
  counts = collections.Counter() if counts is None else counts

  def flush(batch):
    documents = [doc for _, doc in batch]
    encoded = _encode_documents(documents, tokenizer, num_threads)
    for (index, doc), doc_encoded in zip(batch, encoded):
      # (ids, word starts, unit labels, capitalized), non-empty only.
      sentences = [x for x in doc_encoded if len(x[0])]
      if len(sentences) < len(doc_encoded):
        counts['empty_sentences'] += len(doc_encoded) - len(sentences)
      if not sentences:
        counts['empty_documents'] += 1
        continue
      ids, word_starts, labels, capitalized = zip(*sentences)
      doc_spans = getattr(doc, 'spans', None)
      if doc_spans is not None and annotations.has_units(doc_spans):
        unit_labels = np.concatenate(labels)
      elif gazetteer is not None:  # Per sentence: units stay in sentences.
        unit_labels = np.concatenate([
            gazetteer.label(x, w) for x, w in zip(ids, word_starts)])
      else:
        unit_labels = np.zeros(sum(map(len, ids)), np.int8)
      yield index, {
          'token_ids': np.concatenate(ids).astype(np.int32),
          'sentence_lengths': np.array([len(x) for x in ids], np.int32),
          'word_starts': np.concatenate(word_starts),
          'unit_labels': unit_labels.astype(np.int8),
          'capitalized': (np.concatenate(capitalized)
                          if tokenizer.lowercases
                          else np.zeros(sum(map(len, ids)), bool)),
      }

  batch = []
  for item in documents:
    batch.append(item)
    if len(batch) == _DOCS_PER_ENCODE_BATCH:
      yield from flush(batch)
      batch = []
  if batch:
    yield from flush(batch)


def _encode_documents(documents: Sequence[list[str]],
                      tokenizer: tokenizer_lib.Tokenizer, num_threads: int
                      ) -> list[list[list]]:
  """Per document, per sentence: [ids, word starts, unit labels or None,
  capitalized or None], empty sentences included; SentencePiece encodes
  all the sentences of ``documents`` at once.

  Annotated documents take their word starts and unit labels from their
  spans (``annotations.token_labels``), the others their word starts from
  the tokenizer. ``capitalized`` (``tokenizer.capitalized_words``) needs
  the text of each token, a second and slower encoding: only a
  lowercasing tokenizer gives it, the others None.
  """
  spans = [getattr(doc, 'spans', None) for doc in documents]
  plain = iter(tokenizer.encode(
      [s for doc, sp in zip(documents, spans) if sp is None for s in doc],
      num_threads=num_threads))
  annotated = iter(tokenizer.encode_with_offsets(
      [s for doc, sp in zip(documents, spans) if sp is not None
       for s in doc], num_threads=num_threads))
  encoded = []
  for doc, doc_spans in zip(documents, spans):
    sentences = []
    for j in range(len(doc)):
      if doc_spans is None:
        ids = next(plain)
        sentences.append([ids, tokenizer.word_starts(ids), None, None])
      else:
        ids, ends = next(annotated)
        sentences.append([ids, *annotations.token_labels(
            ends, doc_spans[j], tokenizer.word_starts(ids)), None])
    encoded.append(sentences)
  if tokenizer.lowercases:
    flat = [x for sentences in encoded for x in sentences]
    text = [s for doc in documents for s in doc]
    for x, capitalized in zip(flat, tokenizer_lib.capitalized_words(
        text, tokenizer.token_begins(text, num_threads),
        [word_starts for _, word_starts, _, _ in flat])):
      x[3] = capitalized
  return encoded


def _varint(n: int) -> bytes:
  out = bytearray()
  while n >= 0x80:
    out.append(n & 0x7f | 0x80)
    n >>= 7
  out.append(n)
  return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited protobuf field."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# Per feature: its map entry's key field, then the map value's tag.
_ENTRY_HEADS = [(_field(1, name.encode()) + _varint(2 << 3 | 2), dtype)
                for name, dtype in sorted(FEATURES.items())]


def serialize(record: dict[str, np.ndarray]) -> bytes:
  """A record as the tf.train.Example that TFDS writes for ``FEATURES``
  (each a BytesList of one value), serialized deterministically (map keys
  sorted): the bytes of ``Example.SerializeToString(deterministic=True)``
  (tested), without importing TensorFlow Datasets into every worker.

  Example{features: Features{feature: map<string, Feature{bytes_list:
  BytesList{value}}>}}: each message's field number 1, the map value's 2.
  """
  entries = []
  for (head, dtype), name in zip(_ENTRY_HEADS, sorted(FEATURES)):
    feature = _field(1, _field(1, np.ascontiguousarray(
        record[name], dtype).tobytes()))
    entries.append(_field(1, head + _varint(len(feature)) + feature))
  return _field(1, b''.join(entries))


def write_shard(settings: Settings, number: int, first_index: int,
                raw_documents: Sequence[tuple]) -> dict:
  """Parses, tokenizes and writes shard ``number``: the raw documents of
  indices ``first_index, first_index + 1, ...``. Returns its summary
  (``load_summary``'s form), also written to ``summary_path``, after the
  record files: a shard whose summary exists is whole."""
  tokenizer, gazetteer = load_tools(settings)
  counts = collections.Counter()
  parsed = ((first_index + i, corpus_lib.parse_document(raw, counts))
            for i, raw in enumerate(raw_documents))
  documents = ((i, doc) for i, doc in parsed if doc is not None)
  lengths = {s: [] for s in SPLITS}
  unigrams = {s: np.zeros(tokenizer.vocab_size, np.int64) for s in SPLITS}
  summary = {'number': number, 'first_index': first_index,
             'num_raw_documents': len(raw_documents),
             'text_size': sum(map(corpus_lib.raw_size, raw_documents))}
  with contextlib.ExitStack() as stack:
    # Written locally (ArrayRecord writes only local files), then renamed
    # or uploaded whole when the stack closes.
    local = {s: stack.enter_context(storage.staged(
        shard_path(settings.directory, s, number))) for s in SPLITS}
    writers = {s: array_record_module.ArrayRecordWriter(
        local[s], ARRAY_RECORD_OPTIONS) for s in SPLITS}
    try:
      for index, record in tokenize_documents(
          documents, tokenizer, settings.threads, gazetteer, counts):
        in_eval = counter_rng.uniform(
            settings.split_seed, counter_rng.Stream.EVAL_SPLIT,
            index) < settings.eval_fraction
        split = 'eval' if in_eval else 'train'
        writers[split].write(serialize(record))
        lengths[split].append(record['sentence_lengths'])
        unigrams[split] += np.bincount(record['token_ids'],
                                       minlength=tokenizer.vocab_size)
    finally:
      for writer in writers.values():
        writer.close()
    for s in SPLITS:
      summary[s] = {'records': len(lengths[s]),
                    'bytes': os.path.getsize(local[s]),
                    'sha256': storage.sha256(local[s]),
                    'tokens': int(unigrams[s].sum()),
                    'sentences': int(sum(map(len, lengths[s])))}
  summary['skipped'] = {k: int(counts[k]) for k in corpus_lib.SKIP_COUNTERS}
  arrays = {}
  for s in SPLITS:
    arrays[f'{s}_sentence_lengths'] = (np.concatenate(lengths[s]).astype(
        np.int32) if lengths[s] else np.zeros(0, np.int32))
    arrays[f'{s}_document_sentences'] = np.array(
        [len(x) for x in lengths[s]], np.int32)
    arrays[f'{s}_unigram_counts'] = unigrams[s]
  buffer = io.BytesIO()
  np.savez_compressed(buffer, summary=np.array(json.dumps(summary)), **arrays)
  storage.write_bytes(summary_path(settings.directory, number),
                      buffer.getvalue())
  return summary


def load_summary(directory: str, number: int) -> dict | None:
  """Shard ``number``'s summary, or None if the shard is not whole: no
  summary, or a record file whose size is not the summary's."""
  try:
    with storage.open(summary_path(directory, number), 'rb') as f, (
        np.load(f)) as z:
      summary = json.loads(str(z['summary']))
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    return None   # Missing, or cut short: the shard is written again.
  for s in SPLITS:
    try:
      if storage.getsize(shard_path(directory, s, number)) != summary[s][
          'bytes']:
        return None
    except OSError:
      return None
  return summary


def chunks(raw_documents: Iterable[tuple], docs_per_shard: int
           ) -> Iterator[tuple[int, int, list[tuple]]]:
  """(shard number, first document index, raw documents) of each shard."""
  chunk, number = [], 0
  for raw in raw_documents:
    chunk.append(raw)
    if len(chunk) == docs_per_shard:
      yield number, number * docs_per_shard, chunk
      chunk, number = [], number + 1
  if chunk:
    yield number, number * docs_per_shard, chunk


def remove_partial_files(directory: str) -> None:
  """Removes what killed writers left in a local directory: temporary
  files, never renamed. (A bucket has none: files are staged locally.)"""
  if storage.is_remote(directory):
    return
  for path in glob.glob(os.path.join(directory, '*.tmp-*')) + glob.glob(
      os.path.join(directory, 'shards', '*.tmp-*')) + glob.glob(
          os.path.join(directory, 'index-*', '*.tmp-*')):
    os.remove(path)


@dataclasses.dataclass(frozen=True)
class Done:
  """A task of ``ordered_map`` whose result is already known."""
  result: object


def ordered_map(fn: Callable, tasks: Iterable, workers: int) -> Iterator:
  """``fn(*task)`` of each task, in the tasks' order, on ``workers``
  spawned processes (1: in this one); a ``Done`` task gives its result.

  ``tasks`` is drawn lazily, at most two per worker ahead of the results
  taken, so it can hold a shard of text each and depend on the results so
  far. Spawned, not forked: the caller may run JAX's threads.
  """
  if workers <= 1:
    for task in tasks:
      yield task.result if isinstance(task, Done) else fn(*task)
    return
  context = multiprocessing.get_context('spawn')
  pending: collections.deque = collections.deque()
  with concurrent.futures.ProcessPoolExecutor(workers,
                                              mp_context=context) as pool:
    for task in tasks:
      pending.append(task if isinstance(task, Done) else
                     pool.submit(fn, *task))
      while len(pending) > 2 * workers:
        item = pending.popleft()
        yield item.result if isinstance(item, Done) else item.result()
    while pending:
      item = pending.popleft()
      yield item.result if isinstance(item, Done) else item.result()


def write_local(raw_documents: Iterable[tuple], settings: Settings,
                docs_per_shard: int, workers: int = 1,
                progress: Callable[[dict, bool], None] | None = None
                ) -> int:
  """Writes every shard of ``raw_documents`` not already whole, on
  ``workers`` processes (1: in this one). Returns the number of shards.

  This process reads the raw documents (the cheap part of reading) and
  hands a shard at a time to the workers, at most two per worker in
  flight, so memory holds a few shards of text, not the corpus.
  ``progress(summary, reused)`` is called for each shard, in order.
  """
  progress = progress or (lambda summary, reused: None)
  storage.makedirs(os.path.join(settings.directory, 'shards'))
  remove_partial_files(settings.directory)
  reused = collections.deque()

  def tasks():
    for number, first, chunk in chunks(raw_documents, docs_per_shard):
      summary = load_summary(settings.directory, number)
      reused.append(summary is not None)
      yield (Done(summary) if summary is not None else
             (settings, number, first, chunk))

  count = 0
  for summary in ordered_map(write_shard, tasks(), workers):
    progress(summary, reused.popleft())
    count += 1
  return count


# The largest sample key: a threshold that admits every sentence.
ALL_KEYS = np.uint64(2**64 - 1)


def sample_shard(seed: int, first_index: int, raw_documents: Sequence[tuple],
                 threshold: np.uint64, k: int) -> tuple[list, dict]:
  """The tokenizer's sample from one shard: of its sentences whose sample
  key is at most ``threshold``, the ``k`` smallest, as (key, document
  index, sentence index, sentence); and what parsing them skipped.

  A sentence's key hashes (seed, its document's index, its index in the
  document): the ``k`` smallest keys of the corpus are a uniform sample of
  its sentences, the same whichever processes draw it and however the
  corpus is cut (``pretokenize.sample_corpus`` merges them).
  """
  counts = collections.Counter()
  found = []
  for i, raw in enumerate(raw_documents):
    document = corpus_lib.parse_document(raw, counts)
    if document is None:
      continue
    index = first_index + i
    keys = counter_rng.hash_counters(
        seed, counter_rng.Stream.TOKENIZER_SAMPLE, index,
        np.arange(len(document), dtype=np.int64))
    found.extend((int(keys[j]), index, int(j), document[j])
                 for j in np.flatnonzero(keys <= threshold))
  return heapq.nsmallest(k, found), dict(counts)


def check_shards(directory: str, manifest: dict, full: bool = False
                 ) -> None:
  """Raises ShardError naming the first shard file that is missing, of
  the wrong size or (with ``full``, which reads every file) of the wrong
  SHA-256, and saying how to rewrite it."""
  sizes = {path: stat.size for path, stat in storage.find(directory).items()}
  for number in range(manifest['num_shards']):
    for s in SPLITS:
      path = shard_path(directory, s, number)
      expected = manifest['splits'][s]['shards'][number]
      problem = None
      if path not in sizes:
        problem = 'is missing'
      elif sizes[path] != expected['bytes']:
        problem = (f'has {sizes[path]} bytes, not the '
                   f'{expected["bytes"]} it was written with (truncated?)')
      elif full and storage.sha256(path) != expected['sha256']:
        problem = 'does not have the SHA-256 it was written with (corrupt)'
      if problem:
        raise ShardError(
            f'shard {path} {problem}. Delete it, '
            f'{summary_path(directory, number)} and '
            f'{os.path.join(directory, MANIFEST)}, and prepare again: only '
            'the missing shards are rewritten.')


def finish(directory: str, num_shards: int, skipped: dict[str, int],
           metadata: dict, check: Callable[[dict], None] = lambda m: None
           ) -> dict:
  """Merges the shards' summaries into the index of each split, TFDS's
  dataset_info.json and the manifest (written last). ``skipped``: what
  reading the raw documents skipped (the shards add theirs). ``check``
  sees the manifest before it is written and may refuse it. Returns the
  manifest."""
  summaries = []
  for number in range(num_shards):
    summary = load_summary(directory, number)
    if summary is None:
      raise ShardError(f'shard {number} of {directory} is not whole; '
                       'prepare again to rewrite it.')
    summaries.append(summary)
  total = collections.Counter(skipped)
  for summary in summaries:
    total.update(summary['skipped'])
  manifest = {
      'format_version': metadata['format_version'],
      'num_shards': num_shards,
      'docs_per_shard': metadata['docs_per_shard'],
      'num_raw_documents': sum(s['num_raw_documents'] for s in summaries),
      'skipped': {k: int(total[k]) for k in corpus_lib.SKIP_COUNTERS},
      'splits': {s: {
          'records': sum(x[s]['records'] for x in summaries),
          'tokens': sum(x[s]['tokens'] for x in summaries),
          'shards': [{k: x[s][k] for k in ('records', 'bytes', 'sha256')}
                     for x in summaries]} for s in SPLITS},
      **{k: v for k, v in metadata.items()
         if k not in ('format_version', 'docs_per_shard')},
  }
  check(manifest)
  _merge_indices(directory, summaries, metadata['vocab_size'])
  _write_dataset_info(directory, manifest)
  storage.write_text(os.path.join(directory, MANIFEST),
                     json.dumps(manifest, indent=1, sort_keys=True))
  return manifest


def _npy_writer(path: str, dtype, length: int):
  """An open .npy file of ``length`` items, its header written: the items
  follow as raw bytes."""
  f = open(path, 'wb')  # pylint: disable=consider-using-with
  np.lib.format.write_array_header_1_0(f, {
      'descr': np.lib.format.dtype_to_descr(np.dtype(dtype)),
      'fortran_order': False, 'shape': (length,)})
  return f


def _merge_indices(directory: str, summaries: list[dict],
                   vocab_size: int) -> None:
  """Writes ``index-<split>`` of both splits from the shards' summaries,
  in one pass: a shard at a time is appended to the files, so memory
  holds one shard's summary, not the corpus's index. Each file is staged
  and appears whole; the manifest, written after them, seals the set."""
  final = {s: os.path.join(directory, f'index-{s}') for s in SPLITS}
  unigrams = {s: np.zeros(vocab_size, np.int64) for s in SPLITS}
  sentence = dict.fromkeys(SPLITS, 0)
  with contextlib.ExitStack() as stack:
    lengths, offsets = {}, {}
    for s in SPLITS:
      storage.makedirs(final[s])
      lengths[s] = stack.enter_context(_npy_writer(
          stack.enter_context(storage.staged(
              os.path.join(final[s], 'sentence_lengths.npy'))), np.int32,
          sum(x[s]['sentences'] for x in summaries)))
      offsets[s] = stack.enter_context(_npy_writer(
          stack.enter_context(storage.staged(
              os.path.join(final[s], 'document_offsets.npy'))), np.int64,
          sum(x[s]['records'] for x in summaries) + 1))
      offsets[s].write(np.zeros(1, np.int64).tobytes())
    for summary in summaries:
      with storage.open(summary_path(directory, summary['number']),
                        'rb') as f, np.load(f) as arrays:
        for s in SPLITS:
          x = arrays[f'{s}_sentence_lengths']
          lengths[s].write(x.astype(np.int32).tobytes())
          offsets[s].write((sentence[s] + np.cumsum(
              arrays[f'{s}_document_sentences'], dtype=np.int64)).tobytes())
          sentence[s] += len(x)
          unigrams[s] += arrays[f'{s}_unigram_counts']
  for s in SPLITS:
    buffer = io.BytesIO()
    np.save(buffer, unigrams[s])
    storage.write_bytes(os.path.join(final[s], 'unigram_counts.npy'),
                        buffer.getvalue())


def _write_dataset_info(directory: str, manifest: dict) -> None:
  """TFDS's metadata, so ``tfds.builder_from_directory`` reads the shards."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  features = tfds.features.FeaturesDict({
      name: tfds.features.Tensor(shape=(None,), dtype=dtype,
                                 encoding=tfds.features.Encoding.BYTES)
      for name, dtype in FEATURES.items()})
  template = tfds.core.ShardedFileTemplate(
      data_dir=directory, template=FILENAME_TEMPLATE,
      dataset_name=DATASET_NAME, filetype_suffix='array_record')
  split_infos = [tfds.core.SplitInfo(
      name=s, shard_lengths=[x['records'] for x in
                             manifest['splits'][s]['shards']],
      num_bytes=sum(x['bytes'] for x in manifest['splits'][s]['shards']),
      filename_template=template.replace(split=s)) for s in SPLITS]
  tfds.folder_dataset.write_metadata(
      data_dir=directory, features=features, split_infos=split_infos,
      version=manifest['format_version'], filename_template=template,
      check_data=False,
      description='Pre-tokenized documents for bertjax pretraining.',
      metadata=tfds.core.MetadataDict(
          tokenizer_sha256=manifest['tokenizer_sha256'],
          vocab_size=manifest['vocab_size'], skipped=manifest['skipped']))


def read_manifest(directory: str) -> dict | None:
  try:
    return json.loads(storage.read_text(os.path.join(directory, MANIFEST)))
  except FileNotFoundError:
    return None
