"""Optimizers and learning-rate schedules, as Optax transformations.

``bert_adamw`` reproduces google-research/bert ``optimization.py``
(AdamWeightDecayOptimizer) exactly:

  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2        (no bias correction)
  u <- m / (sqrt(v) + eps) + wd * param  (wd only for kernels and embeddings)
  param <- param - lr * u

after clipping gradients to a global norm of 1.0, with the schedule
``lr = peak * t / W`` for ``t < W``, else ``peak * (1 - t / T)`` (linear decay
measured from step 0, so the lr drops slightly at t = W).

``adamw`` is Optax's standard AdamW, ``torch.optim.AdamW``'s formula:
bias-corrected moments, ``m_hat / (sqrt(v_hat) + eps)``.

``fairseq_adam`` is fairseq's Adam (fairseq/optim/adam.py, ``Adam.step``;
the same formula as transformers' ``AdamW`` of 2019-2021 with
``correct_bias=True``): bias-corrected, but epsilon is added to the raw
``sqrt(v)`` and the correction folded into the step size,
``lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``, which is
``m_hat / (sqrt(v_hat) + eps / sqrt(1 - b2^t))``: early steps see a larger
epsilon than ``adamw``'s.

``lamb`` is ALBERT's LAMB (You et al., 2020, as google-research/albert's
``lamb_optimizer.py``): the same raw moments and decay, then each decayed
weight's update is rescaled by the trust ratio ``||param|| / ||update||``
(1 where either norm is 0), per tensor as albert's graph has them: the
query, key and value kernels each have their own ratio although bertjax
fuses them into one ``qkv_kernel`` (MobileBERT's Q and K into one
``qk_kernel``), and each layer of a scanned stack its own; biases and
LayerNorm parameters (and NoNorm's) are excluded from both the decay and
the adaptation, as albert does by default.

Weight decay applies to the leaves ``optimizer.decay_mask`` names (every
variant decouples it from the moments, ``param -= lr * wd * param``):
``bert``, kernels and embeddings but no bias or LayerNorm parameter
(google-research/bert's and albert's ``exclude_from_weight_decay``,
electra's, Hugging Face's ``no_decay``), or ``all`` (fairseq's Adam decays
every parameter).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ('bert_adamw', 'adamw', 'fairseq_adam', 'lamb')
# How optimizer.grad_clip_norm applies: one norm over every gradient, or
# each tensor to its own norm (pytorch-pretrained-bert's BertAdam, which
# TinyBERT trains with: ``clip_grad_norm_(p, max_grad_norm)`` per
# parameter).
GRAD_CLIPS = ('global', 'per_tensor')
DECAY_MASKS = ('bert', 'all')
SCHEDULES = ('bert_linear', 'warmup_linear', 'electra', 'spanbert', 'noam',
             'constant')


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
  """fairseq's polynomial_decay (power 1; fairseq/optim/lr_scheduler/
  polynomial_decay_schedule.py, stepped to 0 before the first update):
  linear warmup from 0 to the peak at W, then linear decay from the peak
  at W to 0 at T (RoBERTa); also transformers'
  ``get_linear_schedule_with_warmup`` (DistilBERT)."""
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


def spanbert_schedule(peak_learning_rate: float, warmup_steps: int,
                      total_steps: int) -> optax.Schedule:
  """SpanBERT's: its fork of fairseq's polynomial_decay
  (pretraining/fairseq/optim/lr_scheduler/polynomial_decay_schedule.py,
  ``step_update``) as its trainer steps it. The scheduler first sets the lr
  after the first update, so update 0 runs at the optimizer's initial lr,
  the peak; update ``t >= 1`` at ``peak * t / W`` up to ``t = W``, then
  ``peak * (1 - t / T)`` (decay measured from step 0, as BERT's).

  Not reproduced: at each epoch's end its train.py calls ``lr_step``, which
  sets the lr to ``warmup_factor * peak`` (the peak once warmed up) and is
  undone only by the next ``step_update``, so the first update of every
  epoch after the first runs at the peak. That is one update per pass
  over the corpus; here it takes the schedule's rate, as every other."""
  def schedule(t):
    t = jnp.asarray(t, jnp.float32)
    warmup = peak_learning_rate * t / max(warmup_steps, 1)
    decay = peak_learning_rate * jnp.maximum(0.0, 1.0 - t / total_steps)
    lr = jnp.where(t <= warmup_steps, warmup, decay)
    return jnp.where(t == 0, peak_learning_rate, lr)
  return schedule


def noam_schedule(peak_learning_rate: float, warmup_steps: int,
                  total_steps: int) -> optax.Schedule:
  """ERNIE's ``noam_decay`` (PaddlePaddle/ERNIE optimization.py, which
  calls Paddle's ``noam_decay(1 / (W * peak**2), W)``): update ``t``
  (Paddle counts from 1) at ``peak * min(n / W, sqrt(W / n))``, ``n = t +
  1``: linear warmup to the peak at W, then inverse square root decay;
  ``total_steps`` is not used (the decay has no end)."""
  del total_steps
  w = max(warmup_steps, 1)

  def schedule(t):
    n = jnp.asarray(t, jnp.float32) + 1.0
    return peak_learning_rate * jnp.minimum(n / w, jnp.sqrt(w / n))
  return schedule


def constant_schedule(peak_learning_rate: float, warmup_steps: int,
                      total_steps: int) -> optax.Schedule:
  """The peak at every update: BertAdam's ``schedule='none'``
  (``ConstantLR``), which TinyBERT's task_distill.py takes for its
  intermediate-layer stage. It has no warmup (``make_schedule`` refuses
  one)."""
  del warmup_steps, total_steps
  return optax.constant_schedule(peak_learning_rate)


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


def scale_by_fairseq_adam(b1: float = 0.9, b2: float = 0.999,
                          eps: float = 1e-8) -> optax.GradientTransformation:
  """fairseq's Adam step (fairseq/optim/adam.py): BERT's raw-moment
  ``m / (sqrt(v) + eps)`` times ``sqrt(1 - b2^t) / (1 - b1^t)``, ``t``
  counting updates from 1."""
  return optax.chain(
      scale_by_adam_no_bias_correction(b1, b2, eps),
      optax.scale_by_schedule(
          lambda count: jnp.sqrt(1 - b2**(count + 1.0)) / (
              1 - b1**(count + 1.0))))


def _is_scanned(path) -> bool:
  """Whether ``path`` is in a scanned stack (``model.scan_layers``), whose
  leaves have a leading ``layers`` axis."""
  return any(getattr(k, 'key', None) == 'layers' for k in path)


def _reference_tensor_axes(path, leaf) -> tuple[int, ...]:
  """The axes one reference tensor spans in ``leaf``: all but a scanned
  stack's layer axis and the fused Q/K/V axis of ``qkv_kernel`` [D, 3, H,
  K] and ``qkv_bias`` [3, H, K] (and of MobileBERT's fused Q/K,
  ``qk_kernel``, ``qk_bias``), which are separate tensors in the
  reference's graph."""
  keep = set()
  if _is_scanned(path):
    keep.add(0)
  if _leaf_name(path) in ('qkv_kernel', 'qkv_bias', 'qk_kernel',
                          'qk_bias'):
    keep.add(leaf.ndim - 3)
  return tuple(a for a in range(leaf.ndim) if a not in keep)


def scale_by_reference_trust_ratio() -> optax.GradientTransformation:
  """LAMB's layer adaptation, ``update * ||param|| / ||update||`` (1 where
  either norm is 0), with the norms per reference tensor
  (``_reference_tensor_axes``)."""

  def update(updates, state, params):
    def scale(path, u, p):
      axes = _reference_tensor_axes(path, u)
      norm = lambda x: jnp.sqrt(jnp.sum(jnp.square(x), axis=axes,
                                        keepdims=True))
      p_norm, u_norm = norm(p), norm(u)
      ratio = jnp.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, 1.0)
      return (u * ratio).astype(u.dtype)
    return jax.tree_util.tree_map_with_path(scale, updates, params), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                      update)


