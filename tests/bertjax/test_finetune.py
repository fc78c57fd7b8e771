"""Fine-tuning: what trains in each mode, frozen weights stay bitwise, the
encoder loads from every objective, losses match references."""

import json
import os
import re
import shutil
import types

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax import compress
from bertjax.runtime import checkpoint
from bertjax import finetune
from bertjax import storage
from bertjax.models import bert as bert_lib
from bertjax.models import heads
import preset_helpers

SMALL = bert_lib.BertConfig(vocab_size=128, hidden_size=16, num_layers=3,
                            num_heads=2, intermediate_size=32,
                            max_position_embeddings=32)


def _params(cfg=SMALL, kind='classification', layer_mix=False):
  model = heads.DownstreamModel(cfg, kind, 3, layer_mix=layer_mix)
  ids = jnp.ones((1, 8), jnp.int32)
  return model, jax.tree.map(np.asarray, nn.unbox(jax.jit(model.init)(
      jax.random.key(0), ids, ids * 0, ids)['params']))


def _config(mode, **fields):
  cfg = finetune.base_config()
  cfg.mode = mode
  for key, value in fields.items():
    cfg[key] = value
  return cfg


def _trainable_names(params, cfg):
  return sorted('/'.join(k) for k in flax.traverse_util.flatten_dict(params)
                if finetune.is_trainable(k, cfg))


def test_encoder_names_are_pretrainings():
  """The downstream encoder's trees are BertForPreTraining's, leaf for leaf,
  so a pretrained encoder loads by copying them."""
  ids = jnp.ones((1, 8), jnp.int32)
  pretraining = nn.unbox(jax.eval_shape(
      bert_lib.BertForPreTraining(SMALL).init, jax.random.key(0), ids,
      ids * 0, ids, jnp.zeros((1, 2), jnp.int32))['params'])
  _, params = _params()
  ours = {k: v.shape for k, v in flax.traverse_util.flatten_dict(
      params).items() if k[0] not in heads.HEAD}
  theirs = {k: np.shape(v) for k, v in flax.traverse_util.flatten_dict(
      pretraining).items()
            if k[0] == 'embeddings' or k[0].startswith('layer_')}
  assert ours == theirs


def test_trainable_parameters_per_mode():
  _, params = _params()
  everything = _trainable_names(params, _config('full'))
  head = ['classifier/bias', 'classifier/kernel', 'pooler/bias',
          'pooler/kernel']
  assert len(everything) == len(flax.traverse_util.flatten_dict(params))
  assert _trainable_names(params, _config('frozen')) == head
  assert _trainable_names(params, _config('gradual_unfreeze')) == everything
  adapter_cfg = bert_lib.BertConfig(**{**SMALL.__dict__, 'adapter_size': 4})
  _, adapted = _params(adapter_cfg)
  names = _trainable_names(adapted, _config('adapters'))
  adapters = [n for n in names if n not in head]
  # Two adapters (down, up: kernel and bias each) in each of 3 layers.
  assert len(adapters) == 3 * 2 * 4
  assert all('_adapter/' in n for n in adapters)
  with_norms = _trainable_names(adapted, _config(
      'adapters', adapter_layer_norms=True))
  norms = sorted(set(with_norms) - set(names))
  # Embedding norm + two per layer, scale and bias each.
  assert len(norms) == (1 + 2 * 3) * 2 and all('norm' in n for n in norms)
  _, mixed = _params(layer_mix=True)
  assert _trainable_names(mixed, _config('weighted_layers')) == sorted(
      head + ['layer_mix/gamma', 'layer_mix/weights'])


def test_split_and_merge_round_trip():
  _, params = _params()
  trainable, frozen = finetune.split(params, _config('frozen'))
  assert set(trainable) == {'pooler', 'classifier'}
  merged = finetune.merge(trainable, frozen)
  assert jax.tree.structure(merged) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(params)):
    assert a is b


def test_unfreeze_depth_goes_top_down_and_shares_groups():
  _, params = _params()
  depths = {k[0]: finetune.unfreeze_depth(k, SMALL)
            for k in flax.traverse_util.flatten_dict(params)}
  assert depths == {'classifier': 4, 'pooler': 4, 'layer_2': 3,
                    'layer_1': 2, 'layer_0': 1, 'embeddings': 0}
  # ALBERT-style: 3 layers in one shared group unfreeze with the top layer.
  shared = bert_lib.BertConfig(**{**SMALL.__dict__, 'num_layer_groups': 1})
  assert finetune.unfreeze_depth(('layer_0', 'x'), shared) == 3


def test_layer_mix_starts_as_the_mean_of_every_layer():
  model, params = _params(kind='token', layer_mix=True)
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 128, (2, 8)))
  mask = jnp.ones_like(ids)
  logits = model.apply({'params': params}, ids, ids * 0, mask)
  states = model.apply({'params': params}, ids, ids * 0, mask,
                       method=lambda m, *a: bert_lib.run_layers(
                           m.cfg, m.layers, m.embeddings(a[0], a[1], True),
                           a[0], a[2], True, all_layers=True))
  assert len(states) == SMALL.num_layers + 1
  mean = sum(states) / len(states)
  c = params['classifier']
  np.testing.assert_allclose(logits, mean @ c['kernel'] + c['bias'],
                             rtol=0, atol=1e-5)


