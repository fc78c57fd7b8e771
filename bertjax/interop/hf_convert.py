"""bertjax parameters <-> Hugging Face transformers checkpoints.

One table of names per family maps each bertjax parameter to the tensor the
transformers class holds (``weight`` of a ``torch.nn.Linear`` is ``[out,
in]``, the transpose of a Flax kernel; bertjax's fused Q/K/V kernel ``[D, 3,
H, K]`` is three ``[H*K, D]`` weights), and the same table read backwards
imports. Every conversion is a transpose, reshape or slice, so a round trip
is exact.

Families and their transformers classes:

| family | from a bertjax run | class |
| --- | --- | --- |
| ``bert`` | ``objective.name=bert`` (BERT, wwm, span, ERNIE 1.0, SpanBERT) | ``BertForPreTraining`` |
| ``ernie`` | ``bert`` with ``model.task_type_vocab_size`` > 0 (ERNIE 2.0) | ``ErnieForPreTraining`` |
| ``roberta`` | ``bert`` without NSP on ``full_sentences`` or ``doc_sentences`` | ``RobertaForMaskedLM`` |
| ``albert`` | ``bert`` with ``model.num_layer_groups`` or ``embedding_size`` | ``AlbertForPreTraining`` |
| ``electra`` | ``objective.name=electra`` | ``ElectraForPreTraining`` (discriminator), ``ElectraForMaskedLM`` (generator) |
| ``distilbert`` | ``objective.name=distillation`` (the student) | ``DistilBertForMaskedLM`` |
| ``mobilebert`` | ``bert`` with MobileBERT's options (``model.trigram_input``, ...), or ``objective.name=mobilebert`` (the student) | ``MobileBertForPreTraining`` |

Vocabulary: bertjax's tables have ``padded_vocab_size`` rows (a multiple of
128); an export keeps the tokenizer's ``vocab_size`` rows, the only ones any
input reaches, and an import pads with zero rows that no input reaches.

ERNIE is BERT's table under ``ernie.`` with one more tensor, the task
embedding (``ernie.embeddings.task_type_embeddings.weight``, bertjax's
``embeddings/task_type/embedding``), added before the embedding LayerNorm
in both; ``config.json`` says ``use_task_id`` and ``task_type_vocab_size``.
``ErnieModel.from_pretrained`` loads the encoder of the export (the heads'
``cls.*`` tensors are then unused).

MobileBERT: the trigram embedding, the bottlenecked layers (their FFNs
``ffn_0`` .. ``ffn_{F-1}`` are transformers' ``ffn.0`` .. ``ffn.{F-2}``
and then ``intermediate``/``output``), NoNorm (``scale``, ``bias`` <->
``weight``, ``bias``), and the MLM decoder's extra table
(``mlm_extra_embedding`` [V, H - E] <-> ``cls.predictions.dense.weight``
[H - E, V]). The pooler is the dense + tanh one
(``classifier_activation=True``): bertjax's NSP head reads it.
``MobileBertModel.from_pretrained`` loads the encoder of the export.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import numpy as st_numpy

from bertjax.runtime import checkpoint
from bertjax import config_lib
from bertjax import errors
from bertjax.interop import hf_tokenizer
from bertjax import objectives
from bertjax import pruning
from bertjax import runs
from bertjax import sharding
from bertjax import storage
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import distillation
from bertjax.objectives import electra as electra_objective
from data_pipelines import continual as continual_lib
from data_pipelines import instances as instances_lib
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

FAMILIES = ('bert', 'roberta', 'albert', 'electra', 'distilbert', 'ernie',
            'mobilebert')
# (family, part) -> transformers architecture.
ARCHITECTURES = {
    ('bert', None): 'BertForPreTraining',
    ('ernie', None): 'ErnieForPreTraining',
    ('roberta', None): 'RobertaForMaskedLM',
    ('albert', None): 'AlbertForPreTraining',
    ('electra', 'discriminator'): 'ElectraForPreTraining',
    ('electra', 'generator'): 'ElectraForMaskedLM',
    ('distilbert', None): 'DistilBertForMaskedLM',
    ('mobilebert', None): 'MobileBertForPreTraining',
}
_MODEL_TYPES = {'BertForPreTraining': 'bert', 'ErnieForPreTraining': 'ernie',
                'RobertaForMaskedLM': 'roberta',
                'AlbertForPreTraining': 'albert',
                'ElectraForPreTraining': 'electra',
                'ElectraForMaskedLM': 'electra',
                'DistilBertForMaskedLM': 'distilbert',
                'MobileBertForPreTraining': 'mobilebert'}
# What a family's class has no place for, said in the exported README.
_LEFT_OUT = {
    'sbo': "the span boundary objective's head (SpanBERT's SBO: "
           "`sbo_output_bias` and the `sbo` layers); no transformers class "
           'has one',
    'nsp': 'the pooler and the sentence-pair (NSP) head, which RoBERTa has '
           'not (trained with `objective.nsp_weight=0`, they were never '
           'updated)',
    'tinybert': 'the teacher and the projections from the student\'s width '
                'to the teacher\'s (TinyBERT\'s W_e and W_h), which only '
                'distillation uses; the pooler and NSP head are exported as '
                'initialised (TinyBERT\'s losses never update them)',
    'mobilebert': 'the teacher (IB-BERT), which only the progressive '
                  'transfer and the distillation use',
}


class ConversionError(errors.UserError, ValueError):
  """A checkpoint or run cannot be converted; the message says why."""


# ---------------------------------------------------------------------------
# Which family a run exports as.


def family_of(cfg) -> str:
  """The transformers family of a bertjax run's ``cfg`` (table above), as
  its objective declares it (bertjax/objectives/)."""
  return objectives.get(cfg.objective.name).export_family(cfg)


def check_family(cfg, family: str) -> None:
  """Raises ConversionError if ``cfg``'s model cannot be ``family``'s."""
  natural = family_of(cfg)
  if family not in FAMILIES:
    raise ConversionError(f'family={family!r}; use one of {FAMILIES}.')
  _check_task_embedding(cfg.model, family)
  allowed = {'bert': {'bert', 'roberta'}, 'roberta': {'roberta', 'bert'},
             'albert': {'albert'}, 'electra': {'electra'},
             'distilbert': {'distilbert'}, 'ernie': {'ernie'},
             'mobilebert': {'mobilebert'}}[natural]
  if family not in allowed:
    raise ConversionError(
        f'a {natural} run (objective.name={cfg.objective.name!r}) cannot be '
        f'exported as {family}; use one of {sorted(allowed)}.')
  if cfg.model.scan_layers and family == 'albert':
    raise ConversionError('scanned layers cannot be ALBERT-shared.')
  if family == 'mobilebert':
    _check_mobilebert(cfg.model)
  if family == 'roberta' and (
      cfg.objective.get('nsp_weight', 0)
      or cfg.data.layout not in instances_lib.PACKED_LAYOUTS):
    raise ConversionError(
        f'this run trains sentence pairs (data.layout={cfg.data.layout!r}, '
        f'objective.nsp_weight={cfg.objective.get("nsp_weight", 0)}): its '
        "second segments are token type 1, which RoBERTa's tokenizer never "
        'gives (and RobertaForMaskedLM has no NSP head). Export it as '
        "family 'bert'.")
  if family == 'roberta' and cfg.model.hidden_act != 'gelu':
    raise ConversionError(
        f"RobertaForMaskedLM's head applies GELU, and this run has "
        f"model.hidden_act={cfg.model.hidden_act!r}: export it as family "
        "'bert' (BertForPreTraining, whose head follows hidden_act).")
  if family == 'roberta' and cfg.model.gelu != 'exact':
    raise ConversionError(
        "RobertaForMaskedLM's head applies the exact (erf) GELU, and this run "
        "has model.gelu='tanh': its logits would differ. Export it as "
        "family 'bert' (BertForPreTraining, whose head follows hidden_act), "
        "or train RoBERTa with model.gelu='exact' (the roberta preset does).")


def _check_distilbert(m: bert_lib.BertConfig) -> None:
  """Raises ConversionError where a student (its teacher's architecture)
  has what transformers' DistilBERT has no place for."""
  if m.layer_norm_epsilon != 1e-12:
    raise ConversionError(
        f"transformers' DistilBERT has every LayerNorm at epsilon 1e-12 "
        f'(no config field for it), and this student has '
        f"{m.layer_norm_epsilon} (its teacher's): its outputs would differ. "
        'Distill from a teacher with model.layer_norm_epsilon=1e-12.')
  if m.factorized or m.num_layer_groups:
    raise ConversionError(
        "transformers' DistilBERT has no factorized embedding and no shared "
        "layers, which this student has from its (ALBERT) teacher.")


def _check_task_embedding(m, family: str) -> None:
  """Raises ConversionError where ``family``'s class and the ``model``
  section ``m`` differ on ERNIE 2.0's task embedding: only ERNIE has a
  place for it, and ERNIE's embeddings are BERT's (a token-type table, no
  factorization, no shared layers)."""
  if m.task_type_vocab_size and family != 'ernie':
    raise ConversionError(
        f'model.task_type_vocab_size={m.task_type_vocab_size}: only family '
        f"'ernie' (ErnieForPreTraining) has a task embedding; {family} "
        'would drop it and change every output.')
  if family != 'ernie':
    return
  if m.num_layer_groups or m.embedding_size:
    raise ConversionError(
        'ErnieForPreTraining has no factorized embedding and no shared '
        f'layers (model.embedding_size={m.embedding_size}, '
        f'model.num_layer_groups={m.num_layer_groups}).')
  if not m.type_vocab_size:
    raise ConversionError('ErnieForPreTraining always has a token-type '
                          'table; this run has model.type_vocab_size=0.')


def _check_mobilebert(m) -> None:
  """Raises ConversionError where MobileBertForPreTraining cannot hold the
  ``model`` section ``m``'s model exactly."""
  if not m.trigram_input:
    raise ConversionError(
        f'{", ".join(model_config_lib.mobilebert_options(m))} without '
        "model.trigram_input: transformers' MobileBERT embeds with the "
        'trigram (and projects any embedding_size to H before adding the '
        "H-wide tables, which bertjax's ALBERT factorization does not); set "
        'model.trigram_input=True.')
  if m.num_layer_groups or m.task_type_vocab_size or not m.type_vocab_size:
    raise ConversionError(
        'MobileBertForPreTraining has no shared layers, no task embedding '
        'and always a token-type table (model.num_layer_groups='
        f'{m.num_layer_groups}, model.task_type_vocab_size='
        f'{m.task_type_vocab_size}, model.type_vocab_size='
        f'{m.type_vocab_size}).')
  if (m.intra_bottleneck_size and not m.bottleneck_attention
      and not m.key_query_shared_bottleneck
      and m.intra_bottleneck_size != (m.hidden_size or
                                      bert_lib.SIZES[m.size][1])):
    raise ConversionError(
        'q, k and v reading the H-wide layer input with a bottleneck of '
        f'another width (model.intra_bottleneck_size='
        f'{m.intra_bottleneck_size}, IB-BERT, the teacher): transformers '
        'sizes query and key for I-wide inputs and cannot run it.')
  if m.normalization == 'layer_norm' and m.layer_norm_epsilon != 1e-5:
    raise ConversionError(
        "transformers' MobileBERT LayerNorms the embeddings and each "
        'layer\'s last FFN with epsilon 1e-5 whatever layer_norm_eps says '
        f'(model.layer_norm_epsilon={m.layer_norm_epsilon}): with '
        "model.normalization='layer_norm', set model.layer_norm_epsilon="
        '1e-5 for one epsilon everywhere.')


# ---------------------------------------------------------------------------
# The name tables: (transformers name, bertjax path, conversion).
#
# Conversions: 'copy'; 'linear' (a kernel [in, out] <-> weight [out, in]);
# ('q'|'k'|'v', i) slice i of the fused Q/K/V (or Q/K); 'heads' (a kernel
# [D, H, K] <-> weight [H*K, D], a bias [H, K] <-> [H*K]: MobileBERT's V);
# 'attn_out' (out_kernel [H, K, D] <-> weight [D, H*K]); 'vocab' (rows
# trimmed to the tokenizer's vocabulary); 'vocab.T' (the same, transposed);
# 'positions+N' (RoBERTa's table, whose rows start at N = pad_token_id +
# 1).

Rule = tuple[str, tuple[str, ...], object]

# config.json's record of a pruned model's removed heads ({layer: [heads]}),
# which the export writes as zeros.
PRUNED_HEADS = 'bertjax_pruned_heads'


def _dense(hf: str, path: tuple[str, ...]) -> Iterator[Rule]:
  yield f'{hf}.weight', path + ('kernel',), 'linear'
  yield f'{hf}.bias', path + ('bias',), 'copy'


def _norm(hf: str, path: tuple[str, ...], no_norm: bool = False
          ) -> Iterator[Rule]:
  inner = () if no_norm else ('LayerNorm_0',)   # bert.NoNorm: its own.
  yield f'{hf}.weight', path + inner + ('scale',), 'copy'
  yield f'{hf}.bias', path + inner + ('bias',), 'copy'


# Per family: the names inside one layer, in transformers' terms.
_LAYER_NAMES = {
    'bert': {'q': 'attention.self.query', 'k': 'attention.self.key',
             'v': 'attention.self.value', 'out': 'attention.output.dense',
             'attention_norm': 'attention.output.LayerNorm',
             'wi': 'intermediate.dense', 'wo': 'output.dense',
             'ffn_norm': 'output.LayerNorm'},
    'albert': {'q': 'attention.query', 'k': 'attention.key',
               'v': 'attention.value', 'out': 'attention.dense',
               'attention_norm': 'attention.LayerNorm', 'wi': 'ffn',
               'wo': 'ffn_output', 'ffn_norm': 'full_layer_layer_norm'},
    'distilbert': {'q': 'attention.q_lin', 'k': 'attention.k_lin',
                   'v': 'attention.v_lin', 'out': 'attention.out_lin',
                   'attention_norm': 'sa_layer_norm', 'wi': 'ffn.lin1',
                   'wo': 'ffn.lin2', 'ffn_norm': 'output_layer_norm'},
}


def _layer(hf: str, path: tuple[str, ...], names: dict) -> Iterator[Rule]:
  attention = path + ('attention',)
  for i, part in enumerate('qkv'):
    yield f'{hf}.{names[part]}.weight', attention + ('qkv_kernel',), (part, i)
    yield f'{hf}.{names[part]}.bias', attention + ('qkv_bias',), (part, i)
  yield f'{hf}.{names["out"]}.weight', attention + ('out_kernel',), 'attn_out'
  yield f'{hf}.{names["out"]}.bias', attention + ('out_bias',), 'copy'
  yield from _norm(f'{hf}.{names["attention_norm"]}', path + (
      'attention_norm',))
  yield from _dense(f'{hf}.{names["wi"]}', path + ('ffn', 'wi'))
  yield from _dense(f'{hf}.{names["wo"]}', path + ('ffn', 'wo'))
  yield from _norm(f'{hf}.{names["ffn_norm"]}', path + ('ffn_norm',))


def _embeddings(hf: str, positions='copy', token_types: bool = True,
                task_types: bool = False, no_norm: bool = False
                ) -> Iterator[Rule]:
  yield f'{hf}.word_embeddings.weight', ('embeddings', 'word',
                                         'embedding'), 'vocab'
  yield f'{hf}.position_embeddings.weight', ('embeddings', 'position',
                                             'embedding'), positions
  if token_types:
    yield f'{hf}.token_type_embeddings.weight', ('embeddings', 'token_type',
                                                 'embedding'), 'copy'
  if task_types:
    yield f'{hf}.task_type_embeddings.weight', ('embeddings', 'task_type',
                                                'embedding'), 'copy'
  yield from _norm(f'{hf}.LayerNorm', ('embeddings', 'layer_norm'), no_norm)


def _encoder_layers(hf_prefix: str, prefix: tuple[str, ...], num: int,
                    names: dict) -> Iterator[Rule]:
  for i in range(num):
    yield from _layer(f'{hf_prefix}.{i}', prefix + (f'layer_{i}',), names)


def _mobilebert_layer(hf: str, path: tuple[str, ...], dims: dict
                      ) -> Iterator[Rule]:
  """One of MobileBertLayer's (bert.MobileBertLayer) ``dims``: its
  ``bottleneck``, ``key_query_shared``, ``ffns`` and ``no_norm``."""
  no_norm = dims['no_norm']
  attention = path + ('attention',)
  if dims['bottleneck']:
    yield from _dense(f'{hf}.bottleneck.input.dense',
                      path + ('input_bottleneck',))
    yield from _norm(f'{hf}.bottleneck.input.LayerNorm',
                     path + ('input_bottleneck_norm',), no_norm)
  if dims['key_query_shared']:
    yield from _dense(f'{hf}.bottleneck.attention.dense',
                      path + ('query_key_bottleneck',))
    yield from _norm(f'{hf}.bottleneck.attention.LayerNorm',
                     path + ('query_key_bottleneck_norm',), no_norm)
    for i, (part, name) in enumerate((('q', 'query'), ('k', 'key'))):
      for kind in ('kernel', 'bias'):
        yield (f'{hf}.attention.self.{name}.'
               f'{"weight" if kind == "kernel" else "bias"}',
               attention + (f'qk_{kind}',), (part, i))
    yield (f'{hf}.attention.self.value.weight', attention + ('v_kernel',),
           'heads')
    yield f'{hf}.attention.self.value.bias', attention + ('v_bias',), 'heads'
  else:
    for i, (part, name) in enumerate((('q', 'query'), ('k', 'key'),
                                      ('v', 'value'))):
      yield (f'{hf}.attention.self.{name}.weight',
             attention + ('qkv_kernel',), (part, i))
      yield (f'{hf}.attention.self.{name}.bias', attention + ('qkv_bias',),
             (part, i))
  yield (f'{hf}.attention.output.dense.weight', attention + ('out_kernel',),
         'attn_out')
  yield f'{hf}.attention.output.dense.bias', attention + ('out_bias',), 'copy'
  yield from _norm(f'{hf}.attention.output.LayerNorm',
                   path + ('attention_norm',), no_norm)
  last = dims['ffns'] - 1
  for i in range(dims['ffns']):
    # The stacked FFNs, then the last one under the layer's own names.
    ffn = f'{hf}.ffn.{i}.' if i < last else f'{hf}.'
    intermediate, output = f'{ffn}intermediate', f'{ffn}output'
    name = 'ffn' if dims.get('one_ffn_names') else f'ffn_{i}'
    yield from _dense(f'{intermediate}.dense', path + (name, 'wi'))
    yield from _dense(f'{output}.dense', path + (name, 'wo'))
    yield from _norm(f'{output}.LayerNorm', path + (f'{name}_norm',),
                     no_norm)
  if dims['bottleneck']:
    yield from _dense(f'{hf}.output.bottleneck.dense',
                      path + ('output_bottleneck',))
    yield from _norm(f'{hf}.output.bottleneck.LayerNorm',
                     path + ('output_norm',), no_norm)


def _mobilebert(dims: dict) -> Iterator[Rule]:
  """MobileBertForPreTraining's table."""
  yield from _embeddings('mobilebert.embeddings', no_norm=dims['no_norm'])
  yield from _dense('mobilebert.embeddings.embedding_transformation',
                    ('embeddings', 'trigram_projection'))
  for i in range(dims['num_layers']):
    yield from _mobilebert_layer(f'mobilebert.encoder.layer.{i}',
                                 (f'layer_{i}',), dims)
  yield from _dense('mobilebert.pooler.dense', ('pooler',))
  yield from _dense('cls.predictions.transform.dense', ('mlm_transform',))
  yield from _norm('cls.predictions.transform.LayerNorm', ('mlm_norm',))
  yield 'cls.predictions.bias', ('mlm_output_bias',), 'vocab'
  if dims['decoder_extra']:
    yield ('cls.predictions.dense.weight', ('mlm_extra_embedding',),
           'vocab.T')
  yield from _dense('cls.seq_relationship', ('nsp',))


def rules(family: str, dims: dict, part: str | None = None) -> list[Rule]:
  """The name table of ``family`` for a model of ``dims`` (``num_layers``,
  ``num_groups``, ``factorized``, ``pad_token_id``, ``token_types``; for
  ERNIE ``task_types``, whether it has the task table; for ELECTRA
  ``generator_layers`` and ``generator_factorized``; for MobileBERT
  ``no_norm``, ``bottleneck``, ``key_query_shared``, ``ffns`` and
  ``decoder_extra``, whether the MLM decoder has its extra table)."""
  out: list[Rule] = []
  bert_names = _LAYER_NAMES['bert']
  if family in ('bert', 'roberta', 'ernie'):
    base = family
    positions = ('copy' if family != 'roberta'
                 else f'positions+{dims["pad_token_id"] + 1}')
    out += _embeddings(f'{base}.embeddings', positions,
                       task_types=family == 'ernie' and dims['task_types'])
    out += _encoder_layers(f'{base}.encoder.layer', (), dims['num_layers'],
                           bert_names)
    if family != 'roberta':   # BERT's heads, under the same names.
      out += _dense(f'{base}.pooler.dense', ('pooler',))
      out += _dense('cls.predictions.transform.dense', ('mlm_transform',))
      out += _norm('cls.predictions.transform.LayerNorm', ('mlm_norm',))
      out.append(('cls.predictions.bias', ('mlm_output_bias',), 'vocab'))
      out += _dense('cls.seq_relationship', ('nsp',))
    else:
      out += _dense('lm_head.dense', ('mlm_transform',))
      out += _norm('lm_head.layer_norm', ('mlm_norm',))
      out.append(('lm_head.bias', ('mlm_output_bias',), 'vocab'))
  elif family == 'albert':
    out += _embeddings('albert.embeddings')
    out += _dense('albert.encoder.embedding_hidden_mapping_in',
                  ('embeddings', 'projection'))
    for g in range(dims['num_groups']):
      out += _layer(f'albert.encoder.albert_layer_groups.{g}.albert_layers.0',
                    (f'layer_{g}',), _LAYER_NAMES['albert'])
    out += _dense('albert.pooler', ('pooler',))
    out += _dense('predictions.dense', ('mlm_transform',))
    out += _norm('predictions.LayerNorm', ('mlm_norm',))
    out.append(('predictions.bias', ('mlm_output_bias',), 'vocab'))
    out += _dense('sop_classifier.classifier', ('nsp',))
  elif family == 'electra':
    out += _embeddings('electra.embeddings')
    encoder = f'{part}_encoder'
    factorized = dims['factorized' if part == 'discriminator'
                      else 'generator_factorized']
    if factorized:
      out += _dense('electra.embeddings_project', (encoder, 'projection'))
    layers = dims['num_layers' if part == 'discriminator'
                  else 'generator_layers']
    out += _encoder_layers('electra.encoder.layer', (encoder,), layers,
                           bert_names)
    if part == 'discriminator':
      out += _dense('discriminator_predictions.dense', ('rtd_transform',))
      out += _dense('discriminator_predictions.dense_prediction',
                    ('rtd_output',))
    else:
      out += _dense('generator_predictions.dense', ('generator_transform',))
      out += _norm('generator_predictions.LayerNorm', ('generator_norm',))
      out.append(('generator_lm_head.bias', ('generator_output_bias',),
                  'vocab'))
  elif family == 'mobilebert':
    out += _mobilebert(dims)
  elif family == 'distilbert':
    out += _embeddings('distilbert.embeddings', token_types=False)
    out += _encoder_layers('distilbert.transformer.layer', (),
                           dims['num_layers'], _LAYER_NAMES['distilbert'])
    out += _dense('vocab_transform', ('mlm_transform',))
    out += _norm('vocab_layer_norm', ('mlm_norm',))
    out.append(('vocab_projector.bias', ('mlm_output_bias',), 'vocab'))
  else:
    raise ConversionError(f'family={family!r}; use one of {FAMILIES}.')
  return out


# Tied to the word embeddings in every family: written as the same values
# (transformers re-ties them on load).
TIED = {'bert': ('cls.predictions.decoder.weight',),
        'ernie': ('cls.predictions.decoder.weight',),
        'roberta': ('lm_head.decoder.weight',),
        'albert': ('predictions.decoder.weight',),
        ('electra', 'generator'): ('generator_lm_head.weight',),
        'distilbert': ('vocab_projector.weight',),
        'mobilebert': ('cls.predictions.decoder.weight',)}


# ---------------------------------------------------------------------------
# bertjax -> transformers.


def _get(tree: dict, path: tuple[str, ...]) -> np.ndarray:
  for key in path:
    tree = tree[key]
  return np.asarray(tree)


def unscanned(params: dict, num_layers: int) -> dict:
  """``model.scan_layers`` parameters (one stacked ``layers`` tree) as
  ``layer_0`` ... trees."""
  if 'layers' not in params:
    return params
  stacked = params['layers']['scan']['layer']
  out = {k: v for k, v in params.items() if k != 'layers'}
  for i in range(num_layers):
    out[f'layer_{i}'] = jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked)
  return out


