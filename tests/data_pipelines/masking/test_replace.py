"""Tests for data_pipelines.masking.replace: the slots and the 80/10/10
corruption."""

import dataclasses

import numpy as np
import pytest
import scipy.stats

from data_pipelines import masking
from data_pipelines.masking import MaskingConfig
from data_pipelines.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID
from data_pipelines.tokenizer import SEP_ID

from masking_batches import VOCAB_SIZE, make_batch, WORD_STRATEGIES
from masking_batches import make_word_batch, units_of
from masking_batches import used_slots as _used


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


def _code_by_unit(batch, out):
  codes = []
  for u in units_of(batch, out):
    slots = np.isin(out['masked_positions'][u['row']], u['positions']) & (
        out['masked_weights'][u['row']] > 0)
    codes.append(out['masked_corruption'][u['row']][slots])
  return codes


@pytest.mark.parametrize('strategy', WORD_STRATEGIES)
def test_unit_corruption_is_one_decision_per_unit(strategy):
  batch = make_word_batch(2048, 128, seed=14, min_len=64, start_prob=0.5)
  config = MaskingConfig(strategy=strategy, corruption_unit='unit',
                         max_predictions_per_seq=20, vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  codes = _code_by_unit(batch, out)
  assert all(np.all(c == c[0]) for c in codes)
  first = np.array([c[0] for c in codes])
  assert len(first) > 5000
  # Binomial fractions of more than 5000 units: std under 0.006 (at 0.8),
  # 0.0043 (at 0.1); 0.025 is over 4 std.
  np.testing.assert_allclose(np.bincount(first, minlength=3) / len(first),
                             [0.8, 0.1, 0.1], atol=0.025)
  # The corruption matches the code token by token.
  used = _used(out)
  rows = np.arange(len(used))[:, None]
  new = out['input_ids'][rows, out['masked_positions']][used]
  kind = out['masked_corruption'][used]
  assert np.all(new[kind == 0] == MASK_ID)
  np.testing.assert_array_equal(new[kind == 2], out['masked_ids'][used][
      kind == 2])
  assert np.all((new[kind == 1] >= NUM_SPECIAL) & (new[kind == 1] < VOCAB_SIZE))
  # Per-token decisions (the default) do split multi-token units.
  per_token = masking.mask_batch(
      batch, dataclasses.replace(config, corruption_unit='token'), seed=0)
  codes = [c for c in _code_by_unit(batch, per_token) if len(c) > 1]
  mixed = np.mean([np.any(c != c[0]) for c in codes])
  # A 2-token unit is mixed with probability 1 - .8^2 - .1^2 - .1^2 = 0.34.
  assert mixed > 0.3


@pytest.mark.parametrize('strategy', ['token', 'span'])
def test_electra_corruption_has_no_random_tokens(strategy):
  batch = make_word_batch(1300, 128, seed=15, min_len=120)
  config = MaskingConfig(strategy=strategy, mask_token_prob=0.85,
                         random_token_prob=0.0, max_predictions_per_seq=20,
                         vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  used = _used(out)
  rows = np.arange(len(used))[:, None]
  kind = out['masked_corruption'][used]
  new = out['input_ids'][rows, out['masked_positions']][used]
  old = out['masked_ids'][used]
  assert len(kind) > 20_000
  assert not np.any(kind == masking.CORRUPT_RANDOM)
  assert np.all(np.where(kind == 0, new == MASK_ID, new == old))
  # Changed tokens are exactly the [MASK]s.
  changed = out['input_ids'] != batch['input_ids']
  assert changed.sum() == (kind == 0).sum() - (old[kind == 0] == MASK_ID).sum()
  # 20k Bernoulli(0.85) draws: std 0.0025; 0.012 is about 5 std.
  assert abs((kind == 0).mean() - 0.85) < 0.012


def test_unigram_replacements_follow_the_counts():
  batch = make_batch(1300, 128, seed=16, min_len=120)
  # Zipf counts over ids 5..249; none for 250..299; specials very frequent
  # (they must still never be drawn).
  counts = np.zeros(VOCAB_SIZE, np.int64)
  counts[NUM_SPECIAL:250] = 100_000 // np.arange(1, 250 - NUM_SPECIAL + 1)
  counts[:NUM_SPECIAL] = 10**7
  config = MaskingConfig(mask_token_prob=0.0, random_token_prob=1.0,
                         random_source='unigram', unigram_counts=counts,
                         max_predictions_per_seq=20, vocab_size=VOCAB_SIZE)
  out = masking.mask_batch(batch, config, seed=0)
  used = _used(out)
  rows = np.arange(len(used))[:, None]
  assert np.all(out['masked_corruption'][used] == masking.CORRUPT_RANDOM)
  replaced = out['input_ids'][rows, out['masked_positions']][used]
  assert len(replaced) > 20_000
  assert replaced.min() >= NUM_SPECIAL  # No specials, despite their counts.
  assert replaced.max() < 250           # No unseen tokens.
  observed = np.bincount(replaced, minlength=VOCAB_SIZE)[NUM_SPECIAL:250]
  probs = counts[NUM_SPECIAL:250] / counts[NUM_SPECIAL:250].sum()
  expected = probs * len(replaced)
  assert expected.min() > 5  # Chi-square's rule of thumb holds.
  # Fixed threshold, as for the length tests; uniform draws would give a
  # p-value of 0 here (the top id alone expects 16% of draws).
  assert scipy.stats.chisquare(observed, expected).pvalue > 1e-3
  # The most frequent id: 20k draws, std under 0.003; 0.015 is 5 std.
  assert abs(observed[0] / len(replaced) - probs[0]) < 0.015
