"""Corpus mixtures: sampling shares, random access, determinism, pipeline.

Two small made-up corpora in a temp dir (as in test_pipeline.py), one
tokenizer trained on both, each component pre-tokenized once per module.
"""

import copy
import dataclasses
import itertools
import os
import pickle

import numpy as np
import pytest

from bertjax import config_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import masking
from data_pipelines import mixture
from data_pipelines import pipeline
from data_pipelines import pretokenize
from data_pipelines import tokenizer as tokenizer_lib

_SYLLABLES = {
    'large': 'ka to ri an mel so vu ne pa li ost er gan du ba'.split(),
    'small': 'zy qo wix yul frum zed quo vyr'.split(),
}
_BLOCK = 1024  # A small block size, so tests cover many blocks.


def _write_corpus(directory, syllables, num_docs, seed):
  """Documents of made-up words, Zipf-distributed, one sentence per line."""
  rng = np.random.default_rng(seed)
  words = [''.join(rng.choice(syllables, rng.integers(1, 4)))
           for _ in range(200)]
  weights = 1 / np.arange(1, len(words) + 1)
  weights /= weights.sum()
  os.makedirs(directory)
  docs = []
  for _ in range(num_docs):
    sentences = [' '.join(rng.choice(words, rng.integers(3, 15), p=weights)
                          ).capitalize() + '.'
                 for _ in range(rng.integers(4, 12))]
    docs.append('\n'.join(sentences))
  with open(os.path.join(directory, 'part-0.txt'), 'w') as f:
    f.write('\n\n'.join(docs) + '\n')


def _config(tmp_dir):
  cfg = config_lib.base_config()
  cfg.seed = 3
  cfg.batch_size = 8
  cfg.data.mixture.large = config_lib.corpus_config(
      source='files', path=os.path.join(tmp_dir, 'large'))
  cfg.data.mixture.small = config_lib.corpus_config(
      source='files', path=os.path.join(tmp_dir, 'small'))
  cfg.data.mixture_exponent = 0.7
  cfg.data.data_dir = os.path.join(tmp_dir, 'data')
  cfg.data.tokenizer.vocab_size = 300
  cfg.data.eval_fraction = 0.2
  cfg.data.max_seq_length = 64
  cfg.data.dupe_factor = 2
  cfg.data.num_threads = 2
  cfg.data.prefetch_batches = 2
  cfg.masking.max_predictions_per_seq = 10
  cfg.masking.random_source = 'unigram'
  cfg.eval.num_batches = 2
  return cfg


@pytest.fixture(scope='module')
def tmp_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('mixture'))
  _write_corpus(os.path.join(directory, 'large'), _SYLLABLES['large'], 60, 0)
  _write_corpus(os.path.join(directory, 'small'), _SYLLABLES['small'], 15, 1)
  return directory


@pytest.fixture(scope='module')
def cfg(tmp_dir):
  return _config(tmp_dir)


@pytest.fixture(scope='module')
def prepared(cfg):
  return mixture.prepare(cfg.data, num_threads=2)


def _mixed(prepared, cfg, split='train', block_size=_BLOCK):
  return mixture.MixedInstances(
      [pipeline.split_instances(p, cfg, split) for p in prepared.components],
      prepared.probabilities, cfg.seed, block_size)


def _assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ---------------------------------------------------------------------------
# Probabilities and slots.


def test_probabilities_against_a_hand_computation():
  # Sizes 2^20, 2^10, 1: n^0.7 is 2^14, 2^7, 1 exactly.
  sizes = [2**20, 2**10, 1]
  natural = 2**20 + 2**10 + 1
  np.testing.assert_allclose(
      mixture.sampling_probabilities(sizes, 1.0),
      [2**20 / natural, 2**10 / natural, 1 / natural], rtol=1e-12)
  np.testing.assert_allclose(
      mixture.sampling_probabilities(sizes, 0.7),
      [16384 / 16513, 128 / 16513, 1 / 16513], rtol=1e-12)
  np.testing.assert_allclose(mixture.sampling_probabilities(sizes, 0.0),
                             [1 / 3, 1 / 3, 1 / 3], rtol=1e-12)
  with pytest.raises(ValueError, match='positive'):
    mixture.sampling_probabilities([10, 0], 0.7)


