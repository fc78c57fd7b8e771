"""Tokenize a corpus once into ArrayRecord through a TFDS builder.

The result lives in ``data_dir`` keyed by a fingerprint of the corpus, the
tokenizer and the split settings, so a change rebuilds and a rerun reuses.
Each record is one document:

  token_ids:        int32 [num_tokens]     all sentences, concatenated
  sentence_lengths: int32 [num_sentences]  tokens per sentence
  word_starts:      bool  [num_tokens]     does the token start a word?
  unit_labels:      int8  [num_tokens]     entity/phrase units (gazetteer.py
                                           or annotations.py)

Next to the TFDS files, ``index-<split>.npz`` holds what instance planning
needs without reading the documents again (sentence lengths per document)
and the corpus unigram counts. The dataset's ``metadata.json`` holds what
reading and tokenizing skipped or repaired (``corpus.SKIP_COUNTERS``),
written with the records, so a run that reuses the data reports the same
counts.

TFDS writes ArrayRecord without TensorFlow, and ``as_data_source()`` gives
random access, which Grain needs.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import pickle
import tempfile
from typing import Callable, Iterable, Iterator
from unittest import mock

from absl import logging
from array_record.python import array_record_module
import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters
from tensorflow_datasets.proto import tf_example_pb2

from data_pipelines import annotations
from data_pipelines import corpus as corpus_lib
from data_pipelines import counter_rng
from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines import tokenizer as tokenizer_lib

# Bump when the record layout, the split rule, or what reading keeps changes.
# 1.4.0: skip counts in the metadata; lines of control characters dropped
# instead of ending a document; escape sequences removed; long sentences cut.
FORMAT_VERSION = '1.4.0'
# The features of a record. Each is stored as raw little-endian bytes
# (``Encoding.BYTES``), so reading one is a view, not a parse of a list.
FEATURES = {
    'token_ids': np.dtype('<i4'),
    'sentence_lengths': np.dtype('<i4'),
    'word_starts': np.dtype(np.bool_),
    'unit_labels': np.dtype(np.int8),
}
_DOCS_PER_ENCODE_BATCH = 512


class DataError(ValueError):
  """The prepared data cannot be used; the message says why."""


def format_skipped(skipped: dict[str, int]) -> str:
  """The non-zero counts of ``skipped``, as ``key=count, ...``."""
  return ', '.join(f'{key}={skipped[key]}'
                   for key in corpus_lib.SKIP_COUNTERS
                   if skipped.get(key)) or 'nothing'


_MIN_DOCUMENTS = {'train': 2, 'eval': 1}


def check_split_size(split: str, num_documents: int, eval_fraction: float,
                     skipped: dict[str, int] | None = None) -> None:
  """NSP needs two training documents; evaluation needs one."""
  minimum = _MIN_DOCUMENTS[split]
  if num_documents < minimum:
    dropped = (f' (preparing the data skipped {format_skipped(skipped)})'
               if skipped and any(skipped.values()) else '')
    raise DataError(
        f'the {split} split has {num_documents} documents (need at least '
        f'{minimum}){dropped}; the corpus is too small for '
        f'data.eval_fraction={eval_fraction}. Use more text or change '
        'data.eval_fraction.')


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

  def save(self, path: str) -> None:
    tmp = f'{path}.tmp{os.getpid()}.npz'
    np.savez(tmp, sentence_lengths=self.sentence_lengths,
             document_offsets=self.document_offsets,
             unigram_counts=self.unigram_counts)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> 'DocumentIndex':
    with np.load(path) as z:
      return cls(z['sentence_lengths'], z['document_offsets'],
                 z['unigram_counts'])


# ArrayRecord chunks are written uncompressed: TFDS's writer compresses each
# record with zstd, and decompressing one costs more than the rest of
# reading it (experiments/benchmarks/pipeline.py measures both), for about
# 2.8x the disk space.
ARRAY_RECORD_OPTIONS = 'group_size:1,uncompressed'


class _UncompressedArrayRecord(file_adapters.ArrayRecordFileAdapter):
  """TFDS's ArrayRecord adapter, writing with ``ARRAY_RECORD_OPTIONS``."""

  @classmethod
  def write_examples(cls, path, iterator):
    writer = array_record_module.ArrayRecordWriter(os.fspath(path),
                                                   ARRAY_RECORD_OPTIONS)
    for _, serialized_example in iterator:
      writer.write(serialized_example)
    writer.close()


