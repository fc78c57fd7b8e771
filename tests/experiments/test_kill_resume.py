"""experiments/kill_resume.py's guards, without training: a workdir left by
an earlier attempt is refused before anything runs (locally and in a
bucket), and the comparison sees a parameter either run lacks. The kills
themselves are in tests/fault/test_faults.py."""

import os
import types

import numpy as np
import pytest

from bertjax import runs
from bertjax import storage

import preset_helpers

kill_resume = preset_helpers.load_experiment('kill_resume.py')


def _no_training(*args, **kwargs):
  raise AssertionError(f'training started: {args} {kwargs}')


@pytest.mark.parametrize('leftover,reference,refused', [
    ('uninterrupted', '', True),
    ('uninterrupted', 'given', False),
    ('killed', '', True),
    ('killed', 'given', True),
])
def test_an_earlier_attempts_run_is_refused_before_training(
    tmp_path, monkeypatch, leftover, reference, refused):
  (tmp_path / leftover).mkdir()
  monkeypatch.setattr(kill_resume, 'train_to_end', _no_training)
  monkeypatch.setattr(kill_resume, 'kill_at', _no_training)
  if refused:
    with pytest.raises(ValueError, match=f'already holds {leftover}'):
      kill_resume.kill_and_resume('c.py', str(tmp_path), [], 1, 0,
                                  reference)
    with pytest.raises(SystemExit) as e:
      kill_resume.main(['--config=c.py', f'--workdir={tmp_path}',
                        *([f'--reference={reference}'] if reference
                          else [])])
    assert e.value.code == 2
  else:
    kill_resume.check_workdir(str(tmp_path), reference)


def test_a_leftover_in_a_bucket_is_refused_and_lines_read_there(
    gcs_bucket):
  workdir = f'{gcs_bucket}/kill_resume_guard'
  storage.write_text(f'{workdir}/uninterrupted/metrics.jsonl',
                     '{"step": 1}\n{"step": 2}\n')
  with pytest.raises(ValueError, match='already holds uninterrupted'):
    kill_resume.check_workdir(workdir)
  assert kill_resume._final_line(f'{workdir}/uninterrupted') == (
      '{"step": 2}')


def test_compare_names_a_parameter_only_one_run_has(tmp_path,
                                                    monkeypatch):
  params = {'a': {'w': np.zeros(3, np.float32)}}
  saved = {'reference': params,
           'killed': {**params, 'extra': {'w': np.ones(2, np.float32)}}}
  for name in saved:
    (tmp_path / name).mkdir()
    (tmp_path / name / 'metrics.jsonl').write_text('{"step": 4}\n')
  monkeypatch.setattr(runs, 'load_run', lambda workdir: types.SimpleNamespace(
      step=4, params=saved[os.path.basename(workdir)]))
  reference, killed = str(tmp_path / 'reference'), str(tmp_path / 'killed')
  assert kill_resume.compare(reference, reference) == []
  assert kill_resume.compare(reference, killed) == [
      f"parameter ['extra']['w'] is only in {killed}"]
  assert kill_resume.compare(killed, reference) == [
      "parameter ['extra']['w'] differs"]
