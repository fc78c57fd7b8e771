"""Config defaults, the experiment presets, and validation messages."""

import pytest

from bertjax import config_lib
from bertjax import errors
from bertjax import objectives
from bertjax.models import config as model_config_lib
import preset_helpers

_load = preset_helpers.load_module


@pytest.mark.parametrize('arg', ['size=base', 'size=large',
                                 'size=base,phase=2', 'size=large,phase=2',
                                 None])
def test_bert_presets_are_valid_and_paper_exact(arg):
  c = _load('bert').get_config(arg)
  config_lib.validate(c)
  assert c.batch_size == 256 and c.total_steps == 1_000_000
  o = c.optimizer
  assert (o.name, o.learning_rate, o.warmup_steps, o.b1, o.b2, o.eps,
          o.weight_decay, o.grad_clip_norm) == (
              'bert_adamw', 1e-4, 10_000, 0.9, 0.999, 1e-6, 0.01, 1.0)
  assert (c.masking.rate, c.masking.mask_token_prob,
          c.masking.random_token_prob, c.masking.dynamic) == (
              0.15, 0.8, 0.1, False)
  assert (c.data.dupe_factor, c.data.short_seq_prob, c.data.layout) == (
      10, 0.1, 'nsp')
  assert c.model.hidden_dropout_rate == c.model.attention_dropout_rate == 0.1
  if arg and 'phase=2' in arg:
    assert (c.data.max_seq_length, c.masking.max_predictions_per_seq,
            c.num_train_steps) == (512, 80, 1_000_000)
  else:
    assert (c.data.max_seq_length, c.masking.max_predictions_per_seq,
            c.num_train_steps) == (128, 20, 900_000)


def test_bert_preset_rejects_unknown_arg():
  with pytest.raises(ValueError, match='unknown config arg'):
    _load('bert').get_config('sise=base')


@pytest.mark.parametrize('preset', ['demo', 'distilbert'])
def test_a_preset_without_args_refuses_one(preset):
  """demo.py:size=base would otherwise train the demo, size unread."""
  with pytest.raises(ValueError, match="'size'; this config takes none"):
    _load(preset).get_config('size=base')
  assert _load(preset).get_config('') == _load(preset).get_config()


def test_demo_is_valid():
  config_lib.validate(_load('demo').get_config())


@pytest.mark.parametrize('field, value, message', [
    ('model.size', 'huge', 'model.size'),
    ('data.max_seq_length', 1024, 'max_position_embeddings'),
    ('data.layout', 'packed', 'data.layout'),
    ('masking.rate', 1.5, 'masking.rate'),
    ('masking.max_predictions_per_seq', 0, 'max_predictions_per_seq'),
    ('optimizer.name', 'sgd', 'optimizer.name'),
    ('optimizer.warmup_steps', 2_000_000, 'warmup_steps'),
    ('num_train_steps', 2_000_000, 'num_train_steps'),
    ('model.dtype', 'float16', 'model.dtype'),
    ('data.corpus.source', 'web', 'data.corpus.source'),
    ('data.tokenizer.model_path', '/no/such/model', 'model_path'),
    ('batch_size', 0, 'batch_size'),
    ('step_rng', 'philox', 'step_rng'),
    ('model.attention', 'flash', 'model.attention'),
    # This machine has no GPU; cuDNN attention is refused before compiling.
    ('model.attention', 'cudnn', "model.attention='cudnn' needs a GPU"),
])
def test_validate_names_the_field(field, value, message):
  c = config_lib.base_config()
  section = c
  *parents, leaf = field.split('.')
  for p in parents:
    section = section[p]
  section[leaf] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c)


def test_nsp_with_full_sentences_is_rejected():
  c = config_lib.base_config()
  c.data.layout = 'full_sentences'
  with pytest.raises(ValueError, match='nsp_weight=0'):
    config_lib.validate(c)
  c.objective.nsp_weight = 0.0
  config_lib.validate(c)


def test_model_config_applies_overrides_and_padded_vocab():
  c = config_lib.base_config()
  c.model.size = 'mini'
  c.model.num_layers = 2
  m = objectives.bert.encoder_config(c, 30592)
  assert (m.num_layers, m.hidden_size, m.num_heads, m.vocab_size) == (
      2, 256, 4, 30592)