def _to_hf(value: np.ndarray, conversion, vocab_size: int) -> np.ndarray:
  if conversion == 'copy':
    return value
  if conversion == 'linear':
    return value.T
  if conversion == 'vocab':
    return value[:vocab_size]
  if conversion == 'vocab.T':
    return value[:vocab_size].T
  if conversion == 'heads':             # [D, H, K] -> [H*K, D]; [H, K].
    if value.ndim == 3:
      return value.reshape(value.shape[0], -1).T
    return value.reshape(-1)
  if conversion == 'attn_out':
    h, k, d = value.shape
    return value.reshape(h * k, d).T
  if isinstance(conversion, tuple):   # One of the fused Q/K/V.
    part = value[:, conversion[1]] if value.ndim == 4 else value[
        conversion[1]]
    if part.ndim == 3:                  # Kernel [D, H, K] -> [H*K, D].
      return part.reshape(part.shape[0], -1).T
    return part.reshape(-1)            # Bias [H, K] -> [H*K].
  if conversion.startswith('positions+'):
    offset = int(conversion.split('+')[1])
    return np.concatenate([np.zeros((offset, value.shape[1]), value.dtype),
                           value])
  raise AssertionError(conversion)


def _dims(cfg, model_cfg) -> dict:
  dims = {'num_layers': model_cfg.num_layers,
          'num_groups': model_cfg.num_layer_groups or model_cfg.num_layers,
          'factorized': model_cfg.factorized,
          'task_types': bool(model_cfg.task_type_vocab_size),
          'pad_token_id': tokenizer_lib.PAD_ID,
          'no_norm': model_cfg.normalization == 'no_norm',
          'bottleneck': model_cfg.bottleneck,
          'key_query_shared': (model_cfg.bottleneck
                               and model_cfg.key_query_shared_bottleneck),
          'ffns': model_cfg.num_feedforward_networks,
          # EncoderLayer's FFN names (ffn, ffn_norm), else MobileBertLayer's.
          'one_ffn_names': not model_cfg.mobilebert_layers,
          'decoder_extra': bool(model_cfg.decoder_extra_width)}
  if cfg.objective.name == electra_objective.NAME:
    _, generator = electra_objective.model_configs(
        cfg, model_cfg.output_vocab_size)
    dims.update(generator_layers=generator.num_layers,
                generator_factorized=generator.factorized)
  return dims


