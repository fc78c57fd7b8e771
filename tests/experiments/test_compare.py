"""The compare tool: budgets, overrides, errors, and a tiny comparison."""

import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import shutil
import sys

import numpy as np

import pytest

from bertjax import config_lib
from bertjax import intervals
from bertjax.models import bert as bert_lib
from bertjax.objectives import mobilebert
from bertjax import storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, 'experiments', 'configs')
_spec = importlib.util.spec_from_file_location(
    'compare', os.path.join(REPO, 'experiments', 'compare.py'))
compare = importlib.util.module_from_spec(_spec)
sys.modules['compare'] = compare   # Its dataclasses look their module up.
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
TINY_FINETUNE = ('task.examples_per_class=16', 'num_epochs=2.0',
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
  small = compare.finetune_config(
      os.path.join(CONFIGS, 'compare_small.py') + ':finetune', [], 0)
  assert (small.task.examples_per_class, small.task.dev_fraction) == (40, 0.2)


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
  compare.rescale_schedule(cfg, 20)    # 1% of 20 rounds to 0: one step.
  assert cfg.optimizer.warmup_steps == 1


def test_a_schedule_without_warmup_gets_none():
  """A constant schedule refuses any warmup; the rescale adds none."""
  cfg = compare.load_config(os.path.join(CONFIGS, 'bert.py'))
  cfg.optimizer.schedule, cfg.optimizer.warmup_steps = 'constant', 0
  compare.rescale_schedule(cfg, 500)
  assert (cfg.total_steps, cfg.optimizer.warmup_steps) == (500, 0)
  config_lib.validate(cfg)


def test_mobilebert_keeps_its_transfer_share_and_held_lr():
  """MobileBERT: 240k of 740k steps transfer layer by layer (lr held),
  then a 10k warmup of the 500k after. At 1% the transfer keeps its share
  and the hold its tie; the warmup is 2% of the steps after the hold."""
  cfg = compare.load_config(os.path.join(CONFIGS, 'mobilebert.py'))
  compare.rescale_schedule(cfg, 7400)
  assert (cfg.total_steps, cfg.mobilebert.steps_per_layer,
          cfg.optimizer.hold_steps, cfg.optimizer.warmup_steps) == (
              7400, 100, 2400, 100)
  errors = []
  mobilebert.check(cfg, errors)
  assert not [e for e in errors if 'hold_steps' in e], errors
  # Fewer steps than the transfer's layers and a distillation need.
  cfg = compare.load_config(os.path.join(CONFIGS, 'mobilebert.py'))
  with pytest.raises(compare.CompareError, match=r'1 per layer x 24 layers '
                     r'= 24 steps; at least one per layer\) for its '):
    compare.rescale_schedule(cfg, 20)


@pytest.mark.parametrize('runs, overrides, budget, extra, message', [
    (['bert'], [], 'steps:10', {}, 'NAME='),
    ([_run('a', 'bert.py'), _run('a', 'roberta.py')], [], 'steps:10', {},
     'used twice'),
    ([_run('scratch', 'bert.py')], [], 'steps:10', {}, 'control'),
    ([_run('a', 'nope.py')], [], 'steps:10', {}, 'neither a config file'),
    ([_run('a', 'bert.py')], ['model.no_such_field=3'], 'steps:10', {},
     'no field model.no_such_field'),
    ([_run('a', 'bert.py')], ['model.size'], 'steps:10', {}, 'field=value'),
    ([_run('a', 'bert.py')], [], 'hours:3', {}, 'steps:N'),
    ([_run('a', 'bert.py')], [], 'steps:0', {}, 'N > 0'),
    ([_run('a', 'bert.py')], [], 'steps:5,5', {}, 'repeats'),
    ([], [], 'steps:10', {}, 'no --run'),
    ([_run('a', 'bert.py')], [], 'steps:10', {'seeds': 0}, 'at least 1'),
    ([_run('a', 'bert.py')], [], 'steps:10', {'sweeps': ['masking.rate=0.1']},
     'at least two values'),
    ([_run('a', 'bert.py')], [], 'steps:10',
     {'sweeps': ['masking.nope=1,2']}, 'no field masking.nope'),
    ([_run('a', 'bert.py')], [], 'steps:10',
     {'sweeps': ['a=1,2', 'b=1,2', 'c=1,2']}, 'one or two'),
    ([_run('a', 'bert.py')], [], 'steps:10', {'finetune_lrs': '1e-4,x'},
     'learning rates'),
    ([_run('a', 'bert.py')], [], 'steps:10',
     {'finetune_lrs': '1e-4,2e-4', 'dev_fraction': 0.0}, 'dev split'),
    ([_run('a', 'bert.py')], [], 'steps:10', {'baseline': 'b'}, 'not an arm'),
])
def test_bad_arguments_fail_before_training(tmp_path, runs, overrides,
                                            budget, extra, message):
  with pytest.raises(compare.CompareError, match=message):
    compare.make_plan(runs, overrides, budget, **extra)
  assert not os.listdir(tmp_path)


def test_sweeps_make_one_arm_per_point_of_the_grid():
  arms = compare.make_arms([_run('bert', 'bert.py')],
                           ['masking.rate=0.1,0.2', 'masking.span_upper=3,5'])
  assert [a.name for a in arms] == [
      'bert[masking.rate=0.1,masking.span_upper=3]',
      'bert[masking.rate=0.1,masking.span_upper=5]',
      'bert[masking.rate=0.2,masking.span_upper=3]',
      'bert[masking.rate=0.2,masking.span_upper=5]']
  assert arms[2].setting == (('masking.rate', 0.2),
                             ('masking.span_upper', 3))
  cfg = compare.arm_config(arms[2], [], 7, 'steps', 50)
  assert (cfg.masking.rate, cfg.masking.span_upper, cfg.seed,
          cfg.total_steps) == (0.2, 3, 7, 50)
  assert all('[' not in a.directory and ']' not in a.directory for a in arms)


def _ft_row(arm, seed, lr, dev, correct, architecture='x', budget='steps4'):
  labels = [0] * len(correct)
  return {'kind': 'finetune', 'arm': arm, 'budget': budget, 'seed': seed,
          'lr': lr, 'architecture': architecture, 'task': 'embedded',
          'headline': 'accuracy',
          'dev_metrics': {'accuracy': dev, 'f1': dev},
          'metrics': {'accuracy': float(np.mean(correct)), 'f1': 0.0},
          'eval_predictions': [0 if c else 1 for c in correct],
          'eval_labels': labels}


def test_each_arm_chooses_its_rate_on_dev_never_on_held_out():
  # At lr 1 the dev score is best and the held-out score worst: the choice
  # must follow dev.
  rows = []
  for seed in (0, 1, 2):
    rows.append(_ft_row('a', seed, 1.0, 0.9, [seed % 2 == 0] + [False] * 9))
    rows.append(_ft_row('a', seed, 2.0, 0.5, [True] * 10))
  rows.append(_ft_row('a', 3, 2.0, 0.99, [True] * 10))  # Only one rate.
  (group,) = compare.downstream_groups(rows)
  assert group.chosen_lr == 1.0 and sorted(group.by_lr[2.0]) == [0, 1, 2, 3]
  # Rows without a dev split: one rate stands; a grid cannot be chosen.
  for row in rows:
    del row['dev_metrics']
  (group,) = compare.downstream_groups(rows[1::2])
  assert group.chosen_lr == 2.0
  with pytest.raises(compare.CompareError, match='held-out'):
    compare.downstream_groups(rows)


def test_paired_differences_use_the_seeds_both_arms_have():
  a = {s: _ft_row('a', s, 1.0, 0.5, [True] * 8 + [False] * 2)
       for s in (0, 1, 2)}
  b = {s: _ft_row('b', s, 1.0, 0.5, [True] * 5 + [False] * 5)
       for s in (1, 2, 3)}
  iv = compare.headline_interval(a, b)
  assert iv.seeds == 2 and iv.estimate == pytest.approx(0.3)
  # Without per-example predictions: Student t over the paired seeds.
  for row in list(a.values()) + list(b.values()):
    del row['eval_predictions']
  iv = compare.headline_interval(a, b)
  assert iv.seeds == 2 and iv.examples == 0 and iv.estimate == (
      pytest.approx(0.3))
  # Both seeds' differences alike: no spread measured, so no interval
  # (a zero-width one would print in bold as certain).
  assert math.isnan(iv.low) and math.isnan(iv.high)
  assert compare.interval_text(iv, signed=True) == '+0.3000'
  b[2]['metrics']['accuracy'] = 0.6
  iv = compare.headline_interval(a, b)
  assert iv.estimate == pytest.approx(0.25) and iv.low < 0.25 < iv.high


def test_a_metric_that_is_not_a_mean_is_resampled_over_examples():
  # F1 (MRPC's headline): recomputed per bootstrap resample of the held-out
  # examples, paired by seed and example, not over seeds alone.
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, 200).tolist()

  def row(arm, seed, flip):
    predictions = [1 - y if rng.random() < flip else y for y in labels]
    found = sum(p == 1 for p in predictions)
    right = sum(p == y == 1 for p, y in zip(predictions, labels))
    f1 = 2 * right / (found + sum(labels))
    return dict(_ft_row(arm, seed, 1.0, 0.5, [True] * 200),
                headline='f1', metrics={'accuracy': 0.0, 'f1': f1},
                eval_predictions=predictions, eval_labels=labels)

  a = {s: row('a', s, 0.1) for s in (0, 1, 2)}
  b = {s: row('b', s, 0.3) for s in (0, 1, 2)}
  iv = compare.headline_interval(a, b)
  assert iv.examples == 200 and iv.seeds == 3
  assert iv.estimate == pytest.approx(np.mean(
      [a[s]['metrics']['f1'] - b[s]['metrics']['f1'] for s in a]))
  assert iv.low < iv.estimate < iv.high
  b[1] = dict(b[1], eval_labels=labels[::-1])
  with pytest.raises(ValueError, match='different held-out labels'):
    compare.headline_interval(a, b)


