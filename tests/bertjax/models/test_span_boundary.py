"""SpanBERT's span boundary objective: boundaries, the head, the loss."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.objectives import losses
from bertjax.models import bert
from data_pipelines import masking

CFG = bert.BertConfig(vocab_size=64, hidden_size=16, num_layers=1,
                      num_heads=2, intermediate_size=32,
                      max_position_embeddings=16, hidden_dropout_rate=0.0,
                      attention_dropout_rate=0.0, sbo_positions=5)


def test_span_boundaries_of_hand_made_spans():
  # Row 0: spans [2, 4] and [7, 7], then two unused slots. Row 1: [1, 2]
  # and [3, 5], touching (span two's left boundary is span one's last).
  positions = jnp.array([[2, 3, 4, 7, 0, 0], [1, 2, 3, 4, 5, 0]])
  unit_start = jnp.array([[2, 2, 2, 7, 0, 0], [1, 1, 3, 3, 3, 0]])
  left, right, offset = bert.span_boundaries(positions, unit_start)
  np.testing.assert_array_equal(left, [[1, 1, 1, 6, 0, 0],
                                       [0, 0, 2, 2, 2, 0]])
  np.testing.assert_array_equal(right, [[5, 5, 5, 8, 0, 0],
                                        [3, 3, 6, 6, 6, 0]])
  np.testing.assert_array_equal(offset, [[0, 1, 2, 0, 0, 0],
                                         [0, 1, 0, 1, 2, 0]])


def test_span_boundaries_of_real_span_masking():
  """On the pipeline's own span masks: each span's boundaries are the
  unmasked-or-other-span tokens just outside it, inside the row."""
  rng = np.random.default_rng(0)
  b, length = 16, 64
  ids = rng.integers(5, 500, (b, length)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3   # [CLS] ... [SEP]
  batch = {'input_ids': ids, 'attention_mask': np.ones((b, length), np.int32),
           'word_starts': rng.random((b, length)) < 0.6,
           'example_index': np.arange(b), 'mask_epoch': np.zeros(b, np.int64)}
  cfg = masking.MaskingConfig(strategy='span', vocab_size=500,
                              max_predictions_per_seq=12)
  out = masking.mask_batch(batch, cfg, seed=3)
  positions, starts = out['masked_positions'], out['masked_unit_start']
  weights = out['masked_weights']
  left, right, offset = map(np.asarray, bert.span_boundaries(
      jnp.asarray(positions), jnp.asarray(starts)))
  for row in range(b):
    used = weights[row] > 0
    for s in np.unique(starts[row][used]):
      members = positions[row][used & (starts[row] == s)]
      assert np.array_equal(members, np.arange(s, s + len(members)))
      at = used & (starts[row] == s)
      assert (left[row][at] == s - 1).all()
      assert (right[row][at] == members[-1] + 1).all()
      np.testing.assert_array_equal(offset[row][at],
                                    np.arange(len(members)))
      assert 0 <= s - 1 and members[-1] + 1 < length


def _gelu(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p['scale'] + p['bias']


def test_sbo_logits_match_a_numpy_transcription():
  rng = np.random.default_rng(1)
  b, length = 2, 16
  ids = rng.integers(5, CFG.vocab_size, (b, length)).astype(np.int32)
  types = np.zeros_like(ids)
  mask = np.ones_like(ids)
  positions = np.array([[3, 4, 5, 9], [2, 6, 7, 0]], np.int32)
  unit_start = np.array([[3, 3, 3, 9], [2, 6, 6, 0]], np.int32)
  model = bert.BertForPreTraining(CFG)
  params = nn.unbox(model.init(jax.random.key(0), ids, types, mask,
                               positions, unit_start)['params'])
  out = model.apply({'params': params}, ids, types, mask, positions,
                    unit_start)
  x = np.asarray(out['sequence_output'], np.float64)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  sbo = p['sbo']
  eps = CFG.layer_norm_epsilon
  expected = np.zeros((b, 4, CFG.vocab_size))
  for row in range(b):
    for k in range(4):
      s = unit_start[row, k]
      e = positions[row][unit_start[row] == s].max()
      h = np.concatenate([x[row, max(s - 1, 0)],
                          x[row, e + 1 if s > 0 else 0],
                          sbo['position']['embedding'][positions[row, k] - s]])
      for i in range(2):
        dense = sbo[f'dense_{i}']
        h = _layer_norm(_gelu(h @ dense['kernel'] + dense['bias']),
                        sbo[f'norm_{i}']['LayerNorm_0'], eps)
      expected[row, k] = (h @ p['embeddings']['word']['embedding'].T
                          + p['sbo_output_bias'])
  np.testing.assert_allclose(out['sbo_logits'], expected, rtol=2e-4,
                             atol=2e-4)


def test_sbo_loss_is_mlm_loss_of_its_logits_and_adds_with_its_weight():
  rng = np.random.default_rng(2)
  logits = {k: jnp.asarray(rng.normal(size=(2, 3, 7)), jnp.float32)
            for k in ('mlm_logits', 'sbo_logits')}
  outputs = dict(logits, nsp_logits=jnp.zeros((2, 2)))
  batch = {'masked_ids': jnp.array([[1, 2, 3], [4, 5, 0]]),
           'masked_weights': jnp.array([[1., 1., 1.], [1., 1., 0.]]),
           'next_sentence_labels': jnp.array([0, 1])}
  mlm_only, _ = losses.bert_pretraining(outputs, batch, 1.0, 0.0, 0.0)
  both, metrics = losses.bert_pretraining(outputs, batch, 1.0, 0.0, 2.0)
  # By hand: mean NLL over the 5 used slots of the SBO logits.
  lp = jax.nn.log_softmax(logits['sbo_logits'])
  used = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
  nll = -np.mean([lp[r, k, batch['masked_ids'][r, k]] for r, k in used])
  np.testing.assert_allclose(both - mlm_only, 2.0 * nll * 5 / (5 + 1e-5),
                             rtol=1e-5)
  assert float(metrics['sbo_count']) == 5
  summary = losses.summarize(jax.device_get(metrics))
  np.testing.assert_allclose(summary['sbo_loss'], nll, rtol=1e-5)


def test_without_sbo_the_model_has_no_sbo_parameters():
  cfg = dataclasses.replace(CFG, sbo_positions=0)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = bert.BertForPreTraining(cfg).init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32))
  assert 'sbo' not in params['params']
  assert 'sbo_output_bias' not in params['params']
