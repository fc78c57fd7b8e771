"""The compare tool: budgets, overrides, errors, and a tiny comparison."""

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, 'experiments', 'configs')
_spec = importlib.util.spec_from_file_location(
    'compare', os.path.join(REPO, 'experiments', 'compare.py'))
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

# Tiny everything, for every run: a 2-layer 32-wide model on 60 documents.
TINY = ['data.corpus.max_documents=60', 'data.tokenizer.vocab_size=400',
        'data.max_seq_length=32', 'data.eval_fraction=0.1',
        'masking.max_predictions_per_seq=5', 'model.size="tiny"',
        'model.hidden_size=32', 'model.num_heads=2',
        'model.intermediate_size=64', 'model.max_position_embeddings=32',
        'batch_size=8', 'eval.num_batches=2', 'log_every_steps=2',
        'eval_every_steps=4', 'checkpoint_every_steps=4',
        'data.num_threads=1']
# The downstream (embedded) task, tiny: 16 examples per class, one epoch.
TINY_FINETUNE = ('task.examples_per_class=16', 'num_epochs=1.0',
                 'max_seq_length=32', 'batch_size=8')


def _run(name, config):
  return f'{name}={os.path.join(CONFIGS, config)}'


def test_bad_finetune_config_fails_before_training(tmp_path):
  with pytest.raises(compare.CompareError, match='mode='):
    compare.finetune_config(os.path.join(CONFIGS, 'finetune.py'),
                            ['mode="sideways"'], 0)
  with pytest.raises(compare.CompareError, match='no field'):
    compare.finetune_config(os.path.join(CONFIGS, 'finetune.py'),
                            ['task.nope=1'], 0)
  assert compare.finetune_config('none', [], 0) is None


def test_budgets_convert_to_steps():
  cfg = compare.load_config(os.path.join(CONFIGS, 'bert.py') + ':size=base')
  per_step = 256 * 128
  assert compare.budget_steps(cfg, 'steps', 300, 1e9) == 300
  assert compare.budget_steps(cfg, 'tokens', 10 * per_step + 5, 1e9) == 10
  assert compare.budget_steps(cfg, 'flops', 7 * per_step * 2e9, 2e9) == 7


def test_schedule_keeps_the_presets_warmup_fraction():
  cfg = compare.load_config(os.path.join(CONFIGS, 'bert.py'))
  compare.rescale_schedule(cfg, 500)   # BERT: 10k of 1M steps = 1%.
  assert (cfg.total_steps, cfg.optimizer.warmup_steps,
          cfg.num_train_steps) == (500, 5, 0)


@pytest.mark.parametrize('runs, overrides, budget, message', [
    (['bert'], [], 'steps:10', 'NAME='),
    ([_run('a', 'bert.py'), _run('a', 'roberta.py')], [], 'steps:10',
     'used twice'),
    ([_run('a', 'nope.py')], [], 'steps:10', 'neither a config file'),
    ([_run('a', 'bert.py')], ['model.no_such_field=3'], 'steps:10',
     'no field model.no_such_field'),
    ([_run('a', 'bert.py')], ['model.size'], 'steps:10', 'field=value'),
    ([_run('a', 'bert.py')], [], 'hours:3', 'steps:N'),
    ([_run('a', 'bert.py')], [], 'steps:0', 'N > 0'),
    ([], [], 'steps:10', 'no --run'),
])
def test_bad_arguments_fail_before_training(tmp_path, runs, overrides,
                                            budget, message):
  with pytest.raises(compare.CompareError, match=message):
    compare.prepare_runs(runs, overrides, budget, str(tmp_path), 0)
  assert not os.listdir(tmp_path)


@pytest.mark.e2e
def test_tiny_comparison_writes_table_and_plots(tmp_path):
  out = str(tmp_path / 'out')
  data = [f'data.data_dir="{tmp_path / "data"}"']
  runs = [_run('bert', 'bert.py:size=base'),
          _run('roberta', 'roberta.py:size=base'),
          _run('spanbert', 'spanbert.py')]
  markdown = compare.compare(runs, TINY + data, 'steps:4', out, seed=3,
                             finetune_overrides=TINY_FINETUNE)
  rows = markdown.strip().split('\n')
  assert len(rows) == 2 + 3
  assert rows[0].startswith('| run | objective | params | steps')
  bert_row = rows[2].split(' | ')
  assert bert_row[0] == '| bert' and bert_row[3] == '4'
  # NSP only for BERT; SBO only for SpanBERT.
  header = [c.strip() for c in rows[0].strip('|').split('|')]
  cells = {r.split(' | ')[0].strip('| '): [c.strip() for c in
                                            r.strip('|').split('|')]
           for r in rows[2:]}
  nsp, sbo = header.index('NSP/SOP acc.'), header.index('SBO acc.')
  assert cells['bert'][nsp] != '-' and cells['roberta'][nsp] == '-'
  assert cells['spanbert'][sbo] != '-' and cells['bert'][sbo] == '-'
  # Every run's downstream score, from its own fine-tuning.
  downstream = header.index('embedded accuracy')
  for name in ('bert', 'roberta', 'spanbert'):
    assert 0 <= float(cells[name][downstream]) <= 1
    assert os.path.isfile(os.path.join(out, 'finetune', f'{name}-step4',
                                       'downstream.json'))
  with open(os.path.join(out, 'compare.md')) as f:
    assert f.read() == markdown
  for name in ('loss_vs_steps.png', 'loss_vs_flops.png', 'objectives.png'):
    with open(os.path.join(out, name), 'rb') as f:
      png = f.read()
    assert png.startswith(b'\x89PNG') and len(png) > 10_000, name
  # Rerun: nothing trains again, and a finished workdir is read as it is.
  again = compare.compare(
      runs[:2] + [f'spanbert={os.path.join(out, "runs", "spanbert")}'],
      TINY + data, 'steps:4', out, seed=3, finetune_overrides=TINY_FINETUNE)
  strip_wall = lambda md: [r.split(' | ')[:6] + r.split(' | ')[7:]
                           for r in md.strip().split('\n')]
  assert strip_wall(again) == strip_wall(markdown)
  assert all(r.split(' | ')[6] == '-' for r in again.strip().split('\n')[2:])
  assert [r.split(' | ')[1] for r in rows[2:]] == ['MLM+NSP', 'MLM',
                                                   'MLM+SBO']
