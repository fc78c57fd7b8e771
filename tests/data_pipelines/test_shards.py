"""Sharded pre-tokenization: the same bytes for any number of processes,
resumed after a kill, locked, and refusing a damaged shard by name.

One small corpus (3 files, 45 raw documents, one of them with no text) in
shards of 4 documents: 12 shards, the last one short.
"""

import collections
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from bertjax import config_lib
from bertjax import storage
from data_pipelines import corpus as corpus_lib
from data_pipelines import pretokenize
from data_pipelines import shards
from data_pipelines.prepare import progress as progress_lib
from data_pipelines import tokenizer as tokenizer_lib

_WORDS = ('alpha beta gamma delta epsilon zeta eta theta iota kappa lambda '
          'mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega').split()
DOCS_PER_SHARD = 4
NUM_SHARDS = 12


def _write_corpus(directory):
  rng = np.random.default_rng(0)
  os.makedirs(directory)
  for f in range(3):
    docs = []
    for d in range(15):
      if (f, d) == (1, 3):
        docs.append('\x07\x07\n\x1b[31m')   # No text: parsed to nothing.
        continue
      docs.append('\n'.join(
          ' '.join(rng.choice(_WORDS, rng.integers(3, 12))).capitalize()
          + '.' for _ in range(rng.integers(2, 7))))
    with open(os.path.join(directory, f'part-{f}.txt'), 'w') as fh:
      fh.write('\n\n'.join(docs) + '\n')


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  directory = tmp_path_factory.mktemp('shards')
  _write_corpus(str(directory / 'corpus'))
  spec = corpus_lib.CorpusSpec(source='files', path=str(directory / 'corpus'))
  tokenizer = tokenizer_lib.train(
      (s for d in corpus_lib.read_documents(spec) for s in d), 120, 'unigram')
  tokenizer.save(str(directory / 'spm.model'))
  return directory


def _config(root, name, workers=1):
  cfg = config_lib.base_config()
  d = cfg.data
  d.corpus.source = 'files'
  d.corpus.path = str(root / 'corpus')
  d.tokenizer.model_path = str(root / 'spm.model')
  d.data_dir = str(root / name)
  d.eval_fraction = 0.2
  d.docs_per_shard = DOCS_PER_SHARD
  d.prepare_workers = workers
  return cfg


def _files(directory) -> dict[str, bytes]:
  """Every file under ``directory`` (but the lock), by relative path."""
  out = {}
  for base, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(base, name)
      if not name.endswith('.lock'):
        with open(path, 'rb') as f:
          out[os.path.relpath(path, directory)] = f.read()
  return out


@pytest.fixture(scope='module')
def reference(root):
  """Prepared by this process alone."""
  return pretokenize.prepare(_config(root, 'one').data, num_threads=1)


def test_the_corpus_is_cut_into_shards_of_raw_documents(reference):
  manifest = shards.read_manifest(reference.directory)
  assert manifest['num_shards'] == NUM_SHARDS
  assert manifest['num_raw_documents'] == 45
  # The document with no text keeps its index: 44 records in all.
  assert (manifest['splits']['train']['records']
          + manifest['splits']['eval']['records']) == 44
  assert manifest['skipped']['empty_documents'] == 1
  assert all(manifest['splits'][s]['records'] > 0 for s in shards.SPLITS)


@pytest.mark.parametrize('workers', [2, 3])
def test_any_number_of_workers_writes_the_same_bytes(root, reference,
                                                     workers):
  prepared = pretokenize.prepare(_config(root, f'w{workers}', workers).data)
  assert _files(prepared.directory) == _files(reference.directory)


