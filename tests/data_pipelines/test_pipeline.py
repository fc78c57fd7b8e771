"""End-to-end tests of the input pipeline on a tiny corpus in a temp dir.

Corpus -> tokenizer -> pre-tokenized ArrayRecord -> instances -> masked
batches, through ``pretokenize.prepare`` and ``pipeline``.
"""

import copy
import itertools
import os
import time

import numpy as np
import pytest

from bertjax import config_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import instances
from data_pipelines import masking
from data_pipelines import pipeline
from data_pipelines import pretokenize
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID

import masked_units

_SYLLABLES = ('ka to ri an mel so vu ne pa li ost er gan du ba fe hi '
              'jo lu mar').split()


def _write_corpus(directory, num_docs=80, num_files=4, seed=0):
  """Documents of made-up words, Zipf-distributed, one sentence per line."""
  rng = np.random.default_rng(seed)
  words = [''.join(rng.choice(_SYLLABLES, rng.integers(1, 4)))
           for _ in range(500)]
  weights = 1 / np.arange(1, len(words) + 1)
  weights /= weights.sum()
  os.makedirs(directory)
  for f in range(num_files):
    docs = []
    for _ in range(num_docs // num_files):
      sentences = [' '.join(rng.choice(words, rng.integers(3, 15), p=weights)
                            ).capitalize() + '.'
                   for _ in range(rng.integers(4, 12))]
      docs.append('\n'.join(sentences))
    with open(os.path.join(directory, f'part-{f}.txt'), 'w') as fh:
      fh.write('\n\n'.join(docs) + '\n')


def _config(tmp_dir, vocab_size=300):
  cfg = config_lib.base_config()
  cfg.seed = 7
  cfg.batch_size = 8
  cfg.data.corpus.source = 'files'
  cfg.data.corpus.path = os.path.join(tmp_dir, 'corpus')
  cfg.data.corpus.text_format = 'sentence_per_line'
  cfg.data.data_dir = os.path.join(tmp_dir, 'data')
  cfg.data.tokenizer.vocab_size = vocab_size
  cfg.data.eval_fraction = 0.2
  cfg.data.docs_per_shard = 16    # 80 documents: the pipeline reads 5 shards.
  cfg.data.max_seq_length = 64
  cfg.data.dupe_factor = 2
  cfg.data.num_threads = 2
  cfg.data.prefetch_batches = 2
  cfg.masking.max_predictions_per_seq = 10
  cfg.eval.num_batches = 2
  return cfg


@pytest.fixture(scope='module')
def tmp_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('pipeline'))
  _write_corpus(os.path.join(directory, 'corpus'))
  return directory


@pytest.fixture(scope='module')
def cfg(tmp_dir):
  return _config(tmp_dir)


@pytest.fixture(scope='module')
def prepared(cfg):
  return pretokenize.prepare(cfg.data, num_threads=2)


def _host_rows(cfg, process_index, process_count):
  return instances.host_rows(cfg.batch_size, process_index, process_count)


def _take(cfg, prepared, n, process_index=0, process_count=1):
  ds = pipeline.train_dataset(
      prepared, cfg, _host_rows(cfg, process_index, process_count))
  return list(itertools.islice(iter(ds), n))


def _assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _rows(batch):
  """A batch as a sorted list of rows, each a tuple of per-field bytes."""
  n = len(batch['input_ids'])
  return sorted(tuple(batch[k][i].tobytes() for k in sorted(batch))
                for i in range(n))


# ---------------------------------------------------------------------------
# Preparation and caching.