def hf_state_dict(params: dict, cfg, family: str, vocab_size: int,
                  part: str | None = None) -> dict[str, np.ndarray]:
  """``params`` (a run's, nested arrays) as the tensors of ``family``'s
  transformers class, float32, the vocabulary trimmed to ``vocab_size``."""
  _check_task_embedding(cfg.model, family)
  model_cfg = encoder_config(cfg, vocab_size)
  if family != 'electra':   # A distilled student, beside its teacher.
    params = objectives.get(cfg.objective.name).encoder_params(params)
  params = pruning.zero_filled(unscanned(params, model_cfg.num_layers),
                               model_cfg)
  if family == 'albert':
    albert_groups_check(model_cfg.num_layers,
                        model_cfg.num_layer_groups or model_cfg.num_layers)
    if not model_cfg.factorized:
      params = _with_identity_projection(params, model_cfg.hidden_size)
  state = {}
  for hf, path, conversion in rules(family, _dims(cfg, model_cfg), part):
    value = _to_hf(_get(params, path), conversion, vocab_size)
    state[hf] = np.ascontiguousarray(value, dtype=np.float32)
  word = state[next(hf for hf, path, _ in rules(family, _dims(
      cfg, model_cfg), part) if path == ('embeddings', 'word', 'embedding'))]
  for name in TIED.get((family, part), TIED.get(family, ())):
    state[name] = word
  if family == 'mobilebert' and not model_cfg.decoder_extra_width:
    # E == H: transformers keeps its decoder's extra table, with no rows.
    state['cls.predictions.dense.weight'] = np.zeros((0, vocab_size),
                                                     np.float32)
  return state


