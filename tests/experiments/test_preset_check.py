"""experiments/preset_check.py's short runs: a continual preset, however
its spec is written, gets stages that cover the 20 steps; others none."""

import pytest

import preset_helpers


@pytest.fixture(scope='module')
def preset_check():
  return preset_helpers.load_experiment('preset_check.py')


@pytest.mark.parametrize('spec, stages', [
    ('experiments/configs/ernie2.py:size=demo', '(7,7,6)'),
    ('experiments/configs/beyond_masking.py:arm=ernie2', '(7,7,6)'),
    # Spelled otherwise: an extra argument still makes it continual.
    ('experiments/configs/ernie2.py:size=demo,masking=whole_word',
     '(7,7,6)'),
    ('experiments/configs/beyond_masking.py:arm=token_deletion', None),
])
def test_continual_stages_cover_the_short_run(preset_check, spec, stages):
  assert preset_check.STEPS == 20
  assert preset_check.continual_overrides(spec) == (
      [] if stages is None else
      [f'--config.continual.stage_steps={stages}'])
