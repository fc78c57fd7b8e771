"""Tests for data_pipelines.masking.config: the knobs' validation."""

import pytest

from data_pipelines.masking import MaskingConfig


def test_masking_config_validate():
  MaskingConfig().validate()
  MaskingConfig(mask_token_prob=1.0, random_token_prob=0.0).validate()
  bad = [
      (dict(strategy='bogus'), 'strategy'),
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


def test_entity_mixture_is_validated():
  with pytest.raises(ValueError, match='entity_mixture'):
    MaskingConfig(strategy='entity', entity_mixture=(0.5, 0.6, 0.0)).validate()
