"""MobileBERT (a bert run with MobileBERT's options) -> transformers'
MobileBertForPreTraining: both variants (MobileBERT's shared key/query
bottleneck, MobileBERT-TINY's bottleneck attention) load with nothing
missing, their hidden states and logits agree on a padded batch, and the
export imports back to the same parameters."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax import config_lib
from bertjax.interop import hf_convert
from bertjax.models import bert as bert_lib
from bertjax.objectives import bert as bert_objective
from data_pipelines import tokenizer as tokenizer_lib
import preset_helpers

VOCAB = 100          # Not a multiple of 128: bertjax pads its tables.
LENGTH = 16
# The paper's two students in miniature: 2 layers, H 64, I 16, E 16; and
# the trigram and NoNorm on plain layers (no bottleneck, one FFN).
VARIANTS = {
    'mobilebert': dict(key_query_shared_bottleneck=True,
                       num_feedforward_networks=3),
    'tiny': dict(bottleneck_attention=True, num_feedforward_networks=2),
    'plain': dict(intra_bottleneck_size=0, num_feedforward_networks=1),
}
HEADS = {'cls.predictions.transform.dense.weight',
         'cls.predictions.transform.dense.bias',
         'cls.predictions.transform.LayerNorm.weight',
         'cls.predictions.transform.LayerNorm.bias', 'cls.predictions.bias',
         'cls.predictions.dense.weight', 'cls.predictions.decoder.weight',
         'cls.seq_relationship.weight', 'cls.seq_relationship.bias'}


def _config(variant):
  cfg = config_lib.demo_config()
  cfg.model.update(**{**dict(
      num_layers=2, hidden_size=64, num_heads=2, intermediate_size=32,
      max_position_embeddings=40, embedding_size=16, trigram_input=True,
      intra_bottleneck_size=16, normalization='no_norm', hidden_act='relu'),
                      **VARIANTS[variant]})
  cfg.data.max_seq_length = 32
  return cfg


@pytest.fixture(scope='module', params=sorted(VARIANTS))
def exported(request, tmp_path_factory):
  """(variant, cfg, params, directory): a random bertjax MobileBERT on the
  bert objective's parameter tree, written as MobileBertForPreTraining."""
  cfg = _config(request.param)
  assert hf_convert.family_of(cfg) == 'mobilebert'
  # Small enough that the un-normalized (NoNorm) stream stays near 1.
  params = preset_helpers.random_bert_params(cfg, VOCAB, 0.2)
  directory = str(tmp_path_factory.mktemp(request.param))
  hf_convert.write_model(
      directory, hf_convert.hf_state_dict(params, cfg, 'mobilebert', VOCAB),
      hf_convert.hf_config(cfg, 'mobilebert', VOCAB))
  return request.param, cfg, params, directory