def _uncompressed_array_record():
  """While active, TFDS builders write ArrayRecord with our options.

  TFDS hard-codes its writer's options; its adapter registry is the one
  place to choose others. Readers need nothing: the options are in the file.
  """
  return mock.patch.dict(file_adapters.ADAPTER_FOR_FORMAT, {
      file_adapters.FileFormat.ARRAY_RECORD: _UncompressedArrayRecord})


class DocumentSource:
  """Random access to the records of one split, decoded with no copies.

  TFDS's generic decoder spends about 0.1 ms per record converting proto
  lists; instance building reads one or two records per instance, so that
  alone would cap the pipeline far below its target. The records here hold
  raw little-endian bytes, and this reader parses the proto and views each
  feature in place: ``source[i]`` is the same dict that TFDS's
  ``as_data_source()[i]`` returns (tested), several times faster.

  It pickles (into Grain's worker processes): it holds only the TFDS
  source's ArrayRecord reader, which reopens its files.
  """

  def __init__(self, tfds_source):
    self._records = tfds_source.data_source

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    features = tf_example_pb2.Example.FromString(
        self._records[i]).features.feature
    return {name: np.frombuffer(features[name].bytes_list.value[0], dtype)
            for name, dtype in FEATURES.items()}


class PretokenizedCorpus(tfds.core.GeneratorBasedBuilder):
  """Documents of a corpus tokenized once; one record per document."""

  VERSION = tfds.core.Version(FORMAT_VERSION)

  def __init__(self, *, documents_fn: Callable[[collections.Counter],
                                                Iterable[list[str]]],
               tokenizer: tokenizer_lib.Tokenizer, eval_fraction: float,
               split_seed: int, num_threads: int,
               gazetteer: gazetteer_lib.Gazetteer | None = None,
               corpus_name: str = 'the corpus', **kwargs):
    """``documents_fn(counts)`` reads the corpus, counting what it skips in
    ``counts``; ``corpus_name`` names it in errors."""
    self._documents_fn = documents_fn
    self._corpus_name = corpus_name
    self._tokenizer = tokenizer
    self._eval_fraction = eval_fraction
    self._split_seed = split_seed
    self._num_threads = num_threads
    self._gazetteer = gazetteer
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='Pre-tokenized documents for bertjax pretraining.',
        features=tfds.features.FeaturesDict({
            name: tfds.features.Tensor(shape=(None,), dtype=dtype,
                                       encoding=tfds.features.Encoding.BYTES)
            for name, dtype in FEATURES.items()}),
        metadata=tfds.core.MetadataDict(
            tokenizer_sha256=self._tokenizer.sha256,
            vocab_size=self._tokenizer.vocab_size),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    one_pass = _OnePass(self._tokenized, self._finish, self.data_dir_root)
    return {split: self._generate_examples(one_pass, split)
            for split in ('train', 'eval')}

  def _generate_examples(self, one_pass: '_OnePass', split: str) -> Iterator:
    """(doc index, record) of ``split``, from the one pass of the corpus."""
    return one_pass.examples(split)

  def _tokenized(self, counts: collections.Counter) -> Iterator:
    """(split, doc index, record) of every document, tokenized once."""
    for doc_index, record in _tokenize_documents(
        self._documents_fn(counts), self._tokenizer, self._num_threads,
        self._gazetteer, counts):
      in_eval = counter_rng.uniform(
          self._split_seed, counter_rng.Stream.EVAL_SPLIT,
          doc_index) < self._eval_fraction
      yield ('eval' if in_eval else 'train'), doc_index, record

  def _finish(self, counts: collections.Counter, sizes: dict) -> None:
    """After the pass: fails on an empty corpus or split, and records what
    reading and tokenizing skipped (TFDS writes the metadata with the
    records, after the last split)."""
    skipped = {key: int(counts[key]) for key in corpus_lib.SKIP_COUNTERS}
    if not sum(sizes.values()):
      raise DataError(
          f'{self._corpus_name}: no document has text to pre-tokenize; '
          f'preparing the data skipped {format_skipped(skipped)} (see '
          'corpus.SKIP_COUNTERS). Check the path, the text format and that '
          'the files are UTF-8 text.')
    self.info.metadata['skipped'] = skipped
    for split in ('train', 'eval'):
      check_split_size(split, sizes[split], self._eval_fraction, skipped)


