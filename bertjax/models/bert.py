"""The BERT encoder and its pretraining heads, in Flax Linen.

Post-LayerNorm Transformer encoder with learned positions and token types
(Devlin et al., 2019), with ALBERT's options (Lan et al., 2020, Sec. 3.1):
a factorized embedding (vocabulary embedded in E dimensions, projected to
the model width H) and cross-layer parameter sharing (all layers, or
groups of consecutive layers, share one set of weights), SpanBERT's span
boundary head (Joshi et al., 2020, Sec. 3.2), ERNIE 2.0's task embedding
(Sun et al., 2020, Sec. 3.3 and Fig. 3: a learned row per task id, added
to the token, position and segment embeddings), and DistilBERT's student
options (Sanh et al., 2019): no token-type embedding, no pooler or NSP
head. Every parameter carries logical axis names and every activation is
constrained at layer boundaries; the rules that map logical names to mesh
axes live in the experiment config, never here.

Logical names. Parameters: ``vocab``, ``embed``, ``factor`` (ALBERT's
factorized embedding width E, where it differs from the model width),
``pos``, ``types`` (token types, and ERNIE's task types), ``heads``,
``kv``, ``qkv`` (the fused Q/K/V axis), ``mlp``, ``classes``.
Activations: ``act_batch``, ``act_len``, ``act_embed``, ``act_heads``,
``act_kv``, ``act_mlp``, ``act_vocab``, ``act_predictions``.

Einsum letters: B batch, L length, D model, H heads, K head dim, F FFN,
V vocabulary, P predictions per sequence, Q the fused q/k/v axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import quantization
from data_pipelines.tokenizer import PAD_ID
from data_pipelines.tokenizer import SEP_ID

# Size presets: (layers, hidden, heads). FFN is 4 x hidden, heads are 64 wide.
# tiny/mini/small/medium: Turc et al. 2019, "Well-Read Students Learn Better",
# Table 6 (the 24 BERT miniatures); base/large: Devlin et al. 2019, Sec. 3.
SIZES = {
    'tiny': (2, 128, 2),
    'mini': (4, 256, 4),
    'small': (4, 512, 8),
    'medium': (8, 512, 8),
    'base': (12, 768, 12),
    'large': (24, 1024, 16),
}


# The logit of an embedding row past the tokenizer's vocabulary. Tables are
# padded to a multiple of 128 (data_pipelines.tokenizer.padded_vocab_size)
# and no distribution over the vocabulary may give those rows probability:
# exp() of it is exactly 0 against any real logit, and it is finite, so a
# soft target's 0 x log p stays 0 where -inf would make it NaN.
PADDING_LOGIT = -1e9


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hyperparameters of the encoder and heads (not the experiment config)."""
  vocab_size: int                   # Rows of the embedding table (padded).
  # The ids the tokenizer produces, [0, real_vocab_size): every output
  # distribution over the vocabulary is over these rows only (0 = all
  # ``vocab_size`` rows are real).
  real_vocab_size: int = 0
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  # Rows of the token-type table; 0 = no token-type embedding (DistilBERT).
  type_vocab_size: int = 2
  # Rows of ERNIE 2.0's task table (task ids 0..N-1); 0 = no task
  # embedding, and no ``task_type_ids`` input.
  task_type_vocab_size: int = 0
  # ALBERT: embedding width E (0 = hidden_size, no projection), and the
  # number of distinct layers, each shared by consecutive layers (0 = none
  # shared; 1 = ALBERT's all-shared default). Layer i uses group
  # floor(i * groups / num_layers), as albert's modeling.py.
  embedding_size: int = 0
  num_layer_groups: int = 0
  # SpanBERT's span boundary objective head: the number of relative
  # positions it embeds (SpanBERT's --max-pair-targets, 15); 0 = no head.
  sbo_positions: int = 0
  # The width of those position embeddings (SpanBERT's
  # --pair-positional-embedding-size, 200); 0 = hidden_size.
  sbo_position_width: int = 0
  # The pooler and the sentence-pair (NSP/SOP) classifier over [CLS];
  # DistilBERT's student has neither.
  with_pooler_nsp: bool = True
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02
  # google-research/bert's gelu is the tanh approximation.
  gelu_approximate: bool = True
  dtype: Any = jnp.float32          # Compute dtype.
  param_dtype: Any = jnp.float32    # Master weights.
  # Rematerialization of each encoder layer in the backward pass (REMAT):
  # 'none' keeps every activation, 'full' keeps only the layers' inputs,
  # 'dots' also keeps the matmul outputs. Same results, less memory.
  remat: str = 'none'
  # The layers as one nn.scan over stacked weights (a leading ``layers``
  # axis): one layer is compiled, not num_layers. Not with layer sharing.
  scan_layers: bool = False
  # Packed rows (RoBERTa's FULL-SENTENCES, a [SEP] closing each document):
  # False keeps each token's attention within its own document.
  attend_across_documents: bool = True
  # The fused attention kernel where no attention dropout is active
  # (ATTENTION_IMPLS): 'xla' (any backend) or 'cudnn' (GPU, bf16/fp16,
  # head_dim a multiple of 8 up to 128). Attention dropout always takes the
  # explicit softmax: cuDNN's dropout seed is a compile-time constant, which
  # would draw the same mask every step.
  attention_impl: str = 'xla'
  # False: the word table's [PAD] row takes no gradient, as PyTorch's
  # nn.Embedding(padding_idx=0) in TinyBERT's code, whose MSE reads padded
  # positions (no BERT loss reaches the row; ELECTRA's discriminator may
  # read a sampled [PAD] at a real position, and google-research/electra
  # trains it).
  pad_row_trains: bool = True
  # Bottleneck adapters (Houlsby et al., 2019) of this width after the
  # attention and the FFN of every layer, for parameter-efficient
  # fine-tuning; 0 = none (pretraining never has them).
  adapter_size: int = 0
  # Head pruning (Michel et al., 2019): per layer, the heads removed, by
  # their index in the unpruned layer (transformers' ``pruned_heads``); ()
  # = none. A pruned layer stores only its other heads, each still
  # ``head_dim`` wide.
  pruned_heads: tuple[tuple[int, ...], ...] = ()
  # LayerDrop (Fan et al., 2020): in training, each layer is skipped with
  # this probability, one draw per layer per step for the whole batch as
  # fairseq's; 0 = off. Any subset of the layers can then be kept
  # (bertjax/pruning.py keep_layers).
  layerdrop: float = 0.0
  # Q8BERT (Zafrir et al., 2019; bertjax/quantization.py): 'int8' trains
  # with fake-quantized weights and activations (and runs int8 weights at
  # inference) in the fully connected layers and embedding tables whose
  # module path matches ``quantize_layers``; 'none' = float.
  quantize: str = 'none'
  quantize_layers: str = '.*'

  @classmethod
  def from_size(cls, size: str, **overrides) -> 'BertConfig':
    if size not in SIZES:
      raise ValueError(f'model.size={size!r}; use one of {sorted(SIZES)}.')
    layers, hidden, heads = SIZES[size]
    kwargs = dict(hidden_size=hidden, num_layers=layers, num_heads=heads,
                  intermediate_size=4 * hidden)
    kwargs.update(overrides)
    return cls(**kwargs)

  @property
  def output_vocab_size(self) -> int:
    """Rows that can have probability: the tokenizer's vocabulary."""
    return self.real_vocab_size or self.vocab_size

  @property
  def sbo_width(self) -> int:
    """Width of the SBO head's position embeddings."""
    return self.sbo_position_width or self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def layer_heads(self, layer: int) -> int:
    """The heads ``layer`` stores: ``num_heads`` less the pruned ones."""
    if not self.pruned_heads:
      return self.num_heads
    return self.num_heads - len(self.pruned_heads[layer])

  @property
  def factorized(self) -> bool:
    """Whether embeddings are E-wide and projected to H (ALBERT)."""
    return bool(self.embedding_size) and (
        self.embedding_size != self.hidden_size)

  @property
  def embedding_width(self) -> int:
    return self.embedding_size if self.factorized else self.hidden_size

  @property
  def embedding_axis(self) -> str:
    """Logical name of the embedding width: ``factor`` when it is E."""
    return 'factor' if self.factorized else 'embed'

  def layer_group(self, layer: int) -> int:
    """The parameter set of ``layer`` (itself when nothing is shared)."""
    if not self.num_layer_groups:
      return layer
    return layer * self.num_layer_groups // self.num_layers