def albert_groups_check(num_layers: int, num_groups: int) -> None:
  """Raises ConversionError where transformers' ALBERT would share other
  layers than bertjax: its ``AlbertTransformer`` takes layer i's group as
  ``int(i / (N / G))`` in floating point, bertjax as floor(i G / N)
  exactly, and the two differ for some counts (N=18, G=14: layer 9)."""
  exact = [bert_lib.shared_group(i, num_layers, num_groups)
           for i in range(num_layers)]
  theirs = [int(i / (num_layers / num_groups)) for i in range(num_layers)]
  differ = [i for i in range(num_layers) if exact[i] != theirs[i]]
  if differ:
    raise ConversionError(
        f'{num_layers} layers in {num_groups} groups: transformers\' '
        f'AlbertTransformer puts layer(s) {differ} in group(s) '
        f'{[theirs[i] for i in differ]}, bertjax in '
        f'{[exact[i] for i in differ]} (its float rounding); the model '
        'would be another one there. Use a group count that divides the '
        'layers.')


def _with_identity_projection(params: dict, hidden_size: int) -> dict:
  """``params`` with an identity ``embeddings/projection``: transformers'
  ALBERT always maps its embeddings through one, where a bertjax model
  whose embeddings are hidden_size wide has none."""
  embeddings = dict(params['embeddings'], projection={
      'kernel': np.eye(hidden_size, dtype=np.float32),
      'bias': np.zeros((hidden_size,), np.float32)})
  return dict(params, embeddings=embeddings)


