"""Traps and impossible mixes: each fires alone, none fires on a preset."""

import pytest

from bertjax import config_check
from bertjax import config_lib
import preset_helpers

PRESETS = [
    ('bert', 'size=base'), ('bert', 'size=large'),
    ('bert', 'size=base,phase=2'), ('bert', 'size=large,phase=2'),
    ('bert_wwm', None), ('ngram_masking', None), ('span_masking', None),
    ('albert', 'size=base'), ('albert', 'size=large'),
    ('albert', 'size=xxlarge'), ('spanbert', None),
    ('roberta', 'size=base'), ('roberta', 'size=large'),
    ('electra', 'size=small'), ('electra', 'size=base'),
    ('demo', None), ('mixture', None),
    ('ernie', 'stage=mixed'),
    # IB-BERT trains with LAMB and dropout 0.1, and masks at most 20 of 512.
    ('mobilebert', 'model=teacher'), ('mobilebert', None),
    ('mobilebert', 'model=tiny'),
    # TinyBERT's BertAdam (per-tensor clipping, lr 5e-5 at batch 256) on
    # packed rows, its MLM-alone control included.
    ('tinybert', None), ('tinybert', 'objective=bert'),
    ('distilbert', None), ('ernie2', 'size=demo'), ('ernie2', 'size=base'),
    ('compare_small', None),
]


_preset = preset_helpers.load_preset


def _set(cfg, **fields):
  """``_set(c, **{'masking.strategy': 'span'})`` sets dotted fields."""
  return preset_helpers.set_fields(cfg, fields)


@pytest.mark.parametrize('name, arg', PRESETS)
def test_presets_have_no_traps_and_no_errors(name, arg):
  c = _preset(name, arg)
  assert config_check.warnings_for(c) == []
  assert config_check.errors_for(c) == []


def test_base_config_has_no_traps_and_no_errors():
  c = config_lib.base_config()
  assert config_check.warnings_for(c) == []
  assert config_check.errors_for(c) == []


