"""model.scan_layers: one nn.scan over stacked layer weights computes what
the unrolled layers compute."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_lib
from bertjax import objectives
from bertjax.models import bert

CFG = bert.BertConfig(vocab_size=128, hidden_size=32, num_layers=3,
                      num_heads=4, intermediate_size=64,
                      max_position_embeddings=16)
SCANNED = dataclasses.replace(CFG, scan_layers=True)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, CFG.vocab_size, (2, 16)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 12:] = 0
  return ids, np.zeros_like(ids), mask, np.array([[1, 2], [3, 4]], np.int32)


def _stacked(unrolled: dict) -> dict:
  """Unrolled parameters (layer_0, layer_1, ...) as the scanned tree."""
  params = {k: v for k, v in unrolled.items() if not k.startswith('layer_')}
  layers = [unrolled[f'layer_{i}'] for i in range(CFG.num_layers)]
  params['layers'] = {'scan': {'layer': jax.tree.map(
      lambda *xs: jnp.stack(xs), *layers)}}
  return params


def _apply(cfg, params):
  out = bert.BertForPreTraining(cfg).apply({'params': params}, *_inputs())
  return jnp.sum(out['mlm_logits'] ** 2) + jnp.sum(out['nsp_logits'])


@pytest.mark.parametrize('remat', ['none', 'full'])
def test_scanned_layers_compute_the_unrolled_ones(remat):
  unrolled = nn.unbox(bert.BertForPreTraining(CFG).init(
      jax.random.key(0), *_inputs())['params'])
  scanned_cfg = dataclasses.replace(SCANNED, remat=remat)
  stacked = _stacked(unrolled)
  # The scanned model's own tree has exactly these paths and shapes.
  own = nn.unbox(jax.eval_shape(bert.BertForPreTraining(scanned_cfg).init,
                                jax.random.key(0), *_inputs())['params'])
  assert jax.tree.map(lambda x: x.shape, own) == jax.tree.map(
      lambda x: x.shape, stacked)
  value, grads = jax.value_and_grad(_apply, argnums=1)(CFG, unrolled)
  scanned_value, scanned_grads = jax.value_and_grad(_apply, argnums=1)(
      scanned_cfg, stacked)
  np.testing.assert_allclose(scanned_value, value, rtol=1e-6)
  for want, got in zip(jax.tree.leaves(_stacked(grads)),
                       jax.tree.leaves(scanned_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-5,
                               atol=1e-6 * np.abs(want).max())


def test_stacked_weights_carry_a_leading_layers_axis():
  boxed = jax.eval_shape(bert.BertForPreTraining(SCANNED).init,
                         jax.random.key(0), *_inputs())['params']
  kernel = boxed['layers']['scan']['layer']['attention']['qkv_kernel']
  assert kernel.names == ('layers', 'embed', 'qkv', 'heads', 'kv')
  assert kernel.value.shape == (3, 32, 3, 4, 8)
  assert dict(config_lib.DEFAULT_RULES)['layers'] is None


def test_config_allows_scan_for_unshared_bert_only():
  cfg = config_lib.demo_config()
  cfg.model.scan_layers = True
  config_lib.validate(cfg)
  assert objectives.bert.encoder_config(cfg, 2048).scan_layers
  cfg.model.num_layer_groups = 1
  with pytest.raises(ValueError, match='model.scan_layers=True needs'):
    config_lib.validate(cfg)
  with pytest.raises(ValueError, match='shared layers are not scanned'):
    bert.BertForPreTraining(dataclasses.replace(
        SCANNED, num_layer_groups=1)).init(jax.random.key(0), *_inputs())