class _OnePass:
  """One reading and tokenization of the corpus for both splits.

  The split TFDS writes first gets its records as they are made; the
  other's are pickled to a spool file as they go by and replayed when TFDS
  asks for them. TFDS writes 'train' first, so the spool holds the eval
  split (``eval_fraction`` of the corpus), not a second copy of the corpus,
  and the corpus is tokenized once, not once per split. TFDS orders the
  records by their keys, so the files are the bytes that a pass per split
  wrote.
  """

  def __init__(self, tokenized: Callable[[collections.Counter], Iterator],
               finish: Callable[[collections.Counter, dict], None],
               spool_dir: str):
    """``tokenized(counts)`` yields (split, doc index, record) of every
    document; ``finish(counts, sizes)`` runs after the last one."""
    self._tokenized = tokenized
    self._finish = finish
    self._spool_dir = spool_dir
    self._first = None
    self._spool = None

  def examples(self, split: str) -> Iterator:
    if self._first is None:
      self._first = split
      yield from self._pass(split)
      return
    if self._spool is None:
      raise AssertionError(f'split {split!r} was asked for before '
                           f'{self._first!r} was written.')
    with self._spool:
      self._spool.seek(0)
      while True:
        try:
          yield pickle.load(self._spool)
        except EOFError:
          return

  def _pass(self, split: str) -> Iterator:
    counts = collections.Counter()
    sizes = {'train': 0, 'eval': 0}
    os.makedirs(self._spool_dir, exist_ok=True)
    spool = tempfile.TemporaryFile(  # pylint: disable=consider-using-with
        dir=self._spool_dir)
    try:
      for record_split, doc_index, record in self._tokenized(counts):
        sizes[record_split] += 1
        if record_split == split:
          yield doc_index, record
        else:
          pickle.dump((doc_index, record), spool,
                      protocol=pickle.HIGHEST_PROTOCOL)
      self._finish(counts, sizes)
    except BaseException:
      spool.close()
      raise
    self._spool = spool


def _tokenize_documents(documents: Iterable[list[str]],
                        tokenizer: tokenizer_lib.Tokenizer,
                        num_threads: int,
                        gazetteer: gazetteer_lib.Gazetteer | None = None,
                        counts: collections.Counter | None = None
                        ) -> Iterator[tuple[int, dict]]:
  """Yields (document index, record); SentencePiece encodes in parallel.

  Annotated documents (``corpus.Document.spans``) take their word starts
  and, if they mark any entity/phrase, their unit labels from the spans
  (annotations.py); the others take word starts from the tokenizer and
  units from the gazetteer, if any. Sentences with no token, and documents
  left with no sentence, are dropped and counted in ``counts``
  ('empty_sentences', 'empty_documents'); the documents that follow keep
  their indices.
  """
  counts = collections.Counter() if counts is None else counts

  def flush(batch, first_index):
    spans = [getattr(doc, 'spans', None) for doc in batch]
    plain = iter(tokenizer.encode(
        [s for doc, sp in zip(batch, spans) if sp is None for s in doc],
        num_threads=num_threads))
    annotated = iter(tokenizer.encode_with_offsets(
        [s for doc, sp in zip(batch, spans) if sp is not None for s in doc],
        num_threads=num_threads))
    for i, (doc, doc_spans) in enumerate(zip(batch, spans)):
      sentences = []  # (ids, word starts, unit labels), non-empty only.
      for j in range(len(doc)):
        if doc_spans is None:
          ids = next(plain)
          word_starts, labels = tokenizer.word_starts(ids), None
        else:
          ids, ends = next(annotated)
          word_starts, labels = annotations.token_labels(
              ends, doc_spans[j], tokenizer.word_starts(ids))
        if len(ids):
          sentences.append((ids, word_starts, labels))
        else:
          counts['empty_sentences'] += 1
      if not sentences:
        counts['empty_documents'] += 1
        continue
      ids, word_starts, labels = zip(*sentences)
      if doc_spans is not None and annotations.has_units(doc_spans):
        unit_labels = np.concatenate(labels)
      elif gazetteer is not None:  # Per sentence: units stay in sentences.
        unit_labels = np.concatenate([
            gazetteer.label(x, w) for x, w in zip(ids, word_starts)])
      else:
        unit_labels = np.zeros(sum(map(len, ids)), np.int8)
      yield first_index + i, {
          'token_ids': np.concatenate(ids).astype(np.int32),
          'sentence_lengths': np.array([len(x) for x in ids], np.int32),
          'word_starts': np.concatenate(word_starts),
          'unit_labels': unit_labels.astype(np.int8),
      }

  batch, first = [], 0
  for index, document in enumerate(documents):
    if not batch:
      first = index
    batch.append(document)
    if len(batch) == _DOCS_PER_ENCODE_BATCH:
      yield from flush(batch, first)
      batch = []
  if batch:
    yield from flush(batch, first)


