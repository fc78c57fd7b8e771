"""The masked batch that several masking test files read."""

import pytest

from data_pipelines import masking

from masking_batches import CONFIG, make_batch


@pytest.fixture(scope='module')
def big():
  batch = make_batch(1300, 128, seed=1, min_len=120)
  return batch, masking.mask_batch(batch, CONFIG, seed=0)
