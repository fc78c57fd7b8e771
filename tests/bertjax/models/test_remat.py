"""Rematerialization (model.remat) trades memory for compute, not results."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from bertjax.models import bert

# Dropout on: the recomputed forward must draw the same masks.
CFG = bert.BertConfig(vocab_size=256, hidden_size=64, num_layers=3,
                      num_heads=4, intermediate_size=128,
                      max_position_embeddings=128)
B, L, P = 4, 128, 8


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, CFG.vocab_size, (B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[2, 90:] = 0
  types = np.zeros((B, L), np.int32)
  positions = np.tile(np.arange(1, P + 1, dtype=np.int32), (B, 1))
  return ids, types, mask, positions


def _loss_and_params(cfg):
  """A scalar of the MLM logits and the sequence output, with dropout."""
  model = bert.BertForPreTraining(cfg)
  ids, types, mask, positions = _inputs()
  params = nn.unbox(model.init(jax.random.key(0), ids, types, mask,
                               positions)['params'])

  def loss(p):
    out = model.apply({'params': p}, ids, types, mask, positions,
                      deterministic=False,
                      rngs={'dropout': jax.random.key(1)})
    return (jnp.sum(out['mlm_logits'] ** 2) * 1e-3
            + jnp.sum(out['sequence_output'][:, 0]))

  return loss, params


def _loss_and_grads(cfg):
  loss, params = _loss_and_params(cfg)
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.fixture(scope='module')
def reference():
  return _loss_and_grads(CFG)


@pytest.mark.parametrize('remat', ['full', 'dots'])
def test_remat_gives_the_same_loss_and_gradients(reference, remat):
  value, grads = _loss_and_grads(dataclasses.replace(CFG, remat=remat))
  want_value, want_grads = reference
  np.testing.assert_allclose(value, want_value, rtol=1e-6)
  assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    want = want_grads
    for key in path:
      want = want[key.key]
    np.testing.assert_allclose(g, want, rtol=1e-5,
                               atol=1e-6 * np.abs(want).max(),
                               err_msg=jax.tree_util.keystr(path))


def _saved_for_backward(cfg) -> int:
  """Bytes the backward pass keeps from the forward (the VJP's residuals,
  parameters and inputs included)."""
  _, backward = jax.vjp(*_loss_and_params(cfg))
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(backward))


def test_remat_keeps_less_for_the_backward_pass():
  saved = {r: _saved_for_backward(dataclasses.replace(CFG, remat=r))
           for r in bert.REMAT}
  # Without remat every layer's activations are kept (attention
  # probabilities, dropout masks, FFN hidden: about 8 MB a layer here);
  # 'full' keeps each layer's input, 'dots' its matmul outputs too.
  assert saved['full'] < 0.1 * saved['none'], saved
  assert saved['full'] < saved['dots'] < 0.3 * saved['none'], saved


def test_config_checks_and_passes_the_setting():
  cfg = config_lib.demo_config()
  cfg.model.remat = 'dots'
  config_lib.validate(cfg)
  assert objectives.bert.encoder_config(cfg, 2048).remat == 'dots'
  cfg.model.remat = 'some'
  with pytest.raises(ValueError, match=r"model.remat='some'; use one of"):
    config_lib.validate(cfg)
  with pytest.raises(ValueError, match='model.remat'):
    bert.layer_class(dataclasses.replace(CFG, remat='some'))


def test_a_run_resumes_with_another_remat_setting():
  cfg = config_lib.demo_config()
  identity = train.run_identity(cfg)
  cfg.model.remat = 'full'
  assert train.run_identity(cfg) == identity
  assert 'remat' not in identity['model']