def test_only_a_difference_over_two_or_more_seeds_is_bold():
  # One seed's interval covers its held-out examples, not the seed spread.
  one = intervals.Interval(0.2, 0.1, 0.3, seeds=1, examples=50)
  two = intervals.Interval(0.2, 0.1, 0.3, seeds=2, examples=50)
  assert compare.interval_text(one, signed=True) == '+0.2000 [+0.1000, +0.3000]'
  assert compare.interval_text(two, signed=True) == (
      '**+0.2000 [+0.1000, +0.3000]**')
  # Not a difference:
  assert compare.interval_text(two) == '0.2000 [0.1000, 0.3000]'


def test_control_repeats_are_averaged_per_example_once_all_are_in():
  rows = []
  for seed in (0, 1, 2):
    for repeat in ((0, 1) if seed < 2 else (0,)):   # Seed 2: one missing.
      row = _ft_row('scratch', seed, 1.0, 0.2 + 0.2 * repeat,
                    [repeat == 1, True, False, False], budget='')
      row['repeat'] = repeat
      rows.append(row)
  rows.append(_ft_row('a', 0, 1.0, 0.5, [True] * 4))
  single = {g.arm: g for g in compare.downstream_groups(rows)}
  assert sorted(single['scratch'].chosen()) == [0, 1, 2]  # Repeat 0 only.
  groups = {g.arm: g for g in compare.downstream_groups(rows, 2)}
  merged = groups['scratch'].chosen()
  assert sorted(merged) == [0, 1] and sorted(groups['a'].chosen()) == [0]
  np.testing.assert_array_equal(compare._correct(merged[0]),
                                [0.5, 1.0, 0.0, 0.0])
  assert merged[0]['metrics']['accuracy'] == pytest.approx(0.375)
  assert merged[0]['dev_metrics']['accuracy'] == pytest.approx(0.3)
  assert merged[0]['repeats'] == 2
  iv = compare.headline_interval(groups['a'].chosen(), merged)
  assert iv.estimate == pytest.approx(1 - 0.375)
  with pytest.raises(compare.CompareError, match='collide'):
    compare.make_plan([_run('a', 'bert.py')], [], 'steps:2', seeds=2,
                      seed=compare.REPEAT_SEED_STRIDE - 1, control_repeats=2)
  assert compare.control_seed(3, 2) == 3 + 2 * compare.REPEAT_SEED_STRIDE