def test_the_index_merged_from_summaries_is_the_records(reference):
  """The index and unigram counts, merged from the shards' summaries,
  equal what reading every record back gives; records are in corpus
  order within each split."""
  for split in shards.SPLITS:
    source = getattr(reference, f'{split}_source')
    index = getattr(reference, f'{split}_index')
    records = [source[i] for i in range(len(source))]
    assert index.num_documents == len(records)
    np.testing.assert_array_equal(index.sentence_lengths, np.concatenate(
        [r['sentence_lengths'] for r in records]))
    np.testing.assert_array_equal(np.diff(index.document_offsets),
                                  [len(r['sentence_lengths'])
                                   for r in records])
    np.testing.assert_array_equal(index.unigram_counts, np.bincount(
        np.concatenate([r['token_ids'] for r in records]),
        minlength=reference.tokenizer.vocab_size))
  # Corpus order: the first training record is the first document.
  spec = corpus_lib.CorpusSpec(source='files', path=str(
      os.path.dirname(reference.directory).replace(
          os.path.join('one', 'pretokenized'), 'corpus')))
  first = next(corpus_lib.read_documents(spec))
  np.testing.assert_array_equal(
      reference.train_source[0]['token_ids'],
      np.concatenate(reference.tokenizer.encode(first)))


def test_records_are_the_bytes_of_tfds_examples():
  from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  for n in (0, 1, 127, 128, 20_000):
    record = {'token_ids': rng.integers(0, 30_000, n).astype(np.int32),
              'sentence_lengths': np.array([n], np.int32),
              'word_starts': rng.random(n) < 0.5,
              'unit_labels': rng.integers(0, 3, n).astype(np.int8),
              'capitalized': rng.random(n) < 0.1}
    example = tf_example_pb2.Example()
    for name, dtype in shards.FEATURES.items():
      example.features.feature[name].bytes_list.value.append(
          record[name].astype(dtype).tobytes())
    assert shards.serialize(record) == example.SerializeToString(
        deterministic=True)


_KILLED_RUN = r'''
import os, signal, sys
from bertjax import config_lib
from bertjax import storage
from data_pipelines import pretokenize, shards
cfg = config_lib.base_config()
d = cfg.data
d.corpus.source = 'files'
d.corpus.path, d.tokenizer.model_path, d.data_dir = sys.argv[1:4]
d.eval_fraction, d.docs_per_shard = 0.2, %d
serialize, written = shards.serialize, []
def dying(record):
  written.append(1)
  if len(written) == int(sys.argv[4]):   # In the middle of a shard.
    os.kill(os.getpid(), signal.SIGKILL)
  return serialize(record)
shards.serialize = dying
pretokenize.prepare(d, num_threads=1)
''' % DOCS_PER_SHARD


def test_a_killed_preparation_resumes_to_the_same_bytes(root, reference):
  cfg = _config(root, 'killed', workers=2)
  run = subprocess.run(
      [sys.executable, '-c', _KILLED_RUN, cfg.data.corpus.path,
       cfg.data.tokenizer.model_path, cfg.data.data_dir, '18'],
      capture_output=True, text=True, check=False)
  assert run.returncode == -signal.SIGKILL, run.stderr
  directory = pretokenize.plan(cfg.data).directory
  assert shards.read_manifest(directory) is None
  finished = [n for n in range(NUM_SHARDS)
              if shards.load_summary(directory, n) is not None]
  assert finished == [0, 1, 2, 3]   # 18 records: 4 shards and a half.
  assert any('.tmp-' in name for name in os.listdir(directory))
  reused = []
  pretokenize.write(pretokenize.plan(cfg.data), workers=2,
                    progress=lambda summary, was_reused: reused.append(
                        was_reused))
  assert reused == [True] * 4 + [False] * (NUM_SHARDS - 4)
  assert _files(directory) == _files(reference.directory)


def test_two_preparations_of_one_key_take_turns(root, reference):
  """The second waits for the lock, then reuses what the first wrote."""
  cfg = _config(root, 'locked')
  the_plan = pretokenize.plan(cfg.data)
  written = collections.Counter()
  results = []

  def prepare(name):
    results.append(pretokenize.write(
        the_plan, progress=lambda s, reused: written.update(
            [(name, reused)])))

  with pretokenize.locked(the_plan.directory):
    threads = [threading.Thread(target=prepare, args=(n,)) for n in 'ab']
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=0.5)
    assert all(t.is_alive() for t in threads)   # Waiting for the lock.
    assert not os.path.exists(the_plan.directory)
  for t in threads:
    t.join()
  # One wrote every shard; the other found the manifest and wrote nothing.
  assert sorted(written.values()) == [NUM_SHARDS]
  assert results[0] == results[1]
  assert _files(the_plan.directory) == _files(reference.directory)