def encoder_config(cfg, vocab_size: int):
  """The run's encoder config, as its objective declares it (a distilled
  student's, ELECTRA's discriminator)."""
  try:
    return objectives.get(cfg.objective.name).encoder_config(cfg, vocab_size)
  except distillation.TeacherError as e:
    raise ConversionError(
        'a DistilBERT student has its teacher\'s architecture, read from '
        f'the teacher\'s run: {e}') from e


def hf_config(cfg, family: str, vocab_size: int, model_cfg=None,
              part: str | None = None) -> dict:
  """``config.json`` of the transformers class for ``cfg``'s model."""
  m = model_cfg or encoder_config(cfg, vocab_size)
  if family == 'electra' and part == 'generator':
    _, generator = electra_objective.model_configs(cfg, vocab_size)
  act = 'gelu_new' if m.gelu_approximate else 'gelu'
  if m.hidden_act == 'relu':
    act = 'relu'
  common = {
      'architectures': [ARCHITECTURES[(family, part)]],
      'model_type': _MODEL_TYPES[ARCHITECTURES[(family, part)]],
      'vocab_size': vocab_size, 'pad_token_id': tokenizer_lib.PAD_ID,
      'dtype': 'float32', 'initializer_range': m.initializer_range,
  }
  if family == 'distilbert':
    return common | {
        'dim': m.hidden_size, 'n_layers': m.num_layers, 'n_heads': m.num_heads,
        'hidden_dim': m.intermediate_size, 'activation': act,
        'max_position_embeddings': m.max_position_embeddings,
        'dropout': m.hidden_dropout_rate,
        'attention_dropout': m.attention_dropout_rate,
        'sinusoidal_pos_embds': False, 'tie_word_embeddings': True}
  encoder = generator if family == 'electra' and part == 'generator' else m
  config = common | {
      'hidden_size': encoder.hidden_size,
      'num_hidden_layers': encoder.num_layers,
      'num_attention_heads': encoder.num_heads,
      'intermediate_size': encoder.intermediate_size,
      'hidden_act': act,
      'hidden_dropout_prob': m.hidden_dropout_rate,
      'attention_probs_dropout_prob': m.attention_dropout_rate,
      'max_position_embeddings': m.max_position_embeddings,
      'type_vocab_size': m.type_vocab_size,
      'layer_norm_eps': m.layer_norm_epsilon,
      'tie_word_embeddings': True,
  }
  if family == 'roberta':
    config['max_position_embeddings'] += tokenizer_lib.PAD_ID + 1
    config.update(bos_token_id=tokenizer_lib.CLS_ID,
                  eos_token_id=tokenizer_lib.SEP_ID)
  if family == 'albert':
    config.update(embedding_size=m.embedding_width,
                  num_hidden_groups=m.num_layer_groups or m.num_layers,
                  inner_group_num=1, classifier_dropout_prob=0.1)
  if family == 'electra':
    config['embedding_size'] = m.embedding_width
  if family == 'ernie':
    config.update(use_task_id=bool(m.task_type_vocab_size),
                  task_type_vocab_size=m.task_type_vocab_size)
  if family == 'mobilebert':
    config.update(
        embedding_size=m.word_width, trigram_input=True,
        use_bottleneck=m.bottleneck, intra_bottleneck_size=m.intra_width,
        use_bottleneck_attention=m.bottleneck and m.bottleneck_attention,
        key_query_shared_bottleneck=(m.bottleneck
                                     and m.key_query_shared_bottleneck),
        num_feedforward_networks=m.num_feedforward_networks,
        normalization_type=m.normalization, classifier_activation=True)
  if encoder.pruned_heads:
    # transformers 5 has no head pruning (its ``pruned_heads`` is gone):
    # the pruned heads are written as zeros (hf_state_dict), and named here
    # for the import, which removes them again.
    config[PRUNED_HEADS] = {str(i): list(heads) for i, heads
                            in enumerate(encoder.pruned_heads) if heads}
  return config


# ---------------------------------------------------------------------------
# transformers -> bertjax.


