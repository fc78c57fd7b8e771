"""What a pretraining run trains: a ``Task`` per objective family.

The trainer (train.py) is the same for every member of the BERT family; what
differs is how the parameters are created and what the loss is. A ``Task``
holds both, as pure functions:

  init(key, batch) -> params          boxed with logical axis names
  loss(params, batch, key, deterministic) -> (loss, metric sums)
  trainable(params) -> bool pytree    False for frozen leaves (a teacher);
                                      called on boxed and plain params, so
                                      a box counts as one leaf

``key`` is the step's key (dropout, and for ELECTRA its masking and
sampling); evaluation passes a fixed key with ``deterministic=True``. The
metric sums add across batches and hosts (``objectives.summarize`` turns
them into means).

``objective.name`` picks the family: ``bert`` (MLM, with NSP or SOP and
SpanBERT's SBO by weight: BERT, RoBERTa, ALBERT, SpanBERT, ERNIE,
BERT-wwm), ``electra`` and ``distillation``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from bertjax import config_lib
from bertjax import flops
from bertjax import objectives
from bertjax.models import bert as bert_lib

OBJECTIVES = config_lib.OBJECTIVES


@dataclasses.dataclass(frozen=True)
class Task:
  init: Callable[[jax.Array, dict], Any]
  loss: Callable[[Any, dict, jax.Array, bool], tuple[jax.Array, dict]]
  trainable: Callable[[Any], Any] | None = None   # None: every leaf.
  # Training FLOPs per real token (bertjax/flops.py), for MFU and compare.
  flops_per_token: float = 0.0


def model_inputs(batch: dict) -> tuple:
  """The pretraining model's positional inputs, from a pipeline batch."""
  return (batch['input_ids'], batch['token_type_ids'],
          batch['attention_mask'], batch['masked_positions'],
          batch['masked_unit_start'])


def bert_task(cfg, vocab_size: int) -> Task:
  """The encoder with its MLM, sentence-pair (NSP/SOP) and SBO heads."""
  model_cfg = config_lib.model_config(cfg, vocab_size)
  model = bert_lib.BertForPreTraining(model_cfg)
  o = cfg.objective

  def init(key, batch):
    return model.init(key, *model_inputs(batch))['params']

  def loss(params, batch, key, deterministic):
    outputs = model.apply({'params': params}, *model_inputs(batch),
                          deterministic=deterministic,
                          rngs=None if deterministic else {'dropout': key})
    return objectives.bert_pretraining(outputs, batch, o.mlm_weight,
                                       o.nsp_weight, o.sbo_weight)

  return Task(init, loss,
              flops_per_token=flops.training_flops_per_token(cfg, model_cfg))


def prepare_config(cfg):
  """``cfg`` with what its family derives before any data is read: for
  distillation, the teacher's tokenizer (checked first). Others: as is."""
  if cfg.objective.name == 'distillation':
    from bertjax import distill  # pylint: disable=g-import-not-at-top
    return distill.prepare_config(cfg)
  return cfg


def make_task(cfg, vocab_size: int) -> Task:
  """The task of ``cfg.objective.name``; ``vocab_size`` is padded."""
  name = cfg.objective.name
  if name == 'bert':
    return bert_task(cfg, vocab_size)
  if name == 'electra':
    # Imported here: bertjax.electra builds on this module's Task.
    from bertjax import electra  # pylint: disable=g-import-not-at-top
    return electra.electra_task(cfg, vocab_size)
  if name == 'distillation':
    # Imported here: bertjax.distill builds on this module's Task.
    from bertjax import distill  # pylint: disable=g-import-not-at-top
    return distill.distillation_task(cfg, vocab_size)
  raise ValueError(f'objective.name={name!r}; use one of {OBJECTIVES}.')
