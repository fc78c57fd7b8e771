"""Every field of config_lib.base_config() is checked by config_lib.validate.

INVALID holds bad values for every field that has any, ANY_VALUE the fields
that take any value of their type; a field added to base_config() must join
one of them. Each bad value is set on demo_config() (with the context it
needs, e.g. objective.name='electra' for electra.*), and validate must fail
with a message that names the field and what it may be.
"""

import dataclasses
import glob
import json
import math
import os
import re
from typing import Any

import ml_collections
import pytest

from bertjax import config_lib
from bertjax.objectives import auxiliary
import preset_helpers

# Paths that exist: validate checks only that a directory or file is there.
_DIR = os.path.dirname(os.path.abspath(__file__))
_FILE = os.path.abspath(__file__)


@dataclasses.dataclass(frozen=True)
class _With:
  """A bad value that is bad only with other fields set (``context``)."""
  value: Any
  context: dict


_ELECTRA = {'objective.name': 'electra'}
_DISTILLATION = {'objective.name': 'distillation',
                 'distillation.teacher_workdir': _DIR}
# A directory that is no run: the checks that read the teacher wait for
# prepare_config, which names what it lacks.
_TINYBERT = {'objective.name': 'tinybert', 'tinybert.teacher_workdir': _DIR}
_MOBILEBERT = {'objective.name': 'mobilebert',
               'mobilebert.teacher_workdir': _DIR}
# A transfer of 2 steps (1 per layer) before 1198 of distillation.
_MOBILEBERT_SHORT = dict(_MOBILEBERT, **{'mobilebert.steps_per_layer': 1,
                                         'optimizer.hold_steps': 2})
_FILES = {'data.corpus.source': 'files', 'data.corpus.path': _DIR}
_TFDS = {'data.corpus.source': 'tfds',
         'data.corpus.tfds_name': 'wikipedia/20230601.en:text'}
_SPAN_BOUNDARY = {'objective.sbo_weight': 1.0}
# MobileBERT's two ways of reading the attention from the bottleneck, at
# once (the demo is 128 wide with 2 heads).
_BOTH_BOTTLENECKS = {'model.intra_bottleneck_size': 64,
                     'model.key_query_shared_bottleneck': True}
# A discriminator whose half width (129) its two generator heads do not
# divide.
_ODD_GENERATOR = dict(_ELECTRA, **{'model.hidden_size': 258})


def _on(task: str, layout: str = '') -> dict:
  """Task ``task`` on (its knobs are checked only then), on the ``layout``
  it needs ('' = the demo's), NSP off there (the task labels the pair, or
  there is no pair)."""
  if not layout:
    return {f'tasks.{task}.weight': 1.0}
  return {'data.layout': layout, 'objective.nsp_weight': 0.0,
          f'tasks.{task}.weight': 1.0}


def _stream(**fields) -> ml_collections.ConfigDict:
  s = auxiliary.stream_defaults()
  s.update(fields)
  return s


# Two streams: masked LM from stage 0, sentence reordering joining at 1.
_STREAMS = {'mlm': _stream(),
            'reorder': _stream(tasks=('sentence_reordering',), mlm=False,
                               layout='full_sentences', first_stage=1)}
_CONTINUAL = {'tasks.sentence_reordering.weight': 1.0,
              'data.layout': 'full_sentences', 'objective.nsp_weight': 0.0,
              'continual.stage_steps': (600, 600),
              'continual.streams': _STREAMS,
              'model.task_type_vocab_size': 2}

