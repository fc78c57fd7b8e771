"""Head pruning and LayerDrop (bertjax/pruning.py, the encoder's options):
a pruned model is the unpruned one with those heads' gates at 0, the
importance is the gates' gradient, LayerDrop skips layers at its rate and
its kept subsets are the models it trained, and transformers loads a
pruned export with its ``pruned_heads`` and equal outputs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import compress
from bertjax import config_lib
from bertjax import pruning
from bertjax.interop import hf_convert
from bertjax.models import bert as bert_lib
from bertjax.objectives import bert as bert_objective
import preset_helpers

VOCAB = 100
LENGTH = 16
# Per layer, stored heads removed: layer 0 loses 2 of its 4, layer 1 one,
# layer 2 three (it keeps one).
REMOVE = {0: [1, 3], 1: [0], 2: [0, 1, 3]}


def _config(**model):
  """The demo at 3 layers of 4 heads, width 32, no dropout."""
  cfg = config_lib.demo_config()
  cfg.model.update(num_layers=3, hidden_size=32, num_heads=4,
                   intermediate_size=64, max_position_embeddings=40,
                   hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
                   **model)
  cfg.data.max_seq_length = 32
  return cfg


def _batch():
  """[2, LENGTH] ids, token types, mask (row 1 padded from 11), all
  positions as the MLM head's."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, (2, LENGTH))
  ids[:, 0], ids[:, -1], ids[1, 11:] = 2, 3, 0
  types = np.zeros((2, LENGTH), np.int32)
  types[0, 9:] = 1
  positions = np.tile(np.arange(LENGTH)[None], (2, 1))
  return (ids.astype(np.int32), types, (ids != 0).astype(np.int32),
          positions.astype(np.int32))


@pytest.fixture(scope='module')
def unpruned():
  """(cfg, model config, params): random values (no bias zero, no
  LayerNorm the identity) on the bert objective's parameter tree."""
  cfg = _config()
  params = preset_helpers.random_bert_params(cfg, VOCAB, 0.5)
  return cfg, bert_objective.encoder_config(cfg, VOCAB), params


def _apply(model_cfg, variables, inputs, **kwargs):
  return bert_lib.BertForPreTraining(model_cfg).apply(variables, *inputs,
                                                      **kwargs)


def _gates(model_cfg, params, value):
  """The gates' tree, every gate ``value`` (a function of layer, head)."""
  _, state = _apply(model_cfg, {'params': params}, _batch(),
                    mutable=[pruning.GATES])
  gates = state[pruning.GATES]
  return {name: {'attention': {'gate': np.asarray(
      [value(i, h) for h in range(len(gates[name]['attention']['gate']))],
      np.float32)}} for i, name in enumerate(pruning.layer_names(gates))}


def test_pruned_model_is_the_unpruned_with_those_heads_gated_off(unpruned):
  _, model_cfg, params = unpruned
  pruned_params, pruned_cfg = pruning.remove_heads(params, model_cfg, REMOVE)
  assert pruned_cfg.pruned_heads == ((1, 3), (0,), (0, 1, 3))
  assert [pruned_cfg.layer_heads(i) for i in range(3)] == [2, 3, 1]
  gates = _gates(model_cfg, params,
                 lambda layer, head: float(head not in REMOVE[layer]))
  gated = _apply(model_cfg, {'params': params, pruning.GATES: gates},
                 _batch())
  ours = jax.jit(lambda p: _apply(pruned_cfg, {'params': p}, _batch()))(
      pruned_params)
  for key in ('sequence_output', 'mlm_logits', 'nsp_logits'):
    np.testing.assert_allclose(ours[key], gated[key], rtol=0, atol=1e-5,
                               err_msg=key)
  # Weights of the attention halve less the output biases (D per layer).
  before = pruning.attention_parameters(params)
  after = pruning.attention_parameters(pruned_params)
  d, per_head = 32, 4 * 32 * 8 + 3 * 8   # Q, K, V, out kernels; Q, K, V bias.
  assert before - after == 6 * per_head and before == 12 * per_head + 3 * d
  # Pruning again addresses the stored heads and records original indices.
  again_params, again = pruning.remove_heads(pruned_params, pruned_cfg,
                                             {0: [1], 1: [2]})
  assert again.pruned_heads == ((1, 2, 3), (0, 3), (0, 1, 3))
  np.testing.assert_array_equal(
      again_params['layer_1']['attention']['qkv_kernel'],
      np.asarray(params['layer_1']['attention']['qkv_kernel'])[:, :, [1, 2]])


def test_bad_removals_are_refused(unpruned):
  _, model_cfg, params = unpruned
  for remove, match in (({0: [0, 1, 2, 3]}, 'keeps at least one head'),
                        ({1: [4]}, 'cannot remove'), ({5: [0]}, 'no layer')):
    with pytest.raises(ValueError, match=match):
      pruning.remove_heads(params, model_cfg, remove)