def test_mean_pooling_averages_the_real_tokens():
  model = heads.DownstreamModel(SMALL, 'classification', 3, pooling='mean')
  ids = jnp.asarray(np.random.default_rng(2).integers(5, 128, (2, 8)))
  mask = jnp.asarray([[1] * 8, [1] * 5 + [0] * 3])
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids, ids * 0,
                                        mask))['params']
  logits = model.apply({'params': params}, ids, ids * 0, mask)
  states = model.apply({'params': params}, ids, ids * 0, mask,
                       method=lambda m, a, b, c: bert_lib.run_layers(
                           m.cfg, m.layers, m.embeddings(a, b, True), a, c,
                           True))
  mean = np.stack([states[0].mean(0), states[1, :5].mean(0)])
  p, c = params['pooler'], params['classifier']
  expected = np.tanh(mean @ p['kernel'] + p['bias']) @ c['kernel'] + c['bias']
  np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize('kind, dropped', [('classification', True),
                                           ('token', True), ('span', False)])
def test_dropout_before_the_head_except_for_spans(kind, dropped):
  # run_squad.py's start/end logits read the final states as they are.
  model = heads.DownstreamModel(SMALL, kind, 2)
  ids = jnp.asarray(np.random.default_rng(3).integers(5, 128, (2, 8)))
  mask = jnp.ones_like(ids)
  params = nn.unbox(model.init(jax.random.key(0), ids, ids * 0, mask)
                    )['params']
  _, state = model.apply(
      {'params': params}, ids, ids * 0, mask, False,
      rngs={'dropout': jax.random.key(1)}, mutable=['intermediates'],
      capture_intermediates=lambda m, _: m.name == 'dropout')
  # The head's own dropout is the top level's (the encoder's are nested).
  assert ('dropout' in state['intermediates']) == dropped


@pytest.mark.parametrize('mode', finetune.MODES)
def test_a_fixed_encoder_runs_without_dropout_and_its_head_with(mode):
  """frozen and weighted_layers read features as extract_features.py does
  (no dropout); the head's dropout stays, and other modes train the
  encoder with its dropout."""
  model = finetune.downstream_model(
      _config(mode), SMALL,
      types.SimpleNamespace(kind='classification', num_labels=2))
  ids = jnp.asarray(np.random.default_rng(3).integers(5, 128, (4, 8)))
  mask = jnp.ones_like(ids)
  params = nn.unbox(model.init(jax.random.key(0), ids, ids * 0, mask)
                    )['params']

  def head_input(deterministic, key):
    """What the classifier reads, before and after the head's dropout."""
    _, state = model.apply(
        {'params': params}, ids, ids * 0, mask, deterministic,
        rngs={'dropout': key}, mutable=['intermediates'],
        capture_intermediates=lambda m, _: m.name in ('pooler', 'dropout'))
    found = state['intermediates']
    return found['pooler']['__call__'][0], found['dropout']['__call__'][0]

  features, _ = head_input(True, jax.random.key(1))
  pooled, dropped = head_input(False, jax.random.key(1))
  fixed = mode in ('frozen', 'weighted_layers')
  assert model.fixed_encoder == fixed
  assert np.array_equal(pooled, features) == fixed
  assert not np.array_equal(dropped, pooled)   # The head's dropout.


def test_adapters_start_near_identity():
  """Adapters (std 1e-3 weights) barely move a pretrained network at init;
  with their up-projection zeroed they are the identity exactly."""
  adapter_cfg = bert_lib.BertConfig(**{**SMALL.__dict__, 'adapter_size': 4})
  model, params = _params()
  adapted_model, adapted = _params(adapter_cfg)
  flat = flax.traverse_util.flatten_dict(adapted)
  base = flax.traverse_util.flatten_dict(params)
  for k in flat:
    if k in base:
      flat[k] = base[k]
  ids = jnp.asarray(np.random.default_rng(1).integers(5, 128, (2, 8)))
  mask = jnp.ones_like(ids)
  plain = model.apply({'params': params}, ids, ids * 0, mask)
  near = adapted_model.apply(
      {'params': flax.traverse_util.unflatten_dict(flat)}, ids, ids * 0, mask)
  assert 0 < float(jnp.abs(near - plain).max()) < 1e-2
  for k in flat:
    if k[-2] == 'up':
      flat[k] = np.zeros_like(flat[k])
  exact = adapted_model.apply(
      {'params': flax.traverse_util.unflatten_dict(flat)}, ids, ids * 0, mask)
  np.testing.assert_array_equal(exact, plain)


def test_batch_rows_visit_every_row_once_per_epoch():
  epoch = [finetune.batch_rows(7, s, 103, 10) for s in range(10)]
  rows = np.concatenate(epoch)
  assert len(set(rows.tolist())) == 100   # 3 rows left out, drop_remainder.
  again = np.concatenate([finetune.batch_rows(7, s, 103, 10)
                          for s in range(10)])
  np.testing.assert_array_equal(rows, again)
  second = np.concatenate([finetune.batch_rows(7, s, 103, 10)
                           for s in range(10, 20)])
  assert not np.array_equal(rows, second)
  assert not np.array_equal(rows, np.concatenate(
      [finetune.batch_rows(8, s, 103, 10) for s in range(10)]))


def test_warmup_is_run_classifiers_truncated_proportion():
  cfg = finetune.base_config()   # warmup_proportion 0.1.
  assert [finetune.warmup_steps(cfg, n) for n in (9, 10, 19, 9819)] == (
      [0, 1, 1, 981])


def test_electras_warmup_keeps_the_fraction():
  cfg = finetune.base_config()
  cfg.optimizer.schedule = 'electra'   # optimization.py: no int().
  assert [finetune.warmup_steps(cfg, n) for n in (9, 10, 19)] == (
      pytest.approx([0.9, 1.0, 1.9]))


