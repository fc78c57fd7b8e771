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
head, and MobileBERT's options (Sun et al., 2020, Sec. 3 and Fig. 2; as
transformers' MobileBertModel computes them): the trigram embedding, the
bottlenecked layers (``MobileBertLayer``: H-wide between the layers, I-wide
inside them) with stacked FFNs, NoNorm and ReLU. Every parameter carries
logical axis names and every activation is constrained at layer boundaries;
the rules that map logical names to mesh axes live in the experiment
config, never here.

Logical names. Parameters: ``vocab``, ``embed``, ``factor`` (ALBERT's
factorized embedding width E, where it differs from the model width, and
MobileBERT's word table and trigram input), ``intra`` (MobileBERT's
intra-block bottleneck width I), ``pos``, ``types`` (token types, and
ERNIE's task types), ``heads``, ``kv``, ``qkv`` (the fused Q/K/V axis, or
Q/K alone), ``mlp``, ``classes``.
Activations: ``act_batch``, ``act_len``, ``act_embed``, ``act_intra``,
``act_heads``, ``act_kv``, ``act_mlp``, ``act_vocab``, ``act_predictions``.

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
  # floor(i * groups / num_layers) exactly; albert's modeling.py and
  # transformers compute it in floating point, each differing from it for
  # some counts (never where the groups divide the layers), and the export
  # refuses those (hf_convert.albert_groups_check).
  embedding_size: int = 0
  num_layer_groups: int = 0
  # MobileBERT (Sun et al., 2020). The embedding: the word table
  # ``embedding_size`` wide (0 = hidden_size), each position's row
  # concatenated with its neighbours' [next, current, previous] (zeros past
  # the sequence's ends) and projected to hidden_size; the position and
  # token-type tables are hidden_size wide. Not with ALBERT's factorization
  # (embedding_size then names the word table's width).
  trigram_input: bool = False
  # The layers' intra-block width I: each layer projects its H-wide input
  # to I (``input_bottleneck``), attends and runs its FFNs at I, and
  # projects back to H with a residual around the whole layer; 0 = no
  # bottleneck (BERT's layers).
  intra_bottleneck_size: int = 0
  # With the bottleneck, what Q, K and V read. ``bottleneck_attention``:
  # all three the I-wide bottlenecked input (MobileBERT-TINY).
  # ``key_query_shared_bottleneck``: Q and K a second H -> I bottleneck of
  # the layer input, V the H-wide input itself (MobileBERT). Neither: all
  # three the H-wide input (IB-BERT, the teacher), projected to I.
  bottleneck_attention: bool = False
  key_query_shared_bottleneck: bool = False
  # FFNs per layer, each with its residual and norm (MobileBERT: 4); 1 =
  # BERT's one.
  num_feedforward_networks: int = 1
  # Every norm of the embeddings and layers (NORMALIZATIONS): 'layer_norm',
  # or MobileBERT's 'no_norm', an elementwise scale * x + bias without
  # statistics. The MLM head's transform keeps its LayerNorm either way.
  normalization: str = 'layer_norm'
  # The FFNs' and the MLM transform's nonlinearity (HIDDEN_ACTS): 'gelu'
  # (BERT's, per gelu_approximate) or 'relu' (MobileBERT's).
  hidden_act: str = 'gelu'
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
    return self.intra_width // self.num_heads

  @property
  def bottleneck(self) -> bool:
    """Whether the layers have MobileBERT's intra-block bottleneck."""
    return self.intra_bottleneck_size > 0

  @property
  def intra_width(self) -> int:
    """The width inside a layer (attention, FFNs): I, or H without the
    bottleneck."""
    return self.intra_bottleneck_size or self.hidden_size

  @property
  def intra_axis(self) -> str:
    """Logical name of ``intra_width``: ``intra`` when it is I."""
    return 'intra' if self.bottleneck else 'embed'

  @property
  def mobilebert_layers(self) -> bool:
    """Whether the layers are ``MobileBertLayer``s (a bottleneck or
    stacked FFNs), not ``EncoderLayer``s."""
    return self.bottleneck or self.num_feedforward_networks > 1

  def layer_heads(self, layer: int) -> int:
    """The heads ``layer`` stores: ``num_heads`` less the pruned ones."""
    if not self.pruned_heads:
      return self.num_heads
    return self.num_heads - len(self.pruned_heads[layer])

  @property
  def factorized(self) -> bool:
    """Whether embeddings are E-wide and projected to H (ALBERT)."""
    return bool(self.embedding_size) and (
        self.embedding_size != self.hidden_size) and not self.trigram_input

  @property
  def embedding_width(self) -> int:
    return self.embedding_size if self.factorized else self.hidden_size

  @property
  def embedding_axis(self) -> str:
    """Logical name of the embedding width: ``factor`` when it is E."""
    return 'factor' if self.factorized else 'embed'

  @property
  def word_width(self) -> int:
    """Width of the word table: MobileBERT's E with the trigram input, else
    the embedding width."""
    if self.trigram_input:
      return self.embedding_size or self.hidden_size
    return self.embedding_width

  @property
  def word_axis(self) -> str:
    return 'embed' if self.word_width == self.hidden_size else 'factor'

  @property
  def decoder_extra_width(self) -> int:
    """MobileBERT's MLM decoder scores the H-wide transformed vector: its
    first E dimensions against the word table, the other H - E against
    ``mlm_extra_embedding`` [V, H - E]; 0 = no such table."""
    return self.embedding_width - self.word_width

  def layer_group(self, layer: int) -> int:
    """The parameter set of ``layer`` (itself when nothing is shared)."""
    if not self.num_layer_groups:
      return layer
    return shared_group(layer, self.num_layers, self.num_layer_groups)