@pytest.mark.parametrize('name, strategy, extra', [
    ('bert_wwm', 'whole_word', {}),
    ('ngram_masking', 'ngram', {'max_ngram': 3}),
    ('span_masking', 'span', {'span_geometric_p': 0.2, 'span_lower': 1,
                              'span_upper': 10, 'corruption_unit': 'unit',
                              'random_source': 'unigram'}),
])
def test_masking_presets(name, strategy, extra):
  c = _load(name).get_config()
  config_lib.validate(c)
  assert c.masking.strategy == strategy
  for key, value in extra.items():
    assert c.masking[key] == value, key


def test_span_preset_is_spanberts_run():
  c = _load('span_masking').get_config()
  assert (c.data.layout, c.data.max_seq_length, c.objective.nsp_weight,
          c.data.short_seq_prob) == ('full_sentences', 512, 0.0, 0.0)
  o = c.optimizer
  assert (o.name, o.decay_mask, o.eps, o.learning_rate, c.total_steps,
          o.schedule, c.model.gelu) == ('fairseq_adam', 'all', 1e-8, 1e-4,
                                        2_400_000, 'spanbert', 'exact')


@pytest.mark.parametrize('stage, mixture', [
    ('word', (1.0, 0.0, 0.0)), ('entity', (0.0, 0.0, 1.0)),
    ('mixed', (1 / 3, 1 / 3, 1 / 3))])
def test_ernie_preset(tmp_path, stage, mixture):
  c = _load('ernie').get_config(f'stage={stage}')
  assert c.masking.strategy == 'entity'
  assert tuple(c.masking.entity_mixture) == pytest.approx(mixture)
  with pytest.raises(ValueError, match='gazetteer_path'):
    config_lib.validate(c)   # Entity masking needs its units.
  (tmp_path / 'g.txt').write_text('new york\n')
  c.data.gazetteer_path = str(tmp_path / 'g.txt')
  config_lib.validate(c)
  # Or the units come with an annotated JSON Lines corpus.
  c.data.gazetteer_path = ''
  c.data.corpus.source, c.data.corpus.path = 'files', str(tmp_path)
  c.data.corpus.text_format = 'jsonl'
  config_lib.validate(c)


# ---- Corpus mixtures.


def _mixture_config(**components):
  c = config_lib.base_config()
  for name, corpus in components.items():
    c.data.mixture[name] = corpus
  return c


def test_base_config_has_no_mixture():
  c = config_lib.base_config()
  assert not c.data.mixture
  assert c.data.mixture_exponent == 0.7
  assert c.data.corpus.to_dict() == config_lib.corpus_config().to_dict()


def test_corpus_config_overrides_and_rejects_unknown_fields():
  c = config_lib.corpus_config(source='files', path='/x')
  assert (c.source, c.path, c.text_format) == ('files', '/x',
                                               'sentence_per_line')
  with pytest.raises(ValueError, match="unknown field 'pth'"):
    config_lib.corpus_config(pth='/x')


def test_a_field_of_another_corpus_source_is_an_error():
  # A path without source="files" would train on the embedded corpus.
  c = config_lib.demo_config()
  c.data.corpus.path = '/data/corpus/*.txt'
  with pytest.raises(errors.ConfigError, match=(
      r'data.corpus.path=.* is read only with data.corpus.source="files", '
      "not 'embedded'")):
    config_lib.validate(c)
  c.data.corpus.source = 'files'
  c.data.corpus.tfds_name = 'wikipedia/20230601.en:text'
  with pytest.raises(errors.ConfigError, match='tfds_name=.* is read only'):
    config_lib.validate(c)
  c.data.corpus.tfds_name = ''
  config_lib.validate(c)


def test_valid_mixture():
  c = _mixture_config(a=config_lib.corpus_config(),
                      b=config_lib.corpus_config(max_documents=10))
  config_lib.validate(c)
  c.data.corpus.source = 'web'   # Ignored when a mixture is set.
  config_lib.validate(c)


