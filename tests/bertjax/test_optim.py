"""Optimizer and schedule against the formulas in google-research/bert."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import config_lib
from bertjax import optim


def _cfg(**optimizer):
  c = config_lib.base_config()
  c.total_steps = 100
  c.optimizer.warmup_steps = 10
  c.optimizer.learning_rate = 1e-3
  c.optimizer.update(optimizer)
  return c


@pytest.mark.parametrize('t', [0, 1, 5, 9, 10, 11, 50, 99, 100, 150])
def test_bert_schedule_matches_formula(t):
  peak, w, total = 1e-4, 10, 100
  expected = peak * t / w if t < w else peak * max(0.0, 1 - t / total)
  got = float(optim.bert_schedule(peak, w, total)(t))
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)


def test_schedule_drops_at_end_of_warmup():
  # Decay is measured from step 0: lr(W) = peak * (1 - W / T) < peak.
  s = optim.bert_schedule(1e-4, 10, 100)
  assert float(s(9)) == pytest.approx(0.9e-4)
  assert float(s(10)) == pytest.approx(0.9e-4)


def test_decay_mask_excludes_layer_norm_and_bias():
  params = {'dense': {'kernel': 1.0, 'bias': 1.0},
            'LayerNorm_0': {'scale': 1.0, 'bias': 1.0},
            'word': {'embedding': 1.0}, 'mlm_output_bias': 1.0,
            'attention': {'qkv_kernel': 1.0, 'qkv_bias': 1.0}}
  mask = optim.decay_mask(params)
  assert mask == {'dense': {'kernel': True, 'bias': False},
                  'LayerNorm_0': {'scale': False, 'bias': False},
                  'word': {'embedding': True}, 'mlm_output_bias': False,
                  'attention': {'qkv_kernel': True, 'qkv_bias': False}}


def _reference_bert_adam(params, grads_seq, lr_fn, b1=0.9, b2=0.999,
                         eps=1e-6, wd=0.01, clip=1.0, lamb=False):
  """A direct numpy transcription of AdamWeightDecayOptimizer + clipping;
  with ``lamb``, of albert's LAMBOptimizer (the trust ratio on the same
  weights that decay)."""
  params = {k: np.array(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  for t, grads in enumerate(grads_seq):
    norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads.values()))
    scale = clip / max(norm, clip)
    lr = lr_fn(t)
    for k in params:
      g = grads[k] * scale
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      update = m[k] / (np.sqrt(v[k]) + eps)
      ratio = 1.0
      if k == 'kernel':  # Decay only for non-bias, non-LayerNorm weights.
        update = update + wd * params[k]
        w_norm, u_norm = np.linalg.norm(params[k]), np.linalg.norm(update)
        if lamb and w_norm > 0 and u_norm > 0:
          ratio = w_norm / u_norm
      params[k] = params[k] - ratio * lr * update
  return params


def _apply(tx, params, grads_seq):
  """float32 params after ``tx``'s updates for each gradient in turn."""
  state = tx.init(jax.tree.map(jnp.asarray, params))
  p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  for grads in grads_seq:
    updates, state = tx.update(jax.tree.map(jnp.asarray, grads), state, p)
    p = optax.apply_updates(p, updates)
  return p


def test_bert_adamw_matches_reference_transcription():
  cfg = _cfg()
  tx, schedule = optim.make_optimizer(cfg)
  rng = np.random.default_rng(0)
  params = {'kernel': rng.normal(size=(4, 3)), 'bias': rng.normal(size=(3,))}
  grads_seq = [{k: rng.normal(size=v.shape) * (3.0 if t % 2 else 0.1)
                for k, v in params.items()} for t in range(15)]
  p = _apply(tx, params, grads_seq)
  expected = _reference_bert_adam(
      params, grads_seq, lambda t: float(schedule(t)))
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), expected[k], rtol=1e-5,
                               atol=1e-7)


def test_lamb_matches_albert_transcription():
  cfg = _cfg(name='lamb')
  tx, schedule = optim.make_optimizer(cfg)
  rng = np.random.default_rng(1)
  params = {'kernel': rng.normal(size=(4, 3)), 'bias': rng.normal(size=(3,))}
  grads_seq = [{k: rng.normal(size=v.shape) * (3.0 if t % 2 else 0.1)
                for k, v in params.items()} for t in range(15)]
  p = _apply(tx, params, grads_seq)
  expected = _reference_bert_adam(
      params, grads_seq, lambda t: float(schedule(t)), lamb=True)
  without = _reference_bert_adam(
      params, grads_seq, lambda t: float(schedule(t)))
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), expected[k], rtol=1e-5,
                               atol=1e-7)
  # The trust ratio changed the kernel, and only the kernel.
  assert not np.allclose(expected['kernel'], without['kernel'], rtol=1e-3)
  np.testing.assert_allclose(expected['bias'], without['bias'])


def test_no_bias_correction_first_step():
  # Without bias correction, step 1's update is g(1-b1)/(|g|sqrt(1-b2)+eps).
  tx = optim.scale_by_adam_no_bias_correction(0.9, 0.999, 1e-6)
  g = {'w': jnp.array([2.0, -0.5])}
  updates, _ = tx.update(g, tx.init(g))
  expected = 0.1 * np.array([2.0, -0.5]) / (
      np.sqrt(0.001) * np.abs([2.0, -0.5]) + 1e-6)
  np.testing.assert_allclose(np.asarray(updates['w']), expected, rtol=1e-6)


def test_standard_adamw_is_bias_corrected():
  cfg = _cfg(name='adamw', grad_clip_norm=0.0, weight_decay=0.0)
  tx, schedule = optim.make_optimizer(cfg)
  g = {'kernel': jnp.array([0.3, -2.0])}
  p = {'kernel': jnp.zeros(2)}
  state = tx.init(p)
  updates, state = tx.update(g, state, p)  # t = 0: lr = 0.
  updates, state = tx.update(g, state, p)  # t = 1: lr = peak / 10.
  lr = float(schedule(1))
  # Bias-corrected Adam's second step with a constant gradient is ~sign(g).
  np.testing.assert_allclose(np.asarray(updates['kernel']),
                             -lr * np.sign([0.3, -2.0]), rtol=1e-4)


def test_unknown_optimizer_is_rejected():
  with pytest.raises(ValueError, match='optimizer.name'):
    optim.make_optimizer(_cfg(name='sgd'))


@pytest.mark.parametrize('t', [0, 5, 10, 11, 55, 100, 120])
def test_warmup_linear_schedule_decays_from_end_of_warmup(t):
  peak, w, total = 1e-4, 10, 100
  expected = peak * t / w if t < w else peak * max(0.0, 1 - (t - w) / (total - w))
  got = float(optim.warmup_linear_schedule(peak, w, total)(t))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize('t', [0, 1, 5, 10, 11, 50, 99, 100])
def test_electra_schedule_is_multiplicative_warmup(t):
  peak, w, total = 5e-4, 10, 100
  expected = peak * max(0.0, 1 - t / total) * min(1.0, t / w)
  got = float(optim.make_schedule(_cfg(schedule='electra',
                                       learning_rate=peak))(t))
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)
