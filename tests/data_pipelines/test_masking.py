"""Tests for data_pipelines.masking: BERT's masked-LM rules, vectorized."""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from data_pipelines import masking
from data_pipelines.masking import MaskingConfig
from data_pipelines.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID
from data_pipelines.tokenizer import SEP_ID, UNK_ID

VOCAB_SIZE = 300
CONFIG = MaskingConfig(max_predictions_per_seq=20, vocab_size=VOCAB_SIZE)


def make_batch(batch_size, seq_len, seed=0, min_len=3, first_index=0,
               mask_epoch=0):
  """Padded NSP-like rows: [CLS] A [SEP] B [SEP] [PAD]...; ids >= 5."""
  rng = np.random.default_rng(seed)
  ids = np.full((batch_size, seq_len), PAD_ID, np.int32)
  lengths = rng.integers(min_len, seq_len + 1, size=batch_size)
  for row, n in enumerate(lengths):
    ids[row, :n] = rng.integers(NUM_SPECIAL, VOCAB_SIZE, size=n)
    ids[row, 0] = CLS_ID
    ids[row, rng.integers(1, n - 1)] = SEP_ID
    ids[row, n - 1] = SEP_ID
  attention_mask = (np.arange(seq_len)[None, :] < lengths[:, None])
  return {
      'input_ids': ids,
      'attention_mask': attention_mask.astype(np.int32),
      'token_type_ids': np.zeros_like(ids),
      'example_index': np.arange(first_index, first_index + batch_size,
                                 dtype=np.int64),
      'mask_epoch': np.full(batch_size, mask_epoch, np.int64),
  }


@pytest.fixture(scope='module')
def big():
  batch = make_batch(1300, 128, seed=1, min_len=120)
  return batch, masking.mask_batch(batch, CONFIG, seed=0)


def _used(out):
  return out['masked_weights'] > 0


def test_output_fields_and_dtypes(big):
  batch, out = big
  p = CONFIG.max_predictions_per_seq
  assert out['masked_positions'].shape == (1300, p)
  assert out['masked_positions'].dtype == np.int32
  assert out['masked_ids'].shape == (1300, p)
  assert out['masked_ids'].dtype == np.int32
  assert out['masked_weights'].dtype == np.float32
  assert out['masked_corruption'].dtype == np.int8
  assert out['input_ids'].shape == batch['input_ids'].shape
  assert out['input_ids'].dtype == batch['input_ids'].dtype
  # The batch itself is not modified; other fields pass through.
  assert out['input_ids'] is not batch['input_ids']
  assert out['token_type_ids'] is batch['token_type_ids']


def test_specials_and_padding_never_selected(big):
  batch, out = big
  rows = np.arange(len(out['masked_positions']))[:, None]
  original = batch['input_ids'][rows, out['masked_positions']]
  used = _used(out)
  assert not np.isin(original[used], [PAD_ID, CLS_ID, SEP_ID]).any()
  # Nothing outside the chosen positions changes.
  changed = out['input_ids'] != batch['input_ids']
  chosen = np.zeros_like(changed)
  chosen[np.broadcast_to(rows, used.shape)[used],
         out['masked_positions'][used]] = True
  assert not (changed & ~chosen).any()


