"""The losses objectives share, as pure functions of model outputs and a
batch (MLM, NSP/SOP, SBO, and their weighted sum for the BERT family).

Each returns ``(loss, metrics)`` where metrics are sums and counts, so they
can be added across batches and hosts before dividing. Formulas follow
google-research/bert ``run_pretraining.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def masked_lm(logits: jax.Array, labels: jax.Array, weights: jax.Array,
              count_offset: float = 1e-5):
  """BERT's MLM loss: ``sum(w * nll) / (sum(w) + count_offset)``.

  Args:
    logits: float32 [B, P, V].
    labels: int [B, P], the original token ids.
    weights: float32 [B, P], 1 for real prediction slots, 0 for padding.
    count_offset: added to the count: 1e-5 in google-research/bert's
      run_pretraining.py, 1e-6 in electra's.
  """
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  loss = jnp.sum(weights * nll) / (jnp.sum(weights) + count_offset)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, {
      'mlm_loss_sum': jnp.sum(weights * nll),
      'mlm_correct': jnp.sum(weights * correct),
      'mlm_count': jnp.sum(weights),
  }


def next_sentence(logits: jax.Array, labels: jax.Array):
  """Mean cross-entropy over the batch. logits [B, 2], labels int [B]."""
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return jnp.mean(nll), {
      'nsp_loss_sum': jnp.sum(nll),
      'nsp_correct': jnp.sum(correct),
      'nsp_count': jnp.asarray(labels.shape[0], jnp.float32),
  }


def span_boundary(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                  count_offset: float = 1e-5):
  """SpanBERT's SBO loss: the MLM loss of the span boundary predictions
  (same targets and weights as MLM), under its own metric names, its sum
  divided by the count + ``count_offset`` (SpanBERT's ``NoNSPPairLoss``,
  criterions/spanbert_loss.py: + 1)."""
  loss, metrics = masked_lm(logits, labels, weights, count_offset)
  return loss, {k.replace('mlm_', 'sbo_'): v for k, v in metrics.items()}


def bert_pretraining(outputs: dict, batch: dict, mlm_weight: float = 1.0,
                     nsp_weight: float = 1.0, sbo_weight: float = 0.0,
                     sbo_count_offset: float = 1e-5):
  """MLM + NSP (or SOP) + SBO, weighted; a loss of weight 0 is skipped."""
  mlm_loss, metrics = masked_lm(outputs['mlm_logits'], batch['masked_ids'],
                                batch['masked_weights'])
  loss = mlm_weight * mlm_loss
  if nsp_weight:
    nsp_loss, nsp_metrics = next_sentence(outputs['nsp_logits'],
                                          batch['next_sentence_labels'])
    loss = loss + nsp_weight * nsp_loss
    metrics.update(nsp_metrics)
  if sbo_weight:
    sbo_loss, sbo_metrics = span_boundary(
        outputs['sbo_logits'], batch['masked_ids'], batch['masked_weights'],
        sbo_count_offset)
    loss = loss + sbo_weight * sbo_loss
    metrics.update(sbo_metrics)
  return loss, metrics


def summarize(sums: dict) -> dict:
  """Summed metrics -> means: for each ``X_count``, ``X_loss`` (from
  ``X_loss_sum``), ``X_accuracy`` (from ``X_correct``) and ``X`` (from
  ``X_sum``: any other quantity, e.g. MobileBERT's stage) where present."""
  out = {}
  for key in sorted(sums):
    if not key.endswith('_count'):
      continue
    name, count = key[:-len('_count')], float(sums[key])
    if not count:
      continue
    for total, mean in (('_loss_sum', '_loss'), ('_correct', '_accuracy'),
                        ('_sum', '')):
      if name + total in sums:
        out[name + mean] = float(sums[name + total]) / count
  return out