def _leaf_name(path) -> str:
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return str(names[-1]) if names else ''


def decay_mask(params, which: str = 'bert'):
  """True for the weights that decay.

  ``bert``: kernels and embeddings; biases (incl. the MLM output bias) and
  LayerNorm scales/biases do not, as in BERT (which excludes "LayerNorm",
  "layer_norm" and "bias"). ``all``: every parameter (fairseq).
  """
  if which not in DECAY_MASKS:
    raise ValueError(f'optimizer.decay_mask={which!r}; use one of '
                     f'{DECAY_MASKS}.')
  return jax.tree_util.tree_map_with_path(
      lambda path, _: which == 'all' or _leaf_name(path).endswith(
          ('kernel', 'embedding')), params)


def clip_per_tensor(max_norm: float) -> optax.GradientTransformation:
  """Each gradient tensor scaled to a norm of at most ``max_norm``, as
  torch's ``clip_grad_norm_`` on one parameter: ``g * min(1, max_norm /
  (||g|| + 1e-6))``; the tensors are the reference's
  (``_reference_tensor_axes``: query, key and value each their own)."""
  def clip(path, g):
    norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32)),
                            axis=_reference_tensor_axes(path, g),
                            keepdims=True))
    return g * jnp.minimum(1.0, max_norm / (norm + 1e-6)).astype(g.dtype)
  return optax.stateless(lambda updates, params=None: (
      jax.tree_util.tree_map_with_path(clip, updates)))


