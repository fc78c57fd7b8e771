"""Tokenize a corpus once into sharded ArrayRecord files (shards.py).

The result lives in ``data_dir/pretokenized/<key>``, the key a fingerprint
of the corpus, the tokenizer, the split settings and the shard size, so a
change rebuilds and a rerun reuses. Each record is one document, in corpus
order:

  token_ids:        int32 [num_tokens]     all sentences, concatenated
  sentence_lengths: int32 [num_sentences]  tokens per sentence
  word_starts:      bool  [num_tokens]     does the token start a word?
  unit_labels:      int8  [num_tokens]     entity/phrase units (gazetteer.py
                                           or annotations.py)
  capitalized:      bool  [num_tokens]     does the token start a word whose
                                           first cased character is upper
                                           case in the original text? (Only
                                           when the tokenizer lowercases;
                                           False everywhere otherwise.)

Next to the shards, ``index-<split>/`` holds what instance planning needs
without reading the documents again (sentence lengths per document) and the
corpus unigram counts, merged from the shards' summaries; ``manifest.json``
holds what reading and tokenizing skipped or repaired
(``corpus.SKIP_COUNTERS``), so a run that reuses the data reports the same
counts. The directory is a TFDS dataset too (``dataset_info.json``):
``tfds.builder_from_directory(...).as_data_source()`` gives random access
without TensorFlow, which Grain needs, and opens a shard's file only when a
record of it is read.

Preparation is parallel (``data.prepare_workers`` processes), resumable (a
killed one keeps its finished shards) and locked (two processes preparing
the same key wait for each other); ``python -m data_pipelines.prepare``
runs it on its own, locally or as an Apache Beam pipeline (beam.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import hashlib
import heapq
import json
import os
from typing import Callable

from absl import logging
import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from bertjax import errors
from bertjax import storage
from data_pipelines import corpus as corpus_lib
from data_pipelines import shards
from data_pipelines import tokenizer as tokenizer_lib

# Bump when the record layout, the split rule, or what reading keeps changes.
# 1.4.0: skip counts in the metadata; lines of control characters dropped
# instead of ending a document; escape sequences removed; long sentences cut.
# 2.0.0: sharded, written in corpus order (TFDS's writer ordered records by
# a hash of their keys); a document's index counts raw documents
# (corpus.raw_documents), those with no text included.
# 2.1.0: a 'capitalized' feature (tokenizer.capitalized_words) per token.
# 2.1.1: in corpora with spans, a sentence's leading bare "▁" is placed with
# the token after it (Tokenizer.encode_with_offsets), so it joins the first
# word instead of being a word of its own (in a non-ASCII sentence it took
# the first character's place).
FORMAT_VERSION = '2.1.1'
# Formats whose documents, order and indices are this one's (a later one
# only added a field, or changed only a leading "▁"'s word flag in corpora
# with spans): a checkpoint trained on one resumes on the batches it would
# have seen (on a corpus with word spans, but for those flags).
SAME_BATCHES_FORMATS = ('2.0.0', '2.1.0', FORMAT_VERSION)
FEATURES = shards.FEATURES
ARRAY_RECORD_OPTIONS = shards.ARRAY_RECORD_OPTIONS
DocumentIndex = shards.DocumentIndex
# data.docs_per_shard when the config has none.
DEFAULT_DOCS_PER_SHARD = 2000


class DataError(errors.UserError, ValueError):
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


def cache_key(*parts) -> str:
  """A short digest of JSON-able ``parts``: a cache directory's name."""
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()
                        ).hexdigest()[:16]