def shared_group(layer: int, num_layers: int, num_groups: int) -> int:
  """ALBERT's group of ``layer``: floor(layer * groups / layers), exactly."""
  return layer * num_groups // num_layers


def param_init(cfg: BertConfig, names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range), names)


def _word_init(cfg: BertConfig, names: tuple[str | None, ...]):
  """The word table's init: ``param_init``'s draw, with the padding rows (from
  ``cfg.output_vocab_size`` on) zero. They have no gradient
  (``vocab_logits``), so they stay zero, and a norm of the table (LAMB's
  trust ratio) is the tokenizer's vocabulary's alone."""
  draw = nn.initializers.truncated_normal(cfg.initializer_range)

  def init(key, shape, dtype=jnp.float32):
    real = jnp.arange(shape[0])[:, None] < cfg.output_vocab_size
    return jnp.where(real, draw(key, shape, dtype), jnp.zeros((), dtype))

  return nn.with_logical_partitioning(init, names)


def zeros_init(names):
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
        bias_init=zeros_init((self.axis,)))(x)


class NoNorm(nn.Module):
  """MobileBERT's NoNorm: ``x * scale + bias`` elementwise, no statistics
  (Sun et al., 2020, Sec. 4.1; transformers' ``NoNorm``, TF's
  ``FakeLayerNorm``)."""
  cfg: BertConfig
  axis: str = 'embed'   # Logical name of the normalized axis.

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    width = x.shape[-1]
    scale = self.param('scale', _ones((self.axis,)), (width,),
                       cfg.param_dtype)
    bias = self.param('bias', zeros_init((self.axis,)), (width,),
                      cfg.param_dtype)
    x, scale, bias = nn.dtypes.promote_dtype(x, scale, bias, dtype=cfg.dtype)
    return x * scale + bias


NORMALIZATIONS = ('layer_norm', 'no_norm')
HIDDEN_ACTS = ('gelu', 'relu')


def norm(cfg: BertConfig, axis: str = 'embed', name: str | None = None):
  """The norm ``cfg.normalization`` names, over the axis named ``axis``."""
  if cfg.normalization == 'no_norm':
    return NoNorm(cfg, axis, name=name)
  return LayerNorm(cfg, axis, name=name)


def _gelu(cfg: BertConfig, x):
  return jax.nn.gelu(x, approximate=cfg.gelu_approximate)


def _activation(cfg: BertConfig, x):
  """The FFNs' and the MLM transform's nonlinearity (``cfg.hidden_act``)."""
  if cfg.hidden_act == 'relu':
    return jax.nn.relu(x)
  return _gelu(cfg, x)


def trigram(x):
  """MobileBERT's trigram input [B, L, 3E] from embeddings ``x`` [B, L, E]:
  each position's row between its next and previous positions' rows,
  [next, current, previous], zeros past the sequence's first and last
  positions (a padded row's neighbours are its [PAD] rows, as in
  transformers and TF)."""
  following = jnp.pad(x[:, 1:], ((0, 0), (0, 1), (0, 0)))
  preceding = jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))
  return jnp.concatenate([following, x, preceding], axis=-1)