# demo_config(): tiny (2 layers, width 128, 2 heads), 128 positions and
# tokens, layout 'nsp', batch 32, 1200 steps, 100 warmup steps.
INVALID = {
    'seed': [-1, 2**32],
    'step_rng': ['philox'],
    'batch_size': [0],
    'total_steps': [0],
    'num_train_steps': [-1, 1201],
    'init_from': ['/no/such/workdir', _FILE],
    'model.size': ['huge'],
    'model.hidden_size': [-1, 129],
    'model.num_layers': [-1],
    'model.num_heads': [-1, 3],
    'model.intermediate_size': [-1],
    'model.embedding_size': [-1],
    'model.num_layer_groups': [-1, 3],
    'model.sbo_positions': [-1, _With(0, _SPAN_BOUNDARY)],
    'model.sbo_position_width': [-1],
    'model.trigram_input': [_With(True, _ELECTRA)],
    'model.intra_bottleneck_size': [-1, 3, _With(16, _ELECTRA)],
    'model.bottleneck_attention': [True, _With(True, _BOTH_BOTTLENECKS)],
    'model.key_query_shared_bottleneck': [True],   # No bottleneck.
    'model.num_feedforward_networks': [0, _With(2, _ELECTRA)],
    'model.normalization': ['batch_norm', _With('no_norm', _ELECTRA)],
    'model.hidden_act': ['tanh', _With('relu', _ELECTRA)],
    'model.max_position_embeddings': [0, 64],
    'model.type_vocab_size': [-1, 1],   # 1: segment B has type 1.
    'model.task_type_vocab_size': [-1, _With(1, _CONTINUAL)],   # 2 streams.
    'model.hidden_dropout_rate': [-0.1, 1.0],
    'model.attention_dropout_rate': [-0.1, 1.0],
    'model.layer_norm_epsilon': [0.0, -1e-12],
    'model.gelu': ['relu'],
    'model.dtype': ['float16'],
    'model.param_dtype': ['float16'],
    'model.remat': ['some'],
    'model.scan_layers': [_With(True, _ELECTRA),
                          _With(True, {'model.num_layer_groups': 1})],
    # Pairs need to attend; so does a task that labels the row's order.
    'model.attend_across_documents': [
        False, _With(False, _on('sentence_reordering', 'full_sentences'))],
    'model.attention': ['flash'],
    # The demo's 2 layers of 2 heads.
    'model.pruned_heads': [((0,),), ((0, 1), ()), ((2,), ()), ((-1,), ()),
                           _With(((0,), ()), _ELECTRA),
                           _With(((0,), ()), {'model.scan_layers': True}),
                           _With(((0,), ()), {'model.num_layer_groups': 1}),
                           _With(((0,), ()),
                                 {'model.num_feedforward_networks': 2})],
    'model.layerdrop': [-0.1, 1.0, _With(0.2, _ELECTRA),
                        _With(0.2, {'model.scan_layers': True})],
    'model.quantize': ['int4', _With('int8', _ELECTRA),
                       _With('int8', {'model.trigram_input': True})],
    'model.quantize_layers': [_With('layer_(', {'model.quantize': 'int8'}),
                              _With('layers_0/.*', {'model.quantize':
                                                    'int8'})],
    'objective.name': ['t5'],
    'objective.mlm_weight': [-1.0, _With(0.0, {'objective.nsp_weight': 0.0})],
    # 1.0 with pairs in no stream, then in one of two.
    'objective.nsp_weight': [-1.0, _With(1.0, {'data.layout':
                                              'full_sentences',
                                              'objective.nsp_weight': 0.0}),
                             _With(1.0, {'data.layout': 'doc_sentences',
                                         'objective.nsp_weight': 0.0}),
                             _With(1.0, {**_CONTINUAL, 'data.layout': 'nsp'})],
    'objective.sbo_weight': [-1.0],
    'objective.sbo_count_offset': [-1.0],
    'electra.generator_hidden_fraction': [
        _With(0.0, _ELECTRA), _With(1.5, _ELECTRA),
        _With(0.001, _ELECTRA),            # round(0.128) = 0 units.
        _With(0.5, _ODD_GENERATOR)],
    'electra.generator_layers_fraction': [
        _With(0.0, _ELECTRA), _With(2.0, _ELECTRA),
        _With(0.1, _ELECTRA)],             # round(0.2) = 0 layers.
    'electra.mask_prob': [_With(0.0, _ELECTRA), _With(1.0, _ELECTRA),
                          _With(0.001, _ELECTRA)],   # No slot in 128.
    'electra.mask_token_prob': [_With(-0.1, _ELECTRA), _With(1.5, _ELECTRA)],
    'electra.temperature': [_With(0.0, _ELECTRA)],
    'electra.generator_weight': [
        _With(-1.0, _ELECTRA),
        _With(0.0, dict(_ELECTRA, **{'electra.discriminator_weight': 0.0}))],
    'electra.discriminator_weight': [_With(-1.0, _ELECTRA)],
    'distillation.teacher_workdir': [_With('', _DISTILLATION),
                                     _With('/no/such/teacher', _DISTILLATION)],
    'distillation.student_layers': [_With(-1, _DISTILLATION)],
    'distillation.temperature': [_With(0.0, _DISTILLATION)],
    'distillation.kl_weight': [
        _With(-1.0, _DISTILLATION),
        _With(0.0, dict(_DISTILLATION, **{'distillation.mlm_weight': 0.0,
                                          'distillation.cosine_weight': 0.0}))],
    'distillation.mlm_weight': [_With(-1.0, _DISTILLATION)],
    'distillation.cosine_weight': [_With(-1.0, _DISTILLATION)],
    'tinybert.teacher_workdir': [_With('', _TINYBERT),
                                 _With('/no/such/teacher', _TINYBERT)],
    'tinybert.layer_map': [_With((1,), _TINYBERT), _With((2, 1), _TINYBERT),
                           _With((0, 2), _TINYBERT)],
    'tinybert.temperature': [_With(0.0, _TINYBERT)],
    'tinybert.embedding_weight': [
        _With(-1.0, _TINYBERT),
        _With(0.0, dict(_TINYBERT, **{
            'tinybert.hidden_weight': 0.0, 'tinybert.attention_weight': 0.0,
            'tinybert.prediction_weight': 0.0,
            'tinybert.intermediate_steps': 1200}))],
    'tinybert.hidden_weight': [_With(-1.0, _TINYBERT)],
    'tinybert.attention_weight': [_With(-1.0, _TINYBERT)],
    'tinybert.prediction_weight': [_With(-1.0, _TINYBERT)],
    'tinybert.mlm_weight': [_With(-1.0, _TINYBERT)],
    'tinybert.intermediate_steps': [_With(-1, _TINYBERT)],
    'mobilebert.teacher_workdir': [_With('', _MOBILEBERT),
                                   _With('/no/such/teacher', _MOBILEBERT)],
    'mobilebert.steps_per_layer': [_With(-1, _MOBILEBERT),
                                   _With(2, _MOBILEBERT_SHORT)],  # Hold 2.
    'mobilebert.hidden_weight': [
        _With(-1.0, _MOBILEBERT),
        _With(0.0, dict(_MOBILEBERT, **{
            'mobilebert.attention_weight': 0.0, 'mobilebert.mean_weight': 0.0,
            'mobilebert.variance_weight': 0.0}))],
    'mobilebert.attention_weight': [_With(-1.0, _MOBILEBERT)],
    'mobilebert.mean_weight': [_With(-1.0, _MOBILEBERT)],
    'mobilebert.variance_weight': [_With(-1.0, _MOBILEBERT)],
    'mobilebert.current_lr_scale': [_With(0.0, _MOBILEBERT)],
    'mobilebert.lower_lr_scale': [_With(-0.1, _MOBILEBERT)],
    'mobilebert.ground_truth_ratio': [_With(-0.1, _MOBILEBERT),
                                      _With(1.5, _MOBILEBERT)],
    'optimizer.grad_clip': ['per_layer'],
    'data.corpus.source': ['web'],
    'data.corpus.path': [_With('', _FILES)],
    'data.corpus.text_format': [_With('xml', _FILES)],
    'data.corpus.tfds_name': [_With('', _TFDS), _With('wikipedia', _TFDS)],
    'data.corpus.tfds_split': [_With('', _TFDS)],
    'data.corpus.max_documents': [-1],
    'data.mixture': [{'only': config_lib.corpus_config()},
                     {'a': config_lib.corpus_config(),
                      'b': config_lib.corpus_config(source='web')}],
    'data.mixture_exponent': [-0.1, 1.5],
    'data.tokenizer.model_path': ['/no/such/model'],
    'data.tokenizer.vocab_size': [5],
    'data.tokenizer.model_type': ['wordpiece'],
    'data.tokenizer.max_sentences': [0],
    'data.tokenizer.sample_seed': [-1],
    'data.data_dir': [''],
    'data.gazetteer_path': ['/no/such/gazetteer'],
    'data.eval_fraction': [0.0, 1.0],
    'data.split_seed': [-1, 2**63],
    # The last two: their pair labels are tasks' classes, not NSP's.
    'data.layout': ['packed', 'discourse', 'sentence_distance'],
    'data.max_seq_length': [4, 256],
    'data.short_seq_prob': [-0.1, 1.5],
    'data.dupe_factor': [0],
    'data.docs_per_shard': [0],
    'data.prepare_workers': [-1],
    'data.num_threads': [0],
    'data.num_workers': [-1],
    'data.prefetch_batches': [-1],
    'masking.strategy': ['random', 'entity'],   # entity: no units given.
    'masking.rate': [0.0, 1.0],
    'masking.max_predictions_per_seq': [0, 129],
    'masking.mask_token_prob': [-0.1, 0.95],    # 0.95 + 0.1 > 1.
    'masking.random_token_prob': [-0.1, 0.3],
    'masking.corruption_unit': ['word'],
    'masking.random_source': ['zipf'],
    'masking.max_ngram': [0],
    'masking.span_geometric_p': [0.0, 1.5],
    'masking.span_lower': [0, 11],
    'masking.span_upper': [0],
    'masking.entity_mixture': [(0.5, 0.5), (0.5, 0.6, 0.1),
                               (-0.5, 0.5, 1.0)],
    'masking.audit_tolerance': [-0.1],
    'masking.split_punctuation': [True],   # The demo masks tokens.
    'optimizer.name': ['sgd'],
    'optimizer.schedule': ['cosine'],
    'optimizer.learning_rate': [0.0, -1e-3],
    'optimizer.warmup_steps': [-1, 1201],
    'optimizer.hold_steps': [-1, 1201, 1150,   # 1150: no room for 100 warmup.
                             _With(5, _MOBILEBERT_SHORT)],   # Not 2.
    'optimizer.b1': [-0.1, 1.0],
    'optimizer.b2': [-0.1, 1.0],
    'optimizer.eps': [0.0],
    'optimizer.weight_decay': [-0.01],
    'optimizer.decay_mask': ['biases'],
    'optimizer.grad_clip_norm': [-1.0],
    'sharding.mesh_shape': [(1, 1), (0, 1, 1), (-1, -1, 1)],
    'sharding.replicas': [0],
    'sharding.rules': [(('embed', 'model'),), (('embed',),),
                       (('embed', ('fsdp', 1)),)],
    'eval.num_batches': [0],
    # 1.0: a continual run whose streams do not build it.
    'tasks.token_deletion.weight': [-1.0, _With(1.0, _CONTINUAL)],
    'tasks.token_deletion.rate': [_With(0.0, _on('token_deletion')),
                                  _With(1.5, _on('token_deletion'))],
    'tasks.token_insertion.weight': [-1.0],
    'tasks.token_insertion.rate': [_With(0.0, _on('token_insertion')),
                                   _With(1.5, _on('token_insertion'))],
    'tasks.token_replacement.weight': [-1.0],
    'tasks.token_replacement.rate': [_With(0.0, _on('token_replacement')),
                                     _With(1.5, _on('token_replacement'))],
    # 1.0: shuffled tokens would carry other tokens' document labels.
    'tasks.token_shuffle.weight': [-1.0, _With(1.0, _on('token_document'))],
    'tasks.token_shuffle.rate': [_With(0.0, _on('token_shuffle')),
                                 _With(1.5, _on('token_shuffle'))],
    'tasks.sentence_permutation.weight': [-1.0],
    'tasks.sentence_permutation.rate': [
        _With(0.0, _on('sentence_permutation')),
        _With(1.5, _on('sentence_permutation'))],
    'tasks.sentence_permutation.max_sentences': [
        _With(1, _on('sentence_permutation'))],
    'tasks.document_rotation.weight': [-1.0],
    'tasks.document_rotation.rate': [
        _With(0.0, _on('document_rotation', 'full_sentences')),
        _With(0.0, _on('document_rotation', 'doc_sentences')),
        _With(1.5, _on('document_rotation', 'full_sentences'))],
    'tasks.sentence_reordering.weight': [-1.0],
    'tasks.sentence_reordering.m': [
        _With(0, _on('sentence_reordering', 'full_sentences')),
        _With(8, _on('sentence_reordering', 'full_sentences'))],
    'tasks.sentence_distance.weight': [-1.0],
    'tasks.sentence_distance.probabilities': [
        _With(p, _on('sentence_distance', 'sentence_distance'))
        for p in [(0.5, 0.5), (0.5, 0.5, 0.5), (0.5, 0.6, -0.1)]],
    'tasks.discourse_relation.weight': [-1.0],
    'tasks.discourse_relation.markers_path': [
        _With('/no/such/markers', _on('discourse_relation', 'discourse'))],
    # 1.0: the input would show the case the task predicts (lowercase off).
    'tasks.capitalization.weight': [-1.0, 1.0],
    'tasks.token_document.weight': [-1.0],
    'continual.stage_steps': [(600, 600),   # No streams.
                              _With((600, 500), _CONTINUAL),   # Sum 1100.
                              _With((1200, 0), _CONTINUAL)],
    'continual.streams': [{'mlm': _stream()}],   # No stage_steps.
    'divergence.policy': ['warn'],
    'divergence.halt_after': [0],
    'divergence.spike_factor': [-1.0, 0.5],
    'divergence.spike_window': [0],
    'log_every_steps': [0],
    'eval_every_steps': [0],
    'checkpoint_every_steps': [0],
    'keep_checkpoints': [0],
}