def test_repeats_without_every_prediction_merge_over_seeds_alone():
  # One repeat lacks per-example predictions: repeat 0's alone must not
  # stand for the seed, or the interval reads one repeat of several.
  rows = []
  for seed in (0, 1):
    for repeat in (0, 1):
      row = _ft_row('scratch', seed, 1.0, 0.5,
                    [True, repeat == 0, False, seed == 0], budget='')
      row['repeat'] = repeat
      if repeat == 1:
        del row['eval_predictions']
      rows.append(row)
  (group,) = compare.downstream_groups(rows, 2)
  merged = group.chosen()
  assert not any('eval_predictions' in r or 'eval_correct' in r
                 for r in merged.values())
  iv = compare.headline_interval(merged)
  assert iv.examples == 0 and iv.estimate == pytest.approx(
      np.mean([(0.75 + 0.5) / 2, (0.5 + 0.25) / 2]))


def _pre_row(arm, seed, budget, steps, loss, architecture='x'):
  return {'kind': 'pretrain', 'key': f'{arm}{seed}{budget}', 'arm': arm,
          'budget': budget, 'seed': seed, 'objective': 'bert',
          'objective_label': 'MLM', 'steps': steps, 'tokens': steps * 100,
          'flops': steps * 1e6, 'parameters': 1000, 'wall_seconds': 2.0,
          'architecture': architecture,
          'final': {'eval_mlm_loss': loss, 'eval_mlm_accuracy': 0.1},
          'curve': [{'step': s, 'mlm_loss': loss + 1 / s,
                     'eval_mlm_loss': loss + 1 / s, 'nsp_accuracy': 0.5}
                    for s in range(1, steps + 1)]}