class Embeddings(nn.Module):
  """Word + position + token-type (+ task-type) embeddings, LayerNorm,
  dropout; with ``cfg.factorized``, all E-wide and then projected to H
  (ALBERT). With ``cfg.trigram_input`` (MobileBERT), the word rows are E
  wide, each is concatenated with its neighbours' (``trigram``) and
  projected to H before the H-wide rows are added. With
  ``cfg.type_vocab_size`` 0 there is no token-type table and
  ``token_type_ids`` are ignored (DistilBERT). With
  ``cfg.task_type_vocab_size`` > 0 a task table's row is added too (ERNIE
  2.0; transformers' ``ErnieEmbeddings`` with ``use_task_id``)."""
  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    width, axis = cfg.embedding_width, cfg.embedding_axis
    self.word = nn.Embed(cfg.vocab_size, cfg.word_width,
                         embedding_init=_word_init(cfg, ('vocab',
                                                         cfg.word_axis)),
                         param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    if cfg.trigram_input:
      self.trigram_projection = nn.Dense(
          cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
          kernel_init=param_init(cfg, ('factor', 'embed')),
          bias_init=zeros_init(('embed',)))
    self.position = nn.Embed(cfg.max_position_embeddings, width,
                             embedding_init=param_init(cfg, ('pos', axis)),
                             param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    if cfg.type_vocab_size:
      self.token_type = nn.Embed(
          cfg.type_vocab_size, width,
          embedding_init=param_init(cfg, ('types', axis)),
          param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    if cfg.task_type_vocab_size:
      self.task_type = nn.Embed(
          cfg.task_type_vocab_size, width,
          embedding_init=param_init(cfg, ('types', axis)),
          param_dtype=cfg.param_dtype, dtype=cfg.dtype)
    self.layer_norm = norm(cfg, axis)
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)
    if cfg.factorized:
      self.projection = nn.Dense(
          cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
          kernel_init=param_init(cfg, ('factor', 'embed')),
          bias_init=zeros_init(('embed',)))

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
    """The tables' rows added up, [B, L, E]: what the LayerNorm normalizes
    (with ``cfg.trigram_input``, the word rows' trigram projected to H and
    the H-wide rows added to it).

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
    if cfg.trigram_input:
      words = self.trigram_projection(trigram(words))
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

  def vocab_logits(self, x, bias, extra=None):
    """float32 logits [..., V] of the tied decoder: ``x`` (``[..., E]``,
    ``cfg.embedding_width`` wide) against the word embeddings, plus
    ``bias`` [V]. Every head that scores the vocabulary (MLM, SBO,
    ELECTRA's generator) makes its logits here, so none can forget that the
    padding rows (``cfg.output_vocab_size`` on) are about ``PADDING_LOGIT``:
    probability exactly 0, so no gradient into their rows or bias.

    MobileBERT's decoder (``extra`` [V, H - E], ``cfg.decoder_extra_width``
    > 0): ``x``'s first E dimensions against the word table, the other
    H - E against ``extra``, as [word table | extra] [V, H] were one table.
    """
    bias = real_vocab_bias(self.cfg, bias)
    if extra is None:
      return (self.word.attend(x) + bias.astype(self.cfg.dtype)).astype(
          jnp.float32)
    width = self.cfg.word_width
    rest, extra = nn.dtypes.promote_dtype(x[..., width:], extra,
                                          dtype=self.cfg.dtype)
    logits = self.word.attend(x[..., :width]) + jnp.einsum(
        '...D,VD->...V', rest, extra)
    return (logits + bias.astype(self.cfg.dtype)).astype(jnp.float32)


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

  It writes ``cfg.intra_width`` (H, or MobileBERT's I) and reads ``x`` of
  any width, whose logical name is ``input_axis``. Given ``values``
  (MobileBERT's shared key/query bottleneck), Q and K are projected from
  ``x`` by one fused kernel (``qk_kernel`` [D, 2, heads, K]) and V from
  ``values`` [B, L, H] by its own (``v_kernel`` [H, heads, K]).
  """
  cfg: BertConfig
  heads: int = 0
  input_axis: str = 'embed'

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool, values=None):
    cfg = self.cfg
    heads = self.heads or cfg.num_heads
    if values is None:
      q, k, v = self._fused(x, heads, 3)
    else:
      q, k = self._fused(x, heads, 2)
      v = self._value(values, heads)
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
    axis = cfg.intra_axis
    out_kernel = self.param('out_kernel',
                            param_init(cfg, ('heads', 'kv', axis)),
                            (heads, cfg.head_dim, cfg.intra_width),
                            cfg.param_dtype)
    out_bias = self.param('out_bias', zeros_init((axis,)), (cfg.intra_width,),
                          cfg.param_dtype)
    out, out_kernel, out_bias = nn.dtypes.promote_dtype(
        out, out_kernel, out_bias, dtype=cfg.dtype)
    out = jax.lax.dot_general(out, out_kernel, (((2, 3), (0, 1)), ((), ()))
                              ) + out_bias   # BLHK,HKD->BLD
    return _constrain(out, 'act_batch', 'act_len', f'act_{axis}')

  def _fused(self, x, heads: int, parts: int):
    """Q, K and V (``parts`` 3: ``qkv_kernel``) or Q and K (2:
    ``qk_kernel``) of ``x``, each [B, L, heads, K], by one matmul."""
    cfg = self.cfg
    name = 'qkv' if parts == 3 else 'qk'
    kernel = self.param(f'{name}_kernel', param_init(
                            cfg, (self.input_axis, 'qkv', 'heads', 'kv')),
                        (x.shape[-1], parts, heads, cfg.head_dim),
                        cfg.param_dtype)
    bias = self.param(f'{name}_bias', zeros_init(('qkv', 'heads', 'kv')),
                      (parts, heads, cfg.head_dim), cfg.param_dtype)
    # promote_dtype, not astype: an int8 model's kernels (bertjax/
    # quantization.py) are quantized arrays that only it passes through.
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias,
                                              dtype=cfg.dtype)
    # dot_general, as nn.Dense: the int8 model's matmul is then the same
    # function as the fake-quantized one's, so their outputs agree.
    fused = jax.lax.dot_general(x, kernel, (((2,), (0,)), ((), ()))
                                ) + bias   # BLD,DQHK->BLQHK
    return tuple(_constrain(fused[:, :, i], 'act_batch', 'act_len',
                            'act_heads', 'act_kv') for i in range(parts))

  def _value(self, values, heads: int):
    """V [B, L, heads, K] of ``values`` [B, L, H] (``v_kernel``)."""
    cfg = self.cfg
    kernel = self.param('v_kernel', param_init(cfg, ('embed', 'heads', 'kv')),
                        (values.shape[-1], heads, cfg.head_dim),
                        cfg.param_dtype)
    bias = self.param('v_bias', zeros_init(('heads', 'kv')),
                      (heads, cfg.head_dim), cfg.param_dtype)
    values, kernel, bias = nn.dtypes.promote_dtype(values, kernel, bias,
                                                   dtype=cfg.dtype)
    v = jax.lax.dot_general(values, kernel, (((2,), (0,)), ((), ()))
                            ) + bias   # BLD,DHK->BLHK
    return _constrain(v, 'act_batch', 'act_len', 'act_heads', 'act_kv')