def test_layer_scales_are_electras_get_layer_lrs():
  """google-research/electra's ``_get_layer_lrs`` for 3 layers: depth 0
  for the embeddings, layer k (0-based) k + 1, the head n + 2; the rate
  is lr * decay ** (n + 2 - depth)."""
  _, params = _params()
  scales = {k[0]: finetune.layer_lr_scale(k, SMALL, 0.8)
            for k in flax.traverse_util.flatten_dict(params)}
  assert scales == pytest.approx({
      'embeddings': 0.8 ** 5, 'layer_0': 0.8 ** 4, 'layer_1': 0.8 ** 3,
      'layer_2': 0.8 ** 2, 'pooler': 1.0, 'classifier': 1.0}, rel=1e-12)
  # The scalar mix of weighted_layers is head; a tree it does not know is
  # refused by name (ELECTRA's optimizer raises on a variable it lacks).
  assert finetune.layer_lr_scale(('layer_mix', 'weights'), SMALL, 0.8) == 1.0
  with pytest.raises(finetune.FinetuneError, match='layers/scan/kernel'):
    finetune.layer_lr_scale(('layers', 'scan', 'kernel'), SMALL, 0.8)


def _one_step(decay, pooling='first'):
  """(params before, after) one step of SMALL's classifier under
  ``decay``, from the same init and batch."""
  cfg = _config('full', pooling=pooling, max_seq_length=8)
  cfg.optimizer.learning_rate, cfg.optimizer.warmup_proportion = 1e-2, 0.0
  cfg.optimizer.layerwise_lr_decay = decay
  model = heads.DownstreamModel(SMALL, 'classification', 3, pooling=pooling)
  steps = finetune.make_steps(cfg, model, total_steps=10, unfreeze_every=1)
  state = jax.jit(steps.init_state)()
  ids = np.random.default_rng(4).integers(5, 128, (4, 8)).astype(np.int32)
  batch = {'input_ids': ids, 'token_type_ids': np.zeros_like(ids),
           'attention_mask': np.ones_like(ids),
           'label': np.array([0, 1, 2, 1], np.int32)}
  after, _ = jax.jit(steps.train_step)(state, batch)
  return (flax.traverse_util.flatten_dict(nn.unbox(state.params)),
          flax.traverse_util.flatten_dict(nn.unbox(after.params)))


def test_layerwise_decay_scales_each_update_weight_decay_included():
  """One step with decay 0.5 moves each parameter by its scale times the
  step without it (Adam's update and the weight decay alike: ELECTRA's
  ``lr * (update + decay_rate * param)``)."""
  before, plain = _one_step(0.0)
  _, decayed = _one_step(0.5)
  assert ('pooler', 'kernel') not in before   # pooling='first': ELECTRA's.
  for key, start in before.items():
    scale = finetune.layer_lr_scale(key, SMALL, 0.5)
    np.testing.assert_allclose(
        np.asarray(decayed[key]) - start,
        scale * (np.asarray(plain[key]) - start), rtol=1e-4, atol=1e-7,
        err_msg='/'.join(key))


def test_first_pooling_reads_the_cls_state_with_no_pooler():
  model = heads.DownstreamModel(SMALL, 'classification', 3, pooling='first')
  ids = jnp.asarray(np.random.default_rng(5).integers(5, 128, (2, 8)))
  mask = jnp.ones_like(ids)
  params = nn.unbox(model.init(jax.random.key(0), ids, ids * 0, mask)
                    )['params']
  assert set(params) == {'embeddings', 'layer_0', 'layer_1', 'layer_2',
                         'classifier'}
  logits = model.apply({'params': params}, ids, ids * 0, mask)
  states = model.apply({'params': params}, ids, ids * 0, mask,
                       method=lambda m, a, b, c: bert_lib.run_layers(
                           m.cfg, m.layers, m.embeddings(a, b, True), a, c,
                           True))
  c = params['classifier']
  np.testing.assert_allclose(logits, states[:, 0] @ c['kernel'] + c['bias'],
                             rtol=0, atol=1e-5)


@pytest.mark.parametrize('head_init', ['bert', 'glorot'])
def test_the_output_layer_starts_as_its_reference(head_init):
  """'bert': run_classifier.py's truncated normal (std 0.02 before the cut
  at 2 std); 'glorot': tf.layers.dense's Glorot uniform, U(-a, a) with a =
  sqrt(6 / (fan_in + fan_out)). 16,384 draws: the bounds and the
  variance (the latter within 5%, where its standard error is 1%)."""
  cfg = bert_lib.BertConfig(vocab_size=128, hidden_size=256, num_layers=1,
                            num_heads=2, intermediate_size=32,
                            max_position_embeddings=32)
  model = heads.DownstreamModel(cfg, 'token', 64, head_init=head_init)
  ids = jnp.ones((1, 8), jnp.int32)
  kernel = np.asarray(nn.unbox(jax.jit(model.init)(
      jax.random.key(0), ids, ids * 0, ids))['params']['classifier'][
          'kernel'])
  assert kernel.shape == (256, 64)
  if head_init == 'glorot':
    bound, variance = np.sqrt(6 / (256 + 64)), 6 / (256 + 64) / 3
  else:   # The variance of N(0, 0.02^2) cut at 2 std.
    bound, variance = 0.04, 0.02 ** 2 * 0.7737413
  assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.98 * bound
  assert kernel.var() == pytest.approx(variance, rel=0.05)


