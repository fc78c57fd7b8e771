"""8-bit quantization-aware training and int8 inference (Q8BERT), by Qwix.

Q8BERT (Zafrir et al., 2019) fine-tunes (or here also pretrains) with
symmetric linear 8-bit fake quantization of the weights and activations of
every fully connected layer and embedding, straight-through gradients,
and softmax, LayerNorm and GELU in float. bertjax does it with Google's
Qwix (``qwix``), not hand-written rounding:

- Training (``quantized``): Qwix's quantized-training provider intercepts
  every matmul of a module whose path matches ``model.quantize_layers``
  (a regular expression, e.g. ``layer_\\d+/ffn/.*``), and fake-quantizes
  its weight and its input to int8 with straight-through gradients. Only
  matmuls with a weight are quantized: attention's query-key and
  probability-value products stay float, as Q8BERT's.
- Embedding tables (word, position, token type, task) of a matching path
  (``embeddings/word``, ...) are fake-quantized row by row where they are
  read (``embedding_rows``).
- Inference (``int8_model``, ``int8_params``): Qwix's post-training
  provider with the kernels stored as int8 and their scales (and the
  tables too); activations are quantized as they come. Its logits equal
  the training forward's (the same quantized operands, the same int8 dot
  products).

Scales (where Q8BERT differs, the comparison in the README measures it):
absmax, symmetric, per output channel for kernels and per row for tables
(Q8BERT: one per tensor); per token for activations, from the token's
own values (Q8BERT: one per tensor, an exponential moving average of the
training batches' maxima). No statistics are kept, so a quantized model
has the float model's parameters and its training state, checkpoints and
exports unchanged.

Qwix is imported where it is first used (it brings ``flax.nnx`` along:
0.2 s of every process's start), so a float model's process never loads
it.
"""

from __future__ import annotations

import functools
import re
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp

QUANTIZE = ('none', 'int8')
_QTYPE = {'int8': jnp.int8}


def _is_weight_op(lhs, rhs) -> bool:
  """Whether one operand of a matmul is a parameter of the current module
  (Qwix's own test): a fully connected layer, not attention's
  activation-by-activation products."""
  q = _qwix()
  return any(isinstance(x, q.ptq.WithAux)
             or q.flax_util.find_param(x) is not None for x in (lhs, rhs))


class _WeightsOnly:
  """Mixin: the provider leaves matmuls without a weight in float."""

  def dot_general(self, lhs, rhs, *args, **kwargs):
    if not _is_weight_op(lhs, rhs):
      return jax.lax.dot_general(lhs, rhs, *args, **kwargs)
    return super().dot_general(lhs, rhs, *args, **kwargs)

  def einsum(self, spec, *operands, **kwargs):
    if len(operands) != 2 or not _is_weight_op(*operands):
      return jnp.einsum(spec, *operands, **kwargs)
    return super().einsum(spec, *operands, **kwargs)


@functools.cache
def _qwix() -> types.SimpleNamespace:
  """Qwix's modules (``qwix``, ``qarray``, ``ptq``, ``flax_util``) and the
  providers that quantize weight matmuls only (``Training``,
  ``Inference``), imported on first use."""
  # pylint: disable=g-import-not-at-top
  import qwix
  from qwix._src.core import qarray
  from qwix._src.providers import ptq
  from qwix._src.utils import flax_util

  class Training(_WeightsOnly, qwix.QtProvider):
    """Fake-quantized weights and activations, straight-through
    gradients."""

  class Inference(_WeightsOnly, qwix.PtqProvider):
    """int8 kernels with their scales; activations quantized
    dynamically."""

  return types.SimpleNamespace(qwix=qwix, qarray=qarray, ptq=ptq,
                               flax_util=flax_util, Training=Training,
                               Inference=Inference)


def _rules(cfg, rule_class):
  qtype = _QTYPE[cfg.quantize]
  return [rule_class(module_path=cfg.quantize_layers, weight_qtype=qtype,
                     act_qtype=qtype)]


def quantized(model: nn.Module, methods=('__call__',)) -> nn.Module:
  """``model`` (its ``cfg`` a ``BertConfig``) trained with fake-quantized
  layers where ``cfg.quantize`` asks for them; ``model`` itself otherwise.
  The parameters are the float model's. Apply it inside ``jax.jit``, as
  every bertjax step does: Qwix intercepts the matmuls as the model is
  traced, and an eager apply of the pretraining model was seen to run
  them float (qwix 0.1.8; the embedding tables, quantized by bertjax
  itself, are quantized either way)."""
  cfg = model.cfg
  if cfg.quantize == 'none':
    return model
  q = _qwix()
  return q.qwix.quantize_model(model, q.Training(_rules(cfg, q.qwix.QtRule)),
                               methods=methods)


def int8_model(model: nn.Module) -> nn.Module:
  """``model`` (a quantized ``DownstreamModel``) running on int8 weights:
  apply it to ``int8_params``."""
  cfg = model.cfg
  if cfg.quantize == 'none':
    raise ValueError('an int8 model of a float model: set model.quantize '
                     "to 'int8' and train with it first.")
  if cfg.scan_layers:
    raise ValueError('an int8 model of a scanned stack: Qwix quantizes '
                     'per module, not through the scan; unscan it first '
                     '(scan_layers=False, hf_convert.unscanned on the '
                     'parameters), as fine-tuning does.')
  q = _qwix()
  return q.qwix.quantize_model(
      model, q.Inference(_rules(cfg, q.qwix.QuantizationRule)))