def _init(cfg: BertConfig, names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range), names)


def _word_init(cfg: BertConfig, names: tuple[str | None, ...]):
  """The word table's init: ``_init``'s draw, with the padding rows (from
  ``cfg.output_vocab_size`` on) zero. They have no gradient
  (``vocab_logits``), so they stay zero, and a norm of the table (LAMB's
  trust ratio) is the tokenizer's vocabulary's alone."""
  draw = nn.initializers.truncated_normal(cfg.initializer_range)

  def init(key, shape, dtype=jnp.float32):
    real = jnp.arange(shape[0])[:, None] < cfg.output_vocab_size
    return jnp.where(real, draw(key, shape, dtype), jnp.zeros((), dtype))

  return nn.with_logical_partitioning(init, names)


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _constrain(x, *names):
  return nn.with_logical_constraint(x, names)


class LayerNorm(nn.Module):
  cfg: BertConfig
  axis: str = 'embed'   # Logical name of the normalized axis.

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(
        epsilon=self.cfg.layer_norm_epsilon, dtype=self.cfg.dtype,
        param_dtype=self.cfg.param_dtype, scale_init=_ones((self.axis,)),
        bias_init=_zeros((self.axis,)))(x)


def _gelu(cfg: BertConfig, x):
  return jax.nn.gelu(x, approximate=cfg.gelu_approximate)