def test_prepare(prepared, cfg):
  tok = prepared.tokenizer
  assert 250 < tok.vocab_size <= 300
  assert prepared.directory.startswith(cfg.data.data_dir)
  # Every document lands in exactly one split; eval is about 20%.
  num_docs = (prepared.train_index.num_documents +
              prepared.eval_index.num_documents)
  assert num_docs == 80
  assert 5 <= prepared.eval_index.num_documents <= 30
  assert len(prepared.train_source) == prepared.train_index.num_documents
  assert len(prepared.eval_source) == prepared.eval_index.num_documents
  for source, index in ((prepared.train_source, prepared.train_index),
                        (prepared.eval_source, prepared.eval_index)):
    offsets = index.document_offsets
    counts = np.zeros(tok.vocab_size, np.int64)
    for d in range(len(source)):
      record = source[d]
      ids = record['token_ids']
      np.testing.assert_array_equal(
          record['sentence_lengths'],
          index.sentence_lengths[offsets[d]:offsets[d + 1]])
      assert record['sentence_lengths'].sum() == len(ids)
      assert ids.min() >= tokenizer_lib.NUM_SPECIAL
      np.testing.assert_array_equal(record['word_starts'],
                                    tok.word_starts(ids))
      counts += np.bincount(ids, minlength=tok.vocab_size)
    np.testing.assert_array_equal(index.unigram_counts, counts)


def test_document_source_decodes_like_tfds(prepared):
  # The fast reader must return exactly what TFDS's own decoder returns.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  reader = tfds.builder_from_directory(prepared.directory)
  for split, source in (('train', prepared.train_source),
                        ('eval', prepared.eval_source)):
    reference = reader.as_data_source(split=split)
    assert len(source) == len(reference)
    for i in range(len(source)):
      ours, theirs = source[i], reference[i]
      assert ours.keys() == theirs.keys()
      for key in ours:
        assert ours[key].dtype == theirs[key].dtype, key
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_records_are_written_uncompressed(prepared):
  # TFDS's own writer would compress each record with zstd.
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  files = [os.path.join(root, name)
           for root, _, names in os.walk(prepared.directory)
           for name in names if '.array_record' in name]
  assert len(files) == 2 * 5  # train and eval of each shard
  for path in files:
    reader = array_record_module.ArrayRecordReader(path, '')
    assert 'uncompressed' in reader.writer_options_string()
    reader.close()


def test_pretokenized_text_decodes_to_the_corpus(prepared, cfg):
  corpus_text = set()
  for name in os.listdir(cfg.data.corpus.path):
    with open(os.path.join(cfg.data.corpus.path, name)) as f:
      corpus_text.update(line.strip() for line in f if line.strip())
  tok = prepared.tokenizer
  record = prepared.train_source[0]
  csum = np.concatenate([[0], np.cumsum(record['sentence_lengths'])])
  for s in range(len(csum) - 1):
    assert tok.decode(record['token_ids'][csum[s]:csum[s + 1]]) in (
        corpus_text)


def test_rebuild_reuses_the_cache(prepared, cfg, monkeypatch):
  def no_training(*args, **kwargs):
    raise AssertionError('the tokenizer was trained again')

  monkeypatch.setattr(tokenizer_lib, 'train', no_training)
  files = sorted(os.path.join(root, name)
                 for root, _, names in os.walk(prepared.directory)
                 for name in names)
  mtimes = [os.stat(f).st_mtime_ns for f in files]
  t0 = time.time()
  again = pretokenize.prepare(cfg.data, num_threads=2)
  assert time.time() - t0 < 10
  assert again.directory == prepared.directory
  assert again.tokenizer.sha256 == prepared.tokenizer.sha256
  assert [os.stat(f).st_mtime_ns for f in files] == mtimes
  np.testing.assert_array_equal(again.train_index.sentence_lengths,
                                prepared.train_index.sentence_lengths)


def test_changed_settings_use_another_directory(prepared, tmp_dir):
  other = _config(tmp_dir, vocab_size=250)
  rebuilt = pretokenize.prepare(other.data, num_threads=2)
  assert rebuilt.tokenizer.sha256 != prepared.tokenizer.sha256
  assert rebuilt.directory != prepared.directory
  assert os.path.isdir(prepared.directory)  # The old one is kept.
  other = _config(tmp_dir)
  other.data.split_seed = 1
  resplit = pretokenize.prepare(other.data, num_threads=2)
  assert resplit.tokenizer.sha256 == prepared.tokenizer.sha256
  assert resplit.directory not in (prepared.directory, rebuilt.directory)