@dataclasses.dataclass
class PreparedData:
  """Everything the input pipeline reads: sources, indices, tokenizer.

  Attributes:
    skipped: what preparing the data skipped or repaired in the whole
      corpus: every key of ``corpus.SKIP_COUNTERS`` (0 when none). Stored
      with the data, so a run that reuses it reports the same counts.
  """
  tokenizer: tokenizer_lib.Tokenizer
  train_source: DocumentSource
  eval_source: DocumentSource
  train_index: DocumentIndex
  eval_index: DocumentIndex
  directory: str
  skipped: dict[str, int]

  @property
  def train_unigram_counts(self) -> np.ndarray:
    """int64 [vocab_size]: token counts of the training split."""
    return self.train_index.unigram_counts


def _documents_fn(spec: corpus_lib.CorpusSpec):
  return lambda counts: corpus_lib.read_documents(spec, counts)


def cache_key(*parts) -> str:
  """A short digest of JSON-able ``parts``: a cache directory's name."""
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()
                        ).hexdigest()[:16]


def cached_tokenizer(data_cfg, text_key: tuple,
                     sentences_fn: Callable[[], Iterable[str]]
                     ) -> tokenizer_lib.Tokenizer:
  """Loads ``tokenizer.model_path``, or trains one on a seeded uniform
  sample of ``tokenizer.max_sentences`` of ``sentences_fn()`` (all of them
  if there are fewer: ``tokenizer.sample_sentences``, one pass, memory for
  the sample alone).

  A trained model is cached in ``data_dir/tokenizers/<key>/spm.model``, the
  key covering ``text_key`` (what identifies the training text) and the
  tokenizer settings.
  """
  tok_cfg = data_cfg.tokenizer
  if tok_cfg.model_path:
    return tokenizer_lib.Tokenizer.load(tok_cfg.model_path)
  # 'sampled': models trained on the first max_sentences are not reused.
  key = cache_key(*text_key, tok_cfg.vocab_size, tok_cfg.model_type,
                  tok_cfg.max_sentences, tokenizer_lib.TRAINING_THREADS,
                  'sampled', tok_cfg.get('sample_seed', 0))
  path = os.path.join(data_cfg.data_dir, 'tokenizers', key, 'spm.model')
  if os.path.exists(path):
    return tokenizer_lib.Tokenizer.load(path)
  logging.info('Training a %s SentencePiece model of %d pieces -> %s',
               tok_cfg.model_type, tok_cfg.vocab_size, path)
  sample = tokenizer_lib.sample_sentences(
      sentences_fn(), tok_cfg.max_sentences, tok_cfg.get('sample_seed', 0))
  tokenizer = tokenizer_lib.train(
      sample, tok_cfg.vocab_size, tok_cfg.model_type,
      max_sentences=tok_cfg.max_sentences)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tokenizer.save(path)
  return tokenizer


