"""What a masked batch's units hold, for the tests of masking's units."""

import numpy as np


def punctuation_in_longer_units(out: dict, punctuation: np.ndarray) -> int:
  """Masked units (grouped by ``masked_unit_start``) of more than one token
  that hold a punctuation piece (``punctuation``: bool [vocab])."""
  count = 0
  for row in range(len(out['masked_ids'])):
    used = out['masked_weights'][row] > 0
    starts = out['masked_unit_start'][row][used]
    labels = out['masked_ids'][row][used]
    for start in np.unique(starts):
      unit = labels[starts == start]
      count += len(unit) > 1 and bool(punctuation[unit].any())
  return count