def test_report_and_plots_from_rows(tmp_path):
  """Two budgets, two architectures, a rate grid, from rows alone."""
  plan = compare.make_plan(
      [_run('a', 'bert.py'), _run('b', 'roberta.py')], [], 'steps:2,4',
      seeds=3, finetune_lrs='1e-3,3e-3', baseline='b')
  rng = np.random.default_rng(0)
  rows = []
  for seed in range(3):
    rows.append(_ft_row('scratch', seed, 1e-3, 0.3, rng.random(50) < 0.3,
                        'x', ''))
    rows.append(_ft_row('scratch', seed, 3e-3, 0.2, rng.random(50) < 0.2,
                        'x', ''))
    rows.append(_ft_row('scratch', seed, 1e-3, 0.3, rng.random(50) < 0.3,
                        'y', ''))
    for budget, steps, p in (('steps2', 2, 0.5), ('steps4', 4, 0.9)):
      for arm, arch in (('a', 'x'), ('b', 'y')):
        rows.append(_pre_row(arm, seed, budget, steps, 5.0 - steps / 4, arch))
        for lr in (1e-3, 3e-3):
          rows.append(_ft_row(arm, seed, lr, p if lr == 1e-3 else 0.1,
                              rng.random(50) < p, arch, budget))
  markdown = compare.report(plan, rows, 'python experiments/compare.py x',
                            1.0)
  lines = markdown.split('\n')
  assert 'Seeds: 0, 1, 2 (N = 3' in markdown
  assert 'Wall time: 0.4 min for every run in the rows' in markdown
  # A control per architecture, in the table and in the rate grid (2 rates
  # of x's, 1 of y's); arm a at 4 steps beats its own clearly.
  assert sum(l.startswith('| scratch (') for l in lines) == 2 + 3
  assert '| scratch (y) | - | 0.001 (chosen) | 0, 1, 2 |' in markdown
  (row,) = [l.split(' | ') for l in lines
            if l.startswith('| a | steps4 | 0, 1, 2 |')]
  assert row[3] == '0.001' and row[6].startswith('**+')   # Chosen on dev.
  assert row[7] != '-'              # Paired with the baseline b.
  (row,) = [l.split(' | ') for l in lines
            if l.startswith('| b | steps4 | 0, 1, 2 |')]
  assert row[7] == '-'              # The baseline itself.
  assert '0.003 |' in markdown and '0.001 (chosen)' in markdown
  paths = compare.plots(plan, rows, str(tmp_path))
  assert sorted(os.path.basename(p) for p in paths) == sorted([
      'loss_vs_steps.png', 'loss_vs_flops.png', 'objectives.png',
      'downstream_vs_flops.png', 'difference_vs_steps.png'])
  for path in paths:
    with open(path, 'rb') as f:
      assert f.read(4) == b'\x89PNG'


