"""The BERT family's objective: MLM, with NSP or SOP and SpanBERT's SBO by
weight (``objective.name='bert'``).

One objective covers BERT, RoBERTa, ALBERT, SpanBERT, ERNIE and BERT-wwm:
they differ in data layout, masking, model options and weights, which are
other config sections. Its loss is ``objective.mlm_weight`` x MLM +
``nsp_weight`` x NSP/SOP + ``sbo_weight`` x SBO (objectives/losses.py,
after google-research/bert's run_pretraining.py), a loss of weight 0 not
computed; plus, by weight, the tasks beyond masking of ``cfg.tasks``
(ERNIE 2.0's, and the encoder forms of BART's and T5's denoising tasks:
objectives/auxiliary.py). With every pretraining weight 0 (a task alone)
the loss runs the encoder without the MLM and NSP heads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax import flops
from bertjax import quantization
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import auxiliary
from bertjax.objectives import base
from bertjax.objectives import losses
from bertjax.objectives import registry
from data_pipelines import instances as instances_lib

NAME = 'bert'


def encoder_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The encoder with the heads its weights ask for (the SBO head when
  ``objective.sbo_weight`` > 0); ``vocab_size`` is the tokenizer's."""
  m = cfg.model
  return model_config_lib.encoder_config(
      m, vocab_size, m.sbo_positions if cfg.objective.sbo_weight else 0)


def _encoder_only(cfg) -> bool:
  """Whether no loss reads the pretraining heads (the tasks beyond masking
  alone): the loss then runs the encoder without them."""
  o = cfg.objective
  return not (o.mlm_weight or o.nsp_weight or o.sbo_weight)


def flops_per_token(cfg, model: bert_lib.BertConfig) -> float:
  """Training FLOPs per real token: the encoder, the MLM head on the
  predicted fraction, the SBO head where it trains, and the heads of the
  tasks beyond masking (objectives/auxiliary.py)."""
  tasks = auxiliary.flops_per_token(cfg, model)
  if _encoder_only(cfg):
    return 3 * flops.encoder_forward(model, cfg.data.max_seq_length) + tasks
  p = flops.masked_fraction(cfg.masking, cfg.data.max_seq_length)
  train = flops.mlm_forward(model, cfg.data.max_seq_length, p)
  if cfg.objective.sbo_weight:
    train += p * flops.sbo_head_forward(model)
  return 3 * train + tasks


def make_task(cfg, vocab_size: int) -> base.Task:
  """The encoder with its MLM, sentence-pair (NSP/SOP) and SBO heads, and
  the heads of the tasks of ``cfg.tasks`` that are on (their parameters
  under ``auxiliary.PARAMS``)."""
  model_cfg = encoder_config(cfg, vocab_size)
  model = quantization.quantized(bert_lib.BertForPreTraining(model_cfg),
                                 methods=('__call__', 'encode'))
  heads = auxiliary.make_heads(cfg, model_cfg)
  encoder_only = _encoder_only(cfg)
  o = cfg.objective

  def init(key, batch):
    params = model.init(key, *base.model_inputs(batch),
                        **base.model_kwargs(batch))['params']
    if heads is None:
      return params
    x = jnp.zeros(batch['input_ids'].shape + (model_cfg.hidden_size,),
                  model_cfg.dtype)
    return dict(params, **{auxiliary.PARAMS: heads.init(
        jax.random.fold_in(key, 1), x, batch['attention_mask'])['params']})

  def loss(params, batch, key, deterministic):
    variables = {'params': auxiliary.drop_heads(params)}
    rngs = None if deterministic else {'dropout': key}
    if encoder_only:
      total, metrics = jnp.zeros((), jnp.float32), {}
      x = model.apply(variables, *base.model_inputs(batch)[:3],
                      deterministic=deterministic, rngs=rngs,
                      method=model.encode, **base.model_kwargs(batch))
    else:
      outputs = model.apply(variables, *base.model_inputs(batch),
                            **base.model_kwargs(batch),
                            deterministic=deterministic, rngs=rngs)
      total, metrics = losses.bert_pretraining(
          outputs, batch, o.mlm_weight, o.nsp_weight, o.sbo_weight,
          o.sbo_count_offset)
      x = outputs['sequence_output']
    if heads is not None:
      logits = heads.apply({'params': params[auxiliary.PARAMS]}, x,
                           batch['attention_mask'])
      task_total, task_metrics = auxiliary.losses(cfg, logits, batch)
      total = total + task_total
      metrics.update(task_metrics)
    return total, metrics

  return base.Task(init, loss,
                   flops_per_token=flops_per_token(cfg, model_cfg))


def export_family(cfg) -> str:
  """MobileBERT with its trigram embedding, bottleneck, stacked FFNs or
  NoNorm (ReLU alone is a BERT's option); ERNIE 2.0 with a task embedding;
  ALBERT with shared layers or a factorized embedding; RoBERTa with no
  NSP, packed full sentences and fairseq's exact GELU; BERT otherwise.
  SpanBERT's runs (span masking, with or without SBO) are BERTs, as
  SpanBERT released them, and so are ERNIE 1.0's (knowledge masking, no
  task embedding)."""
  m = cfg.model
  if (m.trigram_input or model_config_lib.mobilebert_layers(m)
      or m.normalization != 'layer_norm'):
    return 'mobilebert'
  if m.task_type_vocab_size > 0:
    return 'ernie'
  if m.num_layer_groups or m.embedding_size:
    return 'albert'
  if (cfg.objective.nsp_weight == 0
      and cfg.data.layout in instances_lib.PACKED_LAYOUTS
      and m.gelu == 'exact' and m.hidden_act == 'gelu'
      and not cfg.objective.sbo_weight and cfg.masking.strategy != 'span'):
    return 'roberta'
  return 'bert'


OBJECTIVE = registry.register(base.Objective(
    name=NAME, make_task=make_task, encoder_config=encoder_config,
    export_family=export_family, encoder_params=auxiliary.drop_heads))