def test_a_summed_loss_is_the_mean_times_the_examples():
  rng = np.random.default_rng(6)
  logits = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
  batch = {'label': jnp.asarray([0, 2, 1, 1, 0])}
  for kind in ('classification', 'regression'):
    if kind == 'regression':
      batch = {'label': jnp.asarray(rng.normal(size=5), jnp.float32)}
    mean = float(finetune.task_loss(kind, logits, batch))
    assert float(finetune.task_loss(kind, logits, batch, 'sum')) == (
        pytest.approx(5 * mean, rel=1e-6))
  cfg = _config('full', loss_reduction='sum')
  cfg.task.update(name='files', kind='token')
  with pytest.raises(finetune.FinetuneError, match="'sum' with a token"):
    finetune.validate(cfg, check_init=False)


def test_regression_labels_are_normalized_as_electras_sts(tmp_path):
  rows = [{'text': f'a {i}', 'pair': f'b {i}', 'label': i / 2}
          for i in range(11)]
  for name in ('train', 'eval'):
    (tmp_path / f'{name}.jsonl').write_text(
        ''.join(json.dumps(r) + '\n' for r in rows))
  cfg = _config('full')
  cfg.task.update(name='files', kind='regression', pair_field='pair',
                  train_path=str(tmp_path / 'train.jsonl'),
                  eval_path=str(tmp_path / 'eval.jsonl'),
                  regression_normalize=(0.0, 5.0))
  task, _ = finetune.load_task(cfg)
  expected = [i / 10 for i in range(11)]   # (label - 0) / 5.
  assert [e['label'] for e in task.eval] == pytest.approx(expected)
  assert sorted(e['label'] for e in task.train) == pytest.approx(expected)
  cfg.task.kind = 'classification'
  with pytest.raises(finetune.FinetuneError, match='regression_normalize'):
    finetune.validate(cfg, check_init=False)


def test_both_orders_appends_the_swapped_pairs():
  pairs = [{'text': 'a', 'text_pair': 'b', 'label': 1},
           {'text': 'c', 'text_pair': 'd', 'label': 0}]
  assert finetune.both_orders(pairs) == pairs + [
      {'text': 'b', 'text_pair': 'a', 'label': 1},
      {'text': 'd', 'text_pair': 'c', 'label': 0}]
  with pytest.raises(finetune.FinetuneError, match='example 1 has no second'):
    finetune.both_orders(pairs[:1] + [{'text': 'e', 'text_pair': None,
                                       'label': 0}])


def test_double_unordered_doubles_the_training_pairs_only(tmp_path):
  rows = [{'text': f'first {i}', 'pair': f'second {i}', 'label': i % 2}
          for i in range(10)]
  for name in ('train', 'eval'):
    (tmp_path / f'{name}.jsonl').write_text(
        '\n'.join(json.dumps(r) for r in rows) + '\n')
  cfg = _config('full')
  cfg.task.update(name='files', kind='classification', pair_field='pair',
                  train_path=str(tmp_path / 'train.jsonl'),
                  eval_path=str(tmp_path / 'eval.jsonl'),
                  dev_fraction=0.2, double_unordered=True)
  task, dev = finetune.load_task(cfg)
  assert len(task.train) == 16 and len(dev.eval) == 2
  assert len(task.eval) == 10
  assert task.train[8:] == [dict(e, text=e['text_pair'], text_pair=e['text'])
                            for e in task.train[:8]]
  assert not {e['text'] for e in dev.eval} & {e['text_pair']
                                              for e in task.train}
  cfg.task.kind = 'token'
  with pytest.raises(finetune.FinetuneError, match='double_unordered with '
                     'a token task'):
    finetune.validate(cfg, check_init=False)


def test_electra_recipe_preset():
  mrpc = preset_helpers.load_preset('finetune', 'task=glue/mrpc,'
                                    'recipe=electra')
  mrpc.init = 'a run'
  finetune.validate(mrpc, check_init=False)
  o = mrpc.optimizer
  assert (mrpc.pooling, mrpc.head_init, o.schedule, o.learning_rate,
          o.layerwise_lr_decay, o.weight_decay, o.eps, mrpc.num_epochs,
          mrpc.task.double_unordered, mrpc.loss_reduction) == (
              'first', 'glorot', 'electra', 1e-4, 0.8, 0.01, 1e-6, 3.0, True,
              'sum')
  sts = preset_helpers.load_preset('finetune', 'task=glue/stsb,'
                                   'recipe=electra')
  assert (tuple(sts.task.regression_normalize), sts.num_epochs) == (
      (0.0, 5.0), 10.0)
  squad = preset_helpers.load_preset('finetune', 'task=squad,recipe=electra')
  assert squad.loss_reduction == 'mean'   # Span heads take the mean.
  large = preset_helpers.load_preset('finetune', 'task=glue/rte,'
                                     'recipe=electra,size=large')
  assert (large.optimizer.learning_rate, large.optimizer.layerwise_lr_decay,
          large.num_epochs, large.task.double_unordered) == (
              5e-5, 0.9, 10.0, False)
  for arg, message in (('recipe=electra,mode=frozen', 'use mode=full'),
                       ('size=small', 'with recipe=electra'),
                       ('recipe=electra,size=huge', 'size=huge')):
    with pytest.raises(ValueError, match=message):
      preset_helpers.load_preset('finetune', arg)
  cfg = _config('full')
  cfg.optimizer.layerwise_lr_decay = 1.5
  with pytest.raises(finetune.FinetuneError, match='layerwise_lr_decay=1.5'):
    finetune.validate(cfg, check_init=False)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_dev_split_is_drawn_from_the_seed_and_disjoint():
  examples = [{'text': str(i), 'label': i % 3} for i in range(40)]
  train, dev = finetune.dev_split(examples, 0.25, seed=5)
  assert len(dev) == 10 and len(train) == 30
  assert sorted(e['text'] for e in train + dev) == sorted(
      e['text'] for e in examples)
  assert finetune.dev_split(examples, 0.25, seed=5) == (train, dev)
  assert finetune.dev_split(examples, 0.25, seed=6)[1] != dev
  assert [int(e['text']) for e in dev] == sorted(int(e['text']) for e in dev)
  with pytest.raises(finetune.FinetuneError, match='leaves no training'):
    finetune.dev_split(examples[:1], 0.5, seed=0)


