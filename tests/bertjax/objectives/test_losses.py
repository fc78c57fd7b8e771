"""Losses against hand-computed values."""

import jax.numpy as jnp
import numpy as np

from bertjax.objectives import losses


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1,
                    keepdims=True)) - x.max(-1, keepdims=True)


def test_masked_lm_matches_bert_formula():
  logits = np.array([[[2.0, 0.0, -1.0], [0.0, 1.0, 0.0], [5.0, 5.0, 5.0]],
                     [[0.0, 0.0, 3.0], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
  labels = np.array([[0, 2, 1], [2, 0, 0]])
  weights = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
  loss, sums = losses.masked_lm(jnp.asarray(logits), jnp.asarray(labels),
                                    jnp.asarray(weights))
  nll = -np.take_along_axis(_log_softmax(logits), labels[..., None], -1)[..., 0]
  expected = (weights * nll).sum() / (weights.sum() + 1e-5)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  # Correct: row 0 slot 0 (argmax 0 == 0) and row 1 slot 0 (2 == 2).
  assert float(sums['mlm_correct']) == 2.0
  assert float(sums['mlm_count']) == 4.0


def test_next_sentence_mean_cross_entropy():
  logits = np.array([[1.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])
  labels = np.array([0, 1, 0])
  loss, sums = losses.next_sentence(jnp.asarray(logits),
                                        jnp.asarray(labels))
  nll = -np.take_along_axis(_log_softmax(logits), labels[:, None], -1)[:, 0]
  np.testing.assert_allclose(float(loss), nll.mean(), rtol=1e-6)
  # argmax: 0, 0 (tie -> first), 1 vs labels 0, 1, 0.
  assert float(sums['nsp_correct']) == 1.0


def test_pretraining_weights_and_nsp_off():
  outputs = {'mlm_logits': jnp.zeros((1, 2, 4)),
             'nsp_logits': jnp.array([[0.0, 2.0]])}
  batch = {'masked_ids': jnp.array([[1, 2]]),
           'masked_weights': jnp.array([[1.0, 1.0]]),
           'next_sentence_labels': jnp.array([0])}
  mlm = np.log(4.0) * 2 / (2 + 1e-5)
  nsp = -_log_softmax(np.array([0.0, 2.0]))[0]
  loss, sums = losses.bert_pretraining(outputs, batch, 2.0, 0.5)
  np.testing.assert_allclose(float(loss), 2 * mlm + 0.5 * nsp, rtol=1e-6)
  loss, sums = losses.bert_pretraining(outputs, batch, 1.0, 0.0)
  np.testing.assert_allclose(float(loss), mlm, rtol=1e-6)
  assert 'nsp_count' not in sums


def test_summarize_divides_sums():
  out = losses.summarize({'mlm_loss_sum': 6.0, 'mlm_correct': 3.0,
                              'mlm_count': 12.0})
  assert out == {'mlm_loss': 0.5, 'mlm_accuracy': 0.25}


def test_summarize_gives_the_mean_of_any_other_sum():
  out = losses.summarize({'progressive_layer_sum': 3.0,
                          'progressive_layer_count': 2.0,
                          'mlm_loss_sum': 6.0, 'mlm_count': 12.0})
  assert out == {'progressive_layer': 1.5, 'mlm_loss': 0.5}