def test_the_corpus_is_read_and_tokenized_once_for_both_splits(
    prepared, tmp_dir, monkeypatch):
  """Both splits come from one pass of the corpus: each shard writes its
  documents of either split."""
  passes = []
  read = corpus_lib.raw_documents
  monkeypatch.setattr(corpus_lib, 'raw_documents', lambda *a, **k: (
      passes.append(1), read(*a, **k))[1])
  other = _config(tmp_dir)
  other.data.split_seed = 2   # Another key: prepared anew.
  other.data.tokenizer.model_path = os.path.join(
      other.data.data_dir, 'spm.model')
  prepared.tokenizer.save(other.data.tokenizer.model_path)
  again = pretokenize.prepare(other.data, num_threads=2)
  assert len(passes) == 1
  for split in ('train', 'eval'):
    source = getattr(again, f'{split}_source')
    assert len(source) == getattr(again, f'{split}_index').num_documents > 0
  # Another split of the same documents.
  assert (again.train_index.num_documents + again.eval_index.num_documents
          == prepared.train_index.num_documents
          + prepared.eval_index.num_documents)


def test_too_small_corpus(tmp_path):
  cfg = _config(str(tmp_path))
  _write_corpus(cfg.data.corpus.path, num_docs=2, num_files=1)
  cfg.data.tokenizer.vocab_size = 100
  cfg.data.eval_fraction = 0.01
  with pytest.raises(pretokenize.DataError, match='eval split has 0'):
    pretokenize.prepare(cfg.data, num_threads=2)


# ---------------------------------------------------------------------------
# Training batches.


@pytest.mark.parametrize('process_count', [1, 2])
def test_batches_match_the_spec(prepared, cfg, process_count):
  spec = pipeline.batch_spec(cfg, cfg.batch_size // process_count)
  for batch in _take(cfg, prepared, 3, 0, process_count):
    assert set(spec) == set(pipeline.MODEL_FEATURES)
    assert set(batch) == set(spec) | {pipeline.STATISTICS}
    assert batch[pipeline.STATISTICS].shape == (
        masking.NUM_STATISTICS,)
    for key, (shape, dtype) in spec.items():
      assert batch[key].shape == shape, key
      assert batch[key].dtype == dtype, key


def test_batch_contents(prepared, cfg):
  vocab_size = prepared.tokenizer.vocab_size
  labels = []
  for batch in _take(cfg, prepared, 10):
    ids, mask = batch['input_ids'], batch['attention_mask']
    assert ids.min() >= 0 and ids.max() < vocab_size
    assert np.all(ids[:, 0] == CLS_ID)
    np.testing.assert_array_equal(ids == PAD_ID, mask == 0)
    np.testing.assert_array_equal((ids == SEP_ID).sum(axis=1), 2)
    lengths = mask.sum(axis=1)
    weights = batch['masked_weights']
    np.testing.assert_array_equal(
        weights.sum(axis=1),
        np.minimum(10, np.maximum(1, np.round(lengths * 0.15))))
    rows = np.arange(8)[:, None]
    at = ids[rows, batch['masked_positions']]
    used = weights > 0
    assert np.isin(at[used], [MASK_ID]).mean() > 0.5
    assert not np.isin(batch['masked_ids'][used], [PAD_ID, CLS_ID,
                                                   SEP_ID]).any()
    labels.append(batch['next_sentence_labels'])
  labels = np.concatenate(labels)
  assert set(labels) == {0, 1}


def test_two_iterators_give_identical_batches(prepared, cfg):
  a = _take(cfg, prepared, 25)  # More than one epoch of the train split.
  b = _take(cfg, prepared, 25)
  for x, y in zip(a, b):
    _assert_batches_equal(x, y)
  assert not np.array_equal(a[0]['input_ids'], a[1]['input_ids'])


def test_host_sharding(prepared, cfg):
  whole = _take(cfg, prepared, 6)
  host0 = _take(cfg, prepared, 6, process_index=0, process_count=2)
  host1 = _take(cfg, prepared, 6, process_index=1, process_count=2)
  for w, h0, h1 in zip(whole, host0, host1):
    # Each host reads its half of the rows, in place.
    for key in pipeline.MODEL_FEATURES:
      np.testing.assert_array_equal(np.concatenate([h0[key], h1[key]]),
                                    w[key], err_msg=key)
    # Per-host telemetry adds up to the whole batch's.
    np.testing.assert_array_equal(
        h0[pipeline.STATISTICS] + h1[pipeline.STATISTICS],
        w[pipeline.STATISTICS])


def test_state_round_trip(prepared, cfg):
  it = iter(pipeline.train_dataset(prepared, cfg))
  for _ in range(17):  # The next batches cross into the second epoch.
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(4)]
  resumed = iter(pipeline.train_dataset(prepared, cfg))
  resumed.set_state(state)
  for want in expected:
    _assert_batches_equal(next(resumed), want)
  assert resumed.get_state() == it.get_state()