def _copy(reference, root, name):
  target = root / name / 'pretokenized' / os.path.basename(
      reference.directory)
  shutil.copytree(reference.directory, target)
  return str(target)


def test_a_truncated_shard_is_refused_by_name(root, reference):
  directory = _copy(reference, root, 'truncated')
  path = shards.shard_path(directory, 'train', 5)
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 3)
  with pytest.raises(pretokenize.DataError) as error:
    pretokenize.prepare(_config(root, 'truncated').data)
  assert path in str(error.value) and 'truncated' in str(error.value)
  # Its summary no longer counts it as written: preparing again rewrites it.
  assert shards.load_summary(directory, 5) is None
  # Nor does a summary cut short (damaged outside a write, which is atomic).
  assert shards.load_summary(directory, 4) is not None
  summary = shards.summary_path(directory, 4)
  with open(summary, 'r+b') as f:
    f.truncate(os.path.getsize(summary) // 2)
  assert shards.load_summary(directory, 4) is None


def test_a_corrupt_shard_is_found_by_its_checksum(root, reference):
  directory = _copy(reference, root, 'corrupt')
  path = shards.shard_path(directory, 'eval', 2)
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x40]))
  manifest = shards.read_manifest(directory)
  shards.check_shards(directory, manifest)   # Sizes alone: it passes.
  with pytest.raises(shards.ShardError, match='corrupt') as error:
    shards.check_shards(directory, manifest, full=True)
  assert path in str(error.value)


def test_the_fingerprint_of_many_files_reads_none(tmp_path, monkeypatch):
  """10,000 files: stat'ed, never opened."""
  for i in range(10_000):
    (tmp_path / f'{i:05d}.txt').touch()
  spec = corpus_lib.CorpusSpec(source='files', path=str(tmp_path))
  before = corpus_lib.fingerprint(spec)

  def refuse(*args, **kwargs):
    raise AssertionError(f'opened {args[0]}')
  monkeypatch.setattr(corpus_lib, 'open_binary', refuse)
  monkeypatch.setattr('builtins.open', refuse)
  assert corpus_lib.fingerprint(spec) == before
  os.utime(tmp_path / '09999.txt', ns=(0, 0))
  assert corpus_lib.fingerprint(spec) != before


def test_the_beam_pipeline_writes_the_same_bytes(root, reference):
  """Beam's DirectRunner, in two processes, cuts and writes the shards of
  the local path: the same directory, byte for byte."""
  from data_pipelines import beam  # pylint: disable=g-import-not-at-top
  the_plan = pretokenize.plan(_config(root, 'beam').data)
  beam.run(the_plan, workers=2)
  assert _files(the_plan.directory) == _files(reference.directory)


def _bucket_files(url: str) -> dict[str, bytes]:
  """Every object under ``url``, by path relative to it."""
  return {os.path.relpath(path, url): storage.read_bytes(path)
          for path in storage.find(url)}


