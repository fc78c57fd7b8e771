"""The task heads and losses against direct numpy."""

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import bert as bert_lib
from bertjax.objectives import auxiliary
from data_pipelines import tasks as tasks_lib

_TOKEN = tasks_lib.HostTask(
    name='probe_token', head='token', num_classes=lambda p, L: 3,
    label_field='probe_labels', weight_field='probe_weights',
    fields=lambda p, L: {})
_SENTENCE = tasks_lib.HostTask(
    name='probe_sentence', head='sentence', num_classes=lambda p, L: 4,
    label_field='probe_label', weight_field='', fields=lambda p, L: {})


def _nll(logits, labels):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, labels[..., None], -1)[..., 0]


def test_token_loss_is_the_weighted_mean_cross_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 3)).astype(np.float32)
  labels = rng.integers(0, 3, (3, 5))
  weights = (rng.random((3, 5)) < 0.6).astype(np.float32)
  present = np.array([1.0, 0.0, 1.0], np.float32)
  batch = {'probe_labels': labels, 'probe_weights': weights,
           'probe_token_present': present}
  loss, sums = auxiliary.task_loss(_TOKEN, jnp.asarray(logits), batch)
  w = weights * present[:, None]   # A row its stream does not build: 0.
  nll = _nll(logits, labels)
  np.testing.assert_allclose(float(loss), (w * nll).sum() / (w.sum() + 1e-5),
                             rtol=1e-5)
  assert float(sums['probe_token_count']) == w.sum()
  correct = (logits.argmax(-1) == labels) * w
  assert float(sums['probe_token_correct']) == correct.sum()


def test_sentence_loss_counts_the_rows_present():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(4, 4)).astype(np.float32)
  labels = rng.integers(0, 4, 4)
  present = np.array([1.0, 1.0, 0.0, 1.0], np.float32)
  batch = {'probe_label': labels, 'probe_sentence_present': present}
  loss, sums = auxiliary.task_loss(_SENTENCE, jnp.asarray(logits), batch)
  nll = _nll(logits, labels)
  np.testing.assert_allclose(
      float(loss), (present * nll).sum() / (3 + 1e-5), rtol=1e-5)
  assert float(sums['probe_sentence_count']) == 3.0


def test_heads_shapes_and_the_pointer_ignores_padding():
  model = bert_lib.BertConfig.from_size('tiny', vocab_size=64)
  heads = auxiliary.TaskHeads(model, (('t', 'token', 2), ('s', 'sentence', 5),
                                      ('p', 'pointer', 8)))
  x = jax.random.normal(jax.random.key(0), (2, 8, model.hidden_size))
  mask = jnp.array([[1] * 8, [1] * 5 + [0] * 3])
  params = heads.init(jax.random.key(1), x, mask)
  out = heads.apply(params, x, mask)
  assert out['t'].shape == (2, 8, 2) and out['s'].shape == (2, 5)
  assert out['p'].shape == (2, 8)
  assert np.all(np.asarray(out['p'])[1, 5:] == -1e9)
  assert jax.nn.softmax(out['p'])[1, 5:].sum() == 0.0
  # The sentence head reads the [CLS] state alone.
  moved = x.at[:, 1:].set(0.0)
  np.testing.assert_array_equal(heads.apply(params, moved, mask)['s'],
                                out['s'])