# Fields that take any value of their type (the type is still checked).
ANY_VALUE = (
    # '' = TFDS's default; the directory is TFDS's to find when it reads.
    'data.corpus.tfds_data_dir',
    # Both are valid (config_check warns about static masks made once).
    'masking.dynamic',
    # Both are valid: case-folded input (the capitalization task's) or not.
    'data.tokenizer.lowercase',
    # One projection (the code's) or two (the paper's).
    'tinybert.share_projection',
    # Each phase's lr multipliers warm up (the reference's), or not.
    'mobilebert.phase_warmup',
)

# A message says what the field may be: a range, a rule or values to use
# (config_check's messages say which to set).
_ALLOWED = re.compile(r'\b(use|must|at least|at most|set)\b', re.IGNORECASE)


def _leaves(section, prefix=''):
  """Dotted names of the fields of ``section``; an empty section (the
  mixture) counts as a field."""
  for key in section:
    value = section[key]
    if isinstance(value, ml_collections.ConfigDict) and value:
      yield from _leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}'


def _config(fields: dict) -> ml_collections.ConfigDict:
  """demo_config() with dotted ``fields`` set, built from a dict so that a
  value of the wrong type gets in (a ConfigDict refuses it, JSON doesn't)."""
  d = config_lib.demo_config().to_dict()
  for key, value in fields.items():
    *parents, leaf = key.split('.')
    section = d
    for p in parents:
      section = section[p]
    if isinstance(value, dict):
      value = {k: v.to_dict() if isinstance(v, ml_collections.ConfigDict)
               else v for k, v in value.items()}
    section[leaf] = value
  return ml_collections.ConfigDict(d)


