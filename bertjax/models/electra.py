"""ELECTRA's generator and discriminator, built from bert.py's blocks.

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators
Rather Than Generators", Sec. 2 and 3.2, as google-research/electra builds
it (run_pretraining.py, model/modeling.py):

- one set of token, position and token-type embeddings with their
  LayerNorm, ``E`` wide (``embedding_size``), shared by both networks:
  ELECTRA's ``electra/embeddings`` scope is reused by the generator;
- the generator: a narrower encoder (``generator_config``, ELECTRA's
  ``get_generator_config``) and an MLM head at the masked positions only
  (dense to ``E``, GELU, LayerNorm, decoder tied to the shared word
  embeddings plus a bias);
- the discriminator: the experiment's encoder and its replaced-token
  detection head at every position (dense ``H -> H``, GELU, dense
  ``H -> 1``).

Where ``E`` differs from a network's width, that network has its own
projection from ``E`` (ELECTRA's ``embeddings_project``, one per network).
Both networks live in one module, so one ``init`` creates them, one set of
shardings places them and one optimizer step updates them.

Logical names are bert.py's. The shared tables are ``bert.Embeddings`` at
width ``E``, so their ``E`` axis is named like a model width (``embed``); a
projection names its ``E`` input ``factor``, as ALBERT's does. The
generator's narrower widths reuse ``embed``, ``heads``, ``mlp``: the rules
map names to mesh axes, whatever the sizes.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bertjax.models import bert as bert_lib


def num_slots(mask_prob: float, seq_len: int) -> int:
  """ELECTRA's ``max_predictions_per_seq``: prediction slots per row."""
  return int((mask_prob + 0.005) * seq_len)


def generator_config(cfg: bert_lib.BertConfig, hidden_fraction: float,
                     layers_fraction: float = 1.0) -> bert_lib.BertConfig:
  """The generator's encoder: ELECTRA's ``get_generator_config``.

  Width ``round(H * hidden_fraction)``, depth ``round(L * layers_fraction)``,
  ``max(1, width // 64)`` heads and FFN ``4 x width``; everything else
  (dropout, vocabulary, positions, dtypes) is the discriminator's, and its
  ``embedding_size`` is the discriminator's embedding width ``E``.

  Raises:
    ValueError: the fractions give an empty network, or a width that its
      number of heads does not divide.
  """
  hidden = int(round(cfg.hidden_size * hidden_fraction))
  layers = int(round(cfg.num_layers * layers_fraction))
  if hidden < 1 or layers < 1:
    raise ValueError(
        f'electra.generator_hidden_fraction={hidden_fraction} and '
        f'electra.generator_layers_fraction={layers_fraction} give a '
        f'generator of {layers} layers of width {hidden} (discriminator: '
        f'{cfg.num_layers} x {cfg.hidden_size}); both must be >= 1.')
  heads = max(1, hidden // 64)
  if hidden % heads:
    raise ValueError(
        f'electra.generator_hidden_fraction={hidden_fraction} gives a '
        f'generator width of {hidden}, not divisible by its {heads} heads '
        '(width // 64). ELECTRA uses 1/4 (small) and 1/3 (base): 64 and 256.')
  return dataclasses.replace(
      cfg, hidden_size=hidden, num_layers=layers, num_heads=heads,
      intermediate_size=4 * hidden, embedding_size=cfg.embedding_width,
      num_layer_groups=min(cfg.num_layer_groups, layers), sbo_positions=0,
      pruned_heads=(), layerdrop=0.0)


def shared_embedding_config(cfg: bert_lib.BertConfig) -> bert_lib.BertConfig:
  """``bert.Embeddings``' config for the shared tables: the discriminator's,
  at its embedding width ``E`` and unprojected."""
  return dataclasses.replace(cfg, hidden_size=cfg.embedding_width,
                             embedding_size=0, num_layer_groups=0,
                             sbo_positions=0)


def _glorot(names):
  # ELECTRA's embeddings_project and final RTD layer are tf.layers.dense
  # with no initializer given: Glorot uniform, not truncated normal.
  return nn.with_logical_partitioning(nn.initializers.xavier_uniform(), names)


class Encoder(nn.Module):
  """One network's own trunk: the projection from the shared ``E``-wide
  embeddings to its width (when they differ) and its Transformer layers.

  ``cfg.embedding_size`` is ``E``; ALBERT's layer sharing
  (``num_layer_groups``) applies as in ``bert.BertForPreTraining``.
  """
  cfg: bert_lib.BertConfig

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool):
    cfg = self.cfg
    if cfg.factorized:
      x = nn.Dense(cfg.hidden_size, dtype=cfg.dtype,
                   param_dtype=cfg.param_dtype,
                   kernel_init=_glorot(('factor', 'embed')),
                   bias_init=bert_lib.zeros_init(('embed',)),
                   name='projection')(x)
      x = bert_lib._constrain(x, 'act_batch', 'act_len', 'act_embed')
    for layer in bert_lib.encoder_layers(cfg):
      x = layer(x, attention_mask, deterministic)
    return x