def load_or_train_tokenizer(data_cfg, spec: corpus_lib.CorpusSpec,
                            corpus_fingerprint: str
                            ) -> tokenizer_lib.Tokenizer:
  """Loads ``tokenizer.model_path`` or trains one on the corpus (cached).

  Raises:
    DataError: the corpus has no text to train on (naming it and what
      reading skipped).
  """
  counts = collections.Counter()
  try:
    return cached_tokenizer(
        data_cfg, (corpus_fingerprint,),
        lambda: (s for doc in corpus_lib.read_documents(spec, counts)
                 for s in doc))
  except tokenizer_lib.NoTrainingText as e:
    raise DataError(
        f'{corpus_lib.describe(spec)}: no text to train a tokenizer on; '
        f'reading it skipped {format_skipped(counts)} ({e}). Check the path,'
        ' the text format and that the files are UTF-8 text.') from e


def _build_index(source, vocab_size: int) -> DocumentIndex:
  lengths, offsets = [], [0]
  counts = np.zeros(vocab_size, np.int64)
  for i in range(len(source)):
    record = source[i]
    lengths.append(record['sentence_lengths'])
    offsets.append(offsets[-1] + len(record['sentence_lengths']))
    counts += np.bincount(record['token_ids'], minlength=vocab_size)
  return DocumentIndex(
      np.concatenate(lengths).astype(np.int32) if lengths
      else np.zeros(0, np.int32), np.asarray(offsets, np.int64), counts)


def prepare(data_cfg, num_threads: int = 0,
            tokenizer: tokenizer_lib.Tokenizer | None = None,
            corpus_fingerprint: str | None = None) -> PreparedData:
  """Tokenizer + pre-tokenized splits + indices, built once and cached.

  Args:
    data_cfg: the config's ``data`` section.
    num_threads: tokenization threads (0 = one per core).
    tokenizer: the result of ``load_or_train_tokenizer`` if the caller
      already has it (e.g. to check it before the expensive build).
    corpus_fingerprint: ``corpus.fingerprint`` of the corpus if the caller
      already computed it (it stats every file of a large corpus).
  """
  spec = corpus_lib.CorpusSpec.from_config(data_cfg.corpus)
  corpus_fp = corpus_fingerprint or corpus_lib.fingerprint(spec)
  if tokenizer is None:
    tokenizer = load_or_train_tokenizer(data_cfg, spec, corpus_fp)
  gazetteer = None
  gazetteer_sha = ''
  if data_cfg.get('gazetteer_path'):
    gazetteer = gazetteer_lib.Gazetteer.load(data_cfg.gazetteer_path,
                                             tokenizer)
    gazetteer_sha = gazetteer_lib.file_sha256(data_cfg.gazetteer_path)
  key = cache_key(FORMAT_VERSION, corpus_fp, tokenizer.sha256,
                  data_cfg.eval_fraction, data_cfg.split_seed, gazetteer_sha)
  builder = PretokenizedCorpus(
      documents_fn=_documents_fn(spec), tokenizer=tokenizer,
      eval_fraction=data_cfg.eval_fraction, split_seed=data_cfg.split_seed,
      num_threads=num_threads or os.cpu_count(), gazetteer=gazetteer,
      corpus_name=corpus_lib.describe(spec),
      data_dir=os.path.join(data_cfg.data_dir, 'pretokenized', key),
      file_format='array_record')
  with _uncompressed_array_record():
    builder.download_and_prepare()
  # Read through a builder restored from the directory: it needs no corpus
  # or tokenizer, so the sources pickle into Grain's worker processes.
  reader = tfds.builder_from_directory(builder.data_dir)
  sources, indices = {}, {}
  for split in ('train', 'eval'):
    source = DocumentSource(reader.as_data_source(split=split))
    path = os.path.join(builder.data_dir, f'index-{split}.npz')
    if not os.path.exists(path):
      _build_index(source, tokenizer.vocab_size).save(path)
    sources[split], indices[split] = source, DocumentIndex.load(path)
  skipped = {key: int(reader.info.metadata['skipped'][key])
             for key in corpus_lib.SKIP_COUNTERS}
  for split in ('train', 'eval'):
    check_split_size(split, indices[split].num_documents,
                     data_cfg.eval_fraction, skipped)
  return PreparedData(tokenizer, sources['train'], sources['eval'],
                      indices['train'], indices['eval'], builder.data_dir,
                      skipped)
