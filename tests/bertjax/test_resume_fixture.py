"""A workdir written by an earlier bertjax resumes, bit for bit.

``golden/resume_v1`` was written by the code before the package was
restructured (commit bbf65d9, the one that first added this fixture): the
demo config made tiny (``TINY``) with a 384-piece vocabulary, a 6-step
schedule stopped at step 4 (``num_train_steps=4``) with its checkpoint, and
``expected_metrics.jsonl``, the same run's metrics.jsonl when it trains all
6 steps without stopping. Resuming that checkpoint with today's code must
log steps 5 and 6 exactly as the old code did.

384 is a multiple of 128: the embedding table has no padding rows, so the
later fix that keeps padding rows out of the vocabulary softmax leaves the
old code's numbers unchanged (at ``TINY``'s 400 it changes them, as it
should).
"""

import os
import shutil

import pytest

from bertjax import train
import preset_helpers

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden',
                       'resume_v1')


@pytest.mark.e2e
def test_a_checkpoint_of_the_earlier_layout_resumes_bitwise(tmp_path, capfd):
  workdir = tmp_path / 'run'
  shutil.copytree(os.path.join(FIXTURE, 'workdir'), workdir)
  cfg = preset_helpers.load_preset('demo')
  preset_helpers.set_fields(cfg, {
      **preset_helpers.TINY, 'data.data_dir': str(tmp_path / 'data'),
      'data.tokenizer.vocab_size': 384,
      'total_steps': 6, 'log_every_steps': 1, 'eval_every_steps': 6,
      'checkpoint_every_steps': 4})
  train.train_and_evaluate(cfg, str(workdir))
  # Resumed, not retrained (a fresh run would log the same numbers).
  assert 'resumed from the checkpoint at step 4' in capfd.readouterr().out
  with open(os.path.join(FIXTURE, 'expected_metrics.jsonl')) as f:
    expected = f.readlines()
  with open(workdir / 'metrics.jsonl') as f:
    resumed = f.readlines()
  assert len(resumed) == len(expected) == 6
  assert resumed[4:] == expected[4:]