def held_schedule(peak_learning_rate: float, hold_steps: int,
                  schedule: optax.Schedule) -> optax.Schedule:
  """The peak for the first ``hold_steps`` updates, then ``schedule`` from
  its own step 0 (MobileBERT's progressive transfer holds the lr constant,
  and its pretraining distillation, a new run in the reference, warms up
  and decays after it)."""
  def held(t):
    t = jnp.asarray(t, jnp.int32)
    return jnp.where(t < hold_steps,
                     jnp.asarray(peak_learning_rate, jnp.float32),
                     schedule(jnp.maximum(t - hold_steps, 0)))
  return held


_SCHEDULE_FUNCTIONS = {'bert_linear': bert_schedule,
                       'warmup_linear': warmup_linear_schedule,
                       'electra': electra_schedule,
                       'spanbert': spanbert_schedule,
                       'noam': noam_schedule,
                       'constant': constant_schedule}


def make_schedule(cfg) -> optax.Schedule:
  """``optimizer.schedule`` over ``total_steps - optimizer.hold_steps``
  updates, after ``hold_steps`` at the peak (``held_schedule``; none by
  default)."""
  o = cfg.optimizer
  if o.schedule not in SCHEDULES:
    raise ValueError(f'optimizer.schedule={o.schedule!r}; use one of '
                     f'{SCHEDULES}.')
  if o.schedule == 'constant' and o.warmup_steps:
    raise ValueError(f'optimizer.warmup_steps={o.warmup_steps} with '
                     "optimizer.schedule='constant': a constant rate has no "
                     'warmup; set warmup_steps=0 or take another schedule.')
  hold = o.get('hold_steps', 0)   # Fine-tuning's sections have none.
  schedule = _SCHEDULE_FUNCTIONS[o.schedule](
      o.learning_rate, o.warmup_steps, cfg.total_steps - hold)
  return held_schedule(o.learning_rate, hold, schedule) if hold else schedule


def make_optimizer(cfg) -> tuple[optax.GradientTransformation,
                                 optax.Schedule]:
  """The optimizer named by ``cfg.optimizer.name`` and its schedule."""
  o = cfg.optimizer
  schedule = make_schedule(cfg)
  if o.name in ('bert_adamw', 'lamb'):
    scale = scale_by_adam_no_bias_correction(o.b1, o.b2, o.eps)
  elif o.name == 'adamw':
    scale = optax.scale_by_adam(o.b1, o.b2, o.eps)
  elif o.name == 'fairseq_adam':
    scale = scale_by_fairseq_adam(o.b1, o.b2, o.eps)
  else:
    raise ValueError(f'optimizer.name={o.name!r}; use one of {OPTIMIZERS}.')
  decays = lambda params: decay_mask(params, o.decay_mask)
  parts = []
  if o.grad_clip_norm and o.grad_clip == 'per_tensor':
    parts.append(clip_per_tensor(o.grad_clip_norm))
  elif o.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(o.grad_clip_norm))
  parts.append(scale)
  if o.weight_decay:
    parts.append(optax.add_decayed_weights(o.weight_decay, mask=decays))
  if o.name == 'lamb':
    # albert excludes the same leaves from the adaptation as from decay.
    parts.append(optax.masked(scale_by_reference_trust_ratio(), decays))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), schedule


def keep_unread(tx: optax.GradientTransformation, reads, updates,
                opt_state, old_opt_state):
  """(updates, optimizer state) with the leaves a step does not read left
  as they were: no update (so no weight decay either) and their moments
  unchanged, as PyTorch's optimizers skip a parameter with no gradient.

  ``reads`` is a tree of Python bools shaped as the parameters (True:
  the step's loss reads the leaf), so the selection costs nothing at run
  time; ``opt_state`` is ``tx.update``'s new state, ``old_opt_state`` the
  one it started from.
  """
  updates = jax.tree.map(lambda u, r: u if r else jnp.zeros_like(u),
                         updates, reads)
  kept = optax.tree_utils.tree_map_params(
      tx, lambda _, r: r, opt_state, reads,
      transform_non_params=lambda _: True)
  opt_state = jax.tree.map(lambda r, new, old: new if r else old, kept,
                           opt_state, old_opt_state)
  return updates, opt_state