def test_importance_is_the_gates_gradient_normalised_per_layer(unpruned):
  cfg, model_cfg, params = unpruned
  batch = dict(zip(('input_ids', 'token_type_ids', 'attention_mask',
                    'masked_positions'), _batch()))

  def loss(variables, b):
    out = _apply(model_cfg, variables, (b['input_ids'], b['token_type_ids'],
                                        b['attention_mask'],
                                        b['masked_positions']))
    return jnp.mean(out['mlm_logits'][..., 7] * b['attention_mask'])

  def apply(variables, b, mutable):
    return _apply(model_cfg, variables, (
        b['input_ids'], b['token_type_ids'], b['attention_mask'],
        b['masked_positions']), mutable=mutable)

  # The same batch twice: each score is twice its one-batch gradient.
  importance = pruning.head_importance(loss, apply, params, [batch, batch])
  assert [len(s) for s in importance] == [4, 4, 4]
  for scores in importance:
    np.testing.assert_allclose(np.linalg.norm(scores), 1.0, rtol=1e-12)
  # Central differences of the loss in one gate at a time (float32, step
  # 1e-2: the error is far below the 2e-3 tolerance).
  raw = np.zeros((3, 4))
  for layer in range(3):
    for head in range(4):
      values = []
      for delta in (1e-2, -1e-2):
        gates = _gates(model_cfg, params, lambda i, h, layer=layer,
                       head=head, delta=delta: 1.0 + delta * (
                           (i, h) == (layer, head)))
        values.append(float(loss({'params': params,
                                  pruning.GATES: gates}, batch)))
      raw[layer, head] = 2 * abs(values[0] - values[1]) / 2e-2
  expected = raw / np.linalg.norm(raw, axis=1, keepdims=True)
  np.testing.assert_allclose(np.stack(importance), expected, atol=2e-3)
  with pytest.raises(ValueError, match='at least one batch'):
    pruning.head_importance(loss, apply, params, [])


def test_least_important_is_global_and_leaves_every_layer_a_head():
  importance = [np.array([0.1, 0.9, 0.2]), np.array([0.05, 0.8]),
                np.array([0.3, 0.01, 0.02])]
  assert pruning.least_important(importance, 3) == {1: [0], 2: [1, 2]}
  assert pruning.least_important(importance, 5) == {
      0: [0, 2], 1: [0], 2: [1, 2]}
  # Each layer has one head left: no sixth.
  with pytest.raises(ValueError, match='every layer keeping one'):
    pruning.least_important(importance, 6)
  # Layer 0's second head is less important than layer 1's but stays.
  assert pruning.least_important([np.array([0.1, 0.2]),
                                  np.array([0.5, 0.6, 0.7])], 2) == {
                                      0: [0], 1: [0]}


def test_layerdrop_skips_layers_at_its_rate_and_only_in_training(unpruned):
  _, model_cfg, params = unpruned
  rate = 0.3
  dropping = dataclasses.replace(model_cfg, layerdrop=rate)
  keep = jax.jit(jax.vmap(lambda k: bert_lib.layerdrop_keep(dropping, k, 3)))(
      jax.random.split(jax.random.key(0), 4000))
  # 12,000 draws: within 4.5 binomial sigmas of the rate, per layer too.
  dropped = 1 - np.asarray(keep, np.float64)
  sigma = np.sqrt(rate * (1 - rate) / dropped.size)
  assert abs(dropped.mean() - rate) < 4.5 * sigma
  assert np.all(np.abs(dropped.mean(0) - rate) < 4.5 * sigma * np.sqrt(3))
  # Evaluation runs every layer: the output of a model without LayerDrop.
  plain = _apply(model_cfg, {'params': params}, _batch())
  evaluated = _apply(dropping, {'params': params}, _batch())
  np.testing.assert_array_equal(evaluated['sequence_output'],
                                plain['sequence_output'])


def _kept_in_step(model_cfg, params, key):
  """bool [3]: the layers a training step with ``key`` ran, read from its
  recorded hidden states (a skipped layer passes its input on)."""
  _, state = _apply(model_cfg, {'params': params}, _batch(),
                    deterministic=False, rngs={'dropout': key},
                    mutable=['intermediates'])
  states = state['intermediates']['hidden_states']
  return np.array([not np.array_equal(states[i + 1], states[i])
                   for i in range(len(states) - 1)])


def test_a_layerdrop_step_is_the_model_of_its_kept_layers(unpruned):
  """A training step that dropped layer 1 of 3 computes what the model of
  layers 0 and 2 (pruning.keep_layers) computes (rates 0: no dropout)."""
  _, model_cfg, params = unpruned
  dropping = dataclasses.replace(model_cfg, layerdrop=0.5)
  key = next(k for k in (jax.random.key(i) for i in range(200))
             if np.array_equal(_kept_in_step(dropping, params, k),
                               [True, False, True]))
  step = _apply(dropping, {'params': params}, _batch(), deterministic=False,
                rngs={'dropout': key})
  kept_params, kept_cfg = pruning.keep_layers(params, model_cfg, [0, 2])
  assert kept_cfg.num_layers == 2
  assert pruning.layer_names(kept_params) == ['layer_0', 'layer_1']
  kept = _apply(kept_cfg, {'params': kept_params}, _batch())
  for name in ('sequence_output', 'mlm_logits'):
    np.testing.assert_allclose(step[name], kept[name], rtol=0, atol=1e-6,
                               err_msg=name)
  full = _apply(model_cfg, {'params': params}, _batch())
  assert not np.allclose(full['sequence_output'], kept['sequence_output'])
  with pytest.raises(ValueError, match='distinct increasing'):
    pruning.keep_layers(params, model_cfg, [2, 0])


