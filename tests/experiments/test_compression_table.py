"""The compression table's report (intervals and verdicts from rows) and
its argument checks; the fine-tunings it runs are fine-tuning's and
compress.py's, tested there."""

import importlib.util
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    'compression_table', os.path.join(REPO, 'experiments',
                                      'compression_table.py'))
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)

LABELS = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0] * 4


def _row(model, seed, wrong):
  """Predictions wrong on the first ``wrong`` examples."""
  predictions = [(y + 1) % 3 if i < wrong else y
                 for i, y in enumerate(LABELS)]
  return {'model': model, 'seed': seed, 'eval_predictions': predictions,
          'eval_labels': LABELS, 'max_abs_logit_difference': 0.0}


def test_report_pairs_by_seed_and_calls_an_interval_holding_zero_none():
  rows = {}
  for s, wrong in enumerate((10, 12, 11)):
    rows['float', s] = _row('float', s, wrong)
    rows['int8', s] = _row('int8', s, wrong + (1 if s == 1 else 0))
    rows['heads50', s] = _row('heads50', s, 30)
  measured = {m: {'parameters': 1000, 'bytes': 4000 if m != 'int8' else 1100,
                  'ms_per_sequence_batch1': 2.0,
                  'ms_per_sequence_batch8': 0.5} for m in table.MODELS}
  text = table.report(rows, measured, [0, 1, 2], 'python x')
  lines = {line.split(' | ')[0].lstrip('| '): line
           for line in text.splitlines() if line.startswith('| ')}
  assert '0.7250 [' in lines['float']   # 1 - 33 / 120.
  assert lines['int8'].endswith(': no difference |')
  assert '| 1,100 |' in lines['int8']
  assert lines['heads50'].endswith(': lower |')
  assert '-0.4750 [' in lines['heads50']   # 0.25 - 0.725.


def test_mobilebert_is_compared_with_its_teacher_not_the_float_source():
  rows = {}
  for s in range(3):
    rows['float', s] = _row('float', s, 0)   # Better than both.
    rows['ib-bert', s] = _row('ib-bert', s, 20)
    rows['mobilebert', s] = _row('mobilebert', s, 20 + s % 2)
  text = table.report(rows, {}, [0, 1, 2], 'python x',
                      ('float', 'ib-bert', 'mobilebert'))
  lines = {line.split(' | ')[0].lstrip('| '): line
           for line in text.splitlines() if line.startswith('| ')}
  assert '| 0.5000 [' in lines['ib-bert']    # A source: no difference.
  assert lines['ib-bert'].endswith('] |  |')
  assert '| ib-bert -0.0083 [' in lines['mobilebert']   # -1 / 120.
  assert lines['mobilebert'].endswith(': no difference |')


def test_a_served_model_gone_from_out_is_fine_tuned_again(tmp_path):
  out = str(tmp_path)
  for kept in ('float/seed0/downstream.json',
               'int8/seed0-int8/compression.json'):
    os.makedirs(os.path.dirname(os.path.join(out, kept)), exist_ok=True)
    open(os.path.join(out, kept), 'w').close()
  rows = {(m, 0): _row(m, 0, 10) for m in ('float', 'int8', 'heads50',
                                          'mobilebert')}
  calls = []

  def run(model, seed, spec, runs, where):
    calls.append((model, seed, spec, runs, where))
    return _row(model, seed, 10 if model == 'heads50' else 11)

  notes = table.remake_served(['float', 'int8', 'heads50', 'mobilebert'],
                              rows, 'ft.py', {'float': 'init'}, out, run)
  assert calls == [(m, 0, 'ft.py', {'float': 'init'}, out)
                   for m in ('heads50', 'mobilebert')]
  (note,) = notes   # heads50 came back the same; mobilebert did not.
  assert note.startswith('mobilebert seed 0 was fine-tuned again')


def test_a_missing_seed_is_said_and_not_paired():
  rows = {('float', 0): _row('float', 0, 10), ('int8', 0): _row('int8', 0, 10),
          ('float', 1): _row('float', 1, 10)}
  text = table.report(rows, {}, [0, 1], 'python x')
  assert '(1 seeds)' in text and '(2 seeds)' not in text
  # One paired seed: its interval covers examples only, so no verdict.
  rows['int8', 0] = _row('int8', 0, 30)
  (line,) = [l for l in table.report(rows, {}, [0, 1], 'python x'
                                     ).splitlines() if l.startswith('| int8')]
  assert line.endswith(': no claim (one seed) |')


def _run(tmp_path, objective: str, teacher: str) -> str:
  """A pretraining workdir's run_meta.json (what the table reads of it)
  in ``tmp_path / 'runs' / objective``."""
  workdir = tmp_path / 'runs' / objective
  workdir.mkdir(parents=True)
  (workdir / 'run_meta.json').write_text(json.dumps({'config': {
      'objective': {'name': objective},
      'mobilebert': {'teacher_workdir': teacher}}}))
  return str(workdir)


def test_a_mobilebert_run_brings_its_teacher(tmp_path):
  student = _run(tmp_path, 'mobilebert', 'runs/ib-bert')
  assert table.pretrained_runs('runs/demo', student) == {
      'float': 'runs/demo', 'mobilebert': student, 'ib-bert': 'runs/ib-bert'}
  assert table.pretrained_runs('runs/demo', None) == {'float': 'runs/demo'}


def test_bad_arguments_fail_before_any_work(tmp_path, capsys):
  for args, message in (
      (['--seeds=0'], 'use at least 1'),
      (['--models=int8,heads100'], "model 'heads100': use float, int8 or "
       'headsNN'),
      (['--finetune=' + os.path.join(REPO, 'experiments', 'configs',
                                     'finetune.py') + ':mode=sideways'],
       'mode'),
      (['--mobilebert=' + str(tmp_path / 'none')], 'has no run_meta.json'),
      (['--mobilebert=' + _run(tmp_path, 'bert', 'runs/t')],
       "is a 'bert' run: use a run of the mobilebert objective"),
  ):
    with pytest.raises(SystemExit) as e:
      table.main(['--init=runs/none', f'--out={tmp_path / "out"}',
                  f'--results={tmp_path / "results"}', *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == ['runs']   # _run's, nothing else.
