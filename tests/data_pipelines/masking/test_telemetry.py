"""Tests for data_pipelines.masking.telemetry: statistics and the audit."""

import numpy as np
import pytest

from data_pipelines import masking
from data_pipelines.masking import MaskingConfig

from masking_batches import VOCAB_SIZE, make_batch, make_word_batch


def test_statistics_count_what_mask_batch_did():
  batch = make_word_batch(64, 64, seed=5)
  config = MaskingConfig(strategy='span', max_predictions_per_seq=20,
                         vocab_size=VOCAB_SIZE, corruption_unit='unit')
  out = masking.mask_batch(batch, config, 3)
  stats = masking.statistics(out)
  weights = out['masked_weights'] > 0
  assert stats[0] == batch['attention_mask'].sum()
  assert stats[1] == weights.sum()
  assert stats[2] + stats[3] + stats[4] == weights.sum()
  units = sum(len(np.unique(out['masked_unit_start'][r][weights[r]]))
              for r in range(64))
  assert stats[5] == units == stats[6:].sum()
  summary = masking.summarize_statistics(stats + stats)  # Sums add up.
  assert summary['masking_rate'] == pytest.approx(stats[1] / stats[0])
  assert summary['masking_unit_length_mean'] == pytest.approx(
      stats[1] / units)
  assert sum(summary[f'masking_unit_len_{i}'] for i in range(1, 11)) == (
      pytest.approx(1.0))


def test_audit_passes_on_target_and_names_the_drift():
  batch = make_batch(512, 128, seed=2)
  config = MaskingConfig(max_predictions_per_seq=20, vocab_size=VOCAB_SIZE)
  summary = masking.summarize_statistics(masking.statistics(
      masking.mask_batch(batch, config, 0)))
  # Rows of 3..128 tokens: BERT's rounding moves the realized rate by
  # less than 0.001 here (0.1502); 80/10/10 over ~5k predictions: 4 sigma < 0.024,
  # and the fractions' sigma is < 0.006.
  masking.audit(summary, config, 0.02, 'in the test')
  capped = MaskingConfig(max_predictions_per_seq=5, vocab_size=VOCAB_SIZE)
  summary = masking.summarize_statistics(masking.statistics(
      masking.mask_batch(batch, capped, 0)))
  with pytest.raises(ValueError,
                     match=r'masking_rate is 0\.06\d+, configured 0\.1500'):
    masking.audit(summary, capped, 0.02, 'in the test')
