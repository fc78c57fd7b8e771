"""A workdir written by an earlier bertjax resumes.

``golden/resume_v1`` was written by the code before the package was
restructured (commit bbf65d9, the one that first added this fixture): the
demo config made tiny (``TINY``) with a 384-piece vocabulary, a 6-step
schedule stopped at step 4 (``num_train_steps=4``) with its checkpoint.

Until data format 2.0.0, ``expected_metrics.jsonl`` was the old code's
unbroken 6-step run, and resuming had to log steps 5 and 6 exactly as it
did. Format 2.0.0 (data_pipelines/shards.py) writes the same documents in
corpus order instead of TFDS's hashed order, so no resumption on it can
see the old batches: steps 5 and 6 there are now what the first
resumption on format 2.0.0 logged (lines 1-4 are still the old run's).
The test guards that the old layout restores, that the trainer says the
data under it changed, and that nothing else changes what a resumed run
computes.

384 is a multiple of 128: the embedding table has no padding rows. The
checkpoint was rewritten by the same old code when SentencePiece was pinned
below 0.2.3 (which trains other models from the same text).
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
  out = capfd.readouterr().out
  assert 'resumed from the checkpoint at step 4' in out
  assert 'trained on pre-tokenized data of format before 2.0.0' in out
  with open(os.path.join(FIXTURE, 'expected_metrics.jsonl')) as f:
    expected = f.readlines()
  with open(workdir / 'metrics.jsonl') as f:
    resumed = f.readlines()
  assert len(resumed) == len(expected) == 6
  assert resumed[4:] == expected[4:]