@pytest.mark.parametrize('change, message', [
    (lambda c: setattr(c.data, 'mixture_exponent', -0.1),
     r'data.mixture_exponent=-0.1 must be in \[0, 1\]'),
    (lambda c: setattr(c.data, 'mixture_exponent', 1.5),
     r'data.mixture_exponent=1.5 must be in \[0, 1\]'),
    (lambda c: c.data.mixture.__delitem__('b'),
     r'data.mixture has one component \(a\); a mixture needs at least 2'),
    (lambda c: setattr(c.data.mixture.b, 'source', 'web'),
     "data.mixture.b.source='web'; use one of"),
    (lambda c: setattr(c.data.mixture.b, 'source', 'files'),
     'data.mixture.b.source="files" needs data.mixture.b.path'),
    (lambda c: setattr(c.data.mixture.a, 'max_documents', -1),
     'data.mixture.a.max_documents=-1 must be >= 0'),
    (lambda c: c.data.mixture.b.__delitem__('tfds_name'),
     r'data.mixture.b has the fields .*corpus_config\(\)'),
])
def test_mixture_validation_names_the_field(change, message):
  c = _mixture_config(a=config_lib.corpus_config(),
                      b=config_lib.corpus_config())
  change(c)
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c)


def test_mixture_errors_are_collected():
  c = _mixture_config(a=config_lib.corpus_config(source='web'),
                      b=config_lib.corpus_config(source='ftp'))
  c.data.mixture_exponent = 2.0
  with pytest.raises(ValueError) as e:
    config_lib.validate(c)
  for text in ('data.mixture.a.source', 'data.mixture.b.source',
               'data.mixture_exponent'):
    assert text in str(e.value)


@pytest.mark.parametrize('arg', [None, 'size=base'])
def test_mixture_preset_needs_the_files_path(tmp_path, arg):
  c = _load('mixture').get_config(arg)
  assert sorted(c.data.mixture) == ['embedded', 'files']
  assert c.data.mixture_exponent == 0.7
  with pytest.raises(ValueError, match='data.mixture.files.path'):
    config_lib.validate(c)
  (tmp_path / 'text.txt').write_text('One sentence.\n')
  c.data.mixture.files.path = str(tmp_path / 'text.txt')
  config_lib.validate(c)


@pytest.mark.parametrize('size, layers, hidden, heads, ffn', [
    ('base', 12, 768, 12, 3072), ('large', 24, 1024, 16, 4096)])
def test_albert_preset_is_paper_exact(size, layers, hidden, heads, ffn):
  c = _load('albert').get_config(f'size={size}')
  config_lib.validate(c)
  m = c.model
  assert (m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size,
          m.embedding_size, m.num_layer_groups, m.hidden_dropout_rate,
          m.attention_dropout_rate) == (layers, hidden, heads, ffn, 128, 1,
                                        0.0, 0.0)
  assert (c.data.layout, c.data.max_seq_length, c.data.short_seq_prob,
          c.data.tokenizer.vocab_size) == ('sop', 512, 0.1, 30_000)
  assert (c.masking.strategy, c.masking.max_ngram,
          c.masking.max_predictions_per_seq, c.masking.dynamic,
          c.data.dupe_factor) == ('ngram', 3, 20, False, 40)
  o = c.optimizer
  assert (o.name, o.learning_rate, o.warmup_steps, o.weight_decay, o.eps,
          o.grad_clip_norm, c.batch_size, c.total_steps) == (
              'lamb', 0.00176, 3125, 0.01, 1e-6, 1.0, 4096, 125_000)


def test_albert_base_preset_has_the_papers_12m_parameters():
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bertjax.models import bert  # pylint: disable=g-import-not-at-top
  from data_pipelines import tokenizer  # pylint: disable=g-import-not-at-top
  c = _load('albert').get_config('size=base')
  vocab = tokenizer.padded_vocab_size(c.data.tokenizer.vocab_size)
  model = bert.BertForPreTraining(objectives.bert.encoder_config(c, vocab))
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32)))
  count = sum(int(np.prod(x.shape))
              for x in jax.tree.leaves(nn.unbox(shapes['params'])))
  assert abs(count - 12e6) <= 0.02 * 12e6, count


