"""The experiment config's ``model`` section: its fields and what they give.

``section()`` is the section with its defaults (BERT-base, google-research/
bert); ``encoder_config`` turns a section into the ``BertConfig`` the Flax
modules take. Both live next to the model, below the objectives and the
root config (bertjax/config_lib.py), so that an objective can build its
networks, and read a teacher run's saved section, from the section alone.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_collections

from bertjax import quantization
from bertjax.models import bert as bert_lib
from data_pipelines import tokenizer as tokenizer_lib


def section() -> ml_collections.ConfigDict:
  """The ``model`` section with its defaults (BERT-base)."""
  m = ml_collections.ConfigDict()
  m.size = 'base'           # bertjax.models.bert.SIZES
  m.hidden_size = 0         # 0 = from size.
  m.num_layers = 0
  m.num_heads = 0
  m.intermediate_size = 0
  m.embedding_size = 0      # ALBERT's E; 0 = hidden_size (no projection).
  m.num_layer_groups = 0    # ALBERT's sharing: 1 = all layers share
                            # one set of weights; 0 = none shared.
  m.sbo_positions = 200     # SBO head's relative positions; the head
                            # exists when sbo_weight > 0 (spanbert.py:
                            # SpanBERT's --max-pair-targets, 15).
  m.sbo_position_width = 0  # Their embeddings' width, 0 = H (spanbert.py:
                            # --pair-positional-embedding-size, 200).
  # MobileBERT (Sun et al., 2020; bertjax.models.bert.BertConfig): the
  # trigram embedding (a word table embedding_size wide, 0 = H), the
  # layers' intra-block bottleneck I (0 = none), what the attention reads
  # with it, FFNs per layer, the norm and the nonlinearity. The bert
  # objective only.
  m.trigram_input = False
  m.intra_bottleneck_size = 0
  m.bottleneck_attention = False   # Q, K, V read the I-wide input (TINY).
  m.key_query_shared_bottleneck = False  # Q, K another bottleneck, V the
                            # H-wide input (MobileBERT).
  m.num_feedforward_networks = 1
  m.normalization = 'layer_norm'  # layer_norm | no_norm (MobileBERT's).
  m.hidden_act = 'gelu'     # gelu (model.gelu says which) | relu.
  m.max_position_embeddings = 512
  m.type_vocab_size = 2
  m.task_type_vocab_size = 0  # ERNIE 2.0's task embedding: rows (task ids
                            # 0..N-1) added to the input; 0 = none.
  m.hidden_dropout_rate = 0.1
  m.attention_dropout_rate = 0.1
  m.layer_norm_epsilon = 1e-12  # BERT's; fairseq's RoBERTa uses 1e-5.
  m.gelu = 'tanh'           # tanh (BERT's approximation) | exact (erf:
                            # fairseq's RoBERTa; ELECTRA always).
  m.dtype = 'float32'       # Compute dtype: float32 | bfloat16.
  m.param_dtype = 'float32'
  m.remat = 'none'          # none | full | dots: recompute each layer's
                            # activations in the backward pass.
  m.scan_layers = False     # One nn.scan over stacked layer weights
                            # (compiles one layer); bert objective,
                            # no layer sharing.
  m.attend_across_documents = True  # False: packed documents
                            # (full_sentences) attend only to themselves.
  m.attention = 'xla'       # xla | cudnn | auto: the fused attention
                            # kernel where no attention dropout is
                            # active; auto is cuDNN on GPU in bfloat16,
                            # else XLA (cuDNN is not yet measured).
  m.pruned_heads = ()       # Per layer, the heads removed (indices in the
                            # unpruned layer); () = none. Written by
                            # experiments/compress.py prune_heads.
  m.layerdrop = 0.0         # LayerDrop: each layer skipped in training
                            # with this probability (Fan et al. use 0.2).
  m.quantize = 'none'       # none | int8: Q8BERT's 8-bit quantization-
                            # aware training (bertjax/quantization.py).
  m.quantize_layers = '.*'  # The quantized layers: a regular expression
                            # over module paths (embeddings/word,
                            # layer_0/attention, layer_0/ffn/wi, pooler,
                            # classifier, ...).
  return m


_DIMS = ('hidden_size', 'num_layers', 'num_heads', 'intermediate_size')


def check(m, errors: list[str]) -> None:
  """Appends what is wrong with the ``model`` section ``m`` to ``errors``
  (fields of other sections it must agree with: config_lib.validate)."""
  _check(m.size in bert_lib.SIZES,
         f'model.size={m.size!r}; use one of {sorted(bert_lib.SIZES)}.',
         errors)
  for name in _DIMS:
    _check(m[name] >= 0, f'model.{name}={m[name]} must be >= 0 (0 = '
           'model.size\'s).', errors)
  if m.size in bert_lib.SIZES and min(m[name] for name in _DIMS) >= 0:
    layers, hidden, heads = bert_lib.SIZES[m.size]
    layers = m.num_layers or layers
    hidden, heads = m.hidden_size or hidden, m.num_heads or heads
    if m.intra_bottleneck_size > 0:   # The heads split I, not H.
      _check(m.intra_bottleneck_size % heads == 0,
             f'model.intra_bottleneck_size={m.intra_bottleneck_size} must '
             f'be divisible by model.num_heads={heads}.', errors)
    else:
      _check(hidden % heads == 0, f'model.hidden_size={hidden} must be '
             f'divisible by model.num_heads={heads}.', errors)
    _check(0 <= m.num_layer_groups <= layers,
           f'model.num_layer_groups={m.num_layer_groups} must be in [0, '
           f'{layers}] (the number of layers): 0 shares nothing, 1 shares '
           'one set of weights across all layers.', errors)
  _check(m.embedding_size >= 0,
         f'model.embedding_size={m.embedding_size} must be >= 0 (0 = the '
         'hidden size, no factorization).', errors)
  _check(m.sbo_positions >= 0, f'model.sbo_positions={m.sbo_positions} '
         'must be >= 0 (SpanBERT uses 15).', errors)
  _check(m.sbo_position_width >= 0, 'model.sbo_position_width='
         f'{m.sbo_position_width} must be >= 0 (0 = the hidden size; '
         'SpanBERT uses 200).', errors)
  _check(m.max_position_embeddings >= 1, 'model.max_position_embeddings='
         f'{m.max_position_embeddings} must be >= 1.', errors)
  _check(m.type_vocab_size >= 0, 'model.type_vocab_size='
         f'{m.type_vocab_size} must be >= 0 (0 = no token-type embedding; '
         'BERT uses 2).', errors)
  _check(m.task_type_vocab_size >= 0, 'model.task_type_vocab_size='
         f'{m.task_type_vocab_size} must be >= 0 (0 = no task embedding; '
         'ERNIE 2.0 has one row per task).', errors)
  _check(m.layer_norm_epsilon > 0, 'model.layer_norm_epsilon='
         f'{m.layer_norm_epsilon} must be > 0 (BERT uses 1e-12, RoBERTa '
         '1e-5).', errors)
  _check(m.gelu in ('tanh', 'exact'),
         f"model.gelu={m.gelu!r}; use 'tanh' (BERT) or 'exact' (RoBERTa).",
         errors)
  for name in ('dtype', 'param_dtype'):
    _check(m[name] in ('float32', 'bfloat16'),
           f'model.{name}={m[name]!r}; use float32 or bfloat16.', errors)
  _check(m.attention in ('auto',) + bert_lib.ATTENTION_IMPLS,
         f'model.attention={m.attention!r}; use auto or one of '
         f'{bert_lib.ATTENTION_IMPLS}.', errors)
  if m.attention == 'cudnn':
    _check(jax.default_backend() == 'gpu' and m.dtype == 'bfloat16',
           "model.attention='cudnn' needs a GPU and model.dtype='bfloat16' "
           f'(here: {jax.default_backend()}, {m.dtype}); use auto or xla.',
           errors)
  _check(m.remat in bert_lib.REMAT,
         f'model.remat={m.remat!r}; use one of {bert_lib.REMAT}.', errors)
  for name in ('hidden_dropout_rate', 'attention_dropout_rate', 'layerdrop'):
    _check(0 <= m[name] < 1, f'model.{name}={m[name]} must be in [0, 1).',
           errors)
  _check(not (m.layerdrop and m.scan_layers),
         f'model.layerdrop={m.layerdrop} with model.scan_layers: a scanned '
         'stack cannot skip a layer; set scan_layers=False.', errors)
  _check_pruned_heads(m, errors)
  check_quantize(m.quantize, m.quantize_layers, errors)
  _check_mobilebert(m, errors)
  if m.quantize in quantization.QUANTIZE[1:] and not errors:
    _check_quantized_layers(m, errors)


def mobilebert_options(m) -> list[str]:
  """The MobileBERT options the ``model`` section ``m`` turns on, as
  ``model.field=value`` (none: [])."""
  on = {'trigram_input': m.trigram_input,
        'intra_bottleneck_size': m.intra_bottleneck_size,
        'bottleneck_attention': m.bottleneck_attention,
        'key_query_shared_bottleneck': m.key_query_shared_bottleneck,
        'num_feedforward_networks': m.num_feedforward_networks != 1,
        'normalization': m.normalization != 'layer_norm',
        'hidden_act': m.hidden_act != 'gelu'}
  return [f'model.{name}={m[name]!r}' for name, value in on.items()
          if value]


def mobilebert_layers(m) -> bool:
  """Whether ``m``'s layers are MobileBERT's (BertConfig.mobilebert_layers)."""
  return m.intra_bottleneck_size > 0 or m.num_feedforward_networks > 1


def _check_mobilebert(m, errors: list[str]) -> None:
  """MobileBERT's options: widths, what the attention reads (only with the
  bottleneck, one way), and the encoder options not built for them."""
  _check(m.intra_bottleneck_size >= 0, 'model.intra_bottleneck_size='
         f'{m.intra_bottleneck_size} must be >= 0 (0 = no bottleneck; '
         'MobileBERT uses 128).', errors)
  for name in ('bottleneck_attention', 'key_query_shared_bottleneck'):
    _check(not m[name] or m.intra_bottleneck_size > 0,
           f'model.{name}=True chooses what the attention reads inside '
           'the bottleneck, and there is none: set '
           'model.intra_bottleneck_size > 0 (MobileBERT: 128).', errors)
  _check(not (m.bottleneck_attention and m.key_query_shared_bottleneck),
         'model.bottleneck_attention=True and '
         'model.key_query_shared_bottleneck=True: set one (MobileBERT-TINY '
         'reads Q, K and V from the bottleneck, MobileBERT Q and K from a '
         'shared one).', errors)
  _check(m.num_feedforward_networks >= 1, 'model.num_feedforward_networks='
         f'{m.num_feedforward_networks} must be at least 1 (BERT: 1, '
         'MobileBERT: 4).', errors)
  _check(m.normalization in bert_lib.NORMALIZATIONS,
         f'model.normalization={m.normalization!r}; use one of '
         f'{bert_lib.NORMALIZATIONS}.', errors)
  _check(m.hidden_act in bert_lib.HIDDEN_ACTS,
         f'model.hidden_act={m.hidden_act!r}; use one of '
         f'{bert_lib.HIDDEN_ACTS}.', errors)
  options = mobilebert_options(m)
  _check(not (mobilebert_layers(m) and m.pruned_heads),
         f'model.pruned_heads with {", ".join(options)}: head pruning is '
         "built for BERT's layers only; use ().", errors)
  _check(not (options and m.quantize != 'none'),
         f'model.quantize={m.quantize!r} with {", ".join(options)}: 8-bit '
         "training is not built for MobileBERT's options; use 'none'.",
         errors)


def check_quantize(quantize: str, layers: str, errors: list[str]) -> None:
  """``model.quantize`` is known, and ``model.quantize_layers`` a regular
  expression (``_check_quantized_layers``: one that covers a layer)."""
  _check(quantize in quantization.QUANTIZE,
         f'model.quantize={quantize!r}; use one of '
         f'{quantization.QUANTIZE}.', errors)
  if quantize == 'none':
    return
  try:
    re.compile(layers)
  except re.error as e:
    errors.append(f'model.quantize_layers={layers!r} is not a '
                  f'regular expression ({e}); use one, e.g. '
                  "'layer_\\d+/.*'.")


def pretraining_weight_paths(m) -> list[str]:
  """``quantization.weight_paths`` of the pretraining model of the
  (checked) section ``m``, with every head it can have (SpanBERT's too):
  from its shapes alone."""
  ids = jnp.zeros((1, 4), jnp.int32)
  return quantization.model_weight_paths(
      bert_lib.BertForPreTraining(encoder_config(m, 8, sbo_positions=1)),
      ids, ids, ids + 1, ids[:, :1], ids[:, :1])


def _check_quantized_layers(m, errors: list[str]) -> None:
  """``model.quantize_layers`` covers a layer of this model (a pattern of
  another layout, e.g. a scanned stack's for an unscanned one, would
  quantize nothing, silently)."""
  problem = quantization.uncovered(m.quantize_layers,
                                   pretraining_weight_paths(m))
  if problem:
    errors.append(problem)


def _check_pruned_heads(m, errors: list[str]) -> None:
  """``m.pruned_heads``: one entry per layer, distinct heads of the layer,
  at least one kept; not with shared or scanned layers."""
  pruned = m.pruned_heads
  if not pruned:
    return
  if m.scan_layers or m.num_layer_groups:
    errors.append('model.pruned_heads with model.scan_layers or '
                  'model.num_layer_groups: pruned layers differ in shape, '
                  'so they are neither scanned nor shared; set '
                  'scan_layers=False and num_layer_groups=0.')
  if not (m.size in bert_lib.SIZES and min(m[n] for n in _DIMS) >= 0):
    return
  layers, _, heads = bert_lib.SIZES[m.size]
  layers, heads = m.num_layers or layers, m.num_heads or heads
  if len(pruned) != layers:
    errors.append(f'model.pruned_heads has {len(pruned)} entries for '
                  f'{layers} layers; it must have one (possibly empty) '
                  'tuple per layer.')
    return
  for i, removed in enumerate(pruned):
    removed = list(removed)
    if (len(set(removed)) != len(removed)
        or not all(isinstance(h, int) and 0 <= h < heads for h in removed)
        or len(removed) >= heads):
      errors.append(f'model.pruned_heads[{i}]={tuple(removed)}: use '
                    f'distinct heads in [0, {heads}), at most {heads - 1} '
                    '(a layer keeps a head; to remove whole layers, train '
                    'with model.layerdrop and keep a subset).')


def _check(condition: bool, message: str, errors: list[str]) -> None:
  if not condition:
    errors.append(message)


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """A ``model`` section an earlier run saved, with the fields added since
  at their defaults."""
  m = section()
  for key, value in saved.items():
    m[key] = value
  return m


def encoder_config(m, vocab_size: int, sbo_positions: int = 0
                   ) -> bert_lib.BertConfig:
  """The encoder's hyperparameters from the ``model`` section ``m``.

  Args:
    m: the ``model`` section.
    vocab_size: the tokenizer's vocabulary; the tables are padded to
      ``padded_vocab_size`` rows, and the rows past it get no probability
      (``BertConfig.real_vocab_size``).
    sbo_positions: relative positions of SpanBERT's span boundary head;
      0 = no such head (the objective decides).
  """
  overrides = {k: getattr(m, k) for k in ('hidden_size', 'num_layers',
                                          'num_heads', 'intermediate_size')
               if getattr(m, k)}
  return bert_lib.BertConfig.from_size(
      m.size, vocab_size=tokenizer_lib.padded_vocab_size(vocab_size),
      real_vocab_size=vocab_size,
      max_position_embeddings=m.max_position_embeddings,
      type_vocab_size=m.type_vocab_size,
      task_type_vocab_size=m.task_type_vocab_size,
      embedding_size=m.embedding_size, num_layer_groups=m.num_layer_groups,
      sbo_positions=sbo_positions, sbo_position_width=m.sbo_position_width,
      hidden_dropout_rate=m.hidden_dropout_rate,
      attention_dropout_rate=m.attention_dropout_rate,
      dtype=jnp.dtype(m.dtype), param_dtype=jnp.dtype(m.param_dtype),
      remat=m.remat, attend_across_documents=m.attend_across_documents,
      gelu_approximate=m.gelu == 'tanh',
      layer_norm_epsilon=m.layer_norm_epsilon,
      scan_layers=m.scan_layers, attention_impl=attention_impl(m),
      pruned_heads=tuple(tuple(int(h) for h in layer)
                         for layer in m.pruned_heads),
      layerdrop=m.layerdrop, quantize=m.quantize,
      quantize_layers=m.quantize_layers, trigram_input=m.trigram_input,
      intra_bottleneck_size=m.intra_bottleneck_size,
      bottleneck_attention=m.bottleneck_attention,
      key_query_shared_bottleneck=m.key_query_shared_bottleneck,
      num_feedforward_networks=m.num_feedforward_networks,
      normalization=m.normalization, hidden_act=m.hidden_act, **overrides)


def attention_impl(m) -> str:
  """``m.attention`` (the ``model`` section's) resolved for this backend:
  'auto' is cuDNN's fused attention on GPU in bfloat16 where the head size
  allows it."""
  if m.attention != 'auto':
    return m.attention
  _, hidden, heads = bert_lib.SIZES[m.size]
  head_dim = (m.intra_bottleneck_size or m.hidden_size or hidden) // (
      m.num_heads or heads)
  usable = (jax.default_backend() == 'gpu' and m.dtype == 'bfloat16'
            and head_dim % 8 == 0 and head_dim <= 128)
  return 'cudnn' if usable else 'xla'