def weight_paths(params) -> list[str]:
  """The module paths (``layer_0/ffn/wi``) of ``params`` that hold a matrix
  or a table: the layers ``model.quantize_layers`` chooses among (arrays
  or shapes; boxed or not)."""
  leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]
  return sorted({'/'.join(str(k.key) for k in path[:-1])
                 for path, leaf in leaves if len(leaf.shape) >= 2} - {''})


def model_weight_paths(model: nn.Module, *inputs) -> list[str]:
  """``weight_paths`` of ``model`` initialised on ``inputs`` (arrays or
  shapes): from its shapes alone, a trace that allocates nothing."""
  return weight_paths(jax.eval_shape(
      lambda: model.init(jax.random.key(0), *inputs)['params']))


def uncovered(pattern: str, paths: list[str]) -> str | None:
  """Why ``model.quantize_layers`` = ``pattern`` would quantize nothing of
  a model whose ``weight_paths`` are ``paths``; None if it covers one."""
  if any(re.fullmatch(pattern, path) for path in paths):
    return None
  kinds = sorted({re.sub(r'^layer_\d+/', 'layer_<i>/', path)
                  for path in paths})
  return (f'model.quantize_layers={pattern!r} matches none of the '
          "model's layers, so nothing would be quantized; its layers with "
          f"weights are {', '.join(kinds)} (layer_<i>: each layer i). Use a "
          "regular expression over these, e.g. '.*' or 'layer_\\d+/.*'.")


def unscanned_layers(pattern: str) -> str:
  """``pattern`` written for a scanned stack (``layers/scan/layer/``, one
  module for every layer), for the same stack unscanned (``layer_<i>/``)."""
  return pattern.replace('layers/scan/layer/', r'layer_\d+/')


def table_quantized(cfg, path: str) -> bool:
  """Whether the embedding table at module path ``path`` (e.g.
  ``embeddings/word``) is quantized."""
  return cfg.quantize != 'none' and re.fullmatch(
      cfg.quantize_layers, path) is not None


def _row_how(qtype):
  """Qwix's ``HowToQuantize`` of a table: absmax, a scale per row."""
  return _qwix().qarray.HowToQuantize(
      qtype=qtype, channelwise_axes=[0], tiled_axes={},
      calibration_method='absmax')


def _quantize_rows(table, qtype):
  """``table`` as int8 with a scale per row (absmax), each scale rounded to
  17 significant bits: an int8 value (7 bits) times it is then exact in
  float32, so a row read back is the same number however XLA fuses the
  product with the sum of the tables (a fused multiply-add or not), in
  the training forward and in the int8 model alike. The rounding moves a
  scale by at most 2**-17 of itself."""
  qarray, how = _qwix().qarray, _row_how(qtype)
  scale, zero_point = qarray.compute_scale_zero_point(
      qarray.calibrate(table, how), qtype)
  scale = jax.lax.reduce_precision(scale, exponent_bits=8, mantissa_bits=16)
  return qarray.quantize_with_scale_zero_point(table, qtype, scale,
                                               zero_point)


def _lookup(table, ids):
  """Rows ``ids`` of the int8 table ``table`` (a ``QArray``), in float."""
  rows = jnp.take(table.qvalue, ids, axis=0).astype(table.scale.dtype)
  return rows * jnp.take(table.scale, ids, axis=0)


@jax.custom_vjp
def _fake_quantized_lookup(table, ids):
  # Quantized, then read as the int8 model reads it: the same operations
  # give the same values.
  return _lookup(_quantize_rows(table, jnp.int8), ids)


def _fake_quantized_lookup_fwd(table, ids):
  return _fake_quantized_lookup(table, ids), (table, ids)


def _fake_quantized_lookup_bwd(residuals, g):
  table, ids = residuals   # Straight through: the float lookup's gradient.
  return jnp.zeros_like(table).at[ids].add(g.astype(table.dtype)), None


_fake_quantized_lookup.defvjp(_fake_quantized_lookup_fwd,
                              _fake_quantized_lookup_bwd)


def is_int8(table) -> bool:
  """Whether ``table`` is an int8 table of ``int8_params``."""
  # int8_params made it, so Qwix is loaded if there is one.
  ptq = sys.modules.get('qwix._src.providers.ptq')
  return ptq is not None and isinstance(table, ptq.WithAux)


def embedding_rows(table, ids, quantize: bool, dtype):
  """Rows ``ids`` of an embedding table, as ``dtype``.

  ``table`` is a float table (fake-quantized row by row when ``quantize``,
  with a straight-through gradient) or, in ``int8_params``, an int8 table
  with a scale per row, read the same way.
  """
  if is_int8(table):
    return _lookup(table.array, ids).astype(dtype)
  if quantize:
    return _fake_quantized_lookup(table, ids).astype(dtype)
  return jnp.take(table, ids, axis=0).astype(dtype)


def int8_params(model: nn.Module, params: dict, *inputs) -> dict:
  """``params`` (float, as trained) for ``int8_model(model)``: kernels and
  quantized tables as int8 with their scales, the rest (biases, LayerNorms)
  float. ``inputs`` are any model inputs of the right kinds (shapes only
  are read)."""
  params = jax.tree.map(jnp.asarray, nn.unbox(params))
  abstract = nn.unbox(jax.eval_shape(
      int8_model(model).init, jax.random.PRNGKey(0), *inputs)['params'])
  q = _qwix()
  out = q.qwix.quantize_params(params, abstract)
  qtype = _QTYPE[model.cfg.quantize]
  for name in ('word', 'position', 'token_type', 'task_type'):
    if name in out.get('embeddings', {}) and table_quantized(
        model.cfg, f'embeddings/{name}'):
      table = params['embeddings'][name]['embedding']
      out['embeddings'][name]['embedding'] = q.ptq.WithAux(
          _quantize_rows(table, qtype), _row_how(qtype))
  return out