def test_spanbert_preset_is_span_masking_plus_sbo():
  c = _load('spanbert').get_config()
  config_lib.validate(c)
  assert (c.objective.sbo_weight, c.model.sbo_positions,
          c.model.sbo_position_width, c.objective.sbo_count_offset,
          c.objective.mlm_weight, c.objective.nsp_weight) == (
              1.0, 15, 200, 1.0, 1.0, 0.0)
  ablation = _load('span_masking').get_config()
  assert ablation.objective.sbo_weight == 0.0
  # Without SBO and its head's fields, it is the ablation.
  for field in ('objective.sbo_weight', 'objective.sbo_count_offset',
                'model.sbo_positions', 'model.sbo_position_width'):
    section, name = field.split('.')
    c[section][name] = ablation[section][name]
  assert c.to_dict() == ablation.to_dict()
  assert objectives.bert.encoder_config(c, 30592).sbo_positions == 0
  assert objectives.bert.encoder_config(_load('spanbert').get_config(),
                                 30592).sbo_positions == 15


def test_sbo_needs_positions():
  c = _load('spanbert').get_config()
  c.model.sbo_positions = 0
  with pytest.raises(ValueError, match='model.sbo_positions'):
    config_lib.validate(c)


@pytest.mark.parametrize('size, lr, warmup', [('base', 6e-4, 24_000),
                                              ('large', 4e-4, 30_000)])
def test_roberta_preset_is_the_papers_final_run(size, lr, warmup):
  c = _load('roberta').get_config(f'size={size}')
  config_lib.validate(c)
  o = c.optimizer
  assert (o.name, o.schedule, o.learning_rate, o.warmup_steps, o.b1, o.b2,
          o.eps, o.weight_decay, o.grad_clip_norm) == (
              'fairseq_adam', 'warmup_linear', lr, warmup, 0.9, 0.98, 1e-6,
              0.01, 0.0)
  assert o.decay_mask == 'all'     # fairseq's Adam decays every parameter.
  assert (c.data.layout, c.data.max_seq_length, c.objective.nsp_weight,
          c.masking.dynamic, c.batch_size, c.total_steps) == (
              'full_sentences', 512, 0.0, True, 8192, 500_000)
  assert c.model.gelu == 'exact'   # fairseq's, and RobertaLMHead's.
  assert (c.masking.rate, c.masking.mask_token_prob,
          c.masking.random_token_prob) == (0.15, 0.8, 0.1)


@pytest.mark.parametrize('objective, field, value', [
    ('electra', 'electra.mask_prob', 0.0), ('electra', 'electra.mask_prob', 1.0),
    ('electra', 'electra.mask_token_prob', 1.5),
    ('electra', 'electra.temperature', 0.0),
    ('electra', 'electra.discriminator_weight', -1.0),
    ('distillation', 'distillation.temperature', -2.0),
    ('distillation', 'distillation.kl_weight', -5.0)])
def test_family_knobs_fail_before_any_data(objective, field, value):
  c = config_lib.base_config()
  c.objective.name = objective
  section, leaf = field.split('.')
  c[section][leaf] = value
  with pytest.raises(ValueError, match=leaf):
    config_lib.validate(c)
  c.objective.name = 'bert'   # Other families' knobs are not theirs.
  config_lib.validate(c)


def test_electra_needs_a_prediction_slot():
  c = config_lib.base_config()
  c.objective.name = 'electra'
  c.electra.mask_prob = 0.001
  c.data.max_seq_length = 128   # int(0.006 * 128) = 0 slots.
  with pytest.raises(ValueError, match='no prediction slots'):
    config_lib.validate(c)


def test_auto_attention_is_xla_off_gpu():
  c = config_lib.base_config()
  c.model.attention, c.model.dtype = 'auto', 'bfloat16'
  assert model_config_lib.attention_impl(c.model) == 'xla'   # The tests run on CPU.
  assert objectives.bert.encoder_config(c, 30592).attention_impl == 'xla'


def test_from_saved_fills_fields_added_since():
  saved = config_lib.base_config().to_dict()
  del saved['step_rng'], saved['model']['attention']
  saved['model']['hidden_size'] = 48
  c = config_lib.from_saved(saved)
  assert (c.step_rng, c.model.attention, c.model.hidden_size) == (
      'threefry', 'xla', 48)
  config_lib.validate(c)
