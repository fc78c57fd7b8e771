"""Golden bytes of data_pipelines.masking: its outputs over a grid, hashed.

The digests were recorded from masking.py as it stood before it was
restructured into steps (issue 22: sample units -> choose -> replace). A
digest that changes is a change of behaviour, not of structure: the masks a
seed gives are part of a run's identity (static masking repeats them, resumed
runs replay them), so they change only on purpose, with the new digests
recorded in the same commit and the reason in its message.

Each group hashes every output array of ``mask_batch`` (name, dtype, shape and
bytes, passed-through fields included) for a grid of configs and batches:
every strategy, static (``epoch % dupe_factor``) and dynamic epochs, several
seeds, rates, budgets and span bounds, rows with padding, short rows, rows
with no maskable token and rows whose budget cannot be met. The inputs come
from ``counter_rng`` (test-only counters), not numpy's generators, so they do
not move with numpy's streams.

To print the digests of the code as it is, from the repository root:
``PYTHONPATH=. python tests/data_pipelines/test_masking_golden.py``.
"""

import dataclasses
import hashlib
import itertools
import types

import numpy as np
import pytest

from data_pipelines import counter_rng
from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines import masking
from data_pipelines.masking import MaskingConfig
from data_pipelines.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID
from data_pipelines.tokenizer import SEP_ID

VOCAB_SIZE = 300
DUPE_FACTOR = 4
# A counter outside counter_rng.Stream, so test data never shares draws with
# the masking under test.
_DATA_STREAM = 1000


def _uniform(data_seed, purpose, *shape_counters):
  return counter_rng.uniform(_DATA_STREAM, data_seed, purpose,
                             *shape_counters)