class FeedForward(nn.Module):
  """wo(act(wi(x))), from and to the width of ``x`` (logical name
  ``axis``: H, or MobileBERT's I)."""
  cfg: BertConfig
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    h = nn.Dense(cfg.intermediate_size, dtype=cfg.dtype,
                 param_dtype=cfg.param_dtype,
                 kernel_init=param_init(cfg, (self.axis, 'mlp')),
                 bias_init=zeros_init(('mlp',)), name='wi')(x)
    h = _constrain(_activation(cfg, h), 'act_batch', 'act_len', 'act_mlp')
    return nn.Dense(x.shape[-1], dtype=cfg.dtype,
                    param_dtype=cfg.param_dtype,
                    kernel_init=param_init(cfg, ('mlp', self.axis)),
                    bias_init=zeros_init((self.axis,)), name='wo')(h)


# model.remat -> jax.checkpoint policy (None: save nothing but the inputs).
REMAT_POLICIES = {
    'full': None,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
REMAT = ('none',) + tuple(REMAT_POLICIES)
ATTENTION_IMPLS = ('xla', 'cudnn')


def layer_class(cfg: BertConfig):
  """``EncoderLayer`` (``MobileBertLayer`` with ``cfg.mobilebert_layers``),
  rematerialized per ``cfg.remat``."""
  layer = MobileBertLayer if cfg.mobilebert_layers else EncoderLayer
  if cfg.remat == 'none':
    return layer
  if cfg.remat not in REMAT_POLICIES:
    raise ValueError(f'model.remat={cfg.remat!r}; use one of {REMAT}.')
  # Argument 3 counts the module: (self, x, attention_mask, deterministic).
  return nn.remat(layer, policy=REMAT_POLICIES[cfg.remat],
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
                 bias_init=zeros_init(('embed',)), name='up')(_gelu(cfg, h))
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
    x = norm(cfg, name='attention_norm')(
        x + adapted(h, 'attention_adapter'))
    h = FeedForward(cfg, name='ffn')(x)
    x = norm(cfg, name='ffn_norm')(x + adapted(h, 'ffn_adapter'))
    return _constrain(x, 'act_batch', 'act_len', 'act_embed')


class MobileBertLayer(nn.Module):
  """MobileBERT's layer (Sun et al., 2020, Fig. 2 (c); transformers'
  ``MobileBertLayer``): with ``cfg.bottleneck``, for the layer input x
  [B, L, H],

    a = N(x Wb + bb)                               input_bottleneck, [B, L, I]
    a = N(a + Attn(q, k, v))                       attention, attention_norm
    a = N(a + FFN_i(a)), i = 0 .. F - 1            ffn_i, ffn_i_norm
    out = N(x + dropout(a Wo + bo))                output_bottleneck, output_norm

  N is ``cfg.normalization``'s norm. Q, K and V read ``a``
  (``cfg.bottleneck_attention``); or Q and K another bottleneck of x
  (``query_key_bottleneck``) and V x itself
  (``cfg.key_query_shared_bottleneck``); or all three x. Dropout is applied
  only before the output's residual, as transformers' and TF's. Without the
  bottleneck it is BERT's layer with F FFNs (dropout before the attention's
  and the last FFN's residual; I = H). ``heads``: as ``EncoderLayer``'s.
  """
  cfg: BertConfig
  heads: int = 0

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool):
    cfg = self.cfg
    if cfg.adapter_size:
      raise ValueError('adapters (fine-tuning mode=adapters) are not built '
                       "for MobileBERT's layers; use another mode.")
    dropout = nn.Dropout(cfg.hidden_dropout_rate)
    intra = cfg.intra_axis

    def bottleneck(name):
      h = nn.Dense(cfg.intra_width, dtype=cfg.dtype,
                   param_dtype=cfg.param_dtype,
                   kernel_init=param_init(cfg, ('embed', intra)),
                   bias_init=zeros_init((intra,)), name=name)(x)
      return _constrain(norm(cfg, intra, name=f'{name}_norm')(h),
                        'act_batch', 'act_len', f'act_{intra}')

    if not cfg.bottleneck:
      a = x
      h = dropout(SelfAttention(cfg, self.heads, name='attention')(
          x, attention_mask, deterministic), deterministic=deterministic)
    else:
      a = bottleneck('input_bottleneck')
      if cfg.bottleneck_attention:
        h = SelfAttention(cfg, self.heads, intra, name='attention')(
            a, attention_mask, deterministic)
      elif cfg.key_query_shared_bottleneck:
        h = SelfAttention(cfg, self.heads, intra, name='attention')(
            bottleneck('query_key_bottleneck'), attention_mask,
            deterministic, values=x)
      else:
        h = SelfAttention(cfg, self.heads, name='attention')(
            x, attention_mask, deterministic)
    a = norm(cfg, intra, name='attention_norm')(a + h)
    for i in range(cfg.num_feedforward_networks):
      h = FeedForward(cfg, intra, name=f'ffn_{i}')(a)
      if not cfg.bottleneck and i == cfg.num_feedforward_networks - 1:
        h = dropout(h, deterministic=deterministic)
      a = norm(cfg, intra, name=f'ffn_{i}_norm')(a + h)
      a = _constrain(a, 'act_batch', 'act_len', f'act_{intra}')
    if cfg.bottleneck:
      h = nn.Dense(cfg.hidden_size, dtype=cfg.dtype,
                   param_dtype=cfg.param_dtype,
                   kernel_init=param_init(cfg, (intra, 'embed')),
                   bias_init=zeros_init(('embed',)),
                   name='output_bottleneck')(a)
      a = norm(cfg, name='output_norm')(
          x + dropout(h, deterministic=deterministic))
    return _constrain(a, 'act_batch', 'act_len', 'act_embed')


