"""ELECTRA's replaced token detection as a pretraining ``Task``.

Clark et al. 2020, Sec. 2, as google-research/electra's run_pretraining.py
and pretrain/pretrain_helpers.py do it, all inside the jitted step from the
step's key (the masking needs no host randomness, and the replacements need
the generator's outputs):

1. The pipeline's batch arrives masked for BERT; its ``masked_ids`` put the
   original tokens back.
2. ELECTRA's own masking: ``P = int((mask_prob + 0.005) * L)`` prediction
   slots; a row predicts ``min(P, max(1, round(mask_prob * n)))`` tokens, n
   its non-pad tokens (electra's ``num_to_predict``; P for a full 128-token
   row), chosen uniformly among the tokens that are not [CLS], [SEP],
   [MASK] or padding (all of them when there are fewer). A chosen token
   becomes [MASK] with probability ``mask_token_prob`` (0.85) and is kept
   otherwise; none is replaced by a random token.
3. The generator predicts the chosen tokens (MLM loss, weight
   ``generator_weight``).
4. Replacements are drawn from the generator by Gumbel-max at
   ``temperature``, with no gradient through the draw; a replacement equal
   to the original is labelled "real".
5. The discriminator labels every non-pad token as replaced or real
   (sigmoid cross-entropy, mean over non-pad tokens, weight
   ``discriminator_weight``, 50).

Departure: positions are drawn without replacement. electra draws them with
replacement (``tf.random.categorical``), so a row can repeat a position and
mask a little fewer distinct tokens than its count (about 1.4 repeats per
full 128-token row).

Metric sums: ``mlm_*`` (the generator's), ``rtd_*`` over non-pad tokens,
``rtd_replaced_*`` over replaced tokens (its accuracy is the
discriminator's recall of replacements) and ``generator_sample_*`` (how
often a draw equals the original, electra's sampled_masked_lm_accuracy).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax import flops
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.models import electra as electra_lib
from bertjax.objectives import base
from bertjax.objectives import losses
from bertjax.objectives import registry
from data_pipelines.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID

NAME = 'electra'

# Tokens never chosen for masking, as electra's _get_candidates_mask.
NEVER_MASKED = (PAD_ID, CLS_ID, SEP_ID, MASK_ID)


num_slots = electra_lib.num_slots


def defaults() -> ml_collections.ConfigDict:
  """The ``electra`` section; Clark et al. 2020 and google-research/electra.

  The generator has the discriminator's depth times layers_fraction and its
  width times hidden_fraction, and shares its token and position
  embeddings; masking and sampling happen inside the step.
  """
  e = ml_collections.ConfigDict()
  e.generator_hidden_fraction = 0.25
  e.generator_layers_fraction = 1.0
  e.mask_prob = 0.15          # N = int((mask_prob + 0.005) * L).
  e.mask_token_prob = 0.85    # [MASK]; the rest kept, none random.
  e.temperature = 1.0         # Gumbel-max sampling temperature.
  e.generator_weight = 1.0
  e.discriminator_weight = 50.0
  return e


_FRACTIONS = ('generator_hidden_fraction', 'generator_layers_fraction')


def check(cfg, errors: list[str]) -> None:
  """Appends what is wrong with the ``electra`` section (and the model it
  makes a generator of) to ``errors``."""
  e, seq_len = cfg.electra, cfg.data.max_seq_length
  _check(0 < e.mask_prob < 1,
         f'electra.mask_prob={e.mask_prob} must be in (0, 1).', errors)
  _check(num_slots(e.mask_prob, seq_len) >= 1,
         f'electra.mask_prob={e.mask_prob} with data.max_seq_length='
         f'{seq_len} gives no prediction slots '
         '(int((mask_prob + 0.005) * L) = 0); use a mask_prob that gives '
         'one (ELECTRA uses 0.15).', errors)
  _check(0 <= e.mask_token_prob <= 1,
         f'electra.mask_token_prob={e.mask_token_prob} must be in [0, 1].',
         errors)
  _check(e.temperature > 0,
         f'electra.temperature={e.temperature} must be > 0.', errors)
  for name in ('generator_weight', 'discriminator_weight'):
    _check(e[name] >= 0, f'electra.{name}={e[name]} must be >= 0.', errors)
  _check(bool(e.generator_weight or e.discriminator_weight),
         f'electra.generator_weight={e.generator_weight} and '
         f'electra.discriminator_weight={e.discriminator_weight}: the loss '
         'is 0; use weights > 0 (ELECTRA uses 1 and 50).', errors)
  for name in _FRACTIONS:
    _check(0 < e[name] <= 1, f'electra.{name}={e[name]} must be in (0, 1]'
           ': the generator is at most as wide and deep as the '
           'discriminator.', errors)
  _check_generator(cfg.model, e, errors)


def _check_generator(m, e, errors: list[str]) -> None:
  """The generator the fractions make of the model: a layer, a unit, a
  width its heads divide (checked only where the model's own fields are)."""
  dims = ('hidden_size', 'num_layers', 'num_heads', 'intermediate_size')
  if not (m.size in bert_lib.SIZES and min(m[name] for name in dims) >= 0
          and all(0 < e[name] <= 1 for name in _FRACTIONS)):
    return
  layers, hidden, heads = bert_lib.SIZES[m.size]
  discriminator = bert_lib.BertConfig(
      vocab_size=1, hidden_size=m.hidden_size or hidden,
      num_layers=m.num_layers or layers, num_heads=m.num_heads or heads)
  try:
    electra_lib.generator_config(discriminator, e.generator_hidden_fraction,
                                 e.generator_layers_fraction)
  except ValueError as error:
    errors.append(f'{error} Use fractions whose generator has a layer '
                  'and a width that its heads (width // 64) divide.')


def _check(condition: bool, message: str, errors: list[str]) -> None:
  if not condition:
    errors.append(message)


def scatter_where(ids, positions, values, where):
  """``ids`` [B, L] with ``values`` [B, P] written at ``positions`` [B, P]
  where ``where`` [B, P] holds; positions are distinct where it holds."""
  ids = jnp.asarray(ids)
  rows = jnp.arange(ids.shape[0])[:, None]
  # Slots that do not write point past the row's end and are dropped.
  columns = jnp.where(where, positions, ids.shape[1])
  return ids.at[rows, columns].set(jnp.asarray(values, ids.dtype),
                                  mode='drop')


def original_ids(batch: dict) -> jax.Array:
  """The pipeline's ``input_ids`` [B, L] with its masking undone."""
  return scatter_where(batch['input_ids'], batch['masked_positions'],
                       batch['masked_ids'], batch['masked_weights'] > 0)


def mask_tokens(key, input_ids, attention_mask, mask_prob: float,
                mask_token_prob: float):
  """ELECTRA's dynamic masking of original ids.

  Args:
    key: PRNG key.
    input_ids: int [B, L], the original tokens.
    attention_mask: int [B, L], 1 for real tokens.
    mask_prob: fraction of each row's real tokens to predict.
    mask_token_prob: probability that a chosen token becomes [MASK] (else
      it is kept).

  Returns:
    ``(masked_ids [B, L], positions int32 [B, P], weights float32 [B, P])``
    with ``P = num_slots(mask_prob, L)``; unused slots have position 0 and
    weight 0.
  """
  choose_key, corrupt_key = jax.random.split(key)
  seq_len = input_ids.shape[1]
  slots = num_slots(mask_prob, seq_len)
  candidates = attention_mask > 0
  for token in NEVER_MASKED:
    candidates &= input_ids != token
  # Top-P of uniform noise over the candidates is a uniform draw without
  # replacement; non-candidates score -1 and come last.
  noise = jax.random.uniform(choose_key, input_ids.shape)
  scores, positions = jax.lax.top_k(jnp.where(candidates, noise, -1.0),
                                    slots)
  # electra's num_to_predict, from the real tokens ([CLS]/[SEP] included),
  # in float32 as TensorFlow rounds it.
  num_tokens = jnp.sum(attention_mask, axis=1).astype(jnp.float32)
  count = jnp.clip(jnp.round(num_tokens * mask_prob), 1, slots)
  used = (jnp.arange(slots)[None, :] < count[:, None]) & (scores >= 0)
  positions = jnp.where(used, positions, 0).astype(jnp.int32)
  to_mask = used & (jax.random.uniform(corrupt_key, used.shape)
                    < mask_token_prob)
  masked = scatter_where(input_ids, positions,
                         jnp.full(positions.shape, MASK_ID), to_mask)
  return masked, positions, used.astype(jnp.float32)


def sample(key, logits, temperature: float = 1.0):
  """Gumbel-max draws int32 [...] from ``softmax(logits / temperature)``,
  with no gradient into ``logits`` [..., V]. Padding rows (about
  ``bert.PADDING_LOGIT``) stay impossible at any temperature: they are
  -inf after the scaling, which a Gumbel draw cannot lift."""
  logits = jax.lax.stop_gradient(logits)
  logits = jnp.where(logits > bert_lib.PADDING_LOGIT / 2,
                     logits / temperature, -jnp.inf)
  return jnp.argmax(logits + gumbel_noise(key, logits.shape),
                    axis=-1).astype(jnp.int32)


def gumbel_noise(key, shape) -> jax.Array:
  """The standard Gumbel noise float32 ``shape`` that ``sample`` adds."""
  return jax.random.gumbel(key, shape, jnp.float32)


class Corruption(NamedTuple):
  """What one step draws from its key before the networks run.

  ``ids`` [B, L] are the original tokens, ``masked`` [B, L] the generator's
  input, ``positions``/``weights``/``labels`` [B, P] its prediction slots
  and their original tokens; ``sample_key`` draws the replacements
  (``sample``), the other two keys the networks' dropout.
  """
  ids: jax.Array
  masked: jax.Array
  positions: jax.Array
  weights: jax.Array
  labels: jax.Array
  sample_key: jax.Array
  generator_key: jax.Array
  discriminator_key: jax.Array


def corrupt(key, batch: dict, e) -> Corruption:
  """The step's masking of ``batch`` (the pipeline's masking undone) and
  its keys, from the step's ``key``; ``e`` is the ``electra`` section."""
  mask_key, sample_key, generator_key, discriminator_key = (
      jax.random.split(key, 4))
  ids = original_ids(batch)
  masked, positions, weights = mask_tokens(
      mask_key, ids, batch['attention_mask'], e.mask_prob, e.mask_token_prob)
  labels = jnp.take_along_axis(ids, positions, axis=1)
  return Corruption(ids, masked, positions, weights, labels, sample_key,
                    generator_key, discriminator_key)


def replace_tokens(input_ids, positions, weights, sampled_ids):
  """The discriminator's input and labels.

  Returns ``(ids [B, L], replaced float32 [B, L])``: ``input_ids`` with the
  used slots' ``sampled_ids`` written at ``positions``, and 1 where the
  written token differs from the original.
  """
  ids = scatter_where(input_ids, positions, sampled_ids, weights > 0)
  return ids, (ids != input_ids).astype(jnp.float32)


def replaced_token_detection(logits, replaced, attention_mask):
  """ELECTRA's discriminator loss: sigmoid cross-entropy, mean over the
  non-pad tokens (``sum / (count + 1e-6)``, as electra).

  Args:
    logits: float32 [B, L], > 0 predicts "replaced".
    replaced: float32 [B, L], 1 for replaced tokens.
    attention_mask: [B, L], 1 for real tokens.
  """
  weights = attention_mask.astype(jnp.float32)
  losses = optax.sigmoid_binary_cross_entropy(logits, replaced)
  predicted = (logits > 0).astype(jnp.float32)
  correct = (predicted == replaced).astype(jnp.float32)
  return jnp.sum(weights * losses) / (jnp.sum(weights) + 1e-6), {
      'rtd_loss_sum': jnp.sum(weights * losses),
      'rtd_correct': jnp.sum(weights * correct),
      'rtd_count': jnp.sum(weights),
      'rtd_replaced_correct': jnp.sum(weights * replaced * predicted),
      'rtd_replaced_count': jnp.sum(weights * replaced),
  }


def electra_objective(generator_logits, masked_ids, masked_weights,
                      rtd_logits, replaced, attention_mask,
                      generator_weight: float, discriminator_weight: float):
  """``generator_weight x MLM + discriminator_weight x RTD`` and the metric
  sums of both (shapes as ``losses.masked_lm`` and
  ``replaced_token_detection``)."""
  mlm_loss, metrics = losses.masked_lm(generator_logits, masked_ids,
                                       masked_weights, count_offset=1e-6)
  rtd_loss, rtd_metrics = replaced_token_detection(rtd_logits, replaced,
                                                   attention_mask)
  metrics.update(rtd_metrics)
  return generator_weight * mlm_loss + discriminator_weight * rtd_loss, metrics


def model_configs(cfg, vocab_size: int):
  """(discriminator, generator) ``BertConfig``s of ``cfg``."""
  e = cfg.electra
  discriminator = encoder_config(cfg, vocab_size)
  return discriminator, electra_lib.generator_config(
      discriminator, e.generator_hidden_fraction,
      e.generator_layers_fraction)


def encoder_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The discriminator: the ``model`` section's encoder with electra's
  modeling.py GELU (the exact erf form, not BERT's tanh one)."""
  return dataclasses.replace(
      model_config_lib.encoder_config(cfg.model, vocab_size),
      gelu_approximate=False)


def flops_per_token(cfg, discriminator: bert_lib.BertConfig,
                    generator: bert_lib.BertConfig) -> float:
  """Training FLOPs per real token: the generator with its MLM head on
  ELECTRA's masked fraction, and the discriminator with its per-token head
  (d -> d, d -> 1), both trained."""
  s = cfg.data.max_seq_length
  p = num_slots(cfg.electra.mask_prob, s) / s
  d = discriminator.hidden_size
  discriminator_head = 2 * (d * d + d)
  return 3 * (flops.mlm_forward(generator, s, p)
              + flops.encoder_forward(discriminator, s) + discriminator_head)


def make_task(cfg, vocab_size: int) -> base.Task:
  """Generator + discriminator trained together; ``vocab_size`` is the
  tokenizer's."""
  e = cfg.electra   # Its values are checked by ``check``.
  discriminator, generator = model_configs(cfg, vocab_size)
  model = electra_lib.Electra(discriminator, generator)

  def init(key, batch):
    positions = jnp.zeros((batch['input_ids'].shape[0],
                           num_slots(e.mask_prob,
                                     batch['input_ids'].shape[1])), jnp.int32)
    return model.init(key, batch['input_ids'], batch['token_type_ids'],
                      batch['attention_mask'], positions)['params']

  def loss(params, batch, key, deterministic):
    types, attention_mask = batch['token_type_ids'], batch['attention_mask']
    (ids, masked, positions, weights, labels, sample_key, generator_key,
     discriminator_key) = corrupt(key, batch, e)

    def apply(method, dropout_key, *inputs):
      return model.apply({'params': params}, *inputs,
                         deterministic=deterministic, method=method,
                         rngs=None if deterministic
                         else {'dropout': dropout_key})

    generator_logits = apply(electra_lib.Electra.generate, generator_key,
                             masked, types, attention_mask, positions)
    sampled = sample(sample_key, generator_logits, e.temperature)
    fake_ids, replaced = replace_tokens(ids, positions, weights, sampled)
    rtd_logits = apply(electra_lib.Electra.discriminate, discriminator_key,
                       fake_ids, types, attention_mask)
    total, metrics = electra_objective(
        generator_logits, labels, weights, rtd_logits, replaced,
        attention_mask, e.generator_weight, e.discriminator_weight)
    metrics['generator_sample_correct'] = jnp.sum(
        weights * (sampled == labels))
    metrics['generator_sample_count'] = jnp.sum(weights)
    return total, metrics

  return base.Task(init, loss, flops_per_token=flops_per_token(
      cfg, discriminator, generator))


def discriminator_params(params: dict) -> dict:
  """The discriminator's encoder in a run's parameters, laid out as a BERT
  encoder's (``embeddings``, ``layer_{g}``): its layers over the tables it
  shares with the generator."""
  encoder = params['discriminator_encoder']
  embeddings = dict(params['embeddings'])
  if 'projection' in encoder:
    embeddings['projection'] = encoder['projection']
  return {'embeddings': embeddings,
          **{k: v for k, v in encoder.items() if k.startswith('layer_')}}


OBJECTIVE = registry.register(base.Objective(
    name=NAME, make_task=make_task, encoder_config=encoder_config,
    export_family=lambda cfg: 'electra', section='electra',
    defaults=defaults, check=check, encoder_params=discriminator_params))