def _names(field: str, message: str) -> bool:
  """Whether ``message`` names ``field`` (not one that ends with it)."""
  return re.search(rf'(?<![\w.]){re.escape(field)}\b', message) is not None


def _error(fields: dict) -> str:
  with pytest.raises(ValueError) as e:
    config_lib.validate(_config(fields))
  return str(e.value)


def _cases():
  for field, values in INVALID.items():
    for value in values:
      context = value.context if isinstance(value, _With) else {}
      value = value.value if isinstance(value, _With) else value
      shown = sorted(value) if isinstance(value, dict) else value
      yield pytest.param(field, value, context, id=f'{field}={shown!r}')


def test_every_field_is_classified():
  leaves = set(_leaves(config_lib.base_config()))
  assert not set(INVALID) & set(ANY_VALUE)
  assert sorted(leaves - set(INVALID) - set(ANY_VALUE)) == [], (
      'new fields: add bad values to INVALID, or the field to ANY_VALUE')
  assert sorted((set(INVALID) | set(ANY_VALUE)) - leaves) == []


def test_demo_and_every_context_are_valid():
  contexts = [{}] + [v.context for values in INVALID.values() for v in values
                     if isinstance(v, _With)]
  for context in contexts:
    config_lib.validate(_config(context))


@pytest.mark.parametrize('field, value, context', list(_cases()))
def test_bad_value_fails_naming_the_field_and_what_it_may_be(field, value,
                                                            context):
  message = _error({**context, field: value})
  assert _names(field, message), message
  for line in message.splitlines()[1:]:   # One problem a line.
    assert _ALLOWED.search(line), line