def cached_tokenizer(data_cfg, text_key: tuple,
                     sample_fn: Callable[[int, int], list[str]],
                     method: str, may_train: bool = True
                     ) -> tokenizer_lib.Tokenizer:
  """Loads ``tokenizer.model_path``, or trains one on
  ``sample_fn(tokenizer.max_sentences, tokenizer.sample_seed)``: a seeded
  uniform sample of the text's sentences (all of them if there are fewer).

  A trained model is cached in ``data_dir/tokenizers/<key>/spm.model``, the
  key covering ``text_key`` (what identifies the training text), the
  sampling ``method`` and the tokenizer settings; ``tokenizer.lowercase``
  trains a case-folding model (``tokenizer_lib.train``). ``may_train``
  False: a model not yet trained is a ``DataError`` (writes nothing).
  """
  tok_cfg = data_cfg.tokenizer
  if tok_cfg.model_path:
    return tokenizer_lib.Tokenizer.load(tok_cfg.model_path)
  seed = tok_cfg.get('sample_seed', 0)
  lowercase = bool(tok_cfg.get('lowercase', False))
  # Only a lowercasing model adds to the key: the cased models trained
  # before the option existed keep theirs.
  key = cache_key(*text_key, tok_cfg.vocab_size, tok_cfg.model_type,
                  tok_cfg.max_sentences, tokenizer_lib.TRAINING_THREADS,
                  method, seed, *(('lowercase',) if lowercase else ()))
  path = os.path.join(data_cfg.data_dir, 'tokenizers', key, 'spm.model')
  if storage.exists(path):
    return tokenizer_lib.Tokenizer.load(path)
  if not may_train:
    raise DataError(f'this config\'s tokenizer is not trained yet (no '
                    f'{path}): the data is not prepared. Prepare it first '
                    '(the same command without --verify, or a training '
                    'run).')
  logging.info('Training a %s%s SentencePiece model of %d pieces -> %s',
               'lowercasing ' if lowercase else '', tok_cfg.model_type,
               tok_cfg.vocab_size, path)
  tokenizer = tokenizer_lib.train(
      sample_fn(tok_cfg.max_sentences, seed), tok_cfg.vocab_size,
      tok_cfg.model_type, max_sentences=tok_cfg.max_sentences,
      lowercase=lowercase)
  storage.makedirs(os.path.dirname(path))
  tokenizer.save(path)
  return tokenizer


def sample_corpus(spec: corpus_lib.CorpusSpec, k: int, seed: int,
                  workers: int = 1,
                  docs_per_shard: int = DEFAULT_DOCS_PER_SHARD,
                  counts: collections.Counter | None = None) -> list[str]:
  """A seeded uniform sample of ``k`` of the corpus's sentences (all of
  them if there are fewer), in corpus order, drawn by ``workers``
  processes in one pass (``shards.sample_shard``: the ``k`` smallest
  sentence keys). The same sentences for any number of processes; memory
  for the sample and a shard per process.

  Each shard is asked only for keys up to the largest of the ``k`` kept so
  far, so after the first ``k`` sentences, about ``k * ln(n / k)`` more
  of the corpus's ``n`` come back to this process.
  """
  return in_corpus_order(smallest_keys(spec, k, seed, workers,
                                       docs_per_shard, counts))


def smallest_keys(spec: corpus_lib.CorpusSpec, k: int, seed: int,
                  workers: int = 1,
                  docs_per_shard: int = DEFAULT_DOCS_PER_SHARD,
                  counts: collections.Counter | None = None) -> list[tuple]:
  """``sample_corpus``'s sample as (key, document, index, sentence), by
  key: its first ``q`` are a uniform sample of ``q`` sentences."""
  counts = collections.Counter() if counts is None else counts
  kept: list = []   # A max-heap of the k smallest (key, doc, sentence).

  def tasks():
    for _, first, chunk in shards.chunks(
        corpus_lib.raw_documents(spec, counts), docs_per_shard):
      threshold = (shards.ALL_KEYS if len(kept) < k
                   else np.uint64(-kept[0][0]))
      yield seed, first, chunk, threshold, k

  for found, shard_counts in shards.ordered_map(shards.sample_shard,
                                                tasks(), workers):
    counts.update(shard_counts)
    for key, document, index, sentence in found:
      entry = (-key, -document, -index, sentence)
      if len(kept) < k:
        heapq.heappush(kept, entry)
      elif entry > kept[0]:
        heapq.heapreplace(kept, entry)
  return sorted((-key, -document, -index, sentence)
                for key, document, index, sentence in kept)