def test_task_losses_match_references():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 3)).astype(np.float32)
  label = np.array([0, 2, 1, 2])
  np.testing.assert_allclose(
      finetune.task_loss('classification', logits, {'label': label}),
      -_log_softmax(logits)[np.arange(4), label].mean(), rtol=1e-6)
  target = rng.normal(size=4).astype(np.float32)
  np.testing.assert_allclose(
      finetune.task_loss('regression', logits, {'label': target}),
      ((logits[:, 0] - target) ** 2).mean(), rtol=1e-6)
  token_logits = rng.normal(size=(2, 5, 3)).astype(np.float32)
  labels = np.array([[-1, 0, 2, -1, -1], [-1, 1, -1, -1, -1]])
  real = labels >= 0
  expected = -_log_softmax(token_logits)[real, labels[real]].mean()
  np.testing.assert_allclose(
      finetune.task_loss('token', token_logits, {'labels': labels}),
      expected, rtol=1e-6)
  span_logits = rng.normal(size=(2, 5, 2)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
  start, end = np.array([1, 2]), np.array([3, 2])
  masked = np.where(mask[..., None] == 1, span_logits, -1e9)
  expected = 0.5 * (-_log_softmax(masked[..., 0])[[0, 1], start].mean()
                    - _log_softmax(masked[..., 1])[[0, 1], end].mean())
  np.testing.assert_allclose(
      finetune.task_loss('span', span_logits, {
          'attention_mask': mask, 'start_positions': start,
          'end_positions': end}), expected, rtol=1e-6)


def test_span_windows_that_cannot_overlap_are_refused():
  cfg = finetune.base_config()   # 128 tokens, doc_stride 128, question 64.
  cfg.task.name, cfg.task.kind, cfg.init = 'files', 'span', 'a run'
  with pytest.raises(finetune.FinetuneError, match=(
      'doc_stride=128 .* as few as 61 context tokens')):
    finetune.validate(cfg, check_init=False)
  cfg.max_seq_length = 384   # run_squad.py's, as the preset takes it.
  finetune.validate(cfg, check_init=False)
  squad = preset_helpers.load_preset('finetune', 'task=squad')
  squad.init = 'a run'
  finetune.validate(squad, check_init=False)
  assert (squad.max_seq_length, squad.doc_stride, squad.max_query_length,
          squad.optimizer.learning_rate) == (384, 128, 64, 5e-5)


@pytest.mark.parametrize('fields, message', [
    ({'optimizer.grad_clip': 'per-tensor'},
     "optimizer.grad_clip='per-tensor'; use one of ('global', 'per_tensor')"),
    ({'optimizer.name': 'adam'}, "optimizer.name='adam'; use one of"),
    ({'optimizer.decay_mask': 'kernels'}, "optimizer.decay_mask='kernels'"),
    # A layer unfrozen late would take a late step's bias correction.
    ({'mode': 'gradual_unfreeze', 'optimizer.name': 'adamw'},
     "mode=gradual_unfreeze with optimizer.name='adamw'"),
])
def test_optimizer_fields_are_checked_before_any_work(fields, message):
  cfg = _config(fields.pop('mode', 'full'))
  cfg.init = 'a run'
  preset_helpers.set_fields(cfg, fields)
  with pytest.raises(finetune.FinetuneError, match=re.escape(message)):
    finetune.validate(cfg, check_init=False)


def test_bad_config_fails_before_any_work(tmp_path):
  cfg = _config('sideways')
  cfg.init = str(tmp_path / 'nothing')
  cfg.task.name = 'files'
  cfg.task.dev_fraction = 1.0
  with pytest.raises(finetune.FinetuneError) as e:
    finetune.finetune(cfg, str(tmp_path / 'out'))
  message = str(e.value)
  for part in ('mode=\'sideways\'', 'task.kind', 'holds no checkpoint',
               'task.dev_fraction=1.0'):
    assert part in message
  assert not (tmp_path / 'out').exists()


# ---------------------------------------------------------------------------
# End to end: a tiny pretrained run, fine-tuned on small file tasks.

_WORDS = ('alpha', 'beta', 'gamma', 'delta', 'module', 'function', 'class',
          'returns', 'string', 'number', 'file', 'object')


def _write_tasks(directory):
  """Small tasks of every kind: classification (does the text mention
  'file'?), token (tag each word by its first letter's place in the
  alphabet, 3 tags), regression (the share of words before 'f') and span
  (find the word after 'the')."""
  rng = np.random.default_rng(0)
  paths = {}
  for split, n in (('train', 64), ('eval', 24)):
    texts = [' '.join(rng.choice(_WORDS, 6)) for _ in range(n)]
    path = directory / f'reg_{split}.jsonl'
    path.write_text(''.join(json.dumps(
        {'text': t, 'label': sum(w < 'f' for w in t.split()) / 6}) + '\n'
                            for t in texts))
    paths[f'reg_{split}'] = str(path)
    path = directory / f'span_{split}.jsonl'
    records = []
    for i, t in enumerate(texts):
      words = t.split()
      context = ' '.join(words[:3] + ['the'] + words[3:])
      start = len(' '.join(words[:3] + ['the'])) + 1
      records.append({'id': f'{split}{i}', 'question': 'what follows the?',
                      'context': context, 'answers': [
                          {'text': words[3], 'answer_start': start}]})
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    paths[f'span_{split}'] = str(path)
    path = directory / f'cls_{split}.jsonl'
    path.write_text(''.join(json.dumps(
        {'text': t, 'label': 'yes' if 'file' in t else 'no'}) + '\n'
                            for t in texts))
    paths[f'cls_{split}'] = str(path)
    path = directory / f'tok_{split}.jsonl'
    path.write_text(''.join(json.dumps(
        {'words': t.split(), 'labels': [
            'A' if w < 'f' else 'M' if w < 'n' else 'Z' for w in t.split()]})
                            + '\n' for t in texts))
    paths[f'tok_{split}'] = str(path)
  return paths


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  import test_hf_convert  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('pretrained')
  return test_hf_convert._train_tiny(root / 'run', root / 'data')  # pylint: disable=protected-access


@pytest.fixture(scope='module')
def tasks(tmp_path_factory):
  return _write_tasks(tmp_path_factory.mktemp('tasks'))


def _run(pretrained, tasks, workdir, mode, kind='classification', **fields):
  cfg = finetune.base_config()
  cfg.init = pretrained
  cfg.mode = mode
  cfg.task.name = 'files'
  cfg.task.kind = kind
  prefix = {'classification': 'cls', 'token': 'tok', 'regression': 'reg',
            'span': 'span'}[kind]
  cfg.task.train_path = tasks[f'{prefix}_train']
  cfg.task.eval_path = tasks[f'{prefix}_eval']
  cfg.max_seq_length = 16
  cfg.batch_size = 8
  cfg.num_epochs = 1.0
  cfg.adapter_size = 4
  cfg.optimizer.learning_rate = 1e-3
  cfg.log_every_steps = 4
  cfg.checkpoint_every_steps = 4
  for key, value in fields.items():
    *parents, leaf = key.split('.')
    section = cfg
    for part in parents:
      section = section[part]
    section[leaf] = value
  return finetune.finetune(cfg, str(workdir))


@pytest.fixture(scope='module')
def full(pretrained, tasks, tmp_path_factory):
  """(workdir, result) of a full fine-tuning at ``_run``'s settings, its
  checkpoints at steps 4 and 8 kept: the tests below read it and never
  write into it."""
  workdir = tmp_path_factory.mktemp('finetune') / 'full'
  return workdir, _run(pretrained, tasks, workdir, 'full',
                       keep_checkpoints=2)


def _final_params(workdir):
  directory = storage.absolute(os.path.join(str(workdir), 'checkpoints'))
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    state = manager.restore(manager.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore()))['state']
  return {k: np.asarray(v) for k, v in
          flax.traverse_util.flatten_dict(state['params']).items()}