def _get(cfg, field: str):
  for key in field.split('.'):
    cfg = cfg[key]
  return cfg


def _wrong_type(default):
  """A value of another type than ``default``'s (an integral float where an
  int is, as a JSON config or a Python file can give)."""
  if isinstance(default, bool):
    return 1
  if isinstance(default, int):
    return float(default)
  if isinstance(default, str):
    return 0
  return 'x'


@pytest.mark.parametrize('field', sorted(_leaves(config_lib.base_config())))
def test_wrong_type_fails_naming_the_field(field):
  message = _error({field: _wrong_type(_get(config_lib.base_config(),
                                            field))})
  assert _names(field, message) and 'has type' in message, message
  assert _ALLOWED.search(message)


def test_every_float_must_be_finite():
  base = config_lib.base_config()
  floats = [f for f in _leaves(base) if isinstance(_get(base, f), float)]
  assert 'optimizer.learning_rate' in floats
  for field in floats:
    for value in (math.nan, math.inf):
      message = _error({field: value})
      assert f'{field}={value!r} is not finite; use a finite number.' in (
          message)


@pytest.mark.parametrize('fields, message', [
    ({'batch_size': 32.0}, 'batch_size=32.0 has type float; use an integer.'),
    ({'batch_size': True}, 'batch_size=True has type bool; use an integer.'),
    ({'model.scan_layers': 1},
     'model.scan_layers=1 has type int; use True or False.'),
    ({'sharding.mesh_shape': (-1, 1.0, 1)},
     'sharding.mesh_shape[1]=1.0 has type float; use an integer.'),
    ({'masking.entity_mixture': (0.5, '0.5', 0.0)},
     "masking.entity_mixture[1]='0.5' has type str; use a finite number."),
    ({'data.mixture': {'a': dict(config_lib.corpus_config().to_dict(),
                                 max_documents=1.5),
                       'b': config_lib.corpus_config()}},
     'data.mixture.a.max_documents=1.5 has type float; use an integer.'),
])
def test_type_messages(fields, message):
  assert message in _error(fields)


