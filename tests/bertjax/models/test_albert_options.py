"""ALBERT's model options: factorized embedding and cross-layer sharing."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_lib
from bertjax.models import bert

SMALL = bert.BertConfig(vocab_size=256, hidden_size=32, num_layers=4,
                        num_heads=4, intermediate_size=64,
                        max_position_embeddings=16, hidden_dropout_rate=0.0,
                        attention_dropout_rate=0.0)
B, L, P = 3, 16, 4


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SMALL.vocab_size, (B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 10:] = 0
  types = np.zeros((B, L), np.int32)
  types[:, 8:] = 1
  positions = np.tile(np.arange(1, P + 1, dtype=np.int32), (B, 1))
  return ids, types, mask, positions


def _params(cfg: bert.BertConfig):
  model = bert.BertForPreTraining(cfg)
  return model, nn.unbox(model.init(jax.random.key(0), *_inputs())['params'])


def _count(cfg: bert.BertConfig) -> int:
  """Parameters of the pretraining model, from shapes only."""
  model = bert.BertForPreTraining(cfg)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
      nn.unbox(shapes['params'])))


def test_all_shared_has_one_layer_of_parameters():
  shared = dataclasses.replace(SMALL, num_layer_groups=1)
  one_layer = dataclasses.replace(SMALL, num_layers=1)
  assert _count(shared) == _count(one_layer)
  _, params = _params(shared)
  assert sorted(k for k in params if k.startswith('layer_')) == ['layer_0']


def test_groups_have_one_layer_of_parameters_each():
  grouped = dataclasses.replace(SMALL, num_layer_groups=2)
  two_layers = dataclasses.replace(SMALL, num_layers=2)
  assert _count(grouped) == _count(two_layers)
  # albert's modeling.py: layer i uses group floor(i * groups / layers).
  assert [grouped.layer_group(i) for i in range(4)] == [0, 0, 1, 1]
  three = dataclasses.replace(SMALL, num_layers=5, num_layer_groups=3)
  assert [three.layer_group(i) for i in range(5)] == [0, 0, 1, 1, 2]


def test_sharing_equals_tied_unshared_layers():
  """All-shared equals the unshared model with every layer's weights set to
  the shared ones, in outputs and in gradients (the sum over layers)."""
  shared_cfg = dataclasses.replace(SMALL, num_layer_groups=1)
  shared_model, shared = _params(shared_cfg)
  model = bert.BertForPreTraining(SMALL)
  tied = dict(shared)
  for i in range(SMALL.num_layers):
    tied[f'layer_{i}'] = shared['layer_0']
  inputs = _inputs(1)
  out_shared = shared_model.apply({'params': shared}, *inputs)
  out_tied = model.apply({'params': tied}, *inputs)
  np.testing.assert_allclose(out_shared['mlm_logits'],
                             out_tied['mlm_logits'], rtol=1e-5, atol=1e-5)

  def loss(m, p):
    return jnp.sum(m.apply({'params': p}, *inputs)['mlm_logits'] ** 2)

  g_shared = jax.grad(lambda p: loss(shared_model, p))(shared)['layer_0']
  g_tied = jax.grad(lambda p: loss(model, p))(tied)
  g_sum = jax.tree.map(lambda *g: sum(g), *[
      g_tied[f'layer_{i}'] for i in range(SMALL.num_layers)])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-6),
               g_shared, g_sum)


def test_factorized_embedding_shapes_and_outputs():
  cfg = dataclasses.replace(SMALL, embedding_size=8)
  model, params = _params(cfg)
  embeddings = params['embeddings']
  assert embeddings['word']['embedding'].shape == (SMALL.vocab_size, 8)
  assert embeddings['position']['embedding'].shape == (16, 8)
  assert embeddings['projection']['kernel'].shape == (8, SMALL.hidden_size)
  assert params['mlm_transform']['kernel'].shape == (SMALL.hidden_size, 8)
  out = model.apply({'params': params}, *_inputs())
  assert out['sequence_output'].shape == (B, L, SMALL.hidden_size)
  assert out['mlm_logits'].shape == (B, P, SMALL.vocab_size)
  # E == H is no factorization: the plain BERT parameters.
  same = dataclasses.replace(SMALL, embedding_size=SMALL.hidden_size)
  assert _count(same) == _count(SMALL)


def test_factorized_parameters_have_their_own_logical_axis():
  cfg = dataclasses.replace(SMALL, embedding_size=8)
  boxed = bert.BertForPreTraining(cfg).init(jax.random.key(0),
                                            *_inputs())['params']
  names = {jax.tree_util.keystr(path): leaf.names for path, leaf in
           jax.tree_util.tree_flatten_with_path(
               boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]}
  assert names["['embeddings']['word']['embedding']"] == ('vocab', 'factor')
  assert names["['embeddings']['projection']['kernel']"] == ('factor',
                                                             'embed')
  assert names["['mlm_transform']['kernel']"] == ('embed', 'factor')
  # Every logical name the model uses has a rule in the default config.
  ruled = {name for name, _ in config_lib.DEFAULT_RULES}
  assert {n for v in names.values() for n in v} <= ruled


# Paper sizes (Lan et al. 2020, Table 1; Devlin et al. 2019, Sec. 3), with
# the papers' vocabularies: ALBERT 30000, BERT 30522. Counted with the
# pretraining heads (pooler, MLM transform and bias, NSP/SOP).
@pytest.mark.parametrize('name, overrides, paper', [
    ('albert-base', dict(vocab_size=30000, embedding_size=128,
                         num_layer_groups=1), 12e6),
    ('bert-base', dict(vocab_size=30522), 110e6),
])
def test_paper_parameter_counts_base(name, overrides, paper):
  cfg = bert.BertConfig.from_size('base', **overrides)
  count = _count(cfg)
  assert abs(count - paper) <= 0.02 * paper, (name, count)


def test_paper_parameter_count_bert_large():
  count = _count(bert.BertConfig.from_size('large', vocab_size=30522))
  assert abs(count - 340e6) <= 0.02 * 340e6, count


@pytest.mark.parametrize('field, value', [('num_layer_groups', 13),
                                          ('num_layer_groups', -1),
                                          ('embedding_size', -8)])
def test_config_rejects_impossible_sharing_and_widths(field, value):
  cfg = config_lib.base_config()
  cfg.model[field] = value
  with pytest.raises(ValueError, match=f'model.{field}'):
    config_lib.validate(cfg)