def _set(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _from_hf(tensors: list[np.ndarray], conversion, padded_vocab: int,
             head_dim: int) -> np.ndarray:
  (value,) = tensors
  if conversion == 'copy':
    return value
  if conversion == 'linear':
    return value.T
  if conversion in ('vocab', 'vocab.T'):
    value = value.T if conversion == 'vocab.T' else value
    pad = [(0, padded_vocab - value.shape[0])] + [(0, 0)] * (value.ndim - 1)
    return np.pad(value, pad)
  if conversion == 'heads':             # [H*K, D] -> [D, H, K]; [H*K].
    if value.ndim == 2:
      return value.T.reshape(value.shape[1], -1, head_dim)
    return value.reshape(-1, head_dim)
  if conversion == 'attn_out':
    d, hk = value.shape
    return value.T.reshape(hk // head_dim, head_dim, d)
  if conversion.startswith('positions+'):
    return value[int(conversion.split('+')[1]):]
  raise AssertionError(conversion)


def params_from_state_dict(state: dict[str, np.ndarray], family: str,
                           dims: dict, head_dim: int, padded_vocab: int,
                           part: str | None = None) -> dict:
  """bertjax parameters (nested numpy arrays) from ``family``'s tensors,
  each layer with the heads its tensors hold (``head_dim`` wide); raises
  ConversionError naming any tensor missing."""
  table = rules(family, dims, part)
  missing = [hf for hf, _, _ in table if hf not in state]
  if missing:
    raise ConversionError(
        f'the checkpoint lacks {len(missing)} tensor(s) that '
        f'{ARCHITECTURES[(family, part)]} has, e.g. {missing[:3]}; is it '
        'a checkpoint of that class?')
  params: dict = {}
  fused: dict = {}
  for hf, path, conversion in table:
    value = np.asarray(state[hf], np.float32)
    if isinstance(conversion, tuple):   # Collect Q, K, V (or Q, K), fuse.
      fused.setdefault(path, {})[conversion[1]] = value
      continue
    _set(params, path, _from_hf([value], conversion, padded_vocab, head_dim))
  for path, parts in fused.items():
    parts = [parts[i] for i in sorted(parts)]
    if path[-1].endswith('_kernel'):   # [H*K, D] x 3 -> [D, 3, H, K].
      d = parts[0].shape[1]
      _set(params, path, np.stack([w.T.reshape(d, -1, head_dim)
                                   for w in parts], axis=1))
    else:                              # [H*K] x 3 -> [3, H, K].
      _set(params, path, np.stack([b.reshape(-1, head_dim)
                                   for b in parts]))
  return params


# ---------------------------------------------------------------------------
# Files: safetensors written with numpy; a README of what was left out.


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
  """The tensors of a transformers directory: ``model.safetensors`` (read
  with numpy), or ``pytorch_model.bin`` (needs torch)."""
  path = os.path.join(directory, 'model.safetensors')
  if os.path.isfile(path):
    return dict(st_numpy.load_file(path))
  path = os.path.join(directory, 'pytorch_model.bin')
  if os.path.isfile(path):
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ConversionError(
          f'{path!r} is a PyTorch pickle: reading it needs torch '
          "(pip install '.[bench]'), or convert it to model.safetensors."
      ) from e
    state = torch.load(path, map_location='cpu', weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}
  raise ConversionError(f'{directory!r} has neither model.safetensors nor '
                        'pytorch_model.bin.')


def write_model(directory: str, state: dict[str, np.ndarray], config: dict
                ) -> list[str]:
  """``model.safetensors`` and ``config.json`` in ``directory``."""
  os.makedirs(directory, exist_ok=True)
  st_numpy.save_file(state, os.path.join(directory, 'model.safetensors'),
                     metadata={'format': 'pt'})
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)
  return ['model.safetensors', 'config.json']


def left_out(cfg, family: str) -> list[str]:
  """What ``cfg``'s model has that ``family``'s class lacks."""
  out = []
  if cfg.objective.name == objectives.bert.NAME and cfg.objective.sbo_weight:
    out.append(_LEFT_OUT['sbo'])
  if family == 'roberta':
    out.append(_LEFT_OUT['nsp'])
  if cfg.objective.name in ('tinybert', 'mobilebert'):
    out.append(_LEFT_OUT[cfg.objective.name])
  return out


# ---------------------------------------------------------------------------
# A run's export.


def export_run(workdir: str, out_dir: str, step: int | None = None,
               family: str | None = None) -> list[str]:
  """Writes ``workdir``'s checkpoint at ``step`` (default: the latest) as a
  transformers directory in ``out_dir`` (for ELECTRA, ``discriminator/``
  and ``generator/`` in it), with the run's tokenizer. Returns the
  directories written. ``out_dir`` (local or ``gs://``) must not exist yet:
  an export never overwrites anything; it is written beside and renamed
  into place (for a bucket: written locally, then each file uploaded
  whole, each ``config.json`` last, so that what a loader can open is
  complete; a failed upload removes what it uploaded)."""
  if storage.exists(out_dir):
    raise ConversionError(f'{out_dir!r} exists; export into a new directory '
                          '(an export never overwrites).')
  run = runs.load_run(workdir, step)
  cfg = run.config
  family = family or family_of(cfg)
  check_family(cfg, family)
  if family == 'distilbert':
    _check_distilbert(encoder_config(cfg, run.vocab_size))
  tokenizer = tokenizer_lib.Tokenizer.load(run.tokenizer_path)
  parts = ('discriminator', 'generator') if family == 'electra' else (None,)
  remote = storage.is_remote(out_dir)
  staging = (os.path.join(tempfile.mkdtemp(prefix='bertjax-export-'), 'out')
             if remote else f'{out_dir.rstrip(os.sep)}.partial{os.getpid()}')
  written = []
  try:
    for part in parts:
      directory = os.path.join(staging, part) if part else staging
      write_model(directory, hf_state_dict(run.params, cfg, family,
                                           run.vocab_size, part),
                  hf_config(cfg, family, run.vocab_size, part=part))
      hf_tokenizer.save_tokenizer(tokenizer, directory, family,
                                  model_max_length=cfg.data.max_seq_length)
      _write_readme(directory, run, family, part, left_out(cfg, family))
      written.append(os.path.join(out_dir, part) if part else out_dir)
    if remote:
      _upload(staging, out_dir)
    else:
      os.replace(staging, out_dir)
  finally:   # A failed export leaves nothing behind; a finished one, no copy.
    shutil.rmtree(os.path.dirname(staging) if remote else staging,
                  ignore_errors=True)
  return written


def _upload(staging: str, out_dir: str) -> None:
  """Uploads local directory ``staging`` as ``out_dir`` (which did not
  exist): transformers opens a directory by its ``config.json``, so those
  go last; on a failure the objects uploaded are removed."""
  files = sorted(storage.find(staging),
                 key=lambda p: (os.path.basename(p) == 'config.json', p))
  try:
    for path in files:
      storage.upload(path, os.path.join(out_dir,
                                        os.path.relpath(path, staging)))
  except BaseException:
    with contextlib.suppress(Exception):
      storage.rmtree(out_dir)
    raise


def _write_readme(directory: str, run, family: str, part, omitted) -> None:
  architecture = ARCHITECTURES[(family, part)]
  lines = [
      f'# {architecture} exported by bertjax', '',
      f'From the run in `{os.path.basename(storage.absolute(run.workdir))}` '
      f'at step {run.step} (objective `{run.config.objective.name}`).', '',
      '```python',
      'import transformers',
      f'model = transformers.{architecture}.from_pretrained(PATH)',
      'tokenizer = transformers.AutoTokenizer.from_pretrained(PATH)',
      '```', '',
      'The tokenizer is the run\'s SentencePiece model (also saved here for '
      're-import into bertjax): [CLS] A [SEP] B [SEP], with [PAD], [UNK], '
      '[CLS], [SEP], [MASK] at ids 0-4. The vocabulary tables hold the '
      f'tokenizer\'s {run.vocab_size} ids (bertjax pads its tables to a '
      'multiple of 128 with rows no input reaches).',
  ]
  if family in ('bert', 'ernie', 'mobilebert') and (
      not run.config.objective.nsp_weight):
    lines += ['', f'The pooler and the NSP head (`{family}.pooler`, '
              '`cls.seq_relationship`) are as initialized: the run trained '
              'without NSP (`objective.nsp_weight=0`).']
  if family == 'ernie':
    lines += ['', 'Task embedding (ERNIE 2.0): pass `task_type_ids` '
              '[batch, seq] with ids 0 to '
              f'{run.config.model.task_type_vocab_size - 1}; without them '
              'every token takes task 0, as bertjax\'s fine-tuning does.']
    if continual_lib.is_continual(run.config):
      lines += ['', 'The pretraining streams\' task ids: ' + ', '.join(
          f'{task_id} `{name}` ({", ".join(s.tasks) or "MLM"}'
          f'{" + MLM" if s.tasks and s.mlm else ""})'
          for task_id, (name, s) in enumerate(
              (n, run.config.continual.streams[n])
              for n in continual_lib.stream_order(run.config))) + '.']
  if family == 'roberta':
    lines += ['', 'Position ids start at pad_token_id + 1 = 1, as '
              "RoBERTa's do; row 0 of the position table is unused."]
  if family == 'mobilebert':
    lines += ['', '`transformers.MobileBertModel.from_pretrained(PATH)` loads '
              'the encoder alone. The pooler is a dense layer and tanh '
              '(`classifier_activation=True`, which bertjax\'s NSP head '
              'reads); google-research\'s MobileBERT configs pool the raw '
              '[CLS] state instead.']
  if omitted:
    lines += ['', 'Not exported (this class has no place for it):', '']
    lines += [f'- {item}' for item in omitted]
  with open(os.path.join(directory, 'README.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')


# ---------------------------------------------------------------------------
# A transformers checkpoint's import.

_GELU = {'gelu': 'exact', 'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh',
         'gelu_fast': 'tanh'}


@dataclasses.dataclass(frozen=True)
class Imported:
  """A transformers checkpoint as a bertjax model: ``config`` (a full
  bertjax config whose ``model`` and ``objective`` match the checkpoint),
  ``params`` (nested numpy arrays, laid out as a run of that config holds
  them; a distillation student under ``params['student']``), and
  ``vocab_size`` (the checkpoint's rows; bertjax's tables are padded)."""
  family: str
  config: object
  params: dict
  vocab_size: int


def _read_config(directory: str) -> dict:
  path = os.path.join(directory, 'config.json')
  if not os.path.isfile(path):
    raise ConversionError(f'{directory!r} has no config.json: not a '
                          'transformers model directory.')
  with open(path) as f:
    return json.load(f)


def _family_and_part(hf: dict) -> tuple[str, str | None]:
  names = {arch: key for key, arch in ARCHITECTURES.items()}
  for arch in hf.get('architectures') or ():
    if arch in names:
      return names[arch]
  raise ConversionError(
      f'architectures={hf.get("architectures")}; bertjax imports '
      f'{sorted(names)}.')


def _gelu(hf: dict, key: str) -> str:
  act = hf.get(key, 'gelu')
  if act not in _GELU:
    raise ConversionError(f'{key}={act!r}: bertjax layers use GELU '
                          f'({sorted(_GELU)}).')
  return _GELU[act]


def _encoder_fields(cfg, hf: dict) -> None:
  m = cfg.model
  m.hidden_size = hf['hidden_size']
  m.num_layers = hf['num_hidden_layers']
  m.num_heads = hf['num_attention_heads']
  m.intermediate_size = hf['intermediate_size']
  m.type_vocab_size = hf.get('type_vocab_size', 2)
  m.layer_norm_epsilon = hf.get('layer_norm_eps', 1e-12)
  m.hidden_dropout_rate = hf.get('hidden_dropout_prob', 0.1)
  m.attention_dropout_rate = hf.get('attention_probs_dropout_prob', 0.1)
  if hf.get('hidden_act') == 'relu':
    m.hidden_act = 'relu'
  else:
    m.gelu = _gelu(hf, 'hidden_act')
  m.max_position_embeddings = hf['max_position_embeddings']


def import_model(directory: str, generator_directory: str | None = None
                 ) -> Imported:
  """The transformers checkpoint in ``directory`` as bertjax parameters.

  ELECTRA's two networks are two checkpoints: ``directory`` holds
  ``ElectraForPreTraining`` (the discriminator) and ``generator_directory``
  ``ElectraForMaskedLM``; their shared embeddings are taken from the
  discriminator and must equal the generator's.
  """
  hf = _read_config(directory)
  family, part = _family_and_part(hf)
  if family == 'electra' and (part != 'discriminator'
                              or not generator_directory):
    raise ConversionError(
        'ELECTRA is two checkpoints: give the ElectraForPreTraining '
        '(discriminator) directory and, as the generator directory, the '
        'ElectraForMaskedLM one.')
  state = read_state_dict(directory)
  vocab_size = hf['vocab_size']
  padded = tokenizer_lib.padded_vocab_size(vocab_size)
  generator_hf = (_read_config(generator_directory) if family == 'electra'
                  else None)
  cfg = _config_from_hf(hf, family, generator_hf)
  if family != 'distilbert':   # A student's run also names its teacher.
    config_lib.validate(cfg)
  model_cfg = encoder_config(cfg, vocab_size)
  dims = _dims(cfg, model_cfg)
  if family == 'roberta':
    dims['pad_token_id'] = hf.get('pad_token_id', 1)
  _check_tied(hf, state, family, part, dims)
  params = params_from_state_dict(state, family, dims, model_cfg.head_dim,
                                  padded, part)
  if hf.get(PRUNED_HEADS):
    params, cfg = _pruned(params, cfg, model_cfg, hf[PRUNED_HEADS])
  if family == 'electra':
    params = _with_generator(params, cfg, generator_hf, generator_directory,
                             dims, padded)
  if family == 'distilbert':
    params = {'student': params}
  return Imported(family, cfg, params, vocab_size)


def _check_tied(hf: dict, state: dict, family: str, part, dims) -> None:
  """bertjax's MLM decoder is the word table: a checkpoint whose decoder
  is its own (``tie_word_embeddings`` false, or other values) is refused,
  as importing it would drop that decoder."""
  word = next(name for name, path, _ in rules(family, dims, part)
              if path == ('embeddings', 'word', 'embedding'))
  for name in TIED.get((family, part), TIED.get(family, ())):
    if hf.get('tie_word_embeddings', True) is False or (
        name in state and not np.array_equal(state[name], state[word])):
      raise ConversionError(
          f'{name} is not tied to {word} (tie_word_embeddings='
          f"{hf.get('tie_word_embeddings', True)}): bertjax's MLM decoder "
          "is the word table, so this checkpoint's own decoder would be "
          'lost.')


def _pruned(params: dict, cfg, model_cfg, pruned: dict):
  """An export of a pruned model (its heads written as zeros, named in
  ``PRUNED_HEADS``) made small again."""
  remove = {int(layer): [int(h) for h in heads]
            for layer, heads in pruned.items()}
  for layer, heads in remove.items():
    attention = params.get(f'layer_{layer}', {}).get('attention', {})
    if any(np.any(attention[key][index]) for key, index in (
        ('qkv_kernel', np.s_[:, :, heads]), ('qkv_bias', np.s_[:, heads]),
        ('out_kernel', np.s_[heads])) if key in attention):
      raise ConversionError(
          f'config.json names heads {heads} of layer {layer} as pruned '
          f'({PRUNED_HEADS}), but their weights are not zero: the model '
          'was trained after its export. Delete that entry to import it '
          'with every head.')
  try:
    params, model_cfg = pruning.remove_heads(params, model_cfg, remove)
  except ValueError as e:
    raise ConversionError(f'{PRUNED_HEADS}: {e}') from e
  cfg.model.pruned_heads = model_cfg.pruned_heads
  config_lib.validate(cfg)
  return params, cfg


def _config_from_hf(hf: dict, family: str, generator_hf: dict | None):
  """A bertjax config for the transformers ``config.json`` ``hf`` of
  ``family`` (ELECTRA's generator's in ``generator_hf``)."""
  cfg = config_lib.base_config()
  if family == 'distilbert':
    _distilbert_fields(cfg, hf)
  else:
    _encoder_fields(cfg, hf)
  if family == 'roberta':
    offset = hf.get('pad_token_id', 1) + 1
    cfg.model.max_position_embeddings -= offset
    cfg.objective.nsp_weight = 0.0
    cfg.data.layout = 'full_sentences'
  if family == 'ernie' and hf.get('use_task_id'):
    cfg.model.task_type_vocab_size = hf['task_type_vocab_size']
  if family == 'albert':
    if hf.get('inner_group_num', 1) != 1:
      raise ConversionError(f'inner_group_num={hf["inner_group_num"]}: '
                            'bertjax shares whole layers (1).')
    cfg.model.embedding_size = hf['embedding_size']
    cfg.model.num_layer_groups = hf.get('num_hidden_groups', 1)
    albert_groups_check(hf['num_hidden_layers'],
                        cfg.model.num_layer_groups)
    if cfg.model.embedding_size == cfg.model.hidden_size:
      raise ConversionError('an ALBERT checkpoint with embedding_size == '
                            'hidden_size: bertjax has no projection then.')
  if family == 'mobilebert':
    _mobilebert_fields(cfg.model, hf)
  if family == 'electra':
    cfg.objective.name = electra_objective.NAME
    cfg.model.gelu = 'exact'
    if hf['embedding_size'] != hf['hidden_size']:
      cfg.model.embedding_size = hf['embedding_size']
    cfg.electra.generator_hidden_fraction = (generator_hf['hidden_size']
                                             / hf['hidden_size'])
    cfg.electra.generator_layers_fraction = (
        generator_hf['num_hidden_layers'] / hf['num_hidden_layers'])
  cfg.data.max_seq_length = min(cfg.data.max_seq_length,
                                cfg.model.max_position_embeddings)
  return cfg


def _mobilebert_fields(m, hf: dict) -> None:
  """MobileBERT's options in the ``model`` section ``m`` from its
  ``config.json`` ``hf`` (transformers' defaults where a key is missing)."""
  if not hf.get('trigram_input', True):
    raise ConversionError('trigram_input=False: bertjax builds '
                          "MobileBERT's embedding with the trigram only.")
  if not hf.get('classifier_activation', True):
    raise ConversionError(
        'classifier_activation=False (the pooled output is the raw [CLS] '
        "state): bertjax's NSP head reads a dense + tanh pooler.")
  bottleneck = hf.get('use_bottleneck', True)
  attention = bottleneck and hf.get('use_bottleneck_attention', False)
  m.embedding_size = hf.get('embedding_size', 128)
  m.trigram_input = True
  m.intra_bottleneck_size = (hf.get('intra_bottleneck_size', 128)
                             if bottleneck else 0)
  m.bottleneck_attention = attention
  # With bottleneck attention, transformers keeps a shared bottleneck it
  # never uses; bertjax has none.
  m.key_query_shared_bottleneck = bool(
      bottleneck and not attention
      and hf.get('key_query_shared_bottleneck', True))
  m.num_feedforward_networks = hf.get('num_feedforward_networks', 4)
  m.normalization = hf.get('normalization_type', 'no_norm')
  _check_mobilebert(m)


def _distilbert_fields(cfg, hf: dict) -> None:
  """A DistilBERT student's architecture, as an imported distillation run
  carries it (in ``model``; it has no teacher)."""
  m = cfg.model
  m.hidden_size, m.num_layers = hf['dim'], hf['n_layers']
  m.num_heads, m.intermediate_size = hf['n_heads'], hf['hidden_dim']
  m.max_position_embeddings = hf['max_position_embeddings']
  m.hidden_dropout_rate = hf.get('dropout', 0.1)
  m.attention_dropout_rate = hf.get('attention_dropout', 0.1)
  m.gelu = _gelu(hf, 'activation')
  if hf.get('sinusoidal_pos_embds'):
    raise ConversionError('sinusoidal_pos_embds=True: bertjax learns its '
                          'position embeddings.')
  cfg.objective.name = distillation.NAME
  cfg.distillation.student_layers = hf['n_layers']


def _with_generator(params: dict, cfg, gen: dict, generator_directory: str,
                    dims: dict, padded: int) -> dict:
  """ELECTRA's discriminator ``params`` with its generator's, read from
  ``generator_directory`` (config ``gen``): the generator must be the one
  bertjax builds from the fractions, and its embeddings the shared ones."""
  _, generator = electra_objective.model_configs(cfg, padded)
  if (generator.hidden_size, generator.num_layers, generator.num_heads,
      generator.intermediate_size) != (
          gen['hidden_size'], gen['num_hidden_layers'],
          gen['num_attention_heads'], gen['intermediate_size']):
    raise ConversionError(
        f'the generator is {gen["num_hidden_layers"]} x '
        f'{gen["hidden_size"]} with {gen["num_attention_heads"]} heads and '
        f'FFN {gen["intermediate_size"]}; bertjax builds ELECTRA\'s '
        f'generator as {generator.num_layers} x {generator.hidden_size}, '
        f'{generator.num_heads} heads (width // 64), FFN 4 x width.')
  generator_params = params_from_state_dict(
      read_state_dict(generator_directory), 'electra', dims,
      generator.head_dim, padded, 'generator')
  params = dict(params)
  for name, value in generator_params.items():
    if name != 'embeddings':
      params[name] = value
      continue
    for a, b in zip(jax_leaves(value), jax_leaves(params[name])):
      if not np.array_equal(a, b):
        raise ConversionError('the generator\'s embeddings differ from '
                              'the discriminator\'s; bertjax shares one '
                              'table.')
  return params


def jax_leaves(tree) -> list:
  return jax.tree.leaves(tree)


def _run_params(cfg, vocab_size: int, imported: set[str]) -> dict:
  """The parameters a run of ``cfg`` holds: initialised from the config's
  seed where some are not among ``imported`` (paths as
  ``jax.tree_util.keystr`` gives them), else only their shapes (the
  checkpoint gives every value; compiling the init would be wasted)."""
  task = objectives.get(cfg.objective.name).make_task(cfg, vocab_size)
  dummy = {k: jnp.zeros(shape, dtype) for k, (shape, dtype)
           in pipeline.batch_spec(cfg, num_rows=1).items()}
  init = lambda: task.init(jax.random.key(cfg.seed), dummy)
  abstract = sharding.strip_boxes(jax.eval_shape(init))
  if {jax.tree_util.keystr(p) for p, _ in
      jax.tree_util.tree_flatten_with_path(abstract)[0]} <= imported:
    return abstract
  return sharding.strip_boxes(jax.jit(init)())


def write_import(imported: Imported, tokenizer, out_dir: str,
                 source: str) -> str:
  """A directory that a bertjax run starts from: ``config.json`` (the
  checkpoint's model, ``init_from`` this directory, its tokenizer),
  ``tokenizer.model`` and the parameters as a step-0 checkpoint. Heads the
  checkpoint lacks (RoBERTa's pooler and NSP layer, unused without NSP) are
  initialised from the config's seed. Returns the config's path."""
  if imported.family == 'distilbert':
    raise ConversionError(
        'DistilBERT trains by distillation from a teacher run '
        '(distillation.teacher_workdir); an imported student has none to '
        'continue with.')
  if storage.exists(out_dir):
    raise ConversionError(f'{out_dir!r} exists; import into a new '
                          'directory.')
  if tokenizer.vocab_size != imported.vocab_size:
    raise ConversionError(
        f'the tokenizer has {tokenizer.vocab_size} pieces and the '
        f'checkpoint {imported.vocab_size} rows: they are not a pair.')
  out_dir = storage.absolute(out_dir)
  cfg = config_lib.from_saved(imported.config.to_dict())
  cfg.init_from = out_dir
  cfg.data.tokenizer.model_path = os.path.join(out_dir, 'tokenizer.model')
  flat_imported = {jax.tree_util.keystr(p): v for p, v in
                   jax.tree_util.tree_flatten_with_path(imported.params)[0]}
  fresh = _run_params(cfg, imported.vocab_size, set(flat_imported))
  used = set()

  def pick(path, leaf):
    key = jax.tree_util.keystr(path)
    if key not in flat_imported:
      return np.asarray(leaf)
    used.add(key)
    value = flat_imported[key]
    if value.shape != leaf.shape:
      raise ConversionError(f'{key}: the checkpoint has {value.shape}, the '
                            f'model {leaf.shape}.')
    return value

  params = jax.tree_util.tree_map_with_path(pick, fresh)
  unused = sorted(set(flat_imported) - used)
  if unused:
    raise ConversionError(f'the model has no place for {unused[:3]}.')
  storage.makedirs(out_dir)
  tokenizer.save(cfg.data.tokenizer.model_path)
  checkpoint.save_params(out_dir, params, source)
  path = os.path.join(out_dir, 'config.json')
  storage.write_text(path, json.dumps(cfg.to_dict(), indent=2,
                                      sort_keys=True))
  return path