def in_corpus_order(sample: list[tuple]) -> list[str]:
  """The sentences of a ``smallest_keys`` sample, in corpus order."""
  return [sentence for _, _, _, sentence in sorted(
      sample, key=lambda entry: (entry[1], entry[2]))]


def prepare_workers(data_cfg) -> int:
  """Processes that prepare the data (``data.prepare_workers``)."""
  return data_cfg.get('prepare_workers', 1) or os.cpu_count() or 1


def load_or_train_tokenizer(data_cfg, spec: corpus_lib.CorpusSpec,
                            corpus_fingerprint: str, may_train: bool = True
                            ) -> tokenizer_lib.Tokenizer:
  """Loads ``tokenizer.model_path`` or trains one on a sample of the
  corpus (``sample_corpus``, by ``data.prepare_workers`` processes;
  cached; ``may_train`` as in ``cached_tokenizer``).

  Raises:
    DataError: the corpus has no text to train on (naming it and what
      reading skipped).
  """
  counts = collections.Counter()
  try:
    return cached_tokenizer(
        data_cfg, (corpus_fingerprint,),
        lambda k, seed: sample_corpus(
            spec, k, seed, prepare_workers(data_cfg),
            data_cfg.get('docs_per_shard', DEFAULT_DOCS_PER_SHARD), counts),
        method='bottom-k', may_train=may_train)
  except tokenizer_lib.NoTrainingText as e:
    raise DataError(
        f'{corpus_lib.describe(spec)}: no text to train a tokenizer on; '
        f'reading it skipped {format_skipped(counts)} ({e}). Check the path,'
        ' the text format and that the files are UTF-8 text.') from e


@contextlib.contextmanager
def locked(directory: str):
  """Holds an exclusive lock on local ``directory`` (a file next to it):
  two processes preparing the same data take turns, and the second reuses
  what the first wrote.

  A bucket has no locks, and needs none: every file is written in one
  upload under its final name, and two preparations of one key write the
  same bytes, so the second's uploads replace the first's with equal
  objects (at worst repeating its work).
  """
  if storage.is_remote(directory):
    yield
    return
  os.makedirs(os.path.dirname(directory), exist_ok=True)
  with open(f'{directory}.lock', 'a+') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info('Waiting for another process preparing %s', directory)
      fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


@dataclasses.dataclass(frozen=True)
class Plan:
  """Where and how one config's data is prepared (``plan``)."""
  spec: corpus_lib.CorpusSpec
  tokenizer: tokenizer_lib.Tokenizer
  directory: str
  settings: shards.Settings
  docs_per_shard: int
  eval_fraction: float

  def metadata(self) -> dict:
    return {'format_version': FORMAT_VERSION,
            'docs_per_shard': self.docs_per_shard,
            'tokenizer_sha256': self.tokenizer.sha256,
            'vocab_size': self.tokenizer.vocab_size,
            'corpus': corpus_lib.describe(self.spec)}

  def check(self, manifest: dict) -> None:
    """Refuses a corpus with no text, or a split too small to use."""
    sizes = {s: manifest['splits'][s]['records'] for s in shards.SPLITS}
    skipped = manifest['skipped']
    if not sum(sizes.values()):
      raise DataError(
          f'{corpus_lib.describe(self.spec)}: no document has text to '
          f'pre-tokenize; preparing the data skipped '
          f'{format_skipped(skipped)} (see corpus.SKIP_COUNTERS). Check the '
          'path, the text format and that the files are UTF-8 text.')
    for split in shards.SPLITS:
      check_split_size(split, sizes[split], self.eval_fraction, skipped)


