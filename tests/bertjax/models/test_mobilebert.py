"""MobileBERT's options of the encoder: parameter counts against
transformers' MobileBertModel, the trigram by hand, the encoder machinery
(logical names, scanned, shared and rematerialized layers) working on
MobileBERT's layers, and IB-BERT, the teacher, against the paper's size
and a numpy layer. The forward against transformers' is
tests/bertjax/interop/test_mobilebert_export.py's."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import config_lib
from bertjax.models import bert

# google-research/mobilebert's configs (uncased_L-24_H-128_B-512_A-4_F-4_OPT
# and ..._F-2_tiny_OPT), with the vocabulary unpadded. TINY sets
# key_query_shared_bottleneck explicitly: transformers defaults it to True,
# the TF code (and TINY's training) to False.
_COMMON = dict(vocab_size=30522, hidden_size=512, num_layers=24, num_heads=4,
               intermediate_size=512, embedding_size=128, trigram_input=True,
               intra_bottleneck_size=128, normalization='no_norm',
               hidden_act='relu')
PAPER = {
    'mobilebert': dict(_COMMON, key_query_shared_bottleneck=True,
                       num_feedforward_networks=4),
    'mobilebert-tiny': dict(_COMMON, bottleneck_attention=True,
                            num_feedforward_networks=2),
}
_HF = {'vocab_size': 'vocab_size', 'hidden_size': 'hidden_size',
       'num_layers': 'num_hidden_layers', 'num_heads': 'num_attention_heads',
       'intermediate_size': 'intermediate_size',
       'embedding_size': 'embedding_size', 'trigram_input': 'trigram_input',
       'intra_bottleneck_size': 'intra_bottleneck_size',
       'normalization': 'normalization_type', 'hidden_act': 'hidden_act',
       'bottleneck_attention': 'use_bottleneck_attention',
       'key_query_shared_bottleneck': 'key_query_shared_bottleneck',
       'num_feedforward_networks': 'num_feedforward_networks'}
# The counts transformers 5 gives (MobileBertModel(config), its
# parameters summed), written down; the paper says 25.3M and 15.1M.
HF_COUNTS = {('mobilebert', False): 24_581_888, ('mobilebert', True): 24_844_544,
         ('mobilebert-tiny', False): 15_485_696}


def _bertjax_counts(cfg: bert.BertConfig) -> dict[str, int]:
  """Parameters of each top-level tree of the pretraining model, from
  shapes only."""
  model = bert.BertForPreTraining(cfg)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = nn.unbox(jax.eval_shape(lambda: model.init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32)))[
          'params'])
  return {name: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
          for name, tree in shapes.items()}


def _hf_count(fields: dict, pooler: bool, model_class=None) -> int:
  config = transformers.MobileBertConfig(
      classifier_activation=pooler,
      **{_HF[k]: v for k, v in fields.items()})
  config.key_query_shared_bottleneck = fields.get(
      'key_query_shared_bottleneck', False)
  with torch.device('meta'):   # Shapes only.
    model = (model_class or transformers.MobileBertModel)(config)
  return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize('name', sorted(PAPER))
def test_parameter_counts_equal_transformers(name):
  counts = _bertjax_counts(bert.BertConfig(**PAPER[name]))
  encoder = sum(n for k, n in counts.items()
                if k == 'embeddings' or k.startswith('layer_'))
  assert encoder == _hf_count(PAPER[name], pooler=False)
  assert encoder + counts['pooler'] == _hf_count(PAPER[name], pooler=True)
  for (model, pooler), expected in HF_COUNTS.items():
    if model == name:
      assert encoder + pooler * counts['pooler'] == expected
  # With the heads: the MLM transform, bias and extra decoder table, NSP.
  assert sum(counts.values()) == _hf_count(
      PAPER[name], pooler=True,
      model_class=transformers.MobileBertForPreTraining)


def test_trigram_by_hand():
  x = jnp.arange(1, 7, dtype=jnp.float32).reshape(1, 3, 2)   # [B, L, E].
  np.testing.assert_array_equal(bert.trigram(x)[0], [
      [3, 4, 1, 2, 0, 0],       # [next, current, previous]
      [5, 6, 3, 4, 1, 2],
      [0, 0, 5, 6, 3, 4]])


SMALL = bert.BertConfig(
    vocab_size=128, hidden_size=32, num_layers=2, num_heads=2,
    intermediate_size=16, max_position_embeddings=16, embedding_size=8,
    trigram_input=True, intra_bottleneck_size=8,
    key_query_shared_bottleneck=True, num_feedforward_networks=2,
    normalization='no_norm', hidden_act='relu', hidden_dropout_rate=0.0,
    attention_dropout_rate=0.0)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 128, (2, 16)).astype(np.int32)
  mask = np.ones((2, 16), np.int32)
  mask[1, 10:] = 0
  return ids, np.zeros((2, 16), np.int32), mask, np.ones((2, 3), np.int32)


def test_layers_and_names():
  assert bert.layer_class(SMALL) is bert.MobileBertLayer
  assert bert.layer_class(bert.BertConfig(vocab_size=128)) is (
      bert.EncoderLayer)
  boxed = jax.eval_shape(bert.BertForPreTraining(SMALL).init,
                         jax.random.key(0), *_inputs())['params']
  names = {jax.tree_util.keystr(path): leaf.names for path, leaf in
           jax.tree_util.tree_flatten_with_path(
               boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]}
  layer = "['layer_0']"
  assert names[f"{layer}['input_bottleneck']['kernel']"] == ('embed',
                                                             'intra')
  assert names[f"{layer}['attention']['qk_kernel']"] == (
      'intra', 'qkv', 'heads', 'kv')
  assert names[f"{layer}['attention']['v_kernel']"] == ('embed', 'heads',
                                                        'kv')
  assert names[f"{layer}['ffn_1']['wo']['kernel']"] == ('mlp', 'intra')
  assert names[f"{layer}['output_norm']['scale']"] == ('embed',)
  assert names["['embeddings']['word']['embedding']"] == ('vocab', 'factor')
  assert names["['mlm_extra_embedding']"] == ('vocab', 'embed')
  # Every logical name the model uses has a rule in the default config.
  ruled = {name for name, _ in config_lib.DEFAULT_RULES}
  assert {n for v in names.values() for n in v} <= ruled


def test_scanned_rematerialized_and_shared_layers():
  """Scanned layers compute what the unscanned ones do with the same
  weights; remat changes nothing; shared layers have one layer's weights."""
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32),
      nn.unbox(jax.eval_shape(bert.BertForPreTraining(SMALL).init,
                              jax.random.key(0), *_inputs())['params']))
  scanned_cfg = dataclasses.replace(SMALL, scan_layers=True, remat='full')
  stacked = jax.tree.map(lambda *x: jnp.stack(x),
                         *[params[f'layer_{i}'] for i in range(2)])
  scanned = {k: v for k, v in params.items() if not k.startswith('layer_')}
  scanned['layers'] = {'scan': {'layer': stacked}}
  apply = lambda cfg, p: jax.jit(lambda p: bert.BertForPreTraining(
      cfg).apply({'params': p}, *_inputs())['mlm_logits'])(p)
  np.testing.assert_allclose(apply(scanned_cfg, scanned),
                             apply(SMALL, params), rtol=1e-5, atol=1e-5)
  shared = _bertjax_counts(dataclasses.replace(SMALL, num_layer_groups=1))
  assert sorted(k for k in shared if k.startswith('layer_')) == ['layer_0']