@pytest.mark.e2e
@pytest.mark.parametrize('mode', ['frozen', 'adapters', 'weighted_layers'])
def test_fixed_encoder_weights_stay_bitwise(pretrained, tasks, tmp_path,
                                            mode):
  result = _run(pretrained, tasks, tmp_path / mode, mode)
  assert result['steps'] == 8 and set(result['metrics']) >= {'accuracy'}
  encoder = flax.traverse_util.flatten_dict(
      finetune.load_pretrained(pretrained).params)
  final = _final_params(tmp_path / mode)
  cfg = _config(mode)
  moved = []
  for key, value in final.items():
    if key in encoder and not finetune.is_trainable(key, cfg):
      assert value.tobytes() == encoder[key].tobytes(), key
    if finetune.is_trainable(key, cfg):
      moved.append(key)
  assert moved and all(k[0] in heads.HEAD or k[1].endswith('_adapter')
                       for k in moved)
  assert result['trainable_parameters'] == sum(
      final[k].size for k in moved)


@pytest.mark.e2e
def test_compare_scratch_pairs_seeds_and_says_no_difference_if_it_is_none(
    pretrained, tasks, tmp_path):
  script = preset_helpers.load_experiment('finetune.py', 'finetune_script')
  cfg = _config('full', init=pretrained, max_seq_length=16, batch_size=8,
                num_epochs=1.0, seed=4)
  cfg.task.name, cfg.task.kind = 'files', 'classification'
  cfg.task.train_path, cfg.task.eval_path = tasks['cls_train'], tasks[
      'cls_eval']
  text = script.compare_scratch(cfg, str(tmp_path), seeds=2)
  assert 'seeds 4, 5;' in text
  accuracy = {}
  for arm in ('pretrained', 'scratch'):
    for seed in (4, 5):
      with open(tmp_path / arm / f'seed{seed}' / finetune.RESULT) as f:
        accuracy[arm, seed] = json.load(f)['metrics']['accuracy']
  difference = np.mean([accuracy['pretrained', s] - accuracy['scratch', s]
                        for s in (4, 5)])
  assert f'accuracy: {difference:+.4f} [' in text
  # Finished runs are read back: the same table.
  assert script.compare_scratch(cfg, str(tmp_path), seeds=2) == text
  # The verdict follows the interval, and one seed is no claim.
  row = lambda correct: {
      'task': 't', 'headline': 'accuracy',
      'metrics': {'accuracy': float(np.mean(correct))},
      'eval_predictions': [int(c) for c in correct],
      'eval_labels': [1] * len(correct)}
  good, bad = [True] * 45 + [False] * 5, [True] * 5 + [False] * 45
  mixed = [True, False] * 25
  verdicts = {
      'pretraining helps': ({0: row(good), 1: row(good[::-1])},
                            {0: row(bad), 1: row(bad[::-1])}),
      'no difference (the interval holds 0)': (
          {0: row(good), 1: row(bad)}, {0: row(mixed), 1: row(mixed)}),
      'one seed, so no claim': ({0: row(good)}, {0: row(bad)}),
      # Without per-example predictions, seeds alike to the last digit.
      'no interval': tuple(
          {s: {k: v for k, v in row(x).items() if k != 'eval_predictions'}
           for s in (0, 1)} for x in (good, bad))}
  for verdict, (a, b) in verdicts.items():
    table = script.scratch_table({'pretrained': a, 'scratch': b}, 'full')
    assert verdict in table, table