def test_lists_stand_for_tuples():
  """A config read back from JSON holds lists."""
  saved = json.loads(json.dumps(config_lib.demo_config().to_dict()))
  config_lib.validate(config_lib.from_saved(saved))


def test_misspelt_and_missing_fields_fail():
  d = config_lib.demo_config().to_dict()
  d['optimizer']['warmup_step'] = 5
  del d['model']['gelu']
  with pytest.raises(ValueError) as e:
    config_lib.validate(ml_collections.ConfigDict(d))
  assert 'optimizer.warmup_step is not a field; use one of [' in str(e.value)
  assert 'model.gelu is missing; use a config built from' in str(e.value)


# ---- Every preset validates, with what it needs from outside.

PRESETS = {
    'bert': [None, 'size=large', 'size=base,phase=2', 'size=large,phase=2'],
    'bert_wwm': [None], 'ngram_masking': [None], 'span_masking': [None],
    'albert': ['size=base', 'size=large', 'size=xlarge', 'size=xxlarge'],
    'spanbert': [None],
    'roberta': ['size=base', 'size=large'],
    'electra': ['size=small', 'size=base'], 'demo': [None],
    'mixture': [None, 'size=base'],
    'ernie': ['stage=word', 'stage=entity', 'stage=mixed'],
    'distilbert': [None],
    'tinybert': ['size=4', 'size=6', 'size=demo', 'size=demo,objective=bert'],
    'compare_small': ['objective=bert', 'objective=roberta',
                      'objective=spanbert', 'objective=albert',
                      'objective=electra'],
    'ernie2': ['size=base', 'size=large', 'size=demo'],
    'mobilebert': ['model=teacher', 'model=mobilebert', 'model=tiny',
                   'model=teacher,size=demo', 'size=demo',
                   'model=tiny,size=demo'],
    'beyond_masking': [f'arm={arm}' for arm in
                       preset_helpers.load_module('beyond_masking').ARMS],
}
# What a preset needs from outside the repo.
_NEEDS = {
    'mixture': {'data.mixture.files.path': _FILE},
    'ernie': {'data.gazetteer_path': _FILE},
    'ernie2': {'data.gazetteer_path': _FILE},
    'distilbert': {'distillation.teacher_workdir': _DIR},
    'tinybert': {'tinybert.teacher_workdir': _DIR},
    'mobilebert': {'mobilebert.teacher_workdir': _DIR},
}
# finetune.validate checks these (task_distill and multitask on top).
NOT_PRETRAINING = ('finetune', 'task_distill', 'multitask')