def test_seed_changes_the_batches(prepared, cfg):
  other = _config(os.path.dirname(cfg.data.data_dir))
  other.seed = cfg.seed + 1
  a = _take(cfg, prepared, 1)[0]
  b = _take(other, prepared, 1)[0]
  assert not np.array_equal(a['input_ids'], b['input_ids'])


# ---------------------------------------------------------------------------
# Eval batches.


def test_eval_batches_are_fixed(prepared, cfg):
  a = pipeline.eval_batches(prepared, cfg)
  b = pipeline.eval_batches(prepared, cfg)
  assert len(a) == cfg.eval.num_batches
  spec = pipeline.batch_spec(cfg)
  for x, y in zip(a, b):
    _assert_batches_equal(x, y)
    for key, (shape, dtype) in spec.items():
      assert x[key].shape == shape and x[key].dtype == dtype
  assert not np.array_equal(a[0]['input_ids'], a[1]['input_ids'])
  # Eval rows come from the eval documents, not the training ones.
  train = _take(cfg, prepared, 1)[0]
  assert not set(_rows(a[0])) & set(_rows(train))


def test_eval_batches_sharded(prepared, cfg):
  whole = pipeline.eval_batches(prepared, cfg)
  host0 = pipeline.eval_batches(prepared, cfg, _host_rows(cfg, 0, 2))
  host1 = pipeline.eval_batches(prepared, cfg, _host_rows(cfg, 1, 2))
  assert len(host0) == len(host1) == len(whole)
  for w, h0, h1 in zip(whole, host0, host1):
    # Each host reads its half of the rows, in place.
    for key in pipeline.MODEL_FEATURES:
      np.testing.assert_array_equal(np.concatenate([h0[key], h1[key]]),
                                    w[key], err_msg=key)
    # Per-host telemetry adds up to the whole batch's.
    np.testing.assert_array_equal(
        h0[pipeline.STATISTICS] + h1[pipeline.STATISTICS],
        w[pipeline.STATISTICS])


def test_eval_batches_error_when_split_too_small(prepared, cfg):
  big = _config(os.path.dirname(cfg.data.data_dir))
  big.batch_size = 4096
  with pytest.raises(pretokenize.DataError, match='fewer than one batch'):
    pipeline.eval_batches(prepared, big)


def test_host_rows():
  np.testing.assert_array_equal(instances.host_rows(8, 1, 2), [4, 5, 6, 7])
  with pytest.raises(ValueError, match='divisible'):
    instances.host_rows(8, 0, 3)
  for bad in ([3, 1], [0, 8], [], [[0]]):
    with pytest.raises(ValueError, match='sorted distinct rows'):
      instances.check_rows(np.array(bad), 8)


