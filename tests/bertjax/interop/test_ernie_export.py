"""ERNIE 2.0 (a BERT with a task embedding) -> transformers' Ernie classes:
the tensors load with nothing missing, the outputs agree with and without
task ids, and the export imports back to a run that fine-tuning loads."""

import itertools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import config_lib
from bertjax import finetune
from bertjax.interop import hf_convert
from bertjax.models import bert as bert_lib
from bertjax.models import heads
from bertjax.objectives import bert as bert_objective
from data_pipelines import corpus
from data_pipelines import tokenizer as tokenizer_lib
import test_mobilebert_export

TASKS = 3
LENGTH = 16
HEADS = {'cls.predictions.transform.dense.weight',
         'cls.predictions.transform.dense.bias',
         'cls.predictions.transform.LayerNorm.weight',
         'cls.predictions.transform.LayerNorm.bias', 'cls.predictions.bias',
         'cls.predictions.decoder.weight',   # Tied to the word table.
         'cls.seq_relationship.weight', 'cls.seq_relationship.bias'}


def _config():
  """The demo at 2 layers of width 32, with a table of TASKS tasks."""
  cfg = config_lib.demo_config()
  cfg.model.update(num_layers=2, hidden_size=32, num_heads=2,
                   intermediate_size=64, max_position_embeddings=40,
                   task_type_vocab_size=TASKS)
  cfg.data.max_seq_length = 32
  return cfg


@pytest.fixture(scope='module')
def tokenizer():
  sentences = itertools.islice(
      (s for document in corpus.embedded_documents() for s in document), 300)
  return tokenizer_lib.train(sentences, 100, 'unigram', num_threads=2)


@pytest.fixture(scope='module')
def exported(tokenizer, tmp_path_factory):
  """(cfg, params, directory): a random bertjax ERNIE as the bert objective
  initialises it, written as transformers' ErnieForPreTraining."""
  cfg = _config()
  vocab = tokenizer.vocab_size
  assert hf_convert.family_of(cfg) == 'ernie'
  ids = jnp.zeros((1, cfg.data.max_seq_length), jnp.int32)
  batch = {'input_ids': ids, 'token_type_ids': ids, 'attention_mask': ids,
           'masked_positions': ids[:, :4], 'masked_unit_start': ids[:, :4],
           'task_type_ids': ids}
  # Random values on the objective's parameter tree (its init would take
  # longer to compile than the test to run): no bias is zero and no
  # LayerNorm the identity, so each tensor's place is checked.
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda x: rng.normal(0, 0.5, x.shape).astype(np.float32),
      nn.unbox(jax.eval_shape(bert_objective.make_task(cfg, vocab).init,
                              jax.random.key(3), batch)))
  directory = str(tmp_path_factory.mktemp('ernie'))
  hf_convert.write_model(
      directory, hf_convert.hf_state_dict(params, cfg, 'ernie', vocab),
      hf_convert.hf_config(cfg, 'ernie', vocab))
  return cfg, params, directory


@pytest.fixture(scope='module')
def loaded(exported):
  """transformers' ErnieForPreTraining and ErnieModel from the export, each
  with its loading info."""
  directory = exported[2]
  return tuple(model_class.from_pretrained(directory,
                                           output_loading_info=True)
               for model_class in (transformers.ErnieForPreTraining,
                                   transformers.ErnieModel))


