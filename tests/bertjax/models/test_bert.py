"""Shapes, logical axes, masking behaviour and the sparse MLM head."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import bert

CFG = bert.BertConfig(vocab_size=256, hidden_size=32, num_layers=2,
                      num_heads=4, intermediate_size=64,
                      max_position_embeddings=16, hidden_dropout_rate=0.1,
                      attention_dropout_rate=0.1)
B, L, P = 3, 16, 4


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, CFG.vocab_size, (B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 10:] = 0
  ids[1, 10:] = 0
  types = np.zeros((B, L), np.int32)
  types[:, 8:] = 1
  positions = np.tile(np.arange(1, P + 1, dtype=np.int32), (B, 1))
  return ids, types, mask, positions


@pytest.fixture(scope='module')
def model_and_params():
  model = bert.BertForPreTraining(CFG)
  variables = model.init(jax.random.key(0), *_inputs())
  return model, variables['params']


def test_output_shapes(model_and_params):
  model, params = model_and_params
  out = model.apply({'params': nn.unbox(params)}, *_inputs())
  assert out['mlm_logits'].shape == (B, P, CFG.vocab_size)
  assert out['mlm_logits'].dtype == jnp.float32
  assert out['nsp_logits'].shape == (B, 2)
  assert out['sequence_output'].shape == (B, L, CFG.hidden_size)
  assert out['pooled_output'].shape == (B, CFG.hidden_size)


def test_every_parameter_has_logical_axes(model_and_params):
  _, params = model_and_params
  leaves = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  for path, leaf in leaves:
    assert isinstance(leaf, nn.Partitioned), jax.tree_util.keystr(path)
    assert len(leaf.names) == leaf.value.ndim, jax.tree_util.keystr(path)


def test_parameter_count_matches_bert_formula(model_and_params):
  _, params = model_and_params
  n = sum(x.size for x in jax.tree.leaves(nn.unbox(params)))
  d, f, v = CFG.hidden_size, CFG.intermediate_size, CFG.vocab_size
  embeddings = (v + CFG.max_position_embeddings + CFG.type_vocab_size) * d + 2 * d
  layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
  heads = (d * d + d) + (d * d + d + 2 * d) + v + (2 * d + 2)
  assert n == embeddings + CFG.num_layers * layer + heads


def test_padding_does_not_change_real_positions(model_and_params):
  model, params = model_and_params
  ids, types, mask, positions = _inputs()
  params = nn.unbox(params)
  out = model.apply({'params': params}, ids, types, mask, positions)
  ids2 = ids.copy()
  ids2[1, 10:] = 77  # Change only padded tokens of row 1.
  out2 = model.apply({'params': params}, ids2, types, mask, positions)
  np.testing.assert_allclose(out['sequence_output'][1, :10],
                             out2['sequence_output'][1, :10], atol=1e-5)


def test_mlm_logits_use_tied_embeddings_at_gathered_positions(
    model_and_params):
  model, params = model_and_params
  params = nn.unbox(params)
  ids, types, mask, positions = _inputs()
  out = model.apply({'params': params}, ids, types, mask, positions)
  seq = out['sequence_output']
  h = jnp.take_along_axis(seq, positions[..., None], axis=1)
  dense = params['mlm_transform']
  h = jax.nn.gelu(h @ dense['kernel'] + dense['bias'], approximate=True)
  ln = params['mlm_norm']['LayerNorm_0']
  mean = h.mean(-1, keepdims=True)
  var = ((h - mean) ** 2).mean(-1, keepdims=True)
  h = (h - mean) / jnp.sqrt(var + CFG.layer_norm_epsilon) * ln['scale'] + ln['bias']
  expected = h @ params['embeddings']['word']['embedding'].T + params[
      'mlm_output_bias']
  np.testing.assert_allclose(out['mlm_logits'], expected, atol=1e-4)


def test_dropout_is_deterministic_per_key_and_off_in_eval(model_and_params):
  model, params = model_and_params
  params = nn.unbox(params)
  args = _inputs()
  a = model.apply({'params': params}, *args, deterministic=False,
                  rngs={'dropout': jax.random.key(1)})
  b = model.apply({'params': params}, *args, deterministic=False,
                  rngs={'dropout': jax.random.key(1)})
  c = model.apply({'params': params}, *args, deterministic=False,
                  rngs={'dropout': jax.random.key(2)})
  np.testing.assert_array_equal(a['mlm_logits'], b['mlm_logits'])
  assert not np.allclose(a['mlm_logits'], c['mlm_logits'])


def test_size_presets():
  assert bert.SIZES['base'] == (12, 768, 12)
  assert bert.SIZES['large'] == (24, 1024, 16)
  cfg = bert.BertConfig.from_size('mini', vocab_size=128)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads,
          cfg.intermediate_size) == (4, 256, 4, 1024)
  with pytest.raises(ValueError, match='model.size'):
    bert.BertConfig.from_size('huge', vocab_size=128)


def test_padding_rows_of_the_vocabulary_get_no_probability_or_gradient():
  """A 500-id tokenizer in a 512-row table: the padding rows start at zero,
  the MLM and SBO logits put them near PADDING_LOGIT (probability 0),
  and no loss reaches their embedding rows or output biases."""
  cfg = bert.BertConfig(vocab_size=512, real_vocab_size=500, hidden_size=32,
                        num_layers=1, num_heads=2, intermediate_size=64,
                        max_position_embeddings=16, sbo_positions=4,
                        hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  model = bert.BertForPreTraining(cfg)
  ids, types, mask, positions = _inputs()
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids, types, mask,
                                        positions, positions)['params'])
  table = params['embeddings']['word']['embedding']
  assert not np.any(table[500:]) and np.all(np.abs(table[:500]).max(1) > 0)
  # Large padding weights: were they scored, they would dominate.
  params['embeddings']['word']['embedding'] = table.at[500:].set(5.0)
  params['mlm_output_bias'] = params['mlm_output_bias'].at[500:].set(100.0)

  def loss(p):
    out = model.apply({'params': p}, ids, types, mask, positions, positions)
    total = 0.0
    for name in ('mlm_logits', 'sbo_logits'):
      log_p = jax.nn.log_softmax(out[name])
      total += -jnp.take_along_axis(log_p, ids[:, :P, None], -1).sum()
    return total, out

  grads, out = jax.jit(jax.grad(loss, has_aux=True))(params)
  for name in ('mlm_logits', 'sbo_logits'):
    assert np.all(out[name][..., 500:] < bert.PADDING_LOGIT / 2)
    probs = jax.nn.softmax(out[name])
    assert not np.any(probs[..., 500:])
    np.testing.assert_allclose(probs[..., :500].sum(-1), 1.0, rtol=1e-6)
  assert not np.any(grads['embeddings']['word']['embedding'][500:])
  assert not np.any(grads['mlm_output_bias'][500:])
  assert not np.any(grads['sbo_output_bias'][500:])
  assert np.abs(grads['embeddings']['word']['embedding'][:500]).sum() > 0