@pytest.mark.parametrize('strategy', ['whole_word', 'ngram', 'span'])
def test_word_strategies_mask_whole_words_of_the_real_data(prepared, cfg,
                                                           strategy):
  cfg = copy.deepcopy(cfg)
  cfg.masking.strategy = strategy
  batch = _take(cfg, prepared, 1)[0]
  starts = prepared.tokenizer.word_starts(batch['masked_ids'])
  weights = batch['masked_weights'] > 0
  assert weights.sum() > 0
  for row in range(len(weights)):
    positions = set(batch['masked_positions'][row][weights[row]].tolist())
    for position, label, is_start in zip(
        batch['masked_positions'][row][weights[row]],
        batch['masked_ids'][row][weights[row]], starts[row][weights[row]]):
      # A masked piece that continues a word has its predecessor masked
      # too, unless it follows a special (a segment may start mid-word).
      previous = batch['input_ids'][row][position - 1]
      if not is_start and previous not in (tokenizer_lib.CLS_ID,
                                           tokenizer_lib.SEP_ID):
        assert position - 1 in positions, (strategy, row, position, label)


def test_split_punctuation_reaches_the_masking(prepared, cfg):
  """Each sentence ends with '.': by default the period is masked with
  its word; with masking.split_punctuation it is a word of its own."""
  cfg = copy.deepcopy(cfg)
  cfg.masking.strategy = 'whole_word'
  punctuation = prepared.tokenizer.punctuation_table
  assert punctuation[prepared.tokenizer.encode(['a.'])[0][-1]]
  batches = _take(cfg, prepared, 4)
  assert sum(masked_units.punctuation_in_longer_units(b, punctuation)
             for b in batches) > 0
  cfg.masking.split_punctuation = True
  batches = _take(cfg, prepared, 4)
  assert sum(masked_units.punctuation_in_longer_units(b, punctuation)
             for b in batches) == 0
  assert sum(int(b['masked_weights'].sum()) for b in batches) > 0


def test_gazetteer_units_reach_the_masking(tmp_dir, tmp_path):
  """Entities from a gazetteer are labelled while pre-tokenizing and masked
  whole by the 'entity' strategy at the entity level."""
  cfg = _config(tmp_dir)
  cfg.data.data_dir = str(tmp_path / 'data')
  # Frequent word pairs of the synthetic corpus serve as entities.
  prepared = pretokenize.prepare(cfg.data, num_threads=2)
  record = prepared.train_source[0]
  first_words = prepared.tokenizer.decode(record['token_ids'][:40]).split()
  entity = ' '.join(first_words[:2])
  (tmp_path / 'gazetteer.txt').write_text(entity + '\n')
  cfg.data.gazetteer_path = str(tmp_path / 'gazetteer.txt')
  cfg.masking.strategy = 'entity'
  cfg.masking.entity_mixture = (0.0, 0.0, 1.0)
  with_units = pretokenize.prepare(cfg.data, num_threads=2)
  assert with_units.directory != prepared.directory   # Rebuilt.
  labelled = sum(int((with_units.train_source[i]['unit_labels'] == 1).sum())
                 for i in range(len(with_units.train_source)))
  assert labelled > 0
  batch = next(iter(pipeline.train_dataset(with_units, cfg)))
  assert batch['masked_weights'].sum() > 0


@pytest.mark.parametrize('num_workers', [2, 3])
def test_worker_processes_give_the_same_batches(prepared, cfg, num_workers):
  expected = _take(cfg, prepared, 5)
  cfg = copy.deepcopy(cfg)
  cfg.data.num_workers = num_workers
  for a, b in zip(expected, _take(cfg, prepared, 5)):
    _assert_batches_equal(a, b)
