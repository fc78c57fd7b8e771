"""Tests for data_pipelines.masking.units: maskable positions and BERT's
count rule."""

import numpy as np
import pytest

from data_pipelines import masking
from data_pipelines.masking import MaskingConfig
from data_pipelines.tokenizer import CLS_ID, MASK_ID, PAD_ID
from data_pipelines.tokenizer import SEP_ID, UNK_ID

from masking_batches import VOCAB_SIZE, make_batch
from masking_batches import used_slots as _used


@pytest.mark.parametrize('length, expected', [
    (1, 1), (3, 1), (10, 2), (30, 4), (50, 8), (70, 10), (128, 19),
    (512, 20)])
def test_num_to_predict(length, expected):
  assert masking.num_to_predict(np.array([length]), 0.15, 20)[0] == expected
  assert expected == min(20, max(1, round(length * 0.15)))


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


def test_unk_and_mask_tokens_are_maskable():
  ids = np.array([[CLS_ID, UNK_ID, MASK_ID, 7, SEP_ID, PAD_ID]])
  np.testing.assert_array_equal(masking.maskable(ids),
                                [[False, True, True, True, False, False]])
