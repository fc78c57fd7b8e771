"""Q8BERT's 8-bit quantization through Qwix (bertjax/quantization.py): what
is quantized, the straight-through gradient, the int8 path against the
fake-quantized forward, and the int8 export read back."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix

from bertjax import compress
from bertjax import config_lib
from bertjax import finetune
from bertjax import multitask
from bertjax import quantization
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config
from bertjax.models import heads

CFG = bert_lib.BertConfig(vocab_size=512, real_vocab_size=500, hidden_size=32,
                          num_layers=2, num_heads=2, intermediate_size=64,
                          max_position_embeddings=16, quantize='int8')
BATCH, LENGTH = 4, 12


def _model(**fields):
  return heads.DownstreamModel(dataclasses.replace(CFG, **fields),
                               'classification', 3)


def _inputs():
  """Rows of different lengths: padding, as a task's batches have."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 500, (BATCH, LENGTH)).astype(np.int32)
  mask = (np.arange(LENGTH)[None] < np.array([[12], [7], [3], [10]])
          ).astype(np.int32)
  return (jnp.asarray(ids * mask), jnp.asarray(
      rng.integers(0, 2, (BATCH, LENGTH)).astype(np.int32) * mask),
          jnp.asarray(mask))


@pytest.fixture(scope='module')
def params():
  """Initial parameters, the classifier's scaled so that the logits are
  about 1 (not the init's 0.01): tolerances on them then mean something."""
  p = nn.unbox(_model().init(jax.random.PRNGKey(1), *_inputs())['params'])
  p['classifier']['kernel'] = p['classifier']['kernel'] * 300
  return p


def _logits(model, params):
  return np.asarray(jax.jit(lambda p: model.apply({'params': p}, *_inputs()))(
      params))