# Each case starts from a preset with no warnings, changes the named fields
# and expects exactly one warning, containing ``expected``.
TRAPS = [
    # 1. Pairs built, pair labels unused.
    ('pairs_nsp', 'bert', 'size=base', {'objective.nsp_weight': 0.0},
     "data.layout='nsp' builds sentence pairs"),
    ('pairs_sop', 'albert', 'size=base', {'objective.nsp_weight': 0.0},
     "data.layout='sop' builds sentence pairs"),
    # 2. SpanBERT's span lengths.
    ('span_p', 'span_masking', None, {'masking.span_geometric_p': 0.3},
     'masking.span_geometric_p=0.3'),
    ('span_upper', 'span_masking', None, {'masking.span_upper': 20},
     'masking.span_upper=20'),
    ('span_lower', 'span_masking', None, {'masking.span_lower': 2},
     'masking.span_lower=2'),
    # 3. SpanBERT's corruption once per span, unigram random tokens.
    ('span_per_token', 'span_masking', None,
     {'masking.corruption_unit': 'token'},
     "masking.corruption_unit='token' decides 80/10/10 per token"),
    ('span_uniform', 'span_masking', None,
     {'masking.random_source': 'uniform'},
     "masking.random_source='uniform': SpanBERT"),
    # 4. Optimizers of one paper with another's settings.
    ('bert_adamw_b2', 'bert', 'size=base', {'optimizer.b2': 0.98},
     "optimizer.name='bert_adamw' with optimizer.b2=0.98"),
    ('lamb_b2', 'albert', 'size=base', {'optimizer.b2': 0.98},
     "optimizer.name='lamb' with optimizer.b2=0.98"),
    ('bert_adamw_packed', 'span_masking', None,
     {'optimizer.name': 'bert_adamw'},
     "data.layout='full_sentences' with optimizer.name='bert_adamw'"),
    # 5. ALBERT: LAMB without dropout, sharing with factorization.
    ('lamb_hidden_dropout', 'albert', 'size=base',
     {'model.hidden_dropout_rate': 0.1},
     "optimizer.name='lamb' with model.hidden_dropout_rate=0.1"),
    ('lamb_attention_dropout', 'albert', 'size=base',
     {'model.attention_dropout_rate': 0.1},
     'model.attention_dropout_rate=0.1: ALBERT'),
    ('sharing_no_embedding_size', 'albert', 'size=base',
     {'model.embedding_size': 0},
     'model.num_layer_groups=1 with model.embedding_size=0'),
    ('sharing_embedding_size_is_hidden', 'albert', 'size=base',
     {'model.embedding_size': 768},
     'model.num_layer_groups=1 with model.embedding_size=768'),
    ('sharing_on_bert', 'bert', 'size=base', {'model.num_layer_groups': 1},
     'model.num_layer_groups=1 with model.embedding_size=0'),
    # 6. google-research/bert's flag default lr.
    ('script_lr', 'bert', 'size=base', {'optimizer.learning_rate': 5e-5},
     'optimizer.learning_rate=5e-05'),
    # 7. Static masks that never change.
    ('static_once', 'bert', 'size=base', {'data.dupe_factor': 1},
     'masking.dynamic=False with data.dupe_factor=1'),
    # 9. Other departures from the papers.
    ('wwm_per_unit', 'bert_wwm', None, {'masking.corruption_unit': 'unit'},
     "masking.strategy='whole_word' with masking.corruption_unit='unit'"),
    ('ngram_per_unit', 'ngram_masking', None,
     {'masking.corruption_unit': 'unit'},
     "masking.strategy='ngram' with masking.corruption_unit='unit'"),
    ('token_unigram', 'bert', 'size=base',
     {'masking.random_source': 'unigram'},
     "masking.strategy='token' with masking.random_source='unigram'"),
    ('ngram_unigram', 'ngram_masking', None,
     {'masking.random_source': 'unigram'},
     "masking.strategy='ngram' with masking.random_source='unigram'"),
    ('ngram_length', 'ngram_masking', None, {'masking.max_ngram': 4},
     'masking.max_ngram=4'),
    ('phase2_cap', 'bert', 'size=base,phase=2',
     {'masking.max_predictions_per_seq': 20},
     'masking.max_predictions_per_seq=20 caps'),
    ('span_cap', 'span_masking', None,
     {'masking.max_predictions_per_seq': 40},
     'masking.max_predictions_per_seq=40 caps'),
    ('albert_other_cap', 'albert', 'size=base',
     {'masking.max_predictions_per_seq': 30},
     'masking.max_predictions_per_seq=30 caps'),
    # 10. MobileBERT's student transfers every layer, then distils.
    ('mobilebert_never_distils', 'mobilebert', None,
     {'total_steps': 100_000}, 'total_steps=100000 ends inside the '
     'progressive transfer'),
]


@pytest.mark.parametrize('case, name, arg, fields, expected', TRAPS,
                         ids=[t[0] for t in TRAPS])
def test_trap_fires_alone(case, name, arg, fields, expected):
  del case
  c = _set(_preset(name, arg), **fields)
  warnings = config_check.warnings_for(c)
  assert len(warnings) == 1, warnings
  assert expected in warnings[0]
  assert config_check.errors_for(c) == []


def test_span_geometry_message_names_the_papers_values():
  c = _set(_preset('span_masking'), **{'masking.span_geometric_p': 0.3})
  (message,) = config_check.warnings_for(c)
  assert 'Geometric(p=0.2) clipped to [1, 10]' in message
  assert 'masking.span_geometric_p=0.2' in message


def test_phase2_cap_message_gives_the_effective_rate_and_the_fix():
  c = _set(_preset('bert', 'size=base,phase=2'),
           **{'masking.max_predictions_per_seq': 20})
  (message,) = config_check.warnings_for(c)
  assert '(77 tokens)' in message and '3.9%' in message
  assert 'Set masking.max_predictions_per_seq=77 or more' in message


def test_dynamic_masking_needs_no_copies():
  c = _set(_preset('bert', 'size=base'),
           **{'data.dupe_factor': 1, 'masking.dynamic': True})
  assert config_check.warnings_for(c) == []


def test_script_lr_is_a_trap_only_at_berts_batch():
  c = _set(_preset('bert', 'size=base'),
           **{'optimizer.learning_rate': 5e-5, 'batch_size': 128})
  assert config_check.warnings_for(c) == []