@pytest.mark.parametrize('runner', ['local', 'beam'])
def test_a_corpus_and_data_in_a_bucket(root, reference, gcs_bucket, runner):
  """Corpus, tokenizer and data dir in a bucket (a Cloud Storage API on
  localhost): written by two processes (or Beam's DirectRunner) through
  the same clients as on GCS, the same bytes as the local preparation
  (the manifest names the corpus's path), and read back by ArrayRecord's
  own GCS client."""
  from data_pipelines import beam  # pylint: disable=g-import-not-at-top
  bucket = f'{gcs_bucket}/{runner}'
  for name in sorted(os.listdir(root / 'corpus')):
    data = (root / 'corpus' / name).read_bytes()
    if name == 'part-2.txt':   # Read decompressed as it streams.
      name, data = name + '.gz', gzip.compress(data, mtime=0)
    storage.write_bytes(f'{bucket}/corpus/{name}', data)
  storage.write_bytes(f'{bucket}/spm.model', (root / 'spm.model').read_bytes())
  cfg = _config(root, 'unused', workers=2)
  cfg.data.corpus.path = f'{bucket}/corpus'
  cfg.data.tokenizer.model_path = f'{bucket}/spm.model'
  cfg.data.data_dir = f'{bucket}/data'
  the_plan = pretokenize.plan(cfg.data)
  if runner == 'beam':
    beam.run(the_plan, workers=2)
  else:   # As the command runs it: a progress bar over the text's size.
    files = corpus_lib.files(the_plan.spec)
    size = progress_lib.estimated_text_size(files)
    assert size == sum(len(storage.read_bytes(f)) * (
        3.0 if f.endswith('.gz') else 1) for f in files) > 0
    progress = progress_lib.Progress(size)
    manifest = pretokenize.write(the_plan, workers=2, progress=progress)
    progress.close()
    assert (progress.written, progress.documents) == (
        manifest['num_shards'], manifest['num_raw_documents'])
  written, expected = _bucket_files(the_plan.directory), _files(
      reference.directory)
  manifest = [json.loads(x.pop(shards.MANIFEST)) for x in (written, expected)]
  assert written == expected
  assert manifest[0].pop('corpus') == (
      f"corpus.path='{bucket}/corpus' (sentence_per_line)")
  manifest[1].pop('corpus')
  assert manifest[0] == manifest[1]
  prepared = pretokenize.load(the_plan)
  for split in shards.SPLITS:
    source = getattr(prepared, f'{split}_source')
    assert len(source) == len(getattr(reference, f'{split}_source'))
    np.testing.assert_array_equal(
        source[len(source) - 1]['token_ids'],
        getattr(reference, f'{split}_source')[len(source) - 1]['token_ids'])


def _open_shards(directory) -> set[str]:
  """The shard files this process has open."""
  paths = set()
  for fd in os.listdir('/proc/self/fd'):
    try:
      target = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
      continue
    if target.startswith(directory) and '.array_record-' in target:
      paths.add(os.path.basename(target))
  return paths