def test_block_slots_largest_remainder():
  # Quotas 3.3, 3.3, 3.4 of 10: floors 3, 3, 3; the one spare slot goes to
  # the largest remainder.
  np.testing.assert_array_equal(mixture.block_slots([0.33, 0.33, 0.34], 10),
                                [3, 3, 4])
  # A tiny share still gets a slot, taken from the largest.
  np.testing.assert_array_equal(
      mixture.block_slots([0.999, 0.0005, 0.0005], 100), [98, 1, 1])
  assert mixture.block_slots([0.5, 0.5], 2**16).sum() == 2**16


def test_equal_shares():
  # Level 27 (27 + 5 + 27 = 59 of 60); the one left over to the first.
  assert mixture.equal_shares([100, 5, 100], 60) == [28, 5, 27]
  assert mixture.equal_shares([10, 10, 10], 7) == [3, 2, 2]
  assert mixture.equal_shares([3, 4], 10) == [3, 4]
  rng = np.random.default_rng(0)
  for _ in range(300):
    sizes = rng.integers(0, 50, rng.integers(1, 6)).tolist()
    total = int(rng.integers(1, 120))
    shares = mixture.equal_shares(sizes, total)
    assert sum(shares) == min(total, sum(sizes))
    assert all(0 <= q <= n for q, n in zip(shares, sizes))
    cut = [q for q, n in zip(shares, sizes) if q < n]   # Not all of theirs.
    assert not cut or max(shares) - min(cut) <= 1
    for j in range(1, len(sizes)):   # A later component only lowers them.
      assert all(a <= b for a, b in zip(
          mixture.equal_shares(sizes[:j + 1], total),
          mixture.equal_shares(sizes[:j], total)))


def test_tokenizer_sample_takes_equal_shares(cfg):
  """All of the small corpus, the rest of k from the large one (its
  natural share would be about a fifth): each part the uniform sample a
  single corpus of that size gets, one sentence from each in turn."""
  specs = mixture.corpus_specs(cfg.data)
  names = ['large', 'small']
  n_small = sum(map(len, corpus_lib.read_documents(specs['small'])))
  k = 2 * n_small + 10
  parts = [pretokenize.sample_corpus(specs[name], share, 5)
           for name, share in zip(names, [k - n_small, n_small])]
  assert len(parts[0]) == k - n_small and len(parts[1]) == n_small
  sample = mixture.tokenizer_sample([specs[n] for n in names], k, 5,
                                    workers=2)
  assert sample == [s for turn in itertools.zip_longest(*parts)
                    for s in turn if s is not None]


def test_prepared_sizes_probabilities_and_counts(prepared):
  assert prepared.names == ('large', 'small')
  sizes = prepared.train_sizes
  assert sizes[0] > 2 * sizes[1] > 0
  np.testing.assert_allclose(prepared.probabilities,
                             sizes**0.7 / (sizes**0.7).sum(), rtol=1e-12)
  # The sampled stream's token frequencies: each component's counts as
  # often as it is drawn (exponent 0.7 draws 'small' above its share).
  counts = [c.train_index.unigram_counts for c in prepared.components]
  np.testing.assert_allclose(
      prepared.train_unigram_counts,
      sizes.sum() * sum(p * c / n for p, c, n in zip(
          prepared.probabilities, counts, sizes)), rtol=1e-12)
  assert prepared.train_unigram_counts.sum() == pytest.approx(sizes.sum())
  natural = dataclasses.replace(prepared, exponent=1.0)
  np.testing.assert_array_equal(natural.train_unigram_counts, sum(counts))
  assert all(c.tokenizer is prepared.tokenizer for c in prepared.components)
  table = prepared.summary()
  assert 'large' in table and 'small' in table and 'sampled' in table


# ---------------------------------------------------------------------------
# The mixed stream.


