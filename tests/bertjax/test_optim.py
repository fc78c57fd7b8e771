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


@pytest.mark.parametrize('t', [0, 1, 8, 9, 10, 39, 399])
def test_noam_schedule_matches_paddles_noam_decay(t):
  # Paddle's noam_decay(d, W) at step n = t + 1: d**-0.5 * min(n**-0.5,
  # n * W**-1.5), with ERNIE's d = 1 / (W * peak**2).
  peak, w = 5e-5, 10
  n = t + 1
  d = 1 / (w * peak**2)
  expected = d**-0.5 * min(n**-0.5, n * w**-1.5)
  got = float(optim.noam_schedule(peak, w, 1000)(t))
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_schedule_drops_at_end_of_warmup():
  # Decay is measured from step 0: lr(W) = peak * (1 - W / T) < peak.
  s = optim.bert_schedule(1e-4, 10, 100)
  assert float(s(9)) == pytest.approx(0.9e-4)
  assert float(s(10)) == pytest.approx(0.9e-4)


@pytest.mark.parametrize('schedule', ['bert_linear', 'warmup_linear'])
@pytest.mark.parametrize('t', [0, 1, 29, 30, 31, 35, 40, 99, 100, 130])
def test_hold_steps_hold_the_peak_then_run_the_schedule(schedule, t):
  """MobileBERT: the peak for 30 steps, then the schedule over the other
  70 from its own step 0, as the reference's second run."""
  peak, w, hold, total = 1e-3, 10, 30, 100
  inner = {'bert_linear': optim.bert_schedule,
           'warmup_linear': optim.warmup_linear_schedule}[schedule](
               peak, w, total - hold)
  expected = peak if t < hold else float(inner(t - hold))
  got = float(optim.make_schedule(_cfg(schedule=schedule, hold_steps=hold,
                                       learning_rate=peak))(t))
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)
  if t == hold:
    assert got == 0.0   # The warmup starts from 0.


def test_constant_schedule_is_the_peak_and_refuses_a_warmup():
  s = optim.make_schedule(_cfg(schedule='constant', warmup_steps=0))
  assert [float(s(t)) for t in (0, 1, 50, 100)] == [
      pytest.approx(1e-3)] * 4
  with pytest.raises(ValueError, match='constant rate has no warmup'):
    optim.make_schedule(_cfg(schedule='constant'))   # warmup_steps=10
  errors = []
  config_lib._check_optimizer(  # pylint: disable=protected-access
      _cfg(schedule='constant').optimizer, 100, errors)
  assert any('constant rate has no warmup' in e for e in errors)


def test_no_hold_is_the_schedule_itself():
  held = optim.make_schedule(_cfg(hold_steps=0))
  plain = optim.bert_schedule(1e-3, 10, 100)
  assert all(float(held(t)) == float(plain(t)) for t in (0, 5, 10, 60))


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


@pytest.mark.parametrize('t', [0, 1, 5, 9, 10, 11, 50, 99, 100])
def test_spanbert_schedule_is_its_forks(t):
  """SpanBERT's fairseq fork: the first update at the peak (the scheduler
  first sets the lr after it), warmup from peak / W, decay from step 0."""
  peak, w, total = 1e-4, 10, 100
  expected = (peak if t == 0 else peak * t / w if t <= w
              else peak * (1 - t / total))
  got = float(optim.make_schedule(_cfg(schedule='spanbert',
                                       learning_rate=peak))(t))
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)


def _reference_fairseq_adam(params, grads_seq, lr_fn, b1=0.9, b2=0.98,
                            eps=1e-6, wd=0.01):
  """fairseq/optim/adam.py ``Adam.step``, in float64: eps on the raw
  sqrt(v), the bias correction in the step size, every parameter
  decayed."""
  params = {k: np.array(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  for t, grads in enumerate(grads_seq, start=1):
    lr = lr_fn(t - 1)
    for k in params:
      m[k] = b1 * m[k] + (1 - b1) * grads[k]
      v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
      step_size = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
      params[k] = params[k] - wd * lr * params[k]
      params[k] = params[k] - step_size * m[k] / (np.sqrt(v[k]) + eps)
  return params


def test_fairseq_adam_matches_its_transcription_and_differs_from_adamw():
  cfg = _cfg(name='fairseq_adam', b2=0.98, eps=1e-6, grad_clip_norm=0.0,
             decay_mask='all')
  tx, schedule = optim.make_optimizer(cfg)
  rng = np.random.default_rng(2)
  params = {'kernel': rng.normal(size=(4, 3)), 'bias': rng.normal(size=(3,))}
  # Small gradients, where epsilon's place matters.
  grads_seq = [{k: rng.normal(size=v.shape) * 1e-5 for k, v in params.items()}
               for _ in range(12)]
  p = _apply(tx, params, grads_seq)
  expected = _reference_fairseq_adam(params, grads_seq,
                                     lambda t: float(schedule(t)))
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), expected[k], rtol=1e-5,
                               atol=1e-7)
  adamw, _ = optim.make_optimizer(_cfg(name='adamw', b2=0.98, eps=1e-6,
                                       grad_clip_norm=0.0, decay_mask='all'))
  adamw = _apply(adamw, params, grads_seq)
  moved = np.abs(expected['kernel'] - params['kernel']).max()
  assert np.abs(np.asarray(adamw['kernel']) - expected['kernel']).max() > (
      0.01 * moved)