def test_pretraining_differences_are_paired_by_seed_between_mlm_losses():
  plan = compare.make_plan(
      [_run('mlm', 'bert.py'), _run('distilled', 'bert.py'),
       _run('gen', 'electra.py:size=small')], [], 'steps:2', seeds=3,
      finetune_spec='none', baseline='mlm')
  rows = []
  for seed, (base, ours) in enumerate(((5.0, 4.8), (5.2, 5.1), (4.9, 4.6))):
    rows.append(_pre_row('mlm', seed, 'steps2', 2, base))
    rows.append(dict(_pre_row('distilled', seed, 'steps2', 2, ours),
                     objective='tinybert'))
    # ELECTRA's eval_mlm_loss is its generator's: not compared.
    rows.append(dict(_pre_row('gen', seed, 'steps2', 2, 1.0),
                     objective='electra'))
  markdown = compare.report(plan, rows, 'python experiments/compare.py x',
                            1.0)
  (line,) = [l for l in markdown.split('\n')
             if l.startswith('| distilled | steps2 | 0, 1, 2 |')]
  iv = intervals.seed_interval([-0.2, -0.1, -0.3])
  # Every seed favours distillation, but 3 seeds' interval holds 0: not
  # bold, no difference.
  assert line.endswith(f' {iv.estimate:+.4f} [{iv.low:+.4f}, '
                       f'{iv.high:+.4f}] |') and '**' not in line
  assert iv.low < 0 < iv.high
  assert not any(l.startswith('| gen | steps2 | 0') for l in
                 markdown.split('\n'))


def test_cells_name_their_seeds_and_a_difference_its_paired_ones():
  # Mid-comparison: arm a has seeds 0 and 1, the baseline b seed 0 only.
  plan = compare.make_plan(
      [_run('a', 'bert.py'), _run('b', 'bert.py')], [], 'steps:4',
      seeds=3, finetune_lrs='1e-3', baseline='b')
  rng = np.random.default_rng(1)
  rows = [_ft_row('scratch', s, 1e-3, 0.3, rng.random(50) < 0.3, 'x', '')
          for s in (0, 1)]
  rows += [_ft_row('a', s, 1e-3, 0.5, rng.random(50) < 0.5) for s in (0, 1)]
  rows += [_ft_row('b', 0, 1e-3, 0.5, rng.random(50) < 0.5)]
  rows += [_pre_row(arm, s, 'steps4', 4, 4.0) for arm, s in
           (('a', 0), ('a', 1), ('b', 0))]
  markdown = compare.report(plan, rows, 'python experiments/compare.py x',
                            1.0)
  lines = markdown.split('\n')
  (row,) = [l.split(' | ') for l in lines
            if l.startswith('| a | steps4 | 0, 1 | 0.001 |')]
  assert '(' not in row[6]                # Δ vs scratch: seeds 0, 1 both.
  assert row[7].endswith(' (seed 0)')     # Δ vs b: b has seed 0 only.
  assert any(l.startswith('| b | steps4 | MLM | 0 |') for l in lines)
  assert any(l.startswith('| a | steps4 | 0.001 (chosen) | 0, 1 |')
             for l in lines)