class Electra(nn.Module):
  """Generator and discriminator over shared embeddings.

  ``cfg`` is the discriminator's (the experiment's encoder), ``generator``
  the generator's (``generator_config(cfg, ...)``). Inputs are ``[B, L]``
  int arrays (``input_ids``, ``token_type_ids``, ``attention_mask``) and the
  generator's ``masked_positions`` ``[B, P]``.
  """
  cfg: bert_lib.BertConfig
  generator: bert_lib.BertConfig

  def setup(self):
    cfg, gen = self.cfg, self.generator
    width = cfg.embedding_width
    self.embeddings = bert_lib.Embeddings(shared_embedding_config(cfg))
    self.generator_encoder = Encoder(gen)
    # The MLM head maps to E for the decoder tied to the shared table.
    self.generator_transform = nn.Dense(
        width, dtype=gen.dtype, param_dtype=gen.param_dtype,
        kernel_init=bert_lib.param_init(gen, ('embed', 'mlp')),
        bias_init=bert_lib.zeros_init(('mlp',)))
    self.generator_norm = bert_lib.LayerNorm(gen, 'embed')
    self.generator_bias = self.param(
        'generator_output_bias', bert_lib.zeros_init(('vocab',)),
        (cfg.vocab_size,), cfg.param_dtype)
    self.discriminator_encoder = Encoder(cfg)
    self.rtd_transform = nn.Dense(
        cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=bert_lib.param_init(cfg, ('embed', 'mlp')),
        bias_init=bert_lib.zeros_init(('mlp',)))
    self.rtd_output = nn.Dense(
        1, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=_glorot(('mlp', 'classes')),
        bias_init=bert_lib.zeros_init(('classes',)))

  def generate(self, input_ids, token_type_ids, attention_mask,
               masked_positions, deterministic: bool = True):
    """Generator logits float32 [B, P, V] at ``masked_positions`` only."""
    gen = self.generator
    x = self.embeddings(input_ids, token_type_ids, deterministic)
    x = self.generator_encoder(x, attention_mask, deterministic)
    # Sparse head: gather the P positions before the V projection.
    h = jnp.take_along_axis(x, masked_positions[..., None], axis=1)
    h = bert_lib._constrain(h, 'act_batch', 'act_predictions', 'act_embed')
    h = self.generator_norm(bert_lib._gelu(gen, self.generator_transform(h)))
    logits = self.embeddings.vocab_logits(h, self.generator_bias)
    return bert_lib._constrain(logits, 'act_batch', 'act_predictions',
                               'act_vocab')

  def discriminate(self, input_ids, token_type_ids, attention_mask,
                   deterministic: bool = True):
    """Replaced-token logits float32 [B, L] (> 0: "replaced")."""
    cfg = self.cfg
    x = self.embeddings(input_ids, token_type_ids, deterministic)
    x = self.discriminator_encoder(x, attention_mask, deterministic)
    h = bert_lib._gelu(cfg, self.rtd_transform(x))
    h = bert_lib._constrain(h, 'act_batch', 'act_len', 'act_mlp')
    logits = self.rtd_output(h)[..., 0].astype(jnp.float32)
    return bert_lib._constrain(logits, 'act_batch', 'act_len')

  def __call__(self, input_ids, token_type_ids, attention_mask,
               masked_positions, deterministic: bool = True):
    """Both networks on the same ids (for ``init``): a dict with
    ``generator_logits`` [B, P, V] and ``rtd_logits`` [B, L]."""
    return {
        'generator_logits': self.generate(input_ids, token_type_ids,
                                          attention_mask, masked_positions,
                                          deterministic),
        'rtd_logits': self.discriminate(input_ids, token_type_ids,
                                        attention_mask, deterministic),
    }


# Top-level parameter collections that only the generator uses (the
# discriminator shares ``embeddings`` with it and owns the rest).
GENERATOR_ONLY = ('generator_encoder', 'generator_transform',
                  'generator_norm', 'generator_output_bias')


def is_generator_only(path) -> bool:
  """Whether the parameter at ``path`` (a tree path) is the generator's."""
  first = path[0]
  return getattr(first, 'key', None) in GENERATOR_ONLY