def encoder_layers(cfg: BertConfig) -> list[nn.Module]:
  """The ``cfg.num_layers`` layers in order, for a module's ``setup``:
  ``layer_{g}`` per distinct parameter set (a shared group's module
  repeats), or one scanned ``layers`` module with ``cfg.scan_layers``."""
  if cfg.pruned_heads and (cfg.scan_layers or cfg.num_layer_groups):
    raise ValueError('model.pruned_heads with model.scan_layers or '
                     'model.num_layer_groups: pruned layers differ in shape '
                     'and are neither scanned nor shared.')
  if cfg.pruned_heads and cfg.mobilebert_layers:
    raise ValueError("model.pruned_heads with MobileBERT's layers "
                     '(model.intra_bottleneck_size or '
                     'model.num_feedforward_networks > 1): head pruning is '
                     "built for BERT's layers only.")
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
                        embedding_init=param_init(cfg, ('pos', None)),
                        param_dtype=cfg.param_dtype, dtype=cfg.dtype,
                        name='position')(
                            jnp.clip(offset, 0, cfg.sbo_positions - 1))
    h = jnp.concatenate([take(left), take(right), position], axis=-1)
    h = _constrain(h, 'act_batch', 'act_predictions', None)
    for i, (width, axis) in enumerate(
        ((cfg.hidden_size, 'embed'), (cfg.embedding_width,
                                      cfg.embedding_axis))):
      h = nn.Dense(width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                   kernel_init=param_init(cfg, (None, axis)),
                   bias_init=zeros_init((axis,)), name=f'dense_{i}')(h)
      h = LayerNorm(cfg, axis, name=f'norm_{i}')(_gelu(cfg, h))
    return h


