"""ERNIE 2.0's task embedding: one learned row per task id, added to the
input before the embedding LayerNorm."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import config_lib
from bertjax.models import bert
from bertjax.models import config as model_config_lib
from bertjax.objectives import base
from bertjax.objectives import bert as bert_objective

CFG = bert.BertConfig(vocab_size=128, hidden_size=32, num_layers=1,
                      num_heads=2, intermediate_size=64,
                      max_position_embeddings=16, task_type_vocab_size=3,
                      hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
B, L, P = 2, 16, 4


def _inputs(seed=0):
  """ids, token types, mask, masked positions, and task ids [B, L], none
  of them task 0 (row 0 tasks 1 then 2; row 1 task 2)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, CFG.vocab_size, (B, L)).astype(np.int32)
  types = np.zeros((B, L), np.int32)
  types[:, 8:] = 1
  mask = np.ones((B, L), np.int32)
  positions = np.tile(np.arange(1, P + 1, dtype=np.int32), (B, 1))
  tasks = np.full((B, L), 2, np.int32)
  tasks[0, :6] = 1
  return ids, types, mask, positions, tasks


def _random(abstract, seed=0):
  """Values for the (boxed) abstract parameters ``abstract``: every leaf
  random, so that no row or bias is zero by chance of the init; compiling
  the init would take longer than the tests."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: rng.normal(0, 0.5, x.shape).astype(np.float32),
      nn.unbox(abstract))


@pytest.fixture(scope='module')
def abstract():
  ids, types, mask, positions, tasks = _inputs()
  return jax.eval_shape(bert.BertForPreTraining(CFG).init, jax.random.key(0),
                        ids, types, mask, positions,
                        task_type_ids=tasks)['params']


@pytest.fixture(scope='module')
def params(abstract):
  return _random(abstract)


def test_task_rows_add_to_the_sum_before_layer_norm(params):
  """With task ids t the sum the LayerNorm reads is the task-free model's
  sum (same other tables) plus row t of the task table."""
  ids, types, _, _, tasks = _inputs()
  embeddings = params['embeddings']
  table = embeddings['task_type']['embedding']
  with_tasks = bert.Embeddings(CFG).apply(
      {'params': embeddings}, ids, types, tasks,
      method=bert.Embeddings.summed)
  without = bert.Embeddings(dataclasses.replace(
      CFG, task_type_vocab_size=0)).apply(
          {'params': {k: v for k, v in embeddings.items()
                      if k != 'task_type'}}, ids, types,
          method=bert.Embeddings.summed)
  # Exactly: the sum is the task-free one, then one more addition.
  np.testing.assert_array_equal(with_tasks, without + table[tasks])


def test_no_task_ids_are_task_zero(params):
  ids, types, _, _, tasks = _inputs()
  summed = lambda t=None: bert.Embeddings(CFG).apply(
      {'params': params['embeddings']}, ids, types, t,
      method=bert.Embeddings.summed)
  np.testing.assert_array_equal(summed(), summed(np.zeros_like(tasks)))


def test_the_table_is_like_the_token_type_table(abstract):
  """[task_type_vocab_size, D], logical axes ('types', 'embed') as the
  token-type table's; it adds task_type_vocab_size x D parameters."""
  task, types = (abstract['embeddings'][k]['embedding']
                 for k in ('task_type', 'token_type'))
  assert task.value.shape == (CFG.task_type_vocab_size, CFG.hidden_size)
  assert task.names == types.names == ('types', 'embed')
  without = jax.eval_shape(
      bert.BertForPreTraining(dataclasses.replace(
          CFG, task_type_vocab_size=0)).init, jax.random.key(0),
      *_inputs()[:4])['params']
  count = lambda tree: sum(x.size for x in jax.tree.leaves(nn.unbox(tree)))
  assert count(abstract) - count(without) == (
      CFG.task_type_vocab_size * CFG.hidden_size)


def test_task_ids_without_a_table_or_of_another_shape_are_refused():
  ids, types, mask, positions, tasks = _inputs()
  plain = bert.BertForPreTraining(dataclasses.replace(
      CFG, task_type_vocab_size=0))
  with pytest.raises(ValueError, match='task_type_vocab_size'):
    jax.eval_shape(plain.init, jax.random.key(0), ids, types, mask,
                   positions, task_type_ids=tasks)
  with pytest.raises(ValueError, match='shaped as input_ids'):
    jax.eval_shape(bert.BertForPreTraining(CFG).init, jax.random.key(0), ids,
                   types, mask, positions, task_type_ids=tasks[:, 0])


def test_model_kwargs_of_a_batch():
  ids = np.zeros((B, L), np.int32)
  assert not base.model_kwargs({'input_ids': ids})
  tasks = np.arange(B * L, dtype=np.int32).reshape(B, L) % 3
  assert base.model_kwargs({'input_ids': ids, 'task_type_ids': tasks}
                           )['task_type_ids'] is tasks
  per_row = base.model_kwargs({'input_ids': ids,
                               'task_type_ids': np.array([2, 1], np.int32)})
  np.testing.assert_array_equal(per_row['task_type_ids'],
                                [[2] * L, [1] * L])


def test_config_field_reaches_the_model_and_is_checked():
  cfg = config_lib.demo_config()
  assert cfg.model.task_type_vocab_size == 0
  assert bert_objective.export_family(cfg) == 'bert'
  cfg.model.task_type_vocab_size = 4
  assert model_config_lib.encoder_config(
      cfg.model, 100).task_type_vocab_size == 4
  assert bert_objective.export_family(cfg) == 'ernie'
  errors = []
  cfg.model.task_type_vocab_size = -1
  model_config_lib.check(cfg.model, errors)
  assert any('model.task_type_vocab_size=-1' in e for e in errors), errors


def test_the_bert_objective_reads_the_task_ids_of_its_batch():
  """make_task threads a batch's ``task_type_ids`` into init and loss."""
  cfg = config_lib.demo_config()
  cfg.model.update(num_layers=1, hidden_size=32, num_heads=2,
                   intermediate_size=64, task_type_vocab_size=3,
                   hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  task = bert_objective.make_task(cfg, 100)
  ids, types, mask, positions, tasks = _inputs()
  ids %= 100   # The tokenizer's ids; the table has 128 rows.
  batch = {'input_ids': ids, 'token_type_ids': types, 'attention_mask': mask,
           'masked_positions': positions, 'masked_ids': ids[:, :P],
           'masked_weights': np.ones((B, P), np.float32),
           'masked_unit_start': positions,
           'next_sentence_labels': np.zeros(B, np.int32),
           'task_type_ids': tasks}
  p = _random(jax.eval_shape(task.init, jax.random.key(0), batch))
  loss = jax.jit(lambda b: task.loss(p, b, jax.random.key(1), True)[0])
  assert loss(batch) != loss(dict(batch, task_type_ids=np.zeros_like(tasks)))