class Embeddings(nn.Module):
  """Word + position + token-type (+ task-type) embeddings, LayerNorm,
  dropout; with ``cfg.factorized``, all E-wide and then projected to H
  (ALBERT). With ``cfg.type_vocab_size`` 0 there is no token-type table
  and ``token_type_ids`` are ignored (DistilBERT). With
  ``cfg.task_type_vocab_size`` > 0 a task table's row is added too (ERNIE
  2.0; transformers' ``ErnieEmbeddings`` with ``use_task_id``)."""
  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    width, axis = cfg.embedding_width, cfg.embedding_axis
    self.word = nn.Embed(cfg.vocab_size, width,
                         embedding_init=_word_init(cfg, ('vocab', axis)),
                         param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    self.position = nn.Embed(cfg.max_position_embeddings, width,
                             embedding_init=_init(cfg, ('pos', axis)),
                             param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    if cfg.type_vocab_size:
      self.token_type = nn.Embed(cfg.type_vocab_size, width,
                                 embedding_init=_init(cfg, ('types', axis)),
                                 param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    if cfg.task_type_vocab_size:
      self.task_type = nn.Embed(cfg.task_type_vocab_size, width,
                                embedding_init=_init(cfg, ('types', axis)),
                                param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    self.layer_norm = LayerNorm(cfg, axis)
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)
    if cfg.factorized:
      self.projection = nn.Dense(
          cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
          kernel_init=_init(cfg, ('factor', 'embed')),
          bias_init=_zeros(('embed',)))

  def __call__(self, input_ids, token_type_ids, deterministic: bool,
               task_type_ids=None):
    """[B, L, D] from int ``input_ids``, ``token_type_ids`` and (ERNIE 2.0)
    ``task_type_ids`` [B, L] (None: task 0 everywhere)."""
    x = self.summed(input_ids, token_type_ids, task_type_ids)
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    if self.cfg.factorized:
      x = self.projection(x)
    return _constrain(x, 'act_batch', 'act_len', 'act_embed')

  def summed(self, input_ids, token_type_ids, task_type_ids=None):
    """The tables' rows added up, [B, L, E]: what the LayerNorm normalizes.

    ``task_type_ids`` [B, L] pick rows of the task table (None: row 0, as
    transformers' ErnieEmbeddings takes a missing input); a model without
    that table takes none.
    """
    cfg = self.cfg
    if task_type_ids is not None and not cfg.task_type_vocab_size:
      raise ValueError('task_type_ids given to a model without a task '
                       'embedding: set model.task_type_vocab_size > 0 '
                       '(ERNIE 2.0), or pass no task_type_ids.')
    positions = jnp.arange(input_ids.shape[1])[None, :]
    words = self._rows('word', input_ids)
    if not cfg.pad_row_trains:
      words = jnp.where((input_ids == PAD_ID)[..., None],
                        jax.lax.stop_gradient(words), words)
    x = words + self._rows('position', positions)
    if cfg.type_vocab_size:
      x = x + self._rows('token_type', token_type_ids)
    if cfg.task_type_vocab_size:
      if task_type_ids is None:
        task_type_ids = jnp.zeros(input_ids.shape, jnp.int32)
      if task_type_ids.shape != input_ids.shape:
        raise ValueError(f'task_type_ids {task_type_ids.shape} must be '
                         f'shaped as input_ids {input_ids.shape}.')
      x = x + self._rows('task_type', task_type_ids)
    return x

  def _rows(self, name: str, ids):
    """Rows ``ids`` of table ``name``: fake-quantized where
    ``cfg.quantize_layers`` covers it (bertjax/quantization.py)."""
    table = getattr(self, name)
    quantize = quantization.table_quantized(
        self.cfg, '/'.join(self.path + (name,)))
    if not (quantize or quantization.is_int8(table.embedding)):
      return table(ids)
    return quantization.embedding_rows(table.embedding, ids, quantize,
                                       self.cfg.dtype)

  def vocab_logits(self, x, bias):
    """float32 logits [..., V] of the tied decoder: ``x`` (``[..., E]``,
    ``cfg.embedding_width`` wide) against the word embeddings, plus
    ``bias`` [V]. Every head that scores the vocabulary (MLM, SBO,
    ELECTRA's generator) makes its logits here, so none can forget that the
    padding rows (``cfg.output_vocab_size`` on) are about ``PADDING_LOGIT``:
    probability exactly 0, so no gradient into their rows or bias."""
    bias = real_vocab_bias(self.cfg, bias)
    return (self.word.attend(x) + bias.astype(self.cfg.dtype)).astype(
        jnp.float32)


def real_vocab_bias(cfg: BertConfig, bias):
  """The output bias [V] with the padding rows at ``PADDING_LOGIT``: a
  select over V numbers, not over the [..., V] logits (which an earlier
  version did: 798 against 761 ms per step, BERT's vocabulary on the
  2-core CPU, one run of experiments/benchmarks/vocab_mask.py)."""
  if cfg.output_vocab_size == bias.shape[-1]:
    return bias
  real = jnp.arange(bias.shape[-1]) < cfg.output_vocab_size
  return jnp.where(real, bias, jnp.asarray(PADDING_LOGIT, bias.dtype))


class SelfAttention(nn.Module):
  """Multi-head self-attention with one fused Q/K/V projection.

  ``heads``: the heads stored (0 = ``cfg.num_heads``; fewer once pruned).
  Applied with the ``head_gates`` collection mutable, or given, each head's
  output is multiplied by its gate (``gate`` [heads], ones when created):
  the gradient of a loss with respect to the gates is Michel et al.'s head
  importance (bertjax/pruning.py).
  """
  cfg: BertConfig
  heads: int = 0

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool):
    cfg = self.cfg
    heads = self.heads or cfg.num_heads
    qkv_kernel = self.param('qkv_kernel',
                            _init(cfg, ('embed', 'qkv', 'heads', 'kv')),
                            (cfg.hidden_size, 3, heads, cfg.head_dim),
                            cfg.param_dtype)
    qkv_bias = self.param('qkv_bias', _zeros(('qkv', 'heads', 'kv')),
                          (3, heads, cfg.head_dim), cfg.param_dtype)
    # promote_dtype, not astype: an int8 model's kernels (bertjax/
    # quantization.py) are quantized arrays that only it passes through.
    x, qkv_kernel, qkv_bias = nn.dtypes.promote_dtype(
        x, qkv_kernel, qkv_bias, dtype=cfg.dtype)
    # dot_general, as nn.Dense: the int8 model's matmul is then the same
    # function as the fake-quantized one's, so their outputs agree.
    qkv = jax.lax.dot_general(x, qkv_kernel, (((2,), (0,)), ((), ()))
                              ) + qkv_bias   # BLD,DQHK->BLQHK
    q, k, v = (_constrain(qkv[:, :, i], 'act_batch', 'act_len', 'act_heads',
                          'act_kv') for i in range(3))
    # mask [B, 1, Lq, Lk]: padding keys are never attended to.
    mask = (attention_mask if attention_mask.ndim == 4 else
            attention_mask[:, None, None, :].astype(bool))
    dropout = not deterministic and cfg.attention_dropout_rate > 0
    # Applied with mutable=['intermediates'] (TinyBERT's distillation), the
    # layer also records its scores.
    record = self.is_mutable_collection('intermediates')
    if dropout or record:
      # jax.nn.dot_product_attention has no dropout and does not return its
      # scores: both need the explicit softmax.
      logits = jnp.einsum('BLHK,BMHK->BHLM', q, k) / jnp.sqrt(
          cfg.head_dim).astype(cfg.dtype)
      if record:
        # The unnormalised scores [B, H, L, L], 0 where a key is masked.
        self.sow('intermediates', 'attention_scores',
                 jnp.where(mask, logits, 0).astype(jnp.float32))
      logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
      probs = jax.nn.softmax(logits.astype(jnp.float32)).astype(cfg.dtype)
      probs = nn.Dropout(cfg.attention_dropout_rate)(
          probs, deterministic=not dropout)
      out = jnp.einsum('BHLM,BMHK->BLHK', probs, v)
    else:
      out = jax.nn.dot_product_attention(
          q, k, v, mask=mask, implementation=cfg.attention_impl)
    out = _constrain(out, 'act_batch', 'act_len', 'act_heads', 'act_kv')
    if self.has_variable('head_gates', 'gate') or (
        self.is_mutable_collection('head_gates')
        and not self.is_initializing()):
      gate = self.variable('head_gates', 'gate', jnp.ones, (heads,),
                           jnp.float32)
      out = out * gate.value[:, None].astype(out.dtype)
    out_kernel = self.param('out_kernel',
                            _init(cfg, ('heads', 'kv', 'embed')),
                            (heads, cfg.head_dim, cfg.hidden_size),
                            cfg.param_dtype)
    out_bias = self.param('out_bias', _zeros(('embed',)), (cfg.hidden_size,),
                          cfg.param_dtype)
    out, out_kernel, out_bias = nn.dtypes.promote_dtype(
        out, out_kernel, out_bias, dtype=cfg.dtype)
    out = jax.lax.dot_general(out, out_kernel, (((2, 3), (0, 1)), ((), ()))
                              ) + out_bias   # BLHK,HKD->BLD
    return _constrain(out, 'act_batch', 'act_len', 'act_embed')


class FeedForward(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    h = nn.Dense(cfg.intermediate_size, dtype=cfg.dtype,
                 param_dtype=cfg.param_dtype,
                 kernel_init=_init(cfg, ('embed', 'mlp')),
                 bias_init=_zeros(('mlp',)), name='wi')(x)
    h = _constrain(_gelu(cfg, h), 'act_batch', 'act_len', 'act_mlp')
    return nn.Dense(cfg.hidden_size, dtype=cfg.dtype,
                    param_dtype=cfg.param_dtype,
                    kernel_init=_init(cfg, ('mlp', 'embed')),
                    bias_init=_zeros(('embed',)), name='wo')(h)


# model.remat -> jax.checkpoint policy (None: save nothing but the inputs).
REMAT_POLICIES = {
    'full': None,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
REMAT = ('none',) + tuple(REMAT_POLICIES)
ATTENTION_IMPLS = ('xla', 'cudnn')


def layer_class(cfg: BertConfig):
  """``EncoderLayer``, rematerialized per ``cfg.remat``."""
  if cfg.remat == 'none':
    return EncoderLayer
  if cfg.remat not in REMAT_POLICIES:
    raise ValueError(f'model.remat={cfg.remat!r}; use one of {REMAT}.')
  # Argument 3 counts the module: (self, x, attention_mask, deterministic).
  return nn.remat(EncoderLayer, policy=REMAT_POLICIES[cfg.remat],
                  static_argnums=(3,))


def attention_mask_for(cfg: BertConfig, input_ids, attention_mask):
  """The keys each query may attend to: [B, 1, L, L] bool, or the padding
  mask [B, L] as it is when every real token may attend to every other.

  With ``attend_across_documents=False``, position p's document is the
  number of [SEP] before it (each [SEP] closes its document), and a real
  query attends only to real keys of its own document.
  """
  if cfg.attend_across_documents:
    return attention_mask
  sep = (input_ids == SEP_ID).astype(jnp.int32)
  document = jnp.cumsum(sep, axis=1) - sep
  same = document[:, None, :, None] == document[:, None, None, :]
  # Padding queries (outputs unused) attend as in BERT, to every real key:
  # no row is left with nothing to attend to.
  padding_query = (attention_mask == 0)[:, None, :, None]
  return (same | padding_query) & attention_mask[:, None, None, :].astype(
      bool)


class Adapter(nn.Module):
  """Houlsby et al. (2019)'s bottleneck: x + Up(GELU(Down(x))), D -> m -> D.

  Initialized near the identity (weights ~ truncated normal, std 1e-3, as
  adapter-bert's ``adapter_init_scale``), so inserting adapters into a
  pretrained network leaves its function unchanged at the start.
  """
  cfg: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    init = nn.with_logical_partitioning(
        nn.initializers.truncated_normal(1e-3), ('embed', None))
    h = nn.Dense(cfg.adapter_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                 kernel_init=init, name='down')(x)
    h = nn.Dense(cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                 kernel_init=nn.with_logical_partitioning(
                     nn.initializers.truncated_normal(1e-3), (None, 'embed')),
                 bias_init=_zeros(('embed',)), name='up')(_gelu(cfg, h))
    return x + h


class EncoderLayer(nn.Module):
  """Post-LN: x = LN(x + Attn(x)); x = LN(x + FFN(x)); with adapters,
  each sublayer's output passes its adapter before the residual sum.
  ``heads``: its attention's stored heads (0 = ``cfg.num_heads``)."""
  cfg: BertConfig
  heads: int = 0

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool):
    cfg = self.cfg
    dropout = nn.Dropout(cfg.hidden_dropout_rate)

    def adapted(h, name):
      h = dropout(h, deterministic=deterministic)
      return Adapter(cfg, name=name)(h) if cfg.adapter_size else h

    h = SelfAttention(cfg, self.heads, name='attention')(
        x, attention_mask, deterministic)
    x = LayerNorm(cfg, name='attention_norm')(
        x + adapted(h, 'attention_adapter'))
    h = FeedForward(cfg, name='ffn')(x)
    x = LayerNorm(cfg, name='ffn_norm')(x + adapted(h, 'ffn_adapter'))
    return _constrain(x, 'act_batch', 'act_len', 'act_embed')


def encoder_layers(cfg: BertConfig) -> list[nn.Module]:
  """The ``cfg.num_layers`` layers in order, for a module's ``setup``:
  ``layer_{g}`` per distinct parameter set (a shared group's module
  repeats), or one scanned ``layers`` module with ``cfg.scan_layers``."""
  if cfg.pruned_heads and (cfg.scan_layers or cfg.num_layer_groups):
    raise ValueError('model.pruned_heads with model.scan_layers or '
                     'model.num_layer_groups: pruned layers differ in shape '
                     'and are neither scanned nor shared.')
  if cfg.scan_layers:
    if cfg.num_layer_groups:
      raise ValueError('model.scan_layers with model.num_layer_groups: '
                       'shared layers are not scanned.')
    return [ScannedLayers(cfg, name='layers')]
  layer = layer_class(cfg)
  groups = [layer(cfg, cfg.layer_heads(g), name=f'layer_{g}')
            for g in range(cfg.num_layer_groups or cfg.num_layers)]
  return [groups[cfg.layer_group(i)] for i in range(cfg.num_layers)]


def run_layers(cfg: BertConfig, layers, x, input_ids, attention_mask,
               deterministic: bool, all_layers: bool = False,
               layerdrop_key=None):
  """The layers over the embeddings ``x`` [B, L, D]: the last output, or
  with ``all_layers`` the list [embeddings, layer 1, ..., layer N].
  ``layerdrop_key``: LayerDrop's draws (``layerdrop_key_of``)."""
  attention_mask = attention_mask_for(cfg, input_ids, attention_mask)
  keep = layerdrop_keep(cfg, layerdrop_key, len(layers))
  outputs = [x]
  for i, layer in enumerate(layers):
    y = layer(x, attention_mask, deterministic)
    # A dropped layer passes its input on. It is still computed (one
    # program for every draw); the saving is a shallower model to keep.
    x = y if keep is None else jnp.where(keep[i], y, x)
    outputs.append(x)
  if all_layers:
    if cfg.scan_layers:
      raise ValueError('every layer\'s output needs unscanned layers '
                       '(model.scan_layers=False).')
    return outputs
  return x


def layerdrop_key_of(module: nn.Module, cfg: BertConfig,
                     deterministic: bool):
  """The key of this step's LayerDrop draws, from ``module``'s dropout
  stream; None (no draw taken) when LayerDrop is off or not training."""
  if cfg.layerdrop and not deterministic:
    return module.make_rng('dropout')
  return None


def layerdrop_keep(cfg: BertConfig, key, num_layers: int):
  """bool [num_layers]: the layers kept this step; None = all."""
  if key is None:
    return None
  if cfg.scan_layers:
    raise ValueError('model.layerdrop with model.scan_layers: a scanned '
                     'stack cannot skip a layer.')
  return jax.random.uniform(key, (num_layers,)) >= cfg.layerdrop


class _ScanBody(nn.Module):
  """One layer as ``nn.scan`` wants it: (carry, _) -> (carry, None)."""
  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x, attention_mask):
    layer = layer_class(self.cfg)(self.cfg, name='layer')
    return layer(x, attention_mask, self.deterministic), None


class ScannedLayers(nn.Module):
  """``cfg.num_layers`` encoder layers scanned over stacked weights, each
  with its own dropout key; parameters get a leading ``layers`` axis."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool):
    scan = nn.scan(_ScanBody, variable_axes={'params': 0},
                   split_rngs={'params': True, 'dropout': True},
                   in_axes=(nn.broadcast,), length=self.cfg.num_layers,
                   metadata_params={nn.PARTITION_NAME: 'layers'})
    x, _ = scan(self.cfg, deterministic, name='scan')(x, attention_mask)
    return x


def span_boundaries(masked_positions, masked_unit_start):
  """(left, right, offset) [B, P] of each prediction's span (SpanBERT).

  A span is the run of predictions that share ``masked_unit_start`` (the
  masking pipeline's unit key): its left boundary is the token before its
  first position, its right boundary the token after its last, and
  ``offset`` is the prediction's position within the span (0 = first).
  Unused slots (unit start 0) give boundaries at 0; their weight is 0.
  """
  same = masked_unit_start[:, :, None] == masked_unit_start[:, None, :]
  last = jnp.max(jnp.where(same, masked_positions[:, None, :], 0), axis=-1)
  left = jnp.maximum(masked_unit_start - 1, 0)
  right = jnp.where(masked_unit_start > 0, last + 1, 0)
  return left, right, masked_positions - masked_unit_start


class SpanBoundaryHead(nn.Module):
  """SpanBERT's SBO: each span token predicted from its span's boundary
  states and its relative position, [x_{s-1}; x_{e+1}; p_i] -> two layers
  of Linear -> GELU -> LayerNorm; the caller applies the tied decoder."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, masked_positions, masked_unit_start):
    cfg = self.cfg
    left, right, offset = span_boundaries(masked_positions, masked_unit_start)
    take = lambda i: jnp.take_along_axis(x, i[..., None], axis=1)
    position = nn.Embed(cfg.sbo_positions, cfg.sbo_width,
                        embedding_init=_init(cfg, ('pos', None)),
                        param_dtype=cfg.param_dtype, dtype=cfg.dtype,
                        name='position')(
                            jnp.clip(offset, 0, cfg.sbo_positions - 1))
    h = jnp.concatenate([take(left), take(right), position], axis=-1)
    h = _constrain(h, 'act_batch', 'act_predictions', None)
    for i, (width, axis) in enumerate(
        ((cfg.hidden_size, 'embed'), (cfg.embedding_width,
                                      cfg.embedding_axis))):
      h = nn.Dense(width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                   kernel_init=_init(cfg, (None, axis)),
                   bias_init=_zeros((axis,)), name=f'dense_{i}')(h)
      h = LayerNorm(cfg, axis, name=f'norm_{i}')(_gelu(cfg, h))
    return h


class BertForPreTraining(nn.Module):
  """Encoder + pooler + sparse MLM head (tied decoder) + NSP head.

  Inputs are ``[B, L]`` int arrays (``input_ids``, ``token_type_ids``,
  ``attention_mask``; with ``cfg.task_type_vocab_size``, optionally the
  keyword ``task_type_ids``, None = task 0) and ``masked_positions``
  ``[B, P]``. Returns a dict:
  ``mlm_logits`` float32 [B, P, V] (only the masked positions are projected
  onto the vocabulary; rows past ``cfg.output_vocab_size`` are about
  ``PADDING_LOGIT``), ``nsp_logits`` float32 [B, 2], ``sequence_output``
  [B, L, D] and ``pooled_output`` [B, D] (these two heads' outputs only with
  ``cfg.with_pooler_nsp``, the default); with ``cfg.sbo_positions``, also
  ``sbo_logits`` float32 [B, P, V] (SpanBERT's span boundary predictions,
  which need ``masked_unit_start`` [B, P] from the masking pipeline).
  """
  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.embeddings = Embeddings(cfg)
    # With sharing, one module per group, called by each of its layers.
    self.layers = encoder_layers(cfg)
    if cfg.with_pooler_nsp:
      self.pooler = nn.Dense(cfg.hidden_size, dtype=cfg.dtype,
                             param_dtype=cfg.param_dtype,
                             kernel_init=_init(cfg, ('embed', 'mlp')),
                             bias_init=_zeros(('mlp',)))
      self.nsp = nn.Dense(2, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                          kernel_init=_init(cfg, ('embed', 'classes')),
                          bias_init=_zeros(('classes',)))
    # The transform maps H to the embedding width, for the tied decoder.
    self.mlm_transform = nn.Dense(
        cfg.embedding_width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=_init(cfg, ('embed', 'factor' if cfg.factorized
                                else 'mlp')),
        bias_init=_zeros(('factor' if cfg.factorized else 'mlp',)))
    self.mlm_norm = LayerNorm(cfg, cfg.embedding_axis)
    self.mlm_bias = self.param('mlm_output_bias', _zeros(('vocab',)),
                               (cfg.vocab_size,), cfg.param_dtype)
    if cfg.sbo_positions:
      self.sbo = SpanBoundaryHead(cfg)
      self.sbo_bias = self.param('sbo_output_bias', _zeros(('vocab',)),
                                 (cfg.vocab_size,), cfg.param_dtype)

  def encode(self, input_ids, token_type_ids, attention_mask,
             deterministic: bool = True, task_type_ids=None):
    """Sequence output [B, L, D] (``task_type_ids`` [B, L]: ERNIE 2.0's task
    of each token, None = task 0). Applied with
    ``mutable=['intermediates']``, also records every hidden state
    (``hidden_states``: the embeddings' output, then each layer's) and each
    layer's attention scores (``attention_scores``; SelfAttention)."""
    x = self.embeddings(input_ids, token_type_ids, deterministic,
                        task_type_ids)
    record = self.is_mutable_collection('intermediates')
    states = run_layers(self.cfg, self.layers, x, input_ids, attention_mask,
                        deterministic, all_layers=record,
                        layerdrop_key=layerdrop_key_of(self, self.cfg,
                                                       deterministic))
    if not record:
      return states
    for state in states:
      self.sow('intermediates', 'hidden_states', state)
    return states[-1]

  def __call__(self, input_ids, token_type_ids, attention_mask,
               masked_positions, masked_unit_start=None,
               deterministic: bool = True, task_type_ids=None):
    x = self.encode(input_ids, token_type_ids, attention_mask, deterministic,
                    task_type_ids)
    # Sparse head: gather the P masked positions before the V projection.
    h = jnp.take_along_axis(x, masked_positions[..., None], axis=1)
    h = _constrain(h, 'act_batch', 'act_predictions', 'act_embed')
    h = self.mlm_norm(_gelu(self.cfg, self.mlm_transform(h)))
    logits = _constrain(self.embeddings.vocab_logits(h, self.mlm_bias),
                        'act_batch', 'act_predictions', 'act_vocab')
    outputs = {'mlm_logits': logits, 'sequence_output': x}
    if self.cfg.with_pooler_nsp:
      pooled = jnp.tanh(self.pooler(x[:, 0]))
      outputs['pooled_output'] = pooled
      outputs['nsp_logits'] = self.nsp(pooled).astype(jnp.float32)
    if self.cfg.sbo_positions:
      if masked_unit_start is None:
        raise ValueError('the span boundary head needs masked_unit_start.')
      h = self.sbo(x, masked_positions, masked_unit_start)
      outputs['sbo_logits'] = _constrain(
          self.embeddings.vocab_logits(h, self.sbo_bias), 'act_batch',
          'act_predictions', 'act_vocab')
    return outputs