def plan(data_cfg, num_threads: int = 0,
         tokenizer: tokenizer_lib.Tokenizer | None = None,
         corpus_fingerprint: str | None = None,
         may_train: bool = True) -> Plan:
  """The tokenizer (trained if needed and ``may_train``) and the data's
  directory and settings, before any shard is written."""
  spec = corpus_lib.CorpusSpec.from_config(data_cfg.corpus)
  corpus_fp = corpus_fingerprint or corpus_lib.fingerprint(spec)
  if tokenizer is None:
    tokenizer = load_or_train_tokenizer(data_cfg, spec, corpus_fp,
                                        may_train)
  gazetteer_path = data_cfg.get('gazetteer_path') or None
  gazetteer_sha = (storage.sha256(gazetteer_path)
                   if gazetteer_path else '')
  docs_per_shard = data_cfg.get('docs_per_shard', DEFAULT_DOCS_PER_SHARD)
  key = cache_key(FORMAT_VERSION, corpus_fp, tokenizer.sha256,
                  data_cfg.eval_fraction, data_cfg.split_seed, gazetteer_sha,
                  docs_per_shard)
  directory = os.path.join(data_cfg.data_dir, 'pretokenized', key)
  settings = shards.Settings(
      directory=directory, tokenizer_proto=tokenizer.model_proto,
      eval_fraction=data_cfg.eval_fraction, split_seed=data_cfg.split_seed,
      gazetteer_path=gazetteer_path,
      threads=num_threads or os.cpu_count() or 1)
  if gazetteer_path:
    # Loaded now, to fail before any shard is written; this process's
    # writer finds it loaded (spawned ones load their own).
    shards.load_tools(settings)
  return Plan(spec, tokenizer, directory, settings, docs_per_shard,
              data_cfg.eval_fraction)


def write(the_plan: Plan, workers: int = 1,
          progress: Callable[[dict, bool], None] | None = None) -> dict:
  """Writes the plan's shards here (``workers`` processes, 1 = this one),
  keeping those a killed run finished, and merges them. Returns the
  manifest; reuses a finished directory."""
  with locked(the_plan.directory):
    manifest = shards.read_manifest(the_plan.directory)
    if manifest is not None:
      return manifest
    counts = collections.Counter()
    settings = (the_plan.settings if workers <= 1 else
                dataclasses.replace(the_plan.settings, threads=1))
    num_shards = shards.write_local(
        corpus_lib.raw_documents(the_plan.spec, counts), settings,
        the_plan.docs_per_shard, workers, progress)
    return shards.finish(the_plan.directory, num_shards, counts,
                         the_plan.metadata(), the_plan.check)


def load(the_plan: Plan) -> PreparedData:
  """The prepared data of a finished directory, its shards checked."""
  directory = the_plan.directory
  manifest = shards.read_manifest(directory)
  if manifest is None:
    raise DataError(f'{directory} has no {shards.MANIFEST}: its preparation '
                    'did not finish. Prepare it again (it resumes).')
  try:
    shards.check_shards(directory, manifest)
  except shards.ShardError as e:
    raise DataError(str(e)) from e
  the_plan.check(manifest)
  reader = tfds.builder_from_directory(directory)
  sources = {s: DocumentSource(reader.as_data_source(split=s))
             for s in shards.SPLITS}
  indices = {s: DocumentIndex.load(os.path.join(directory, f'index-{s}'))
             for s in shards.SPLITS}
  skipped = {k: int(manifest['skipped'][k]) for k in corpus_lib.SKIP_COUNTERS}
  return PreparedData(the_plan.tokenizer, sources['train'], sources['eval'],
                      indices['train'], indices['eval'], directory, skipped)


def prepare(data_cfg, num_threads: int = 0,
            tokenizer: tokenizer_lib.Tokenizer | None = None,
            corpus_fingerprint: str | None = None) -> PreparedData:
  """Tokenizer + pre-tokenized splits + indices, built once and cached.

  Args:
    data_cfg: the config's ``data`` section; ``data.prepare_workers``
      processes write the shards (1: this process).
    num_threads: SentencePiece's threads when this process writes
      (0 = one per core).
    tokenizer: the result of ``load_or_train_tokenizer`` if the caller
      already has it (e.g. to check it before the expensive build).
    corpus_fingerprint: ``corpus.fingerprint`` of the corpus if the caller
      already computed it (it stats every file of a large corpus).
  """
  the_plan = plan(data_cfg, num_threads, tokenizer, corpus_fingerprint)
  write(the_plan, prepare_workers(data_cfg))
  return load(the_plan)