def test_reading_a_record_opens_only_its_shard(root, reference):
  """At pod scale a host reads some documents of many shards: a source
  opens a shard's file when one of its records is read, not before."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  # A copy: other tests' sources keep the reference's files open.
  directory = _copy(reference, root, 'lazy')
  before = _open_shards(directory)
  assert not before
  source = pretokenize.DocumentSource(
      tfds.builder_from_directory(directory).as_data_source(split='train'))
  assert _open_shards(directory) == before
  last = source[len(source) - 1]
  np.testing.assert_array_equal(
      last['token_ids'], reference.train_source[len(source) - 1]['token_ids'])
  assert _open_shards(directory) - before == {
      f'{shards.DATASET_NAME}-train.array_record-{NUM_SHARDS - 1:05d}'}


def test_the_command_prepares_what_the_trainer_reuses(root, reference,
                                                      monkeypatch):
  """``python -m data_pipelines.prepare`` writes the trainer's data: the
  same bytes, found by the same config, and not written again."""
  cfg = _config(root, 'command')
  args = [f'--config.data.{k}={v}' for k, v in (
      ('corpus.source', 'files'), ('corpus.path', cfg.data.corpus.path),
      ('tokenizer.model_path', cfg.data.tokenizer.model_path),
      ('data_dir', cfg.data.data_dir), ('eval_fraction', 0.2),
      ('docs_per_shard', DOCS_PER_SHARD))]
  run = subprocess.run(
      [sys.executable, '-m', 'data_pipelines.prepare',
       '--config=experiments/configs/demo.py', '--workers=2', *args],
      capture_output=True, text=True, check=False,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(
          os.path.abspath(__file__)))))
  assert run.returncode == 0, run.stderr[-2000:]
  assert f'{NUM_SHARDS} shards of {DOCS_PER_SHARD} raw documents' in run.stdout
  assert 'docs' in run.stderr and 'tokens/s' in run.stderr   # Progress.

  def refuse(*args, **kwargs):
    raise AssertionError('a shard was written again')
  monkeypatch.setattr(shards, 'write_shard', refuse)
  prepared = pretokenize.prepare(cfg.data)
  assert _files(prepared.directory) == _files(reference.directory)


def test_verify_before_any_preparation_trains_and_writes_nothing(tmp_path):
  """``prepare --verify`` plans with ``may_train=False``: a config whose
  tokenizer is not trained yet is an error, and nothing is written (a
  tokenizer trained only to find no shards would cost a corpus pass)."""
  data = config_lib.demo_config().data
  data.corpus.source = 'files'
  data.corpus.path = _sample_corpus(str(tmp_path / 'corpus')).path
  data.data_dir = str(tmp_path / 'data')
  with pytest.raises(pretokenize.DataError, match='not trained yet'):
    pretokenize.plan(data, may_train=False)
  assert sorted(os.listdir(tmp_path)) == ['corpus']


def _sample_corpus(directory, documents=10, sentences=10):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'a.txt'), 'w') as f:
    f.write('\n\n'.join('\n'.join(f'D{d} s{s}.' for s in range(sentences))
                        for d in range(documents)) + '\n')
  return corpus_lib.CorpusSpec(source='files', path=directory)


def test_the_tokenizer_sample_is_uniform_and_in_corpus_order(tmp_path):
  """Every sentence is in the sample with probability k / n: a chi-square
  test of the inclusion counts over 2000 seeds (99 degrees of freedom,
  p = 0.001 bound 148.2); a corpus of at most k sentences is all of it."""
  spec = _sample_corpus(str(tmp_path))
  everything = [s for d in corpus_lib.read_documents(spec) for s in d]
  assert pretokenize.sample_corpus(spec, 100, 0) == everything
  assert pretokenize.sample_corpus(spec, 500, 0) == everything
  n, k, seeds = 100, 10, 2000
  counts = collections.Counter()
  for seed in range(seeds):
    sample = pretokenize.sample_corpus(spec, k, seed, docs_per_shard=3)
    assert len(set(sample)) == k
    assert sample == [s for s in everything if s in sample]   # In order.
    counts.update(sample)
  expected = seeds * k / n
  chi2 = sum((counts[s] - expected) ** 2 / expected for s in everything)
  assert chi2 < 148.2, chi2
  assert pretokenize.sample_corpus(spec, k, 7) != pretokenize.sample_corpus(
      spec, k, 8)


def test_the_tokenizer_sample_is_the_same_for_any_workers_and_shards(
    tmp_path):
  spec = _sample_corpus(str(tmp_path), documents=40, sentences=25)
  one = pretokenize.sample_corpus(spec, 60, 3, workers=1, docs_per_shard=40)
  assert len(one) == 60
  assert pretokenize.sample_corpus(spec, 60, 3, workers=1,
                                   docs_per_shard=1) == one
  assert pretokenize.sample_corpus(spec, 60, 3, workers=2,
                                   docs_per_shard=3) == one


@pytest.mark.parametrize('total', [None, 3 * 2**20])
def test_the_progress_bar_with_and_without_a_known_size(capsys, total):
  """A corpus of unknown size (embedded, TFDS) gets a bar with no ETA."""
  from data_pipelines.prepare import progress as progress_lib  # pylint: disable=g-import-not-at-top
  bar = progress_lib.Progress(total)
  summary = {'num_raw_documents': 5, 'text_size': 2**20,
             'train': {'tokens': 900}, 'eval': {'tokens': 100}}
  bar(summary, False)
  bar(summary, True)
  bar.close()
  err = capsys.readouterr().err
  assert '10 docs' in err and 'tokens/s' in err
  assert ('2/3 MB' in err) == (total is not None)
  assert (bar.written, bar.reused, bar.tokens) == (1, 1, 1000)