def _torch(model, ids, types, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids, dtype=torch.long),
                 token_type_ids=torch.tensor(types, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long))


def test_pruned_export_loads_in_transformers_and_imports_back_pruned(
    unpruned, tmp_path):
  cfg, model_cfg, params = unpruned
  pruned_params, pruned_cfg = pruning.remove_heads(params, model_cfg, REMOVE)
  cfg = config_lib.from_saved(cfg.to_dict())
  cfg.model.pruned_heads = pruned_cfg.pruned_heads
  directory = str(tmp_path / 'export')
  config = hf_convert.hf_config(cfg, 'bert', VOCAB)
  assert config[hf_convert.PRUNED_HEADS] == {'0': [1, 3], '1': [0],
                                             '2': [0, 1, 3]}
  assert config['num_attention_heads'] == 4
  hf_convert.write_model(directory, hf_convert.hf_state_dict(
      pruned_params, cfg, 'bert', VOCAB), config)
  # transformers 5 has no head pruning: the removed heads are zeros there.
  model, info = transformers.BertForPreTraining.from_pretrained(
      directory, output_loading_info=True)
  assert not any(info.values()), info
  query = model.bert.encoder.layer[0].attention.self.query.weight.detach()
  assert not query.view(4, 8, 32)[[1, 3]].any()
  assert query.view(4, 8, 32)[[0, 2]].abs().min() > 0
  ids, types, mask, positions = _batch()
  ours = _apply(pruned_cfg, {'params': pruned_params},
                (ids, types, mask, positions))
  theirs = _torch(model.eval(), ids, types, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(
      np.asarray(ours['mlm_logits'])[..., :VOCAB][real],
      theirs.prediction_logits.numpy()[real], rtol=0, atol=1e-4)
  np.testing.assert_allclose(ours['nsp_logits'],
                             theirs.seq_relationship_logits.numpy(), rtol=0,
                             atol=1e-4)
  imported = hf_convert.import_model(directory)
  assert tuple(imported.config.model.pruned_heads) == pruned_cfg.pruned_heads
  for name in pruning.layer_names(pruned_params):
    for key, value in pruned_params[name]['attention'].items():
      np.testing.assert_array_equal(
          imported.params[name]['attention'][key], value, err_msg=key)
  # Trained after the export, the heads are no longer pruned: refused.
  state = hf_convert.read_state_dict(directory)
  state['bert.encoder.layer.2.attention.self.value.bias'][0] = 1.0
  hf_convert.write_model(str(tmp_path / 'trained'), state, config)
  with pytest.raises(hf_convert.ConversionError, match='not zero'):
    hf_convert.import_model(str(tmp_path / 'trained'))


@pytest.mark.parametrize('quantize', ['none', 'int8'])
def test_importance_scores_the_loss_the_run_trained_on(quantize):
  """compress's importance loss, with no gates, is the objective's
  deterministic loss: through the fake-quantized layers of an 8-bit run
  (Q8BERT's), the float model's otherwise."""
  cfg = _config(quantize=quantize)
  params = preset_helpers.random_bert_params(cfg, VOCAB, 0.5)
  ids, types, mask, positions = _batch()
  labels = np.where(mask[:, :4] > 0, ids[:, :4], 0)
  batch = {'input_ids': ids, 'token_type_ids': types, 'attention_mask': mask,
           'masked_positions': positions[:, :4],
           'masked_unit_start': np.ones((2, 4), np.int32),
           'masked_ids': labels.astype(np.int32),
           'masked_weights': (labels > 0).astype(np.float32),
           'next_sentence_labels': np.array([0, 1], np.int32)}
  # Under jit, as training and head_importance run them: Qwix intercepts
  # the matmuls of a traced model (an eager apply here ran them float).
  task = bert_objective.make_task(cfg, VOCAB)
  expected = jax.jit(lambda p, b: task.loss(p, b, jax.random.key(0), True)[0]
                     )(params, batch)
  model_cfg = bert_objective.encoder_config(cfg, VOCAB)
  loss = jax.jit(compress.importance_fns(cfg, model_cfg)[0])
  np.testing.assert_allclose(loss({'params': params}, batch), expected,
                             rtol=1e-6)
  if quantize == 'int8':   # The float model's loss fails that equality.
    float_cfg = dataclasses.replace(model_cfg, quantize='none')
    float_loss = jax.jit(compress.importance_fns(cfg, float_cfg)[0])(
        {'params': params}, batch)
    assert not np.isclose(float_loss, expected, rtol=1e-6, atol=0)