def test_the_rate_grid_pairs_each_arm_with_the_baseline_at_each_rate():
  # a beats b by 0.3 at lr 1e-3 and loses by 0.2 at 3e-3: each rate's row
  # says so, paired by seed at that rate, whichever rate each side chose.
  plan = compare.make_plan(
      [_run('a', 'bert.py'), _run('b', 'bert.py')], [], 'steps:4',
      seeds=2, finetune_lrs='1e-3,3e-3', baseline='b')
  rows = []
  for s in (0, 1):
    rows += [_ft_row('scratch', s, lr, 0.3, [True] * 3 + [False] * 7,
                     'x', '') for lr in (1e-3, 3e-3)]
    rows += [_pre_row(arm, s, 'steps4', 4, 4.0) for arm in 'ab']
    rows += [_ft_row('a', s, 1e-3, 0.9, [True] * (8 + s) + [False] * (2 - s)),
             _ft_row('a', s, 3e-3, 0.1, [True] * 3 + [False] * 7),
             _ft_row('b', s, 1e-3, 0.1, [True] * (5 + s) + [False] * (5 - s)),
             _ft_row('b', s, 3e-3, 0.9, [True] * 5 + [False] * 5)]
  rows.append(_ft_row('a', 2, 3e-3, 0.1, [True] * 10))   # b has no seed 2.
  lines = compare.report(plan, rows, 'x', 1.0).split('\n')
  grid = {tuple(c.strip() for c in l.split('|')[1:4]): l.split('|')[7]
          for l in lines if l.startswith('| ') and '(mean)' not in l
          and len(l.split('|')) == 9}
  assert grid[('a', 'steps4', '0.001 (chosen)')].startswith(' **+0.3000 [')
  assert grid[('a', 'steps4', '0.003')].strip().startswith('-0.')
  assert grid[('a', 'steps4', '0.003')].strip().endswith(' (seeds 0, 1)')
  assert grid[('b', 'steps4', '0.001')].strip() == '-'   # The baseline.
  assert grid[('scratch', '-', '0.001 (chosen)')].strip() == '-'


def test_mlm_losses_over_other_held_out_batches_are_not_paired():
  # ALBERT's pairs, another masking and a corrupting task each change
  # the held-out inputs or masks; a task that only adds labels does not.
  runs = [_run('mlm', 'bert.py'),
          _run('sop', 'bert.py'), _run('spans', 'bert.py'),
          _run('deleted', 'bert.py'), _run('labelled', 'bert.py')]
  settings = {'sop': ('data.layout', 'sop'),
              'spans': ('masking.strategy', 'span'),
              'deleted': ('tasks.token_deletion.weight', 1.0),
              'labelled': ('tasks.token_document.weight', 1.0)}
  plan = compare.make_plan(runs, [], 'steps:2', seeds=2,
                           finetune_spec='none', baseline='mlm')
  plan.arms = [dataclasses.replace(a, setting=(settings[a.name],))
               if a.name in settings else a for a in plan.arms]
  rows = [dict(_pre_row(arm, seed, 'steps2', 2, 5.0 - 0.1 * seed - i / 10),
               objective='bert')
          for seed in range(2) for i, arm in enumerate(
              ['mlm', 'sop', 'spans', 'deleted', 'labelled'])]
  markdown = compare.report(plan, rows, 'python experiments/compare.py x',
                            1.0)
  paired = [l.split(' | ')[0][2:] for l in markdown.split('\n')
            if l.startswith('| ') and ' | steps2 | 0, 1 | ' in l
            and l.count(' | ') == 3]
  assert paired == ['labelled']
  (note,) = [l for l in markdown.split('\n') if l.startswith('Not compared')]
  assert note.endswith('sop (data); spans (masking); deleted '
                       '(tasks.token_deletion).')