def test_realized_shares_are_exact_per_block(prepared, cfg):
  ds = _mixed(prepared, cfg)
  num_blocks = 20
  component = ds.component_of(np.arange(num_blocks * _BLOCK))
  p = prepared.probabilities
  shares = np.bincount(component, minlength=2) / len(component)
  # Largest-remainder rounding: within one slot per block of p_i.
  np.testing.assert_allclose(shares, p, atol=1 / _BLOCK)
  for block in np.split(component, num_blocks):
    np.testing.assert_array_equal(np.bincount(block, minlength=2), ds.slots)


def test_components_are_interleaved_at_random(prepared, cfg):
  """Counts in windows of 64 follow the hypergeometric law of a random
  interleaving: Pearson's chi-square over all windows is about its degrees
  of freedom (runs of one component would make it many times larger)."""
  ds = _mixed(prepared, cfg)
  window = 64
  component = ds.component_of(np.arange(20 * _BLOCK))
  counts = np.stack([np.bincount(w, minlength=2) for w in
                     np.split(component, len(component) // window)])
  expected = window * ds.slots / _BLOCK
  chi2 = (((counts - expected)**2) / expected).sum()
  # Sampling without replacement shrinks the variance by (N - w) / (N - 1).
  dof = len(counts) * (2 - 1) * (_BLOCK - window) / (_BLOCK - 1)
  assert 0.75 < chi2 / dof < 1.25, chi2 / dof
  # Longest run of one component: short, as for independent draws.
  changes = np.flatnonzero(np.diff(component)) + 1
  assert np.diff(np.concatenate([[0], changes, [len(component)]])).max() < 40


def test_element_is_the_components_element(prepared, cfg):
  ds = _mixed(prepared, cfg)
  indices = np.concatenate([np.arange(40), _BLOCK - 20 + np.arange(40),
                            [5 * _BLOCK + 7, 123_456]])
  component, within = ds.locate(indices)
  # Each component's stream is read in order, without gaps, block by block.
  for block in (0, 3):
    labels, positions = ds.locate(block * _BLOCK + np.arange(_BLOCK))
    for c in range(2):
      np.testing.assert_array_equal(
          positions[labels == c], block * ds.slots[c] + np.arange(ds.slots[c]))
  batch = ds.get_batch(indices)
  for row, (c, j) in enumerate(zip(component, within)):
    want = ds.components[c][int(j)]
    for key, value in want.items():
      if key == 'mask_epoch':  # Kept apart per component (see docstring).
        assert batch[key][row] == value * 2 + c
      else:
        np.testing.assert_array_equal(batch[key][row], value, err_msg=key)
    single = ds[int(indices[row])]
    for key in batch:
      np.testing.assert_array_equal(single[key], batch[key][row])


def test_components_stay_distinct(prepared, cfg):
  """Rows of the 'small' corpus use its own syllables' pieces."""
  ds = _mixed(prepared, cfg)
  batch = ds.get_batch(np.arange(64))
  component = ds.component_of(np.arange(64))
  tok = prepared.tokenizer
  for row in np.flatnonzero(component == 1)[:5]:
    text = tok.decode(batch['input_ids'][row])
    assert not any(s in text.lower() for s in ('ka', 'ost', 'gan')), text


def test_pickles_for_worker_processes(prepared, cfg):
  ds = _mixed(prepared, cfg)
  indices = np.arange(_BLOCK - 4, _BLOCK + 4)
  want = ds.get_batch(indices)
  copy_ = pickle.loads(pickle.dumps(ds))
  _assert_batches_equal(copy_.get_batch(indices), want)


# ---------------------------------------------------------------------------
# Through the pipeline.


def _take(cfg, prepared, n):
  return list(itertools.islice(iter(pipeline.train_dataset(prepared, cfg)),
                               n))


def test_train_dataset_end_to_end(prepared, cfg):
  spec = pipeline.batch_spec(cfg)
  vocab_size = prepared.tokenizer.vocab_size
  for batch in _take(cfg, prepared, 4):
    assert set(batch) == set(spec) | {pipeline.STATISTICS}
    assert batch[pipeline.STATISTICS].shape == (masking.NUM_STATISTICS,)
    for key, (shape, dtype) in spec.items():
      assert batch[key].shape == shape and batch[key].dtype == dtype, key
    ids = batch['input_ids']
    assert np.all(ids[:, 0] == tokenizer_lib.CLS_ID)
    assert ids.max() < vocab_size
    assert batch['masked_weights'].sum() > 0
  masking_cfg = pipeline.masking_config(cfg, prepared)
  np.testing.assert_array_equal(masking_cfg.unigram_counts,
                                prepared.train_unigram_counts)
  evals = pipeline.eval_batches(prepared, cfg)
  assert len(evals) == cfg.eval.num_batches
  for x, y in zip(evals, pipeline.eval_batches(prepared, cfg)):
    _assert_batches_equal(x, y)


def test_independent_pipelines_give_identical_batches(prepared, cfg):
  a = _take(cfg, prepared, 6)
  again = mixture.prepare(copy.deepcopy(cfg.data), num_threads=2)
  b = _take(cfg, again, 6)
  for x, y in zip(a, b):
    _assert_batches_equal(x, y)
  assert not np.array_equal(a[0]['input_ids'], a[1]['input_ids'])


def test_state_round_trip(prepared, cfg):
  it = iter(pipeline.train_dataset(prepared, cfg))
  for _ in range(5):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  resumed = iter(pipeline.train_dataset(prepared, cfg))
  resumed.set_state(state)
  for want in expected:
    _assert_batches_equal(next(resumed), want)


def test_worker_processes_give_the_same_batches(prepared, cfg):
  expected = _take(cfg, prepared, 3)
  cfg = copy.deepcopy(cfg)
  cfg.data.num_workers = 2
  for a, b in zip(expected, _take(cfg, prepared, 3)):
    _assert_batches_equal(a, b)


def test_host_sharding(prepared, cfg):
  whole = pipeline.train_dataset(prepared, cfg)
  half = cfg.batch_size // 2
  hosts = [pipeline.train_dataset(prepared, cfg, np.arange(half) + p * half)
           for p in range(2)]
  w = next(iter(whole))
  h0, h1 = (next(iter(h)) for h in hosts)
  for key in pipeline.MODEL_FEATURES:
    # Each host reads its half of the global batch's rows.
    np.testing.assert_array_equal(h0[key], w[key][:half], err_msg=key)
    np.testing.assert_array_equal(h1[key], w[key][half:], err_msg=key)


# ---------------------------------------------------------------------------
# Validation.


def test_validation_errors(cfg):
  bad = copy.deepcopy(cfg)
  bad.data.mixture_exponent = 1.5
  with pytest.raises(ValueError, match=r'data.mixture_exponent=1.5 must be '
                     r'in \[0, 1\]'):
    config_lib.validate(bad)
  one = copy.deepcopy(cfg)
  del one.data.mixture['small']
  with pytest.raises(ValueError, match='data.mixture has one component '
                     r'\(large\); a mixture needs at least 2'):
    config_lib.validate(one)
  source = copy.deepcopy(cfg)
  source.data.mixture.small.source = 'web'
  with pytest.raises(ValueError, match="data.mixture.small.source='web'; "
                     'use one of'):
    config_lib.validate(source)
  missing = copy.deepcopy(cfg)
  missing.data.mixture.small.path = os.path.join(
      os.path.dirname(cfg.data.mixture.small.path), 'missing')
  config_lib.validate(missing)   # Cheap checks pass; the files are absent.
  with pytest.raises(corpus_lib.CorpusError,
                     match='data.mixture.small: .*matches no files'):
    mixture.validate(missing.data)
  with pytest.raises(ValueError, match='at least 2'):
    mixture.prepare(one.data)


def test_component_data_error_names_the_component(tmp_path, cfg):
  tiny = copy.deepcopy(cfg)
  # One document: a split is left without enough (NSP needs two to train).
  _write_corpus(str(tmp_path / 'tiny'), _SYLLABLES['small'], 1, 2)
  tiny.data.mixture.small.path = str(tmp_path / 'tiny')
  tiny.data.data_dir = str(tmp_path / 'data')
  with pytest.raises(pretokenize.DataError,
                     match='data.mixture.small: the (train|eval) split has'):
    mixture.prepare(tiny.data, num_threads=2)