def _count_rounds(jaxpr) -> int:
  """``round`` operations in ``jaxpr`` and every jaxpr inside it: one per
  quantized operand."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == 'round'
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          count += _count_rounds(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          count += _count_rounds(sub)
  return count


@pytest.mark.parametrize('layers, operands', [
    # The fused Q/K/V and the output projection, each weight and input;
    # not the query-key or probability-value products.
    ('layer_0/attention', 4),
    ('layer_0/ffn/wi', 2),
    ('classifier', 2),
    ('embeddings/word', 1),   # The table, row by row.
    # Every layer: 3 tables, 2 x (4 + 2 + 2) in the layers, pooler and
    # classifier.
    ('.*', 3 + 16 + 4),
])
def test_only_layers_with_weights_are_quantized(params, layers, operands):
  model = quantization.quantized(_model(quantize_layers=layers))
  jaxpr = jax.make_jaxpr(lambda p: model.apply({'params': p}, *_inputs()))(
      params)
  assert _count_rounds(jaxpr.jaxpr) == operands


def _fake_quantized_rows(table):
  return qwix.dequantize(quantization._quantize_rows(table, jnp.int8))  # pylint: disable=protected-access


def test_table_rows_are_absmax_int8_with_exact_products(params):
  """Each row's scale is its largest magnitude over 127.5 (Qwix's symmetric
  int8 range, [-127.5, 127.5] before rounding) to 2**-17, which its
  largest magnitude reaches, and every int8 value times its scale is exact
  in float32."""
  table = np.asarray(params['embeddings']['word']['embedding'])
  q = quantization._quantize_rows(jnp.asarray(table), jnp.int8)  # pylint: disable=protected-access
  values, scale = np.asarray(q.qvalue), np.asarray(q.scale)
  assert values.dtype == np.int8 and scale.shape == (table.shape[0], 1)
  real = np.abs(table).max(1) > 0   # The padding rows are zero.
  assert np.abs(values[real].astype(np.int32)).max(1).min() >= 127
  np.testing.assert_allclose(scale[real, 0],
                             np.abs(table[real]).max(1) / 127.5,
                             rtol=2.0 ** -17)
  exact = values.astype(np.float64) * scale.astype(np.float64)
  np.testing.assert_array_equal(exact, exact.astype(np.float32))
  np.testing.assert_allclose(exact[real], table[real],
                             atol=0.51 * scale[real].max())


def test_table_is_read_fake_quantized_with_a_straight_through_gradient(
    params):
  """Quantizing the word table is the float model on the table's int8
  values (absmax per row), and its gradient is the float model's there."""
  quantized = quantization.quantized(_model(quantize_layers='embeddings/word'))
  float_model = _model(quantize='none')
  table = params['embeddings']['word']['embedding']
  on_int8 = jax.tree.map(lambda x: x, params)
  on_int8['embeddings']['word']['embedding'] = _fake_quantized_rows(table)
  np.testing.assert_allclose(_logits(quantized, params),
                             _logits(float_model, on_int8), atol=1e-6)
  assert np.abs(_logits(quantized, params)
                - _logits(float_model, params)).max() > 1e-6

  def grad(model, p):
    return jax.jit(jax.grad(lambda p: model.apply(
        {'params': p}, *_inputs()).sum()))(p)['embeddings']['word'][
            'embedding']

  # Float: the scatter of the gradient into the rows sums in another order.
  np.testing.assert_allclose(grad(quantized, params),
                             grad(float_model, on_int8), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('layers', ['.*', 'layer_\\d+/.*'])
def test_int8_path_equals_the_fake_quantized_forward(params, layers):
  model = quantization.quantized(_model(quantize_layers=layers))
  int8 = quantization.int8_params(model, params, *_inputs())
  served = _logits(quantization.int8_model(model), int8)
  trained = _logits(model, params)
  np.testing.assert_allclose(served, trained, rtol=0, atol=1e-5)
  assert np.abs(trained).max() > 0.5
  assert np.abs(trained - _logits(_model(quantize='none'), params)
                ).max() > 1e-4   # Quantization did change them.
  kinds = {jax.tree_util.keystr(path, simple=True, separator='/'): leaf.dtype
           for path, leaf in jax.tree_util.tree_leaves_with_path(int8)}
  int8_leaves = sorted(k.split('/array/')[0] for k, v in kinds.items()
                       if v == jnp.int8)
  kernels = [f'layer_{i}/{k}' for i in range(2) for k in (
      'attention/out_kernel', 'attention/qkv_kernel', 'ffn/wi/kernel',
      'ffn/wo/kernel')]
  if layers == '.*':
    kernels += ['classifier/kernel', 'embeddings/position/embedding',
                'embeddings/token_type/embedding',
                'embeddings/word/embedding', 'pooler/kernel']
  assert int8_leaves == sorted(kernels)
  with pytest.raises(ValueError, match='scanned stack'):   # Not Qwix's own.
    quantization.int8_params(quantization.quantized(_model(
        scan_layers=True)), params, *_inputs())


def test_export_reads_back_and_refuses_other_files(params, tmp_path):
  model = quantization.quantized(_model())
  int8 = quantization.int8_params(model, params, *_inputs())
  compress.save_int8(str(tmp_path), model, int8)
  loaded, loaded_params = compress.load_int8(str(tmp_path))
  np.testing.assert_array_equal(_logits(loaded, loaded_params),
                                _logits(quantization.int8_model(model), int8))
  # On disk: a byte per quantized weight, 4 per scale and float parameter
  # (and the safetensors header).
  leaves = jax.tree.leaves(int8)
  header = 8 + int.from_bytes(open(os.path.join(
      str(tmp_path), compress.INT8_WEIGHTS), 'rb').read(8), 'little')
  assert os.path.getsize(os.path.join(
      str(tmp_path), compress.INT8_WEIGHTS)) - header == sum(
          x.size * (1 if x.dtype == jnp.int8 else 4) for x in leaves)
  assert sum(x.size for x in leaves if x.dtype == jnp.int8) > 0.9 * sum(
      x.size for x in jax.tree.leaves(params))
  # Another model's parameters: named, not loaded.
  other = quantization.quantized(_model(num_layers=1))
  other_params = nn.unbox(other.init(jax.random.PRNGKey(0),
                                     *_inputs())['params'])
  compress.save_int8(str(tmp_path), model,
                     quantization.int8_params(other, other_params,
                                              *_inputs()))
  with pytest.raises(ValueError, match='missing .*layer_1'):
    compress.load_int8(str(tmp_path))


def test_pretraining_model_quantizes_encode_too():
  """The bert objective applies ``encode`` (the tasks beyond masking) as
  well as ``__call__``: both run quantized."""
  cfg = dataclasses.replace(CFG, quantize_layers='layer_0/ffn/wi')
  ids, types, mask = _inputs()
  model = bert_lib.BertForPreTraining(cfg)
  float_model = bert_lib.BertForPreTraining(dataclasses.replace(
      cfg, quantize='none'))
  quantized = quantization.quantized(model, methods=('__call__', 'encode'))
  p = quantized.init(jax.random.PRNGKey(0), ids, types, mask,
                     jnp.zeros((BATCH, 2), jnp.int32))['params']

  def encoded(m):
    return np.asarray(m.apply({'params': p}, ids, types, mask,
                              method=m.encode))

  assert np.abs(encoded(quantized) - encoded(float_model)).max() > 1e-5
  assert quantization.quantized(float_model) is float_model


@pytest.mark.parametrize('scan, pattern, covers', [
    (False, 'layer_1/ffn/wi', True), (False, 'layers/scan/layer/.*', False),
    (True, 'layers/scan/layer/ffn/wi', True), (True, 'layer_1/.*', False),
    (False, 'layer_2/.*', False),   # The demo has 2 layers.
    (False, 'embeddings/task_type', False), (False, 'sbo/.*', True)])
def test_quantize_layers_must_cover_a_layer_of_the_model(scan, pattern,
                                                         covers):
  """Against the pretraining model's own layers (scanned or not), before
  any data is read: a pattern that covers none would train in float."""
  m = config_lib.demo_config().model
  m.quantize, m.quantize_layers, m.scan_layers = 'int8', pattern, scan
  errors = []
  model_config.check(m, errors)
  assert not errors if covers else (
      len(errors) == 1 and 'matches none of the model' in errors[0]
      and ('layers/scan/layer/ffn/wi' if scan else 'layer_<i>/ffn/wi')
      in errors[0])


def test_a_scanned_runs_pattern_quantizes_its_unscanned_layers(params):
  """Fine-tuning unscans the stack: a pattern over the scanned module
  covers every layer's, and one over no layer is refused."""
  layers = quantization.unscanned_layers('layers/scan/layer/ffn/wi')
  model = quantization.quantized(_model(quantize_layers=layers))
  jaxpr = jax.make_jaxpr(lambda p: model.apply({'params': p}, *_inputs()))(
      params)
  assert _count_rounds(jaxpr.jaxpr) == 2 * 2   # Each layer's weight, input.
  finetune.check_quantized_layers(_model(quantize_layers=layers))
  with pytest.raises(finetune.FinetuneError, match='matches none'):
    finetune.check_quantized_layers(_model(
        quantize_layers='layers/scan/layer/ffn/wi'))


def test_multitask_runs_quantized_as_fine_tuning(params):
  """A task of a multi-task run computes the quantized single-task
  model's logits, to the bit (its tables alone were quantized before)."""
  model = multitask.MultitaskModel(
      CFG, (multitask.HeadSpec('a', 'classification', 3),))
  p = nn.unbox(model.init(jax.random.PRNGKey(1), LENGTH))
  p['heads']['a']['classifier']['kernel'] *= 300
  ids, types, mask = _inputs()
  got = np.asarray(jax.jit(lambda p: model.apply(p, 0, {
      'input_ids': ids, 'token_type_ids': types, 'attention_mask': mask}))(p))
  view = model.task_params(p, 0)
  np.testing.assert_array_equal(
      got, _logits(quantization.quantized(_model()), view))
  assert np.abs(got - _logits(_model(quantize='none'), view)).max() > 1e-3