def test_full_and_gradual_unfreezing(pretrained, tasks, full, tmp_path):
  """Full fine-tuning moves every encoder weight; gradual unfreezing with a
  layer per 3 steps, over 8 steps, reaches the top 2 of 2 layers (steps 3
  and 6) but not the embeddings."""
  encoder = flax.traverse_util.flatten_dict(
      finetune.load_pretrained(pretrained).params)
  final = _final_params(full[0])
  changed = {k for k, v in encoder.items()
             if k in final and final[k].tobytes() != v.tobytes()}
  assert {k[0] for k in changed} >= {'embeddings', 'layer_0', 'layer_1'}
  _run(pretrained, tasks, tmp_path / 'gradual', 'gradual_unfreeze',
       unfreeze_every_steps=3)
  gradual = _final_params(tmp_path / 'gradual')
  changed = {k[0] for k, v in encoder.items()
             if k in gradual and gradual[k].tobytes() != v.tobytes()}
  assert changed == {'layer_0', 'layer_1', 'pooler'}


@pytest.mark.e2e
def test_rerun_resumes_and_runs_are_deterministic(pretrained, tasks, full,
                                                  tmp_path):
  first_dir, first = full
  shutil.copytree(first_dir, tmp_path / 'a')
  again = _run(pretrained, tasks, tmp_path / 'a', 'full')   # Resumes at 8.
  twin = _run(pretrained, tasks, tmp_path / 'b', 'full')
  assert first['metrics'] == again['metrics'] == twin['metrics']
  a, b = _final_params(tmp_path / 'a'), _final_params(tmp_path / 'b')
  assert all(a[k].tobytes() == b[k].tobytes() for k in a)
  with pytest.raises(finetune.FinetuneError, match='other settings'):
    _run(pretrained, tasks, tmp_path / 'a', 'frozen')
  # Fewer epochs would restore the finished run and train nothing; a new
  # rate would change its schedule midway.
  for field, value in (('num_epochs', 0.5), ('optimizer.learning_rate', 3e-3)):
    with pytest.raises(finetune.FinetuneError, match=field.split('.')[0]):
      _run(pretrained, tasks, tmp_path / 'a', 'full', **{field: value})


@pytest.mark.e2e
def test_a_damaged_checkpoint_is_set_aside_and_the_one_before_resumed(
    pretrained, tasks, full, tmp_path, capsys):
  """Step 8's largest file changed on disk: the rerun sets step 8 aside,
  resumes from step 4 and ends as the run that was never damaged."""
  workdir = tmp_path / 'kept'
  shutil.copytree(full[0], workdir)
  files = [p for p in (workdir / 'checkpoints' / '8').rglob('*')
           if p.is_file() and p.name != checkpoint.MANIFEST]
  victim = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0xFF
  victim.write_bytes(bytes(data))
  capsys.readouterr()
  again = _run(pretrained, tasks, workdir, 'full', keep_checkpoints=2)
  out = capsys.readouterr().out
  assert 'checkpoint step 8 is unusable' in out
  assert 'resumed from the checkpoint at step 4' in out
  assert (workdir / 'checkpoints_corrupt' / '8').is_dir()
  assert again['metrics'] == full[1]['metrics']
  a, b = _final_params(workdir), _final_params(full[0])
  assert all(a[k].tobytes() == b[k].tobytes() for k in b)


@pytest.mark.e2e
def test_a_resumed_run_reports_the_step_it_started_from(pretrained, tasks,
                                                         full, tmp_path):
  """With init_step=0 the init's latest checkpoint may move on while a
  fine-tuning runs; resumed, the run keeps and reports the step it
  started from (here as if the init had since trained one step more)."""
  first_dir, first = full
  shutil.copytree(first_dir, tmp_path / 'a')
  meta_path = tmp_path / 'a' / 'finetune_meta.json'
  meta = json.loads(meta_path.read_text())
  assert meta['pretrained']['step'] == first['init_step']
  meta['pretrained']['step'] = first['init_step'] - 1
  meta_path.write_text(json.dumps(meta))
  again = _run(pretrained, tasks, tmp_path / 'a', 'full')   # Resumes at 8.
  assert again['init_step'] == first['init_step'] - 1
  assert json.loads(meta_path.read_text())['pretrained']['step'] == (
      first['init_step'] - 1)
  # Killed before its first checkpoint, a run starts over from the init's
  # step now, and says so, whatever its metadata held.
  shutil.rmtree(tmp_path / 'a' / 'checkpoints')
  fresh = _run(pretrained, tasks, tmp_path / 'a', 'full')
  assert fresh['init_step'] == first['init_step']
  assert json.loads(meta_path.read_text())['pretrained']['step'] == (
      first['init_step'])