@pytest.mark.parametrize('where', ['local', 'bucket'])
def test_a_torn_last_row_is_cut_off_and_rerun(tmp_path, request, where):
  base = (str(tmp_path) if where == 'local' else
          f'{request.getfixturevalue("gcs_bucket")}/compare-rows')
  path = os.path.join(base, compare.ROWS)
  storage.write_text(path, '{"key": "a", "kind": "pretrain"}\n{"key": "b", "ki')
  rows = compare.Rows(path)
  assert [r['key'] for r in rows.rows] == ['a']
  rows.add({'key': 'c'})
  rows.add({'key': 'd'})
  assert [r['key'] for r in compare.Rows(path).rows] == ['a', 'c', 'd']
  storage.write_text(path, '{"key": "a"}\nnot json\n{"key": "b"}\n')
  with pytest.raises(compare.CompareError, match='line 2'):
    compare.Rows(path)


def test_a_resumed_runs_wall_time_counts_every_invocation(tmp_path,
                                                        monkeypatch):
  clock = iter([100.0, 130.0, 500.0, 510.5])
  monkeypatch.setattr(compare.time, 'time', lambda: next(clock))

  def preempted():
    raise KeyboardInterrupt   # As a SIGTERM's Preempted, mid-run.

  with pytest.raises(KeyboardInterrupt):
    compare._timed(str(tmp_path), preempted)
  assert compare._timed(str(tmp_path), lambda x: x * 2, 21) == (42, 40.5)


@pytest.mark.e2e
def test_seeded_comparison_with_control_and_resume(tmp_path):
  out, results = str(tmp_path / 'out'), str(tmp_path / 'results')
  data = [f'data.data_dir="{tmp_path / "data"}"']
  kwargs = dict(seed=3, seeds=2, finetune_overrides=TINY_FINETUNE,
                finetune_lrs='3e-3', results=results, control_repeats=2,
                command='python experiments/compare.py (t)')
  runs = [_run('bert', 'bert.py:size=base')]
  markdown = compare.compare(runs, TINY + data, 'steps:3', out, **kwargs)
  rows = compare.Rows(os.path.join(results, compare.ROWS)).rows
  pre = [r for r in rows if r['kind'] == 'pretrain']
  ft = [r for r in rows if r['kind'] == 'finetune']
  # 2 seeds pretrained and fine-tuned; the control under the same seeds,
  # twice each. (Sweeps, baselines, grids and several architectures: the
  # unit tests.)
  assert len(pre) == 2 and len(ft) == 2 + 2 * 2
  assert sorted((r['seed'], r['repeat']) for r in ft
                if r['arm'] == 'scratch') == [(3, 0), (3, 1), (4, 0), (4, 1)]
  assert len({r['key'] for r in ft}) == 6
  assert len({r['architecture'] for r in ft}) == 1
  assert all(len(r['eval_predictions']) == len(r['eval_labels']) > 100
             for r in ft)
  assert 'Seeds: 3, 4 (N = 2' in markdown
  assert '| scratch | - | 3, 4 × 2 |' in markdown
  (row,) = [l.split(' | ') for l in markdown.split('\n')
            if l.startswith('| bert | steps3 | 3, 4 |')]
  assert '[' in row[5] and '[' in row[6]   # Its score, and Δ vs scratch.
  for name in ('loss_vs_steps.png', 'downstream_vs_flops.png',
               'difference_vs_steps.png'):
    with open(os.path.join(results, name), 'rb') as f:
      png = f.read()
    assert png.startswith(b'\x89PNG') and len(png) > 10_000, name
  # A run killed before its row was whole runs again (here it resumes at
  # its last checkpoint) and gives the same row, bit for bit.
  with open(os.path.join(results, compare.ROWS)) as f:
    lines = f.readlines()
  with open(os.path.join(results, compare.ROWS), 'w') as f:
    f.writelines(lines[:-1] + [lines[-1][:40]])
  compare.compare(runs, TINY + data, 'steps:3', out, **kwargs)
  redone = compare.Rows(os.path.join(results, compare.ROWS)).rows[-1]
  dropped = json.loads(lines[-1])
  for row in (redone, dropped):
    row.pop('wall_seconds')
  assert redone == dropped
  # Other settings in the same --out: the workdirs are another run's, so
  # they are refused rather than resumed (or reported) as this one.
  with pytest.raises(compare.CompareError, match='other settings'):
    compare.compare(runs, TINY + data + ['optimizer.weight_decay=0.02'],
                    'steps:3', out, **kwargs)
  # Another machine: no workdirs, only the rows. Nothing trains again and
  # the report is the same but for this invocation's wall time.
  shutil.rmtree(out)
  again = compare.compare(runs, TINY + data, 'steps:3', out, **kwargs)
  assert not os.path.exists(os.path.join(out, 'runs'))
  same = lambda md: [l for l in md.split('\n') if 'this invocation' not in l]
  assert same(again) == same(markdown)
  shutil.rmtree(out)
  # A row of another grid (the best dev score, were it read) is not this
  # plan's: the report leaves it out.
  stale = dict(ft[0], key='stale', lr=1e-9,
               dev_metrics={'accuracy': 1.0, 'f1': 1.0})
  with open(os.path.join(results, compare.ROWS), 'a') as f:
    f.write(json.dumps(stale) + '\n')
  only = compare.compare(runs, TINY + data, 'steps:3', out, report_only=True,
                         **dict(kwargs, seeds=3))
  assert 'N = 3' in only and not os.path.exists(out)
  assert '1e-09' not in only and '| 0.003 (chosen) |' in only