def _batch(vocab):
  """[2, LENGTH] ids, token types, mask (row 1 padded from 12) and task
  ids: row 0 tasks 1 then 2, row 1 task 2 then 0."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, vocab, (2, LENGTH))
  ids[:, 0], ids[:, -1], ids[1, 12:] = 2, 3, 0
  types = np.zeros((2, LENGTH), np.int64)
  types[0, 8:] = 1
  tasks = np.full((2, LENGTH), 2, np.int64)
  tasks[0, :8], tasks[1, 6:] = 1, 0
  return ids, types, (ids != 0).astype(np.int64), tasks


def _ernie(model, ids, types, mask, tasks=None):
  inputs = {'input_ids': torch.tensor(ids), 'token_type_ids':
            torch.tensor(types), 'attention_mask': torch.tensor(mask)}
  if tasks is not None:
    inputs['task_type_ids'] = torch.tensor(tasks)
  with torch.no_grad():
    return model(**inputs)


def test_config_and_tensors_are_ernies(exported):
  cfg, _, directory = exported
  with open(os.path.join(directory, 'config.json')) as f:
    config = json.load(f)
  assert config['model_type'] == 'ernie'
  assert config['architectures'] == ['ErnieForPreTraining']
  assert config['use_task_id'] is True
  assert config['task_type_vocab_size'] == TASKS
  table = hf_convert.read_state_dict(directory)[
      'ernie.embeddings.task_type_embeddings.weight']
  assert table.shape == (TASKS, cfg.model.hidden_size)
  for family in ('bert', 'roberta'):   # Neither has a place for it.
    with pytest.raises(hf_convert.ConversionError, match='task_type'):
      hf_convert.check_family(cfg, family)


def test_transformers_loads_it_and_agrees(exported, loaded, tokenizer):
  cfg, params, _ = exported
  vocab = tokenizer.vocab_size
  (pretraining, info), (encoder, encoder_info) = loaded
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  info = encoder_info
  # The encoder alone: every tensor of it is there; the unused ones are
  # exactly the pretraining heads'.
  assert not info['missing_keys'] and info['unexpected_keys'] == HEADS, info
  ids, types, mask, tasks = _batch(vocab)
  positions = np.tile(np.arange(LENGTH)[None], (2, 1))
  model = bert_lib.BertForPreTraining(
      bert_objective.encoder_config(cfg, vocab))
  ours = jax.jit(lambda p, *a: model.apply({'params': p}, *a[:4],
                                           task_type_ids=a[4]))(
      params, ids, types, mask, positions, tasks)
  real = mask.astype(bool)
  theirs = _ernie(encoder.eval(), ids, types, mask, tasks)
  np.testing.assert_allclose(
      np.asarray(ours['sequence_output'])[real],
      theirs.last_hidden_state.numpy()[real], rtol=0, atol=1e-4)
  test_mobilebert_export.assert_heads_agree(
      ours, _ernie(pretraining.eval(), ids, types, mask, tasks), vocab, real)


def test_import_round_trips_and_fine_tuning_takes_task_zero(
    exported, loaded, tokenizer, tmp_path):
  """The export imports to the same parameters; as a run, it exports again
  to the same tensors, and the encoder fine-tuning loads from it (task 0
  everywhere) is ErnieModel's without task ids."""
  cfg, params, directory = exported
  imported = hf_convert.import_model(directory)
  assert imported.family == 'ernie'
  assert imported.config.model.task_type_vocab_size == TASKS
  vocab = tokenizer.vocab_size
  for (path, a), b in zip(
      jax.tree_util.tree_flatten_with_path(imported.params)[0],
      jax.tree.leaves({k: params[k] for k in imported.params})):
    rows = vocab if a.shape[:1] == (tokenizer_lib.padded_vocab_size(
        vocab),) else None
    np.testing.assert_array_equal(a[:rows], b[:rows],
                                  err_msg=jax.tree_util.keystr(path))
  run = str(tmp_path / 'run')
  hf_convert.write_import(imported, tokenizer, run, source=directory)
  again = str(tmp_path / 'again')
  assert hf_convert.export_run(run, again) == [again]
  first, second = (hf_convert.read_state_dict(d) for d in (directory, again))
  assert set(first) == set(second)
  for key, value in first.items():
    np.testing.assert_array_equal(second[key], value, err_msg=key)
  assert 'task_type_ids' in open(os.path.join(again, 'README.md')).read()
  ids, types, mask, _ = _batch(vocab)
  pretrained = finetune.load_pretrained(run)
  assert pretrained.model.task_type_vocab_size == TASKS
  model = heads.DownstreamModel(pretrained.model, 'token', 2)
  args = (jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
  abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                     *args)['params'])
  shapes = lambda tree: jax.tree.map(lambda x: x.shape, {
      k: v for k, v in tree.items() if k not in heads.HEAD})
  assert shapes(abstract) == shapes(pretrained.params)
  hidden = jax.jit(lambda p, *a: model.apply(
      {'params': p}, *a, method=lambda m, a, b, c: bert_lib.run_layers(
          m.cfg, m.layers, m.embeddings(a, b, True), a, c, True)))(
              pretrained.params, *args)
  # The same tensors as the first export (above): its ErnieModel.
  theirs = _ernie(loaded[1][0].eval(), ids, types, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(hidden)[real],
                             theirs.last_hidden_state.numpy()[real],
                             rtol=0, atol=1e-4)