# ---- IB-BERT, MobileBERT's teacher: Q, K and V read the H-wide layer input
# and project to the (wider) intra-block width I. transformers cannot run
# it (it sizes Q and K for I-wide inputs), so it is checked against the
# paper's size and a float64 numpy layer.

IB_BERT_LARGE = dict(vocab_size=30522, hidden_size=512, num_layers=24,
                     num_heads=4, intermediate_size=4096, embedding_size=128,
                     trigram_input=True, intra_bottleneck_size=1024)


def test_ib_bert_teacher_has_the_papers_size():
  """google-research's uncased_L-24_H-1024_B-512_A-4.json: 294.2M (the
  paper: 293M), counted with the TF code's shapes (q, k, v [512, 1024])."""
  cfg = bert.BertConfig(**IB_BERT_LARGE)
  counts = _bertjax_counts(cfg)
  encoder = sum(n for k, n in counts.items()
                if k == 'embeddings' or k.startswith('layer_'))
  assert encoder == 294_205_184
  assert encoder + counts['pooler'] == 294_467_840
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(bert.BertForPreTraining(cfg).init,
                          jax.random.key(0), ids, ids, ids, ids[:, :2])
  assert nn.unbox(shapes)['params']['layer_0']['attention'][
      'qkv_kernel'].shape == (512, 3, 4, 256)


