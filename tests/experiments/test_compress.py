"""experiments/compress.py end to end: a saved run's heads pruned by
importance and a LayerDrop run's layers kept, each written as a directory
that pretraining continues from and export takes; bad requests fail
before anything is written."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from bertjax import compress
from bertjax import config_lib
from bertjax import finetune
from bertjax import pruning
from bertjax import runs
from bertjax.interop import hf_convert
from bertjax.models import heads as heads_lib

import preset_helpers
import teacher_helpers

cli = preset_helpers.load_experiment('compress.py', 'compress_cli')

# The tiny demo at 3 layers of 2 heads, LayerDrop on.
FIELDS = {**preset_helpers.TINY, 'model.num_layers': 3,
          'model.layerdrop': 0.2}


@pytest.fixture(scope='module')
def saved_run(tmp_path_factory):
  """(workdir, data_dir): a run of ``FIELDS`` written as the trainer saves
  one (random weights at step ``teacher_helpers.STEP``), untrained."""
  root = tmp_path_factory.mktemp('compress')
  cfg = preset_helpers.set_fields(preset_helpers.load_preset('demo'), {
      **FIELDS, 'data.data_dir': str(root / 'data')})
  teacher_helpers.write_run_on_corpus(str(root / 'run'), cfg)
  return str(root / 'run'), str(root / 'data')


def _attention_sizes(workdir):
  params = runs.load_run(workdir).params
  return pruning.attention_parameters(params), {
      name: params[name]['attention']['qkv_kernel'].shape[2]
      for name in pruning.layer_names(params)}


@pytest.mark.e2e
def test_pruned_heads_continue_pretraining_and_export(saved_run, tmp_path,
                                                      capsys):
  run, data_dir = saved_run
  out = str(tmp_path / 'heads50')
  cli.main(['prune_heads', f'--workdir={run}', f'--out={out}',
            '--fraction=0.5'])
  assert f'wrote {out}' in capsys.readouterr().out
  record = json.load(open(os.path.join(out, compress.SOURCE_FILE)))
  assert record['method'] == 'prune_heads'
  assert record['workdir'] == run and record['step'] == teacher_helpers.STEP
  assert sum(len(h) for h in record['pruned_heads']) == 3   # Of 6.
  before, _ = _attention_sizes(run)
  after, heads = _attention_sizes(out)
  d = 32
  assert after - 3 * d == (before - 3 * d) // 2   # Weights half; biases D.
  assert sorted(heads.values()) == [1, 1, 1]
  # Pretraining continues from it with its config, pruned heads and all
  # (the rounds below train such a directory).
  cfg = preset_helpers.set_fields(
      preset_helpers.load_preset('imported', os.path.join(out,
                                                          'config.json')),
      {**preset_helpers.TINY_DATA, 'data.data_dir': data_dir})
  assert tuple(map(tuple, cfg.model.pruned_heads)) == tuple(
      map(tuple, record['pruned_heads']))
  assert cfg.init_from == out
  config_lib.validate(cfg)
  # Fine-tuning builds its encoder with the pruned layers' shapes.
  pretrained = finetune.load_pretrained(out)
  model = heads_lib.DownstreamModel(pretrained.model, 'classification', 3)
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), ids,
                                     ids, ids)['params'])
  for name in pruning.layer_names(pretrained.params):
    assert jax.tree.map(np.shape, abstract[name]) == jax.tree.map(
        np.shape, pretrained.params[name])
  exported = str(tmp_path / 'exported')
  hf_convert.export_run(out, exported)
  back = hf_convert.import_model(exported)
  assert [list(h) for h in back.config.model.pruned_heads] == record[
      'pruned_heads']
  ours = runs.load_run(out).params
  for name in pruning.layer_names(ours):
    for key, value in ours[name]['attention'].items():
      np.testing.assert_array_equal(back.params[name]['attention'][key],
                                    value, err_msg=f'{name} {key}')


@pytest.mark.e2e
def test_kept_layers_are_the_run_without_the_others(saved_run, tmp_path):
  run, _ = saved_run
  out = str(tmp_path / 'keep2')
  cli.main(['keep_layers', f'--workdir={run}', f'--out={out}', '--keep=2'])
  record = json.load(open(os.path.join(out, compress.SOURCE_FILE)))
  assert record['layers'] == [1, 2] and record['layerdrop'] == 0.2
  source, kept = runs.load_run(run).params, runs.load_run(out).params
  assert pruning.layer_names(kept) == ['layer_0', 'layer_1']
  for new, old in (('layer_0', 'layer_1'), ('layer_1', 'layer_2')):
    for a, b in zip(jax.tree.leaves(kept[new]), jax.tree.leaves(source[old])):
      np.testing.assert_array_equal(a, b)
  assert runs.load_run(out).config.model.num_layers == 2
  exported = str(tmp_path / 'exported')
  hf_convert.export_run(out, exported)
  model, info = transformers.BertForPreTraining.from_pretrained(
      exported, output_loading_info=True)
  assert not any(info.values()) and len(model.bert.encoder.layer) == 2


@pytest.mark.e2e
def test_bad_requests_fail_before_writing(saved_run, tmp_path, capsys):
  run, _ = saved_run
  cases = (
      (['prune_heads', '--fraction=1.0'], 'use a fraction in (0, 1)'),
      (['prune_heads', '--fraction=0.9'], 'every layer keeping one'),
      # 6 heads: rounds of 3 end at round(0.8, 1.6, 2.4) = 1, 2, 2 removed.
      (['prune_heads', '--fraction=0.4', '--rounds=3'],
       'round 3 would remove no head'),
      (['keep_layers', '--layers=2,0'], 'distinct increasing'),
      (['keep_layers', '--keep=4'], 'use 1 to 3 layers'),
      (['int8'], 'not a fine-tuning run'),   # A pretraining run.
  )
  for args, message in cases:
    out = str(tmp_path / 'never')
    with pytest.raises(SystemExit) as e:
      cli.main([args[0], f'--workdir={run}', f'--out={out}', *args[1:]])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(out)
  with pytest.raises(SystemExit):
    cli.main(['keep_layers', f'--workdir={run}', f'--out={run}',
              '--layers=0'])
  assert 'nothing is overwritten' in capsys.readouterr().err
  # Fan et al.'s "every other": layers d = 0 (mod N / (N - keep)) go.
  assert compress.every_other(4, 2) == [1, 3]
  assert compress.every_other(6, 3) == [1, 3, 5]
  assert compress.every_other(6, 4) == [1, 2, 4, 5]
  assert compress.every_other(3, 3) == [0, 1, 2]
  # Exact where floating point's i * (72 / 66) rounds down below 12.
  assert set(range(72)) - set(compress.every_other(72, 66)) == {
      0, 12, 24, 36, 48, 60}


@pytest.mark.e2e
def test_rounds_prune_train_and_resume(saved_run, tmp_path, capsys):
  """Two rounds with 2 pretraining steps between: 2 heads, then 1 more
  scored on the trained model; a rerun reuses the finished rounds and
  their finished runs."""
  run, _ = saved_run
  out = str(tmp_path / 'rounds')
  args = ['prune_heads', f'--workdir={run}', f'--out={out}',
          '--fraction=0.5', '--rounds=2', '--train_steps=2']
  cli.main(args)
  record = json.load(open(os.path.join(out, compress.SOURCE_FILE)))
  assert [r['fraction'] for r in record['rounds']] == [0.25, 0.5]
  first = record['rounds'][0]['pruned_heads']
  assert sum(len(h) for h in first) == 2
  assert sum(len(h) for h in record['pruned_heads']) == 3
  assert all(set(a) <= set(b) for a, b in zip(first,
                                               record['pruned_heads']))
  # Round 1's directory pretrained 2 steps with its heads pruned.
  trained_round = os.path.join(f'{out}.rounds', 'round_1_trained')
  assert runs.load_run(trained_round).step == 2
  assert _attention_sizes(trained_round)[1] == _attention_sizes(
      os.path.join(f'{out}.rounds', 'round_1'))[1]
  before, after = record['attention_parameters']
  assert before == _attention_sizes(run)[0]
  assert after == _attention_sizes(out)[0]
  # Rerun into a new final directory: round 1 and its run are reused.
  marker = os.path.join(f'{out}.rounds', 'round_1', compress.SOURCE_FILE)
  metrics = os.path.join(trained_round, 'metrics.jsonl')
  stamps = [os.stat(f).st_mtime_ns for f in (marker, metrics)]
  os.rename(out, str(tmp_path / 'moved'))
  capsys.readouterr()
  cli.main(args)
  assert [os.stat(f).st_mtime_ns for f in (marker, metrics)] == stamps
  again = json.load(open(os.path.join(out, compress.SOURCE_FILE)))
  assert again['pruned_heads'] == record['pruned_heads']
  # Another request into the same rounds: refused, not reused.
  os.rename(out, str(tmp_path / 'moved_again'))
  capsys.readouterr()
  with pytest.raises(SystemExit):
    cli.main(args[:3] + ['--fraction=0.34', '--rounds=2', '--train_steps=2'])
  assert 'a round of another request' in capsys.readouterr().err
  assert not os.path.exists(out)