def make_batch(batch_size, seq_len, data_seed, start_prob=0.5, epoch=0,
               static=False, first_index=0, ids_dtype=np.int32):
  """A padded batch whose rows cycle through eight shapes.

  Row r % 8: 0 full ([CLS] A [SEP] B [SEP], no padding); 1 padded, random
  length; 2 [CLS] x [SEP]; 3 [CLS] [SEP] only (nothing to mask); 4 [CLS]
  alone; 5 fragmented (a [SEP] after every second token: units collide with
  specials, budgets of long rows are hard to meet); 6 one long word (no
  word start inside: whole words cannot fit the budget); 7 padded, every
  token a word start, and a continuation piece right after the middle [SEP].

  Word starts are set with probability ``start_prob`` and on specials;
  ``unit_labels`` hold entity/phrase units of 1-3 words, some adjacent.
  ``mask_epoch`` is ``epoch`` (dynamic) or ``epoch % DUPE_FACTOR`` (static),
  offset per row so a batch mixes epochs.
  """
  rows = np.arange(batch_size)[:, None]
  cols = np.arange(seq_len)[None, :]
  kind = rows[:, 0] % 8
  u_len = _uniform(data_seed, 1, rows[:, 0])
  length = np.select(
      [kind == 0, kind == 2, kind == 3, kind == 4],
      [seq_len, min(3, seq_len), min(2, seq_len), 1],
      np.maximum(3, (u_len * (seq_len + 1)).astype(np.int64)))
  length = np.minimum(length, seq_len)
  real = cols < length[:, None]
  ids = NUM_SPECIAL + (_uniform(data_seed, 2, rows, cols)
                       * (VOCAB_SIZE - NUM_SPECIAL)).astype(np.int64)
  ids = np.where(real, ids, PAD_ID)
  middle = np.maximum(1, length // 2)[:, None]
  sep = (cols == length[:, None] - 1) | ((cols == middle) & (length[:, None]
                                                              > 3))
  sep |= (kind[:, None] == 5) & (cols % 3 == 2)
  ids = np.where(real & sep, SEP_ID, ids)
  ids[:, 0] = CLS_ID
  special = np.isin(ids, [CLS_ID, SEP_ID])
  word_starts = (_uniform(data_seed, 3, rows, cols) < start_prob) | special
  word_starts &= ~((kind[:, None] == 6) & ~special & (cols > 1))
  word_starts |= (kind[:, None] == 7) & real
  word_starts &= ~((kind[:, None] == 7) & (cols == middle + 1))
  word_starts &= real
  labels = _unit_labels(data_seed, ids, word_starts & ~special, real)
  epochs = epoch + rows[:, 0] % 3
  return {
      'input_ids': ids.astype(ids_dtype),
      'attention_mask': real.astype(np.int32),
      'token_type_ids': (cols > middle).astype(np.int32) * real,
      'word_starts': word_starts,
      'unit_labels': labels,
      'example_index': first_index + rows[:, 0].astype(np.int64),
      'mask_epoch': (epochs % DUPE_FACTOR if static else epochs
                     ).astype(np.int64),
  }


def _unit_labels(data_seed, ids, starts, real):
  """int8 [B, L]: units of 1-3 words from about one word in three, ending
  before a special, a few a piece short of a word end; entities and
  phrases alternate, some back to back."""
  labels = np.zeros(ids.shape, np.int8)
  maskable = masking.maskable(ids)
  for row in range(ids.shape[0]):
    word_at = np.flatnonzero(starts[row])
    u = _uniform(data_seed, 4, row, np.arange(len(word_at)))
    w, unit = 0, 0
    while w < len(word_at):
      if u[w] < 0.35:
        n = 1 + int(u[w] * 8.5)   # 1..3 words.
        end = word_at[w + n] if w + n < len(word_at) else real[row].sum()
        first = word_at[w]
        stop = first + 1
        while stop < end and maskable[row, stop]:
          stop += 1
        if u[w] < 0.12 and stop - first > 2:
          stop -= 1   # Ends mid-word: the piece after it starts a unit.
        begin = (gazetteer_lib.ENTITY_BEGIN,
                 gazetteer_lib.PHRASE_BEGIN)[unit % 2]
        labels[row, first] = begin
        labels[row, first + 1:stop] = begin + 1
        unit += 1
        w += n
      else:
        w += 1
  return labels


def _update(digest, name, value):
  """Feeds a named array (dtype, shape, bytes) or a string to the digest."""
  digest.update(name.encode() + b'\0')
  if isinstance(value, str):
    digest.update(b'str\0' + value.encode() + b'\0')
    return
  value = np.ascontiguousarray(value)
  digest.update(f'{value.dtype.str}{value.shape}\0'.encode())
  digest.update(value.tobytes())


def _hash_mask_batch(digest, case, batch, config, seed):
  out = masking.mask_batch(batch, config, seed)
  assert sorted(out) == sorted(set(batch) | {
      'masked_positions', 'masked_ids', 'masked_weights',
      'masked_corruption', 'masked_unit_start'})
  _update(digest, 'case', repr(case))
  for key in sorted(out):
    _update(digest, key, out[key])
  _update(digest, 'statistics', masking.statistics(out))
  return out


# Batches: (batch_size, seq_len, data_seed, start_prob, ids dtype).
_BATCHES = (
    (8, 12, 0, 0.5, np.int32),
    (24, 40, 1, 0.4, np.int32),
    (17, 64, 2, 0.8, np.int64),
    (40, 128, 3, 0.5, np.int32),    # Enough rows for a smaller block.
    (1, 7, 4, 0.0, np.int32),       # One row; words only at specials.
    (6, 33, 5, 1.0, np.int32),      # Every token a word.
)
# (epoch, static): dynamic epochs, and static ones that wrap at DUPE_FACTOR.
_EPOCHS = ((0, False), (5, False), (5, True), (9, True))
_SEEDS = (0, 7, 2**31 - 1)
# Wider strides where a call costs more, to keep the test near a second.
_STRIDE = {'token': 5, 'whole_word': 5, 'ngram': 11, 'span': 29,
           'entity': 13}


def _cases(group):
  """(name, config kwargs, batch index, epoch, static, seed) of a group."""
  common = [
      dict(rate=0.15, max_predictions_per_seq=20),
      dict(rate=0.4, max_predictions_per_seq=5),
      dict(rate=0.9, max_predictions_per_seq=64),   # Budget beyond reach.
  ]
  corruption = [
      dict(),
      dict(mask_token_prob=0.85, random_token_prob=0.0),
      dict(mask_token_prob=0.0, random_token_prob=1.0,
           random_source='unigram'),
      dict(mask_token_prob=0.5, random_token_prob=0.3,
           corruption_unit='unit'),
  ]
  extra = {
      'token': [dict()],
      'whole_word': [dict()],
      'ngram': [dict(max_ngram=1), dict(max_ngram=3), dict(max_ngram=5)],
      'span': [dict(span_geometric_p=0.2, span_lower=1, span_upper=10),
               dict(span_geometric_p=0.5, span_lower=2, span_upper=4),
               dict(span_geometric_p=1.0, span_lower=3, span_upper=3),
               dict(span_geometric_p=0.05, span_lower=1, span_upper=30)],
      'entity': [dict(entity_mixture=(1 / 3, 1 / 3, 1 / 3)),
                 dict(entity_mixture=(0.0, 0.0, 1.0)),
                 dict(entity_mixture=(0.0, 1.0, 0.0)),
                 dict(entity_mixture=(1.0, 0.0, 0.0))],
  }[group]
  grid = itertools.product(range(len(common)), range(len(corruption)),
                           range(len(extra)), range(len(_BATCHES)),
                           range(len(_EPOCHS)), range(len(_SEEDS)))
  for i, (c, k, e, b, t, s) in enumerate(grid):
    # A fixed stride through the grid (prime to every axis' size): every
    # value of every axis appears, in many combinations, for a fraction of
    # the calls.
    if i % _STRIDE[group]:
      continue
    kwargs = dict(strategy=group, **common[c], **corruption[k], **extra[e])
    yield (f'{group}/{i}', kwargs, b) + _EPOCHS[t] + (_SEEDS[s],)


def _unigram_counts():
  counts = np.zeros(VOCAB_SIZE, np.int64)
  counts[NUM_SPECIAL:250] = 100_000 // np.arange(1, 250 - NUM_SPECIAL + 1)
  counts[:NUM_SPECIAL] = 10**7   # Specials are never drawn all the same.
  return counts


def digest_of(group):
  """Hex sha256 of the group's outputs."""
  digest = hashlib.sha256()
  if group in masking.STRATEGIES:
    counts = _unigram_counts()
    for name, kwargs, b, epoch, static, seed in _cases(group):
      batch_size, seq_len, data_seed, start_prob, dtype = _BATCHES[b]
      batch = make_batch(batch_size, seq_len, data_seed, start_prob, epoch,
                         static, first_index=13 * b, ids_dtype=dtype)
      config = MaskingConfig(vocab_size=VOCAB_SIZE, unigram_counts=counts,
                             **kwargs)
      config.validate()
      _hash_mask_batch(digest, (name, kwargs, b, epoch, static, seed),
                       batch, config, seed)
  elif group == 'edge_rows':
    # 512-token rows at SpanBERT's and BERT's settings: many attempts per
    # row, more drawn as rows run out.
    for strategy, b_seed in itertools.product(masking.STRATEGIES, (0, 1)):
      batch = make_batch(12, 512, 20 + b_seed, 0.6, epoch=b_seed)
      config = MaskingConfig(strategy=strategy, max_predictions_per_seq=80,
                             vocab_size=VOCAB_SIZE, corruption_unit='unit',
                             random_source='unigram',
                             unigram_counts=_unigram_counts())
      _hash_mask_batch(digest, (strategy, b_seed), batch, config, b_seed)
    # Rows whose spans alone meet the budget (no single-word fill-in).
    batch = make_batch(1, 64, 30, 1.0)
    config = MaskingConfig(strategy='span', span_lower=1, span_upper=1,
                           vocab_size=VOCAB_SIZE)
    _hash_mask_batch(digest, 'spans meet the budget', batch, config, 0)
  elif group == 'helpers':
    for length, rate, cap in itertools.product(
        (np.arange(0, 600, 7), np.array([1, 2, 3, 10, 30, 50, 70, 128, 512])),
        (0.15, 0.5, 0.01), (1, 20, 80)):
      _update(digest, 'num_to_predict',
              masking.num_to_predict(length, rate, cap))
    batch = make_batch(16, 20, 9)
    _update(digest, 'maskable', masking.maskable(batch['input_ids']))
    for n in (1, 2, 3, 4, 7):
      _update(digest, 'ngram', masking.ngram_probabilities(n))
    for p, lower, upper in ((0.2, 1, 10), (1.0, 2, 6), (0.9, 400, 402),
                            (0.5, 3, 3), (0.05, 1, 40)):
      _update(digest, 'span',
              masking.span_length_probabilities(p, lower, upper))
    config = MaskingConfig(vocab_size=VOCAB_SIZE,
                           unigram_counts=_unigram_counts())
    _update(digest, 'unigram_cdf', config.unigram_cdf)
    _update(digest, 'constants', repr((
        masking.STRATEGIES, masking.CORRUPTION_UNITS, masking.RANDOM_SOURCES,
        masking.CORRUPT_MASK, masking.CORRUPT_RANDOM, masking.CORRUPT_KEEP,
        masking.HISTOGRAM_BINS, masking.NUM_STATISTICS, MASK_ID)))
    section = types.SimpleNamespace(**{
        f.name: f.default for f in dataclasses.fields(MaskingConfig)})
    section.strategy, section.entity_mixture = 'span', [0.2, 0.3, 0.5]
    _update(digest, 'from_config', repr(MaskingConfig.from_config(
        section, VOCAB_SIZE, _unigram_counts())))
    _update(digest, 'fields', repr([(f.name, f.default) for f in
                                    dataclasses.fields(MaskingConfig)]))
  elif group == 'telemetry':
    for strategy in masking.STRATEGIES:
      batch = make_batch(24, 40, 6)
      for cap in (20, 2):
        config = MaskingConfig(strategy=strategy, vocab_size=VOCAB_SIZE,
                               max_predictions_per_seq=cap)
        stats = masking.statistics(masking.mask_batch(batch, config, 1))
        summary = masking.summarize_statistics(stats + 2 * stats)
        _update(digest, 'summary', repr(sorted(summary.items())))
        for tolerance in (0.0, 0.05, 0.5):
          try:
            masking.audit(summary, config, tolerance, 'in the golden test')
            message = 'passed'
          except ValueError as e:
            message = str(e)
          _update(digest, 'audit', message)
  elif group == 'errors':
    bad_configs = (
        dict(strategy='bogus'), dict(rate=0.0), dict(rate=1.0),
        dict(max_predictions_per_seq=0), dict(mask_token_prob=-0.1),
        dict(random_token_prob=-0.1),
        dict(mask_token_prob=0.8, random_token_prob=0.3),
        dict(corruption_unit='word'), dict(random_source='zipf'),
        dict(max_ngram=0), dict(span_geometric_p=0.0),
        dict(span_geometric_p=1.5), dict(entity_mixture=(0.5, 0.6, 0.0)),
        dict(entity_mixture=(0.5, 0.5)), dict(span_lower=0),
        dict(span_lower=5, span_upper=4))
    for kwargs in bad_configs:
      with pytest.raises(ValueError) as e:
        MaskingConfig(**kwargs).validate()
      _update(digest, 'validate', str(e.value))
    batch = make_batch(4, 10, 0)
    for kwargs in (dict(vocab_size=NUM_SPECIAL),
                   dict(vocab_size=VOCAB_SIZE, random_source='unigram')):
      with pytest.raises(ValueError) as e:
        masking.mask_batch(batch, MaskingConfig(**kwargs), 0)
      _update(digest, 'mask_batch', str(e.value))
  else:
    raise ValueError(group)
  return digest.hexdigest()


GOLDEN = {
    'token': 'ee60f84fc25042ed13667ad3a9c73a9895f4ce948cc7613064e45827a4cba6d6',
    'whole_word': 'e3b208b74d3480c088591086ac5945977d23957f7ca88ba724b96e7ba43f87d4',
    'ngram': 'f34960c1fe0a10dfb5045358c2dc465fa6780482afc51e8c88df5b318e6e8729',
    'span': 'd3d14005066feb8c056525302cc4ad946d3c0eaf918c608a64f861c8036d336d',
    'entity': '1eb21171de7c11192f29e1690e3b168e63c14d1d9456386e6c4c22f25d489036',
    'edge_rows': '02e7be99c33929b82503c68f0884000b1db827f88af8f4f02aa914df9465cb49',
    'helpers': '6b17631e12984a4d03550af872a440cb308fb1a5d0bb5b28c90ddda932210d2e',
    'telemetry': '80b85c6576916d07c8752fe3981b96e0a14bede3ee2990f64edaa9785fc73dd3',
    'errors': '592af6e90d497f0e5abe2adc09fa031e3aabb958c10118df11667fbe8d014716',
}


@pytest.mark.parametrize('group', sorted(GOLDEN))
def test_golden(group):
  assert digest_of(group) == GOLDEN[group]


def test_every_group_is_recorded():
  assert sorted(GOLDEN) == sorted(masking.STRATEGIES + (
      'edge_rows', 'helpers', 'telemetry', 'errors'))


if __name__ == '__main__':
  for name in masking.STRATEGIES + ('edge_rows', 'helpers', 'telemetry',
                                    'errors'):
    print(f'    {name!r}: {digest_of(name)!r},')
