"""Bad data through the whole run: the trainer finishes with the skip counts
in its metrics, or stops before training when nothing usable is left.

The damaged corpus and its exact counts are those of
tests/data_pipelines/test_bad_data.py (which checks the pipeline alone).
"""

import json
import os
import sys

import pytest

from bertjax import train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tests', 'data_pipelines'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'bertjax'))
import preset_helpers  # pylint: disable=g-import-not-at-top,wrong-import-position
import test_bad_data as bad  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.fault


def _tiny(cfg):
  return preset_helpers.set_fields(cfg, {
      **preset_helpers.TINY_MODEL, 'model.max_position_embeddings': 64,
      'total_steps': 4, 'log_every_steps': 2, 'eval_every_steps': 4,
      'checkpoint_every_steps': 4, 'optimizer.warmup_steps': 1})


def test_a_damaged_corpus_trains_and_reports_what_was_dropped(tmp_path,
                                                              capsys):
  corpus = tmp_path / 'corpus'
  bad._write_good(corpus, 60)
  with open(corpus / 'bad.txt', 'wb') as f:
    f.write(bad._BAD_FILE + bad._huge_line() + b'\n\n'
            + b'x' * bad._NO_SPACE_RUN + b'\n')
  workdir = str(tmp_path / 'run')
  final = train.train_and_evaluate(_tiny(bad._config(tmp_path, corpus)),
                                   workdir)
  assert 0 <= final['eval_mlm_accuracy'] <= 1
  expected = {f'data_skipped_{k}': v for k, v in
              bad._BAD_FILE_SKIPPED.items()}
  for record in preset_helpers.read_jsonl(workdir):
    assert {k: record[k] for k in expected} == expected
  with open(os.path.join(workdir, 'run_meta.json')) as f:
    assert json.load(f)['data_skipped'] == bad._BAD_FILE_SKIPPED
  assert 'warning: preparing the data skipped or repaired' in (
      capsys.readouterr().out)


@pytest.mark.parametrize('content, message', [
    # Every document unusable: control characters, invalid bytes, blanks.
    (b'\n\n\x00\x01\n\x1b[0m\n\n\x80\x81\n\n' * 20,
     'hold no text .only whitespace, control characters or invalid UTF-8'),
    # Usable, but fewer instances than one batch of 8.
    (b'One sentence.\nTwo sentences.\n\nThree.\n\nFour here.\n\n',
     'the split holds 3 instances, from 2 documents .* fewer than one batch '
     'of batch_size=8'),
])
def test_an_unusable_corpus_stops_before_training(tmp_path, content,
                                                  message):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'bad.txt').write_bytes(content)
  workdir = tmp_path / 'run'
  cfg = _tiny(bad._config(tmp_path, corpus))
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(cfg, str(workdir))
  assert not workdir.exists()   # Nothing compiled, nothing written.