@pytest.mark.e2e
def test_evaluations_follow_their_own_cadence(pretrained, tasks, tmp_path):
  """eval_every_steps=3 with log_every_steps=4 over 8 steps: evaluations
  at 3, 6 and the end, losses at 4 and 8 as well."""
  _run(pretrained, tasks, tmp_path / 'e', 'full', eval_every_steps=3)
  lines = [json.loads(line) for line in
           (tmp_path / 'e' / 'metrics.jsonl').read_text().splitlines()]
  evaluated = [x['step'] for x in lines if 'eval_accuracy' in x]
  assert evaluated == [3, 6, 8]
  assert [x['step'] for x in lines if 'loss' in x] == [3, 4, 6, 8]


@pytest.mark.e2e
def test_a_pretrained_run_and_a_workdir_in_a_bucket(pretrained, tasks, full,
                                                   gcs_bucket):
  """The pretrained run copied into a bucket (a Cloud Storage API on
  localhost) and fine-tuned there: the local fine-tuning's metrics and
  parameters, bit for bit, and a rerun resumes from the bucket."""
  bucket_run = f'{gcs_bucket}/finetune/pretrained'
  for path in storage.find(str(pretrained)):
    storage.upload(path, os.path.join(bucket_run,
                                      os.path.relpath(path, pretrained)))
  local_dir, local = full
  remote = _run(bucket_run, tasks, f'{gcs_bucket}/finetune/out', 'full')
  again = _run(bucket_run, tasks, f'{gcs_bucket}/finetune/out', 'full')
  assert local['metrics'] == remote['metrics'] == again['metrics']
  a = _final_params(local_dir)
  b = _final_params(f'{gcs_bucket}/finetune/out')
  assert all(a[k].tobytes() == b[k].tobytes() for k in a)
  assert json.loads(storage.read_text(
      f'{gcs_bucket}/finetune/out/{finetune.RESULT}'))['metrics'] == (
          local['metrics'])


@pytest.mark.e2e
@pytest.mark.parametrize('kind, metrics', [
    ('regression', {'pearson', 'spearman'}),
    ('span', {'exact_match', 'span_f1'})])
def test_regression_and_span_tasks(pretrained, tasks, tmp_path, kind,
                                   metrics):
  result = _run(pretrained, tasks, tmp_path / kind, 'full', kind=kind,
                max_seq_length=24, doc_stride=8, max_query_length=8)
  assert result['kind'] == kind and set(result['metrics']) == metrics
  if kind == 'regression':   # One held-out prediction per example.
    assert len(result['eval_predictions']) == len(result['eval_labels'])
    assert result['metrics']['pearson'] == pytest.approx(np.corrcoef(
        result['eval_predictions'], result['eval_labels'])[0, 1], abs=1e-6)
  else:
    assert 'eval_predictions' not in result
  assert all(np.isfinite(v) for v in result['metrics'].values())
  assert result['headline'] in metrics


@pytest.mark.e2e
def test_token_task_and_random_weights(pretrained, tasks, tmp_path):
  result = _run(pretrained, tasks, tmp_path / 'tok', 'full', kind='token')
  assert result['kind'] == 'token'
  assert 0 <= result['metrics'][result['headline']] <= 1
  random = _run(pretrained, tasks, tmp_path / 'random', 'frozen',
                init_weights='random', **{'task.dev_fraction': 0.25})
  # A dev split carved from the training examples is scored on its own,
  # and the held-out predictions, one per example, give the metrics.
  assert set(random['dev_metrics']) == set(random['metrics'])
  predictions = np.array(random['eval_predictions'])
  labels = np.array(random['eval_labels'])
  assert predictions.shape == labels.shape and random['dev_examples'] > 0
  assert random['metrics']['accuracy'] == pytest.approx(
      np.mean(predictions == labels), abs=1e-12)
  encoder = flax.traverse_util.flatten_dict(
      finetune.load_pretrained(pretrained).params)
  final = _final_params(tmp_path / 'random')
  assert all(final[k].tobytes() != v.tobytes() for k, v in encoder.items()
             if k in final and v.std() > 0)
  assert random['init_weights'] == 'random'


@pytest.mark.e2e
def test_quantization_aware_fine_tuning_and_its_int8_export(pretrained,
                                                            tasks, full,
                                                            tmp_path):
  """Q8BERT: fine-tuned with fake-quantized layers (which changes what
  training does), then exported as int8 weights whose logits are the
  training forward's on the held-out set and which read back; a float
  run is refused."""
  q8 = _run(pretrained, tasks, tmp_path / 'q8', 'full',
            **{'model.quantize': 'int8'})
  trained, floating = _final_params(tmp_path / 'q8'), _final_params(full[0])
  assert all(trained[k].tobytes() != floating[k].tobytes()
             for k in trained if k[-1] == 'kernel')
  out = str(tmp_path / 'int8')
  record = compress.int8(str(tmp_path / 'q8'), out)
  assert record['max_abs_logit_difference'] <= 1e-5
  assert record['int8_metrics'] == record['fake_quantized_metrics'] == (
      q8['metrics'])
  assert record['int8_bytes'] < 0.5 * record['float32_bytes']
  # It reads back (its logits against the training forward's:
  # test_quantization's read-back test).
  _, params = compress.load_int8(out)
  assert {x.dtype for x in jax.tree.leaves(params)} == {
      np.dtype(np.int8), np.dtype(np.float32)}
  with pytest.raises(compress.CompressError, match='model.quantize=int8'):
    compress.int8(str(full[0]), str(tmp_path / 'float-int8'))
  assert not (tmp_path / 'float-int8').exists()
  # Layers to quantize of a float run, without model.quantize: refused, as
  # they would train float.
  with pytest.raises(finetune.FinetuneError, match='the model is float'):
    _run(pretrained, tasks, tmp_path / 'layers', 'full',
         **{'model.quantize_layers': r'layer_\d+/.*'})
  assert not (tmp_path / 'layers').exists()
