"""model.attend_across_documents=False: packed documents stay apart."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from bertjax.models import bert
from data_pipelines.tokenizer import CLS_ID, PAD_ID, SEP_ID

CFG = bert.BertConfig(vocab_size=128, hidden_size=32, num_layers=2,
                      num_heads=4, intermediate_size=64,
                      max_position_embeddings=16)
# [CLS] a a a [SEP] b b [SEP] c c [SEP] [PAD] ...: three documents.
ROW = [CLS_ID, 10, 11, 12, SEP_ID, 20, 21, SEP_ID, 30, 31, SEP_ID] + [
    PAD_ID] * 5
DOCUMENT = [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_mask_is_block_diagonal_over_real_keys():
  ids = np.array([ROW])
  real = (ids != PAD_ID).astype(np.int32)
  separate = dataclasses.replace(CFG, attend_across_documents=False)
  mask = np.asarray(bert.attention_mask_for(separate, ids, real))[0, 0]
  document = np.array(DOCUMENT + [-1] * 5)
  # Real queries: real keys of their document; padding queries: real keys.
  want = ((document[:, None] == document[None, :]) | (document[:, None] < 0)
          ) & (real[0] > 0)[None, :]
  np.testing.assert_array_equal(mask, want)
  # Attending across documents: the padding mask, untouched.
  assert bert.attention_mask_for(CFG, ids, real) is real


@pytest.mark.parametrize('deterministic', [True, False])
def test_a_document_does_not_see_its_neighbours(deterministic):
  """Another first document leaves the later ones' outputs as they were
  (with dropout: the same masks, from the same key and row)."""
  other = list(ROW)
  other[1:4] = [40, 41, 42]

  def outputs(cfg, row):
    ids = np.array([row])
    real = (ids != PAD_ID).astype(np.int32)
    types, positions = np.zeros_like(ids), np.array([[1, 5]], np.int32)
    model = bert.BertForPreTraining(cfg)
    params = model.init(jax.random.key(0), ids, types, real, positions)
    return np.asarray(model.apply(
        nn.unbox(params), ids, types, real, positions,
        deterministic=deterministic,
        rngs={'dropout': jax.random.key(1)})['sequence_output'])[0]

  later = slice(5, 11)                # Documents 2 and 3.
  separate = dataclasses.replace(CFG, attend_across_documents=False)
  np.testing.assert_allclose(outputs(separate, ROW)[later],
                             outputs(separate, other)[later],
                             rtol=1e-6, atol=1e-6)
  assert np.abs(outputs(CFG, ROW)[later]
                - outputs(CFG, other)[later]).max() > 1e-3


def test_config_allows_it_for_packed_rows_only():
  cfg = config_lib.demo_config()
  cfg.model.attend_across_documents = False
  with pytest.raises(ValueError, match='only data.layout=full_sentences'):
    config_lib.validate(cfg)
  cfg.data.layout = 'full_sentences'
  cfg.objective.nsp_weight = 0.0
  config_lib.validate(cfg)
  assert not objectives.bert.encoder_config(cfg, 2048).attend_across_documents


def _saved(workdir, identity):
  with open(os.path.join(workdir, 'run_meta.json'), 'w') as f:
    json.dump({'identity': identity}, f)
  os.makedirs(os.path.join(workdir, 'checkpoints', '1'))   # Binds the run.


def test_runs_from_before_the_field_resume_at_its_default(tmp_path):
  cfg = config_lib.demo_config()
  older = json.loads(json.dumps(train.run_identity(cfg)))
  del older['model']['attend_across_documents']   # Written before it existed.
  _saved(tmp_path, older)
  train.check_resume_compatible(str(tmp_path), cfg)
  cfg.model.attend_across_documents = False
  with pytest.raises(train.ResumeError, match='model differ'):
    train.check_resume_compatible(str(tmp_path), cfg)