IB_BERT = bert.BertConfig(
    vocab_size=128, hidden_size=16, num_layers=1, num_heads=2,
    intermediate_size=24, max_position_embeddings=16, embedding_size=8,
    trigram_input=True, intra_bottleneck_size=32, hidden_dropout_rate=0.0,
    attention_dropout_rate=0.0)


def _numpy_ib_bert_layer(p, h, mask):
  """The layer of mobilebert.md's formula, q = k = v input = h, in float64:
  LayerNorms (epsilon 1e-12) and BERT's tanh GELU."""
  f = lambda x: np.asarray(x, np.float64)

  def norm(x, params):
    n = params['LayerNorm_0']
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                  + 1e-12)
    return x * f(n['scale']) + f(n['bias'])

  dense = lambda x, d: x @ f(d['kernel']) + f(d['bias'])
  gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (
      x + 0.044715 * x**3)))
  residual = norm(dense(h, p['input_bottleneck']), p['input_bottleneck_norm'])
  att = p['attention']
  qkv = np.einsum('bld,dphk->blphk', h, f(att['qkv_kernel'])) + f(
      att['qkv_bias'])
  logits = np.einsum('blhk,bmhk->bhlm', qkv[:, :, 0], qkv[:, :, 1]) / np.sqrt(
      qkv.shape[-1])
  logits = np.where(mask[:, None, None, :] > 0, logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  context = np.einsum('bhlm,bmhk->blhk', probs, qkv[:, :, 2])
  a = norm(np.einsum('blhk,hkd->bld', context, f(att['out_kernel'])) +
           f(att['out_bias']) + residual, p['attention_norm'])
  ffn = p['ffn_0']
  a = norm(dense(gelu(dense(a, ffn['wi'])), ffn['wo']) + a, p['ffn_0_norm'])
  return norm(dense(a, p['output_bottleneck']) + h, p['output_norm'])


def test_ib_bert_layer_matches_numpy():
  rng = np.random.default_rng(1)
  x = rng.normal(0, 1, (2, 6, 16)).astype(np.float32)
  mask = np.ones((2, 6), np.int32)
  mask[1, 4:] = 0
  layer = bert.MobileBertLayer(IB_BERT)
  params = jax.tree.map(
      lambda s: rng.normal(0, 0.3, s.shape).astype(np.float32),
      nn.unbox(jax.eval_shape(lambda: layer.init(jax.random.key(0), x, mask,
                                                 True))['params']))
  assert params['attention']['qkv_kernel'].shape == (16, 3, 2, 16)
  ours = jax.jit(lambda p: layer.apply({'params': p}, x, mask, True))(params)
  np.testing.assert_allclose(ours, _numpy_ib_bert_layer(params, x, mask),
                             rtol=0, atol=2e-5)