def test_every_preset_is_listed():
  names = {os.path.basename(p)[:-3] for p in
           glob.glob(os.path.join(preset_helpers.CONFIGS, '*.py'))}
  assert names == set(PRESETS) | set(NOT_PRETRAINING) | {'imported'}


@pytest.mark.parametrize('name, arg', [(n, a) for n, args in PRESETS.items()
                                       for a in args])
def test_preset_is_valid(name, arg):
  c = preset_helpers.load_preset(name, arg)
  config_lib.validate(preset_helpers.set_fields(c, _NEEDS.get(name, {})))


def test_imported_preset_is_valid(tmp_path):
  path = tmp_path / 'config.json'
  path.write_text(json.dumps(config_lib.demo_config().to_dict()))
  config_lib.validate(preset_helpers.load_preset('imported', str(path)))


def test_a_task_on_packed_rows_takes_either_packing():
  """document_rotation trains on doc_sentences as on full_sentences; a pair
  layout is refused naming both packings."""
  config_lib.validate(_config(_on('document_rotation', 'doc_sentences')))
  message = _error({'tasks.document_rotation.weight': 1.0})   # Demo: nsp.
  assert ("tasks.document_rotation needs data.layout='full_sentences' or "
          "'doc_sentences'; got 'nsp'") in message