class BertForPreTraining(nn.Module):
  """Encoder + pooler + sparse MLM head (tied decoder) + NSP head.

  The MLM head's transform maps H to the embedding width (E with ALBERT's
  factorization, else H) with ``cfg.hidden_act`` and a LayerNorm (always a
  LayerNorm, whatever ``cfg.normalization``); with MobileBERT's trigram
  embedding the decoder is [word table | ``mlm_extra_embedding``]
  (``Embeddings.vocab_logits``).

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
                             kernel_init=param_init(cfg, ('embed', 'mlp')),
                             bias_init=zeros_init(('mlp',)))
      self.nsp = nn.Dense(2, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                          kernel_init=param_init(cfg, ('embed', 'classes')),
                          bias_init=zeros_init(('classes',)))
    # The transform maps H to the embedding width, for the tied decoder.
    self.mlm_transform = nn.Dense(
        cfg.embedding_width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=param_init(cfg, ('embed', 'factor' if cfg.factorized
                                     else 'mlp')),
        bias_init=zeros_init(('factor' if cfg.factorized else 'mlp',)))
    self.mlm_norm = LayerNorm(cfg, cfg.embedding_axis)
    self.mlm_bias = self.param('mlm_output_bias', zeros_init(('vocab',)),
                               (cfg.vocab_size,), cfg.param_dtype)
    # MobileBERT: the decoder's rows beyond the word table's E dimensions
    # (TF's extra_output_weights); the SBO head scores against them too.
    self.mlm_extra = (self.param(
        'mlm_extra_embedding', _word_init(cfg, ('vocab', 'embed')),
        (cfg.vocab_size, cfg.decoder_extra_width), cfg.param_dtype)
                      if cfg.decoder_extra_width else None)
    if cfg.sbo_positions:
      self.sbo = SpanBoundaryHead(cfg)
      self.sbo_bias = self.param('sbo_output_bias', zeros_init(('vocab',)),
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
    h = self.mlm_norm(_activation(self.cfg, self.mlm_transform(h)))
    logits = _constrain(
        self.embeddings.vocab_logits(h, self.mlm_bias, self.mlm_extra),
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
          self.embeddings.vocab_logits(h, self.sbo_bias, self.mlm_extra),
          'act_batch', 'act_predictions', 'act_vocab')
    return outputs

