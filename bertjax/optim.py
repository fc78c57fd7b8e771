"""Optimizers and learning-rate schedules, as Optax transformations.

``bert_adamw`` reproduces google-research/bert ``optimization.py``
(AdamWeightDecayOptimizer) exactly:

  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2        (no bias correction)
  u <- m / (sqrt(v) + eps) + wd * param  (wd only for kernels and embeddings)
  param <- param - lr * u

after clipping gradients to a global norm of 1.0, with the schedule
``lr = peak * t / W`` for ``t < W``, else ``peak * (1 - t / T)`` (linear decay
measured from step 0, so the lr drops slightly at t = W).

``adamw`` is Optax's standard AdamW (bias-corrected) with the same decay mask,
for comparison.

``lamb`` is ALBERT's LAMB (You et al., 2020, as google-research/albert's
``lamb_optimizer.py``): the same raw moments and decay, then each decayed
weight's update is rescaled by the trust ratio ``||param|| / ||update||``
(1 where either norm is 0); biases and LayerNorm parameters are excluded
from both the decay and the adaptation, as albert does by default.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ('bert_adamw', 'adamw', 'lamb')
SCHEDULES = ('bert_linear', 'warmup_linear', 'electra')


def bert_schedule(peak_learning_rate: float, warmup_steps: int,
                  total_steps: int) -> optax.Schedule:
  """BERT's warmup + linear decay; ``t`` counts updates applied so far."""
  def schedule(t):
    t = jnp.asarray(t, jnp.float32)
    warmup = peak_learning_rate * t / max(warmup_steps, 1)
    decay = peak_learning_rate * jnp.maximum(0.0, 1.0 - t / total_steps)
    return jnp.where(t < warmup_steps, warmup, decay)
  return schedule


def warmup_linear_schedule(peak_learning_rate: float, warmup_steps: int,
                           total_steps: int) -> optax.Schedule:
  """fairseq's polynomial_decay (power 1): linear warmup to the peak at W,
  then linear decay from the peak at W to 0 at T (RoBERTa, SpanBERT)."""
  return optax.join_schedules([
      optax.linear_schedule(0.0, peak_learning_rate, warmup_steps),
      optax.linear_schedule(peak_learning_rate, 0.0,
                            max(total_steps - warmup_steps, 1)),
  ], [warmup_steps])


def electra_schedule(peak_learning_rate: float, warmup_steps: int,
                     total_steps: int) -> optax.Schedule:
  """ELECTRA's multiplicative warmup: ``peak * (1 - t / T) * min(1, t / W)``
  (google-research/electra optimization.py: polynomial decay, then scaled
  by the warmup fraction)."""
  def schedule(t):
    t = jnp.asarray(t, jnp.float32)
    decay = jnp.maximum(0.0, 1.0 - t / total_steps)
    return peak_learning_rate * decay * jnp.minimum(
        1.0, t / max(warmup_steps, 1))
  return schedule


class ScaleByAdamNoBiasCorrectionState(NamedTuple):
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_no_bias_correction(b1: float = 0.9, b2: float = 0.999,
                                     eps: float = 1e-6
                                     ) -> optax.GradientTransformation:
  """``m / (sqrt(v) + eps)`` with raw (not bias-corrected) moments, as BERT."""

  def init(params):
    zeros = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params)
    return ScaleByAdamNoBiasCorrectionState(mu=zeros, nu=zeros)

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu,
                      updates)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, ScaleByAdamNoBiasCorrectionState(mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def _leaf_name(path) -> str:
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return str(names[-1]) if names else ''


def decay_mask(params):
  """True for weights that decay: kernels and embeddings.

  Biases (incl. the MLM output bias) and LayerNorm scales/biases do not,
  as in BERT (which excludes "LayerNorm", "layer_norm" and "bias").
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, _: _leaf_name(path).endswith(('kernel', 'embedding')),
      params)


def make_schedule(cfg) -> optax.Schedule:
  o = cfg.optimizer
  if o.schedule not in SCHEDULES:
    raise ValueError(f'optimizer.schedule={o.schedule!r}; use one of '
                     f'{SCHEDULES}.')
  if o.schedule == 'warmup_linear':
    return warmup_linear_schedule(o.learning_rate, o.warmup_steps,
                                  cfg.total_steps)
  if o.schedule == 'electra':
    return electra_schedule(o.learning_rate, o.warmup_steps, cfg.total_steps)
  return bert_schedule(o.learning_rate, o.warmup_steps, cfg.total_steps)


def make_optimizer(cfg) -> tuple[optax.GradientTransformation,
                                 optax.Schedule]:
  """The optimizer named by ``cfg.optimizer.name`` and its schedule."""
  o = cfg.optimizer
  schedule = make_schedule(cfg)
  if o.name in ('bert_adamw', 'lamb'):
    scale = scale_by_adam_no_bias_correction(o.b1, o.b2, o.eps)
  elif o.name == 'adamw':
    scale = optax.scale_by_adam(o.b1, o.b2, o.eps)
  else:
    raise ValueError(f'optimizer.name={o.name!r}; use one of {OPTIMIZERS}.')
  parts = []
  if o.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(o.grad_clip_norm))
  parts.append(scale)
  if o.weight_decay:
    parts.append(optax.add_decayed_weights(o.weight_decay, mask=decay_mask))
  if o.name == 'lamb':
    parts.append(optax.masked(optax.scale_by_trust_ratio(), decay_mask))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), schedule