def test_count_rule():
  batch = make_batch(400, 64, seed=2)
  # Rows with fewer candidates than the budget, and one with none at all.
  batch['input_ids'][0, :] = PAD_ID
  batch['input_ids'][0, :3] = [CLS_ID, SEP_ID, SEP_ID]
  batch['attention_mask'][0] = np.arange(64) < 3
  batch['input_ids'][1, :] = PAD_ID
  batch['input_ids'][1, :40] = SEP_ID
  batch['input_ids'][1, [0, 7, 9]] = [CLS_ID, 100, 101]
  batch['attention_mask'][1] = np.arange(64) < 40
  config = MaskingConfig(max_predictions_per_seq=7, vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  used = _used(out)
  lengths = batch['attention_mask'].sum(axis=1)
  candidates = masking.maskable(batch['input_ids']).sum(axis=1)
  for row in range(len(lengths)):
    # google-research/bert: max(1, int(round(len(tokens) * 0.15))), with
    # [CLS] and [SEP] counted; Python rounds half to even.
    budget = min(7, max(1, int(round(int(lengths[row]) * 0.15))))
    assert used[row].sum() == min(budget, candidates[row])
  assert used[0].sum() == 0 and used[1].sum() == 2
  assert (used.sum(axis=1) == 7).any()  # Some rows hit max_predictions.


@pytest.mark.parametrize('length, expected', [
    (1, 1), (3, 1), (10, 2), (30, 4), (50, 8), (70, 10), (128, 19),
    (512, 20)])
def test_num_to_predict(length, expected):
  assert masking.num_to_predict(np.array([length]), 0.15, 20)[0] == expected
  assert expected == min(20, max(1, round(length * 0.15)))


def test_positions_ascending_unique_and_weights(big):
  batch, out = big
  used = _used(out)
  positions = out['masked_positions']
  np.testing.assert_array_equal(np.unique(out['masked_weights']), [0., 1.])
  # Used slots come first; unused slots hold position 0 and weight 0.
  np.testing.assert_array_equal(used, np.arange(used.shape[1])[None, :]
                                < used.sum(axis=1, keepdims=True))
  assert np.all(positions[~used] == 0)
  for row in range(len(positions)):
    p = positions[row][used[row]]
    assert np.all(np.diff(p) > 0)
    assert p.min() >= 1 and p.max() < batch['attention_mask'][row].sum()


def test_masked_ids_are_the_original_tokens(big):
  batch, out = big
  used = _used(out)
  rows = np.arange(len(used))[:, None]
  np.testing.assert_array_equal(
      out['masked_ids'],
      np.where(used, batch['input_ids'][rows, out['masked_positions']], 0))


def test_corruption(big):
  batch, out = big
  used = _used(out)
  rows = np.arange(len(used))[:, None]
  new = out['input_ids'][rows, out['masked_positions']][used]
  old = out['masked_ids'][used]
  kind = out['masked_corruption'][used]
  assert used.sum() > 20_000
  # Fractions of 20k draws: std of each is below 0.003.
  fractions = np.bincount(kind, minlength=3) / len(kind)
  np.testing.assert_allclose(fractions, [0.8, 0.1, 0.1], atol=0.015)
  assert np.all(new[kind == 0] == MASK_ID)
  np.testing.assert_array_equal(new[kind == 2], old[kind == 2])
  replaced = new[kind == 1]
  assert replaced.min() >= NUM_SPECIAL and replaced.max() < VOCAB_SIZE
  # Uniform over the real vocabulary: most ids appear, none dominates.
  counts = np.bincount(replaced - NUM_SPECIAL,
                       minlength=VOCAB_SIZE - NUM_SPECIAL)
  assert (counts > 0).mean() > 0.95
  assert counts.max() < 5 * len(replaced) / (VOCAB_SIZE - NUM_SPECIAL)
  # A random replacement rarely equals the original by chance.
  assert (replaced == old[kind == 1]).mean() < 0.02


def test_corruption_probabilities_follow_the_config():
  batch = make_batch(500, 128, seed=3, min_len=100)
  config = MaskingConfig(max_predictions_per_seq=20, mask_token_prob=0.5,
                         random_token_prob=0.3, vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  kind = out['masked_corruption'][_used(out)]
  np.testing.assert_allclose(np.bincount(kind, minlength=3) / len(kind),
                             [0.5, 0.3, 0.2], atol=0.02)
  config = MaskingConfig(max_predictions_per_seq=20, mask_token_prob=1.0,
                         random_token_prob=0.0, vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  assert np.all(out['masked_corruption'][_used(out)] == 0)


def test_selection_is_uniform_over_positions(big):
  batch, out = big
  used = _used(out)
  counts = np.bincount(out['masked_positions'][used], minlength=128)
  # Positions 2..117 hold real tokens (but for one [SEP]) in every row.
  inner = counts[2:118]
  assert np.all(np.abs(inner - inner.mean()) < 0.35 * inner.mean())
  assert counts[0] == 0  # [CLS] is never chosen.


def test_unk_and_mask_tokens_are_maskable():
  ids = np.array([[CLS_ID, UNK_ID, MASK_ID, 7, SEP_ID, PAD_ID]])
  np.testing.assert_array_equal(masking.maskable(ids),
                                [[False, True, True, True, False, False]])


def test_deterministic(big):
  batch, out = big
  again = masking.mask_batch(batch, CONFIG, seed=0)
  for key in out:
    np.testing.assert_array_equal(out[key], again[key])


def _row(out, i):
  return {k: out[k][i] for k in ('input_ids', 'masked_positions',
                                 'masked_ids', 'masked_weights',
                                 'masked_corruption')}


def _assert_rows_equal(a, b):
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_independent_of_batch_composition():
  a = make_batch(16, 64, seed=4)
  b = make_batch(9, 64, seed=5, first_index=1000)
  # Put a's rows 3 and 11 into positions 0 and 8 of b.
  for src, dst in ((3, 0), (11, 8)):
    for key in a:
      b[key][dst] = a[key][src]
  out_a = masking.mask_batch(a, CONFIG, seed=0)
  out_b = masking.mask_batch(b, CONFIG, seed=0)
  for src, dst in ((3, 0), (11, 8)):
    _assert_rows_equal(_row(out_a, src), _row(out_b, dst))
  # Alone in a batch of one, too.
  single = {k: v[3:4] for k, v in a.items()}
  _assert_rows_equal(_row(out_a, 3),
                     _row(masking.mask_batch(single, CONFIG, seed=0), 0))


def test_counters_change_the_mask():
  batch = make_batch(64, 64, seed=6, min_len=40)
  base = masking.mask_batch(batch, CONFIG, seed=0)

  def fraction_same(out):
    return np.mean([np.array_equal(base['masked_positions'][i],
                                   out['masked_positions'][i])
                    for i in range(64)])

  other_epoch = dict(batch, mask_epoch=batch['mask_epoch'] + 1)
  other_index = dict(batch, example_index=batch['example_index'] + 64)
  for out in (masking.mask_batch(other_epoch, CONFIG, seed=0),
              masking.mask_batch(other_index, CONFIG, seed=0),
              masking.mask_batch(batch, CONFIG, seed=1)):
    assert fraction_same(out) < 0.1


def test_select_positions_more_slots_than_positions():
  ids = np.array([[CLS_ID, 5, 6, 7, SEP_ID, PAD_ID],
                  [CLS_ID, 8, SEP_ID, PAD_ID, PAD_ID, PAD_ID]])
  batch = {'input_ids': ids, 'attention_mask': (ids != PAD_ID).astype(int),
           'example_index': np.array([0, 1]), 'mask_epoch': np.array([0, 0])}
  config = MaskingConfig(rate=0.9, max_predictions_per_seq=10,
                         vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  assert out['masked_positions'].shape == (2, 10)
  np.testing.assert_array_equal(out['masked_positions'][0, :3], [1, 2, 3])
  np.testing.assert_array_equal(out['masked_weights'].sum(axis=1), [3, 1])
  np.testing.assert_array_equal(out['masked_ids'][0, :3], [5, 6, 7])


def test_masking_config_validate():
  MaskingConfig().validate()
  MaskingConfig(mask_token_prob=1.0, random_token_prob=0.0).validate()
  bad = [
      (dict(strategy='span'), 'strategy'),
      (dict(rate=0.0), 'rate'),
      (dict(rate=1.0), 'rate'),
      (dict(max_predictions_per_seq=0), 'max_predictions_per_seq'),
      (dict(mask_token_prob=-0.1), 'mask_token_prob'),
      (dict(random_token_prob=-0.1), 'random_token_prob'),
      (dict(mask_token_prob=0.8, random_token_prob=0.3), 'sum to at most 1'),
  ]
  for kwargs, message in bad:
    with pytest.raises(ValueError, match=message):
      MaskingConfig(**kwargs).validate()


# ---- Property test over random shapes and knobs.

@settings(max_examples=60, deadline=None)
@given(batch_size=st.integers(1, 6), seq_len=st.integers(3, 40),
       max_predictions=st.integers(1, 12), rate=st.floats(0.01, 0.9),
       seed=st.integers(0, 2**31 - 1), mask_epoch=st.integers(0, 50))
def test_invariants_hold_for_any_shape(batch_size, seq_len, max_predictions,
                                       rate, seed, mask_epoch):
  batch = make_batch(batch_size, seq_len, seed=seed % 1000,
                     mask_epoch=mask_epoch)
  config = MaskingConfig(rate=rate, max_predictions_per_seq=max_predictions,
                         vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed)
  ids = batch['input_ids']
  candidates = masking.maskable(ids)
  budget = masking.num_to_predict(batch['attention_mask'].sum(1), rate,
                                  max_predictions)
  for row in range(batch_size):
    used = out['masked_weights'][row] > 0
    positions = out['masked_positions'][row][used]
    assert used.sum() == min(budget[row], candidates[row].sum())
    assert used.sum() <= max_predictions
    assert np.all(np.diff(positions) > 0)            # Ascending, unique.
    assert np.all(candidates[row][positions])        # Never specials/pad.
    assert np.array_equal(out['masked_ids'][row][used], ids[row][positions])
    untouched = np.ones(seq_len, bool)
    untouched[positions] = False
    assert np.array_equal(out['input_ids'][row][untouched],
                          ids[row][untouched])