def _batch():
  """[2, LENGTH] ids, token types and a mask (row 1 padded from 12)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, (2, LENGTH))
  ids[:, 0], ids[:, -1], ids[1, 12:] = 2, 3, 0
  types = np.zeros((2, LENGTH), np.int64)
  types[0, 8:] = 1
  return ids, types, (ids != 0).astype(np.int64)


def _run(model, ids, types, mask):
  with torch.no_grad():
    return model.eval()(input_ids=torch.tensor(ids),
                        token_type_ids=torch.tensor(types),
                        attention_mask=torch.tensor(mask))


def assert_heads_agree(ours, theirs, vocab_size: int, real) -> None:
  """bertjax's MLM logits (at the real positions, the tokenizer's rows)
  and NSP logits equal those of a transformers ...ForPreTraining to 1e-4."""
  np.testing.assert_allclose(
      np.asarray(ours['mlm_logits'])[..., :vocab_size][real],
      theirs.prediction_logits.numpy()[real], rtol=0, atol=1e-4)
  np.testing.assert_allclose(np.asarray(ours['nsp_logits']),
                             theirs.seq_relationship_logits.numpy(),
                             rtol=0, atol=1e-4)


def test_config_is_the_variants(exported):
  variant, _, _, directory = exported
  with open(os.path.join(directory, 'config.json')) as f:
    config = json.load(f)
  assert config['architectures'] == ['MobileBertForPreTraining']
  assert config['model_type'] == 'mobilebert'
  assert (config['key_query_shared_bottleneck'],
          config['use_bottleneck_attention'], config['use_bottleneck']) == {
              'mobilebert': (True, False, True), 'tiny': (False, True, True),
              'plain': (False, False, False)}[variant]
  if variant != 'plain':   # No bottleneck: the field is unread.
    assert config['intra_bottleneck_size'] == 16
  assert (config['normalization_type'], config['hidden_act'],
          config['embedding_size'], config['trigram_input']) == (
              'no_norm', 'relu', 16, True)


def test_transformers_loads_it_and_agrees(exported):
  _, cfg, params, directory = exported
  pretraining, info = transformers.MobileBertForPreTraining.from_pretrained(
      directory, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  encoder, info = transformers.MobileBertModel.from_pretrained(
      directory, output_loading_info=True)
  assert not info['missing_keys'] and set(info['unexpected_keys']) == HEADS
  ids, types, mask = _batch()
  positions = np.tile(np.arange(LENGTH)[None], (2, 1))
  model = bert_lib.BertForPreTraining(
      bert_objective.encoder_config(cfg, VOCAB))
  ours = jax.jit(lambda p, *a: model.apply({'params': p}, *a))(
      params, ids, types, mask, positions)
  real = mask.astype(bool)
  theirs = _run(encoder, ids, types, mask).last_hidden_state.numpy()
  assert np.abs(theirs[real]).max() > 0.1   # Not a vanishing signal.
  np.testing.assert_allclose(np.asarray(ours['sequence_output'])[real],
                             theirs[real], rtol=0, atol=1e-4)
  assert_heads_agree(ours, _run(pretraining, ids, types, mask), VOCAB, real)


def test_import_gives_back_the_parameters(exported):
  variant, cfg, params, directory = exported
  imported = hf_convert.import_model(directory)
  assert imported.family == 'mobilebert'
  for field in ('trigram_input', 'intra_bottleneck_size', 'embedding_size',
                'bottleneck_attention', 'key_query_shared_bottleneck',
                'num_feedforward_networks', 'normalization', 'hidden_act'):
    assert imported.config.model[field] == cfg.model[field], field
  padded = tokenizer_lib.padded_vocab_size(VOCAB)
  ours = {jax.tree_util.keystr(p): v for p, v in
          jax.tree_util.tree_flatten_with_path(params)[0]}
  theirs = {jax.tree_util.keystr(p): v for p, v in
            jax.tree_util.tree_flatten_with_path(imported.params)[0]}
  assert set(theirs) == set(ours) - {"['sbo_output_bias']"} - {
      k for k in ours if k.startswith("['sbo']")}, variant
  for key, value in theirs.items():
    rows = VOCAB if value.shape[:1] == (padded,) else None
    np.testing.assert_array_equal(value[:rows], ours[key][:rows],
                                  err_msg=key)


@pytest.mark.parametrize('fields, match', [
    # IB-BERT, the teacher: transformers sizes q and k for I-wide inputs.
    (dict(intra_bottleneck_size=32), 'cannot run it'),
    (dict(trigram_input=False), 'set model.trigram_input=True'),
    (dict(normalization='layer_norm'), 'layer_norm_epsilon'),
])
def test_what_transformers_cannot_hold_is_refused(fields, match):
  cfg = _config('mobilebert')
  cfg.model.update(key_query_shared_bottleneck=False, **fields)
  if 'intra_bottleneck_size' not in fields:
    cfg.model.key_query_shared_bottleneck = True
  assert hf_convert.family_of(cfg) == 'mobilebert'
  with pytest.raises(hf_convert.ConversionError, match=match):
    hf_convert.check_family(cfg, 'mobilebert')
  with pytest.raises(hf_convert.ConversionError):
    hf_convert.check_family(cfg, 'bert')


def test_relu_alone_is_a_bert():
  cfg = config_lib.demo_config()
  cfg.model.hidden_act = 'relu'
  assert hf_convert.family_of(cfg) == 'bert'
  assert hf_convert.hf_config(cfg, 'bert', VOCAB)['hidden_act'] == 'relu'
  # Without sentence pairs (which RoBERTa refuses on their own).
  cfg.data.layout, cfg.objective.nsp_weight = 'full_sentences', 0.0
  with pytest.raises(hf_convert.ConversionError, match='hidden_act'):
    hf_convert.check_family(cfg, 'roberta')
