"""experiments/multitask_table.py: the table from its rows, the settings the
rows were made with, and the single-task step count."""

import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, 'experiments', 'results', 'multitask')
_spec = importlib.util.spec_from_file_location(
    'multitask_table', os.path.join(REPO, 'experiments', 'multitask_table.py'))
multitask_table = importlib.util.module_from_spec(_spec)
sys.modules['multitask_table'] = multitask_table
_spec.loader.exec_module(multitask_table)


@pytest.fixture(scope='module')
def rows():
  """The committed rows: 3 seeds of every arm on both tasks."""
  with open(os.path.join(RESULTS, 'rows.jsonl')) as f:
    return [json.loads(line) for line in f if line.strip()]


def _cells(text, title):
  line = next(l for l in text.splitlines() if l.startswith(f'| {title} |'))
  return [c.strip() for c in line.strip('|').split('|')]


def test_an_arm_without_its_controls_seed_is_not_run(rows):
  # The single-task control lacks seed 2 on one task: that task's
  # differences cannot be paired, so its cells say so (no KeyError).
  kept = [r for r in rows if not (r['arm'] == multitask_table.SINGLE and
                                  r['seed'] == 2 and r['task'] == 'embedded')]
  text, _ = multitask_table.table(kept, [0, 1, 2])
  cells = _cells(text, multitask_table.TITLES['proportional'])
  assert cells[1:3] == ['(not run)', '']
  assert cells[3] != '(not run)'   # embedded_top4 keeps its control.
  full, _ = multitask_table.table(rows, [0, 1, 2])
  assert _cells(full, multitask_table.TITLES['proportional'])[3:5] == (
      cells[3:5])


def test_one_seed_is_no_claim(rows):
  text, conclusion = multitask_table.table(rows, [0])
  cells = _cells(text, multitask_table.TITLES['proportional'])
  assert cells[2].endswith(' (one seed: no claim)')
  assert '**' not in text
  assert 'without a claim (one seed) on embedded' in conclusion
  three, _ = multitask_table.table(rows, [0, 1, 2])
  assert _cells(three, multitask_table.TITLES['proportional'])[2].startswith(
      '**')


def test_rows_of_other_settings_are_refused(tmp_path, rows):
  path = tmp_path / 'rows.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  table_rows = multitask_table.Rows(str(path))
  table_rows.check_settings('runs/demo', 150)   # The committed table's.
  table_rows.check_settings('./runs/demo', 150)
  for init, steps in (('runs/other', 150), ('runs/demo', 100)):
    with pytest.raises(SystemExit, match='another --results'):
      table_rows.check_settings(init, steps)
  # Rows written before the settings were recorded cannot pass either.
  table_rows.rows.append({k: v for k, v in rows[0].items()
                          if k not in ('init', 'steps_per_task')})
  with pytest.raises(SystemExit, match=r'\(None, None\)'):
    table_rows.check_settings('runs/demo', 150)


def test_single_task_runs_take_exactly_the_steps_asked():
  # ceil(epochs x batches) in fine-tuning's plan: a float epochs just
  # above steps / batches gave one step more (21 -> 22 on embedded_top4).
  for steps in (21, 42, 150):
    cfg = multitask_table.single_config('embedded_top4', 'runs/demo', 0,
                                        steps)
    task, _ = multitask_table.finetune.load_task(cfg)
    total, _ = multitask_table.finetune.plan_steps(
        cfg, len(task.train), 512)
    assert total == steps
