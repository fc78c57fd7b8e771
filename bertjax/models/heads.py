"""Downstream models: the BERT encoder under a task head, in Flax Linen.

The encoder's parameters sit at the top level under the names
``BertForPreTraining`` gives them (``embeddings``, ``layer_{g}``), so a
pretrained run's encoder loads by copying those trees. Heads, as in
Devlin et al. (2019), Sec. 4 and google-research/bert:

- ``classification`` / ``regression``: the [CLS] state through a pooler
  (Dense + tanh; taken from the pretrained pooler where the run has one),
  dropout, and a linear layer to ``num_labels`` logits (1 for regression).
  With ``pooling='first'`` the [CLS] state goes to the dropout as it is,
  with no pooler (google-research/electra's ``get_pooled_output``,
  ``sequence_output[:, 0]``, under its classification and regression
  heads).
- ``token``: dropout and a linear layer on every token's state (labels sit
  on each word's first sub-token).
- ``span``: start and end vectors S, E: a token's start (end) logit is its
  state's dot product with S (E), one linear layer of 2 outputs, with no
  dropout before it (run_squad.py's, and transformers'
  ``BertForQuestionAnswering``).

With ``layer_mix`` the head reads a learned weighted sum of every layer's
output (the embeddings' included), gamma * sum_j softmax(w)_j h_j, as
ELMo's scalar mix (Peters et al., 2018) and BERT's feature-based
experiments (Sec. 5.3) use the layers of a frozen network.

Logical names: the encoder's, plus ``classes`` for the head outputs.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert as bert_lib

KINDS = ('classification', 'regression', 'token', 'span')
POOLING = ('cls', 'mean', 'first')
# The output layer's initial kernel: 'bert' (truncated normal of the
# model's initializer_range, run_classifier.py's) or 'glorot' (Glorot
# uniform, tf.layers.dense's default: ELECTRA's heads).
HEAD_INITS = ('bert', 'glorot')
# Top-level parameter trees that belong to the head (all else is encoder).
HEAD = ('layer_mix', 'pooler', 'classifier')


class ScalarMix(nn.Module):
  """gamma * sum_j softmax(w)_j h_j over a list of [B, L, D] states."""

  @nn.compact
  def __call__(self, states):
    weights = self.param('weights', nn.initializers.zeros_init(),
                         (len(states),), jnp.float32)
    gamma = self.param('gamma', nn.initializers.ones_init(), (), jnp.float32)
    mix = jax.nn.softmax(weights)
    out = sum(w.astype(h.dtype) * h for w, h in zip(mix, states))
    return gamma.astype(out.dtype) * out


class DownstreamModel(nn.Module):
  """Encoder + task head. Inputs ``[B, L]`` int arrays; returns float32
  logits: [B, num_labels] (classification, regression), [B, L, num_labels]
  (token) or [B, L, 2] (span: start, end)."""
  cfg: bert_lib.BertConfig
  kind: str
  num_labels: int
  layer_mix: bool = False
  # What the sentence-level head reads: 'cls' (the [CLS] state through the
  # pooler, BERT's), 'mean' (the mean of the real tokens' states, through
  # the pooler) or 'first' (the [CLS] state, no pooler: ELECTRA's).
  pooling: str = 'cls'
  head_init: str = 'bert'   # HEAD_INITS
  # The encoder is fixed (finetune's frozen and weighted_layers modes): it
  # runs without dropout, as features are read from a pretrained model
  # (BERT Sec. 5.3; extract_features.py builds it with is_training=False).
  # The head's dropout stays.
  fixed_encoder: bool = False

  def setup(self):
    if self.kind not in KINDS:
      raise ValueError(f'task kind {self.kind!r}; use one of {KINDS}.')
    cfg = self.cfg
    self.embeddings = bert_lib.Embeddings(cfg)
    self.layers = bert_lib.encoder_layers(cfg)
    if self.layer_mix:
      self.mix = ScalarMix(name='layer_mix')
    if self.kind in ('classification', 'regression') and (
        self.pooling != 'first'):
      self.pooler = nn.Dense(
          cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
          kernel_init=bert_lib.param_init(cfg, ('embed', 'mlp')),
          bias_init=bert_lib.zeros_init(('mlp',)))
    outputs = 2 if self.kind == 'span' else self.num_labels
    self.classifier = nn.Dense(
        outputs, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=(bert_lib.param_init(cfg, ('embed', 'classes'))
                     if self.head_init == 'bert' else
                     nn.with_logical_partitioning(
                         nn.initializers.glorot_uniform(),
                         ('embed', 'classes'))),
        bias_init=bert_lib.zeros_init(('classes',)))
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids, token_type_ids, attention_mask,
               deterministic: bool = True):
    cfg = self.cfg
    encoder_deterministic = deterministic or self.fixed_encoder
    x = self.embeddings(input_ids, token_type_ids, encoder_deterministic)
    # Applied with mutable=['intermediates'] (task-specific distillation),
    # it records every hidden state and attention score, as
    # BertForPreTraining.encode does.
    record = self.is_mutable_collection('intermediates')
    x = bert_lib.run_layers(cfg, self.layers, x, input_ids, attention_mask,
                            encoder_deterministic,
                            all_layers=self.layer_mix or record)
    if record:
      for state in x:
        self.sow('intermediates', 'hidden_states', state)
    if self.layer_mix:
      x = self.mix(x)
    elif record:
      x = x[-1]
    if self.kind in ('classification', 'regression'):
      if self.pooling == 'mean':
        weights = attention_mask[..., None].astype(x.dtype)
        x = (x * weights).sum(1) / jnp.maximum(weights.sum(1), 1)
      else:
        x = x[:, 0]
      if self.pooling != 'first':
        x = jnp.tanh(self.pooler(x))
    if self.kind != 'span':   # run_squad.py's logits read the states as
      x = self.dropout(x, deterministic=deterministic)   # they are.
    logits = self.classifier(x)
    return logits.astype(jnp.float32)