@pytest.mark.parametrize('fields', [
    # ELECTRA's 85% [MASK], 15% kept, 0% random.
    {'masking.mask_token_prob': 0.85, 'masking.random_token_prob': 0.0},
    # ELECTRA-small's E=128 without sharing.
    {'model.embedding_size': 128},
])
def test_paper_settings_are_not_traps(fields):
  c = _set(_preset('bert', 'size=base'), **fields)
  assert config_check.warnings_for(c) == []


def test_sop_pairs_with_their_loss_are_not_a_trap():
  c = _set(_preset('bert', 'size=base'), **{'data.layout': 'sop'})
  assert c.objective.nsp_weight > 0
  assert config_check.warnings_for(c) == []


def test_albert_prediction_cap_is_albert_s_own():
  # google-research/albert masks at most 20 tokens of 512 (its flags).
  c = _preset('albert', 'size=base')
  assert (c.data.max_seq_length, c.masking.max_predictions_per_seq) == (
      512, 20)
  assert config_check.warnings_for(c) == []


# Each case starts from a preset with no errors and no warnings, changes the
# named fields and expects exactly one error, containing ``expected``.
ERRORS = [
    ('pairs_one_token_type', 'bert', 'size=base',
     {'model.type_vocab_size': 1},
     "model.type_vocab_size=1 with data.layout='nsp'"),
    ('sop_one_token_type', 'albert', 'size=base',
     {'model.type_vocab_size': 1},
     "model.type_vocab_size=1 with data.layout='sop'"),
    ('pairs_no_token_type', 'bert', 'size=base',
     {'model.type_vocab_size': 0},
     "model.type_vocab_size=0 with data.layout='nsp': the model has no "
     'token-type table, so segment B is not told apart from A'),
    ('continual_pairs_one_token_type', 'ernie2', 'size=demo',
     {'model.type_vocab_size': 1},
     "model.type_vocab_size=1 with the continual streams with layouts "
     "'discourse', 'sentence_distance'"),
    ('no_loss', 'span_masking', None, {'objective.mlm_weight': 0.0},
     'objective.mlm_weight=0.0 and objective.nsp_weight=0.0'),
    ('mobilebert_transfer_without_loss', 'mobilebert', None,
     {'mobilebert.hidden_weight': 0.0, 'mobilebert.attention_weight': 0.0,
      'mobilebert.mean_weight': 0.0, 'mobilebert.variance_weight': 0.0},
     'the progressive transfer runs mobilebert.steps_per_layer=10000'),
]


@pytest.mark.parametrize('case, name, arg, fields, expected', ERRORS,
                         ids=[e[0] for e in ERRORS])
def test_error_fires_alone(case, name, arg, fields, expected):
  del case
  c = _set(_preset(name, arg), **fields)
  errors = config_check.errors_for(c)
  assert len(errors) == 1, errors
  assert expected in errors[0]


def test_span_boundary_loss_alone_is_a_loss():
  c = _set(_preset('span_masking'), **{'objective.mlm_weight': 0.0})
  c.objective.sbo_weight = 1.0
  assert config_check.errors_for(c) == []


@pytest.mark.parametrize('size', [0, 1])
def test_packed_rows_need_one_token_type_or_none(size):
  """Type 0 only: one row, or no table at all (DistilBERT's student)."""
  c = _set(_preset('span_masking'), **{'model.type_vocab_size': size})
  assert config_check.errors_for(c) == []


@pytest.mark.parametrize('fields, message', [
    ({'masking.mask_token_prob': 0.8, 'masking.random_token_prob': 0.3},
     'sum to at most 1'),
    ({'data.layout': 'full_sentences', 'objective.nsp_weight': 1.0},
     'nsp_weight=0'),
])
def test_validates_own_errors_are_not_repeated(fields, message):
  c = _set(config_lib.base_config(), **fields)
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c)
  assert config_check.errors_for(c) == []


def test_checks_do_not_change_the_config():
  c = _set(_preset('span_masking'), **{'masking.span_geometric_p': 0.3,
                                       'objective.mlm_weight': 0.0})
  before = c.to_dict()
  assert config_check.warnings_for(c) and config_check.errors_for(c)
  assert c.to_dict() == before