def test_settings_key_follows_what_is_computed_not_where():
  cfg = compare.load_config(os.path.join(CONFIGS, 'bert.py'))
  key = compare.settings_key(cfg)
  moved = cfg.copy_and_resolve_references()
  moved.data.data_dir = '/elsewhere'
  assert compare.settings_key(moved) == key
  moved.masking.rate = 0.2
  assert compare.settings_key(moved) != key
  # A field the defaults do not have always counts.
  grown = cfg.copy_and_resolve_references()
  with grown.unlocked():
    grown.model.new_option = 0
  assert compare.settings_key(grown) != key   # Not a default: it counts.
  ft = compare.finetune_config(os.path.join(CONFIGS, 'finetune.py'), [], 0)
  other = ft.copy_and_resolve_references()
  other.init = '/some/run'
  assert compare.settings_key(other) == compare.settings_key(ft)
  other.seed = 1
  assert compare.settings_key(other) != compare.settings_key(ft)


def test_model_key_is_unchanged_by_a_field_added_at_its_default():
  model = bert_lib.BertConfig(vocab_size=64, hidden_size=32, num_layers=2,
                              num_heads=2, intermediate_size=64)
  key = compare.model_key(model, b'spm')
  # The key rows were written with: every field BertConfig had then.
  fields_then = {k: v for k, v in dataclasses.asdict(model).items()
                 if k in compare._KEYED_MODEL_FIELDS}
  written = compare._row_key(repr(sorted(fields_then.items())),
                             hashlib.sha256(b'spm').hexdigest())[:12]
  assert key == written
  # Fields added since (LayerDrop) count where they are set.
  assert compare.model_key(dataclasses.replace(model, layerdrop=0.1),
                           b'spm') != key
  grown_class = dataclasses.make_dataclass(
      'Grown', [('new_option', int, 0)], bases=(bert_lib.BertConfig,),
      frozen=True)
  grown = grown_class(**dataclasses.asdict(model))
  assert compare.model_key(grown, b'spm') == key
  assert compare.model_key(dataclasses.replace(grown, new_option=1),
                           b'spm') != key
  assert compare.model_key(dataclasses.replace(model, num_heads=4),
                           b'spm') != key
  assert compare.model_key(model, b'other') != key