def test_decay_mask_all_decays_every_parameter():
  params = {'dense': {'kernel': 1.0, 'bias': 1.0},
            'LayerNorm_0': {'scale': 1.0, 'bias': 1.0}}
  assert all(jax.tree.leaves(optim.decay_mask(params, 'all')))
  with pytest.raises(ValueError, match='optimizer.decay_mask'):
    optim.decay_mask(params, 'none')


def test_lamb_trust_ratio_is_per_reference_tensor():
  """albert's graph has separate query, key and value kernels, and a scanned
  stack is one tensor per layer: each gets its own ||w|| / ||u||."""
  tx = optim.scale_by_reference_trust_ratio()
  rng = np.random.default_rng(3)
  qkv = jnp.asarray(rng.normal(size=(2, 4, 3, 2, 2)), jnp.float32)
  qkv = qkv * jnp.asarray([1.0, 10.0, 0.1])[None, None, :, None, None]
  update = jnp.asarray(rng.normal(size=qkv.shape), jnp.float32)
  params = {'layers': {'scan': {'layer': {'attention': {'qkv_kernel': qkv}}}},
            'out_kernel': qkv[0]}
  updates = {'layers': {'scan': {'layer': {'attention': {
      'qkv_kernel': update}}}}, 'out_kernel': update[0]}
  out, _ = tx.update(updates, tx.init(params), params)
  scanned = out['layers']['scan']['layer']['attention']['qkv_kernel']
  for layer in range(2):
    for part in range(3):
      w, u = qkv[layer, :, part], update[layer, :, part]
      np.testing.assert_allclose(
          scanned[layer, :, part],
          u * jnp.linalg.norm(w) / jnp.linalg.norm(u), rtol=1e-5)
  # Any other leaf is one tensor (here a 4-d one named otherwise).
  np.testing.assert_allclose(
      out['out_kernel'],
      update[0] * jnp.linalg.norm(qkv[0]) / jnp.linalg.norm(update[0]),
      rtol=1e-5)


def test_per_tensor_clipping_is_torchs_per_reference_tensor():
  """BertAdam's ``clip_grad_norm_(p, c)`` on each parameter: query, key and
  value, fused in ``qkv_kernel`` and ``qkv_bias``, are clipped apart."""
  rng = np.random.default_rng(0)
  grads = {'layer_0': {'attention': {
      'qkv_kernel': rng.normal(size=(4, 3, 2, 2)).astype(np.float32),
      'qkv_bias': rng.normal(size=(3, 2, 2)).astype(np.float32)}},
           'small': np.full((3,), 0.1, np.float32)}
  grads['layer_0']['attention']['qkv_kernel'][:, 1] *= 0.01   # Key: small.
  clipped, _ = optim.clip_per_tensor(1.0).update(grads, optax.EmptyState())

  def torch_clip(g):
    return g * min(1.0, 1.0 / (np.linalg.norm(g) + 1e-6))

  for name, axis in (('qkv_kernel', 1), ('qkv_bias', 0)):
    g = grads['layer_0']['attention'][name]
    expected = np.stack([torch_clip(np.take(g, i, axis)) for i in range(3)],
                        axis)
    np.testing.assert_allclose(clipped['layer_0']['attention'][name],
                               expected, rtol=1e-6)
  # Under the norm: left as it is (the key's part above too).
  np.testing.assert_array_equal(clipped['small'], grads['small'])
  key = clipped['layer_0']['attention']['qkv_kernel'][:, 1]
  np.testing.assert_allclose(
      key, grads['layer_0']['attention']['qkv_kernel'][:, 1], rtol=1e-6)
