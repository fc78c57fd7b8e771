"""The BERT family's objective: MLM, with NSP or SOP and SpanBERT's SBO by
weight (``objective.name='bert'``).

One objective covers BERT, RoBERTa, ALBERT, SpanBERT, ERNIE and BERT-wwm:
they differ in data layout, masking, model options and weights, which are
other config sections. Its loss is ``objective.mlm_weight`` x MLM +
``nsp_weight`` x NSP/SOP + ``sbo_weight`` x SBO (objectives/losses.py,
after google-research/bert's run_pretraining.py), a loss of weight 0 not
computed.
"""

from __future__ import annotations

from bertjax import flops
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import base
from bertjax.objectives import losses
from bertjax.objectives import registry

NAME = 'bert'


def encoder_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The encoder with the heads its weights ask for (the SBO head when
  ``objective.sbo_weight`` > 0); ``vocab_size`` is the tokenizer's."""
  m = cfg.model
  return model_config_lib.encoder_config(
      m, vocab_size, m.sbo_positions if cfg.objective.sbo_weight else 0)


def flops_per_token(cfg, model: bert_lib.BertConfig) -> float:
  """Training FLOPs per real token: the encoder, the MLM head on the
  predicted fraction, and the SBO head where it trains."""
  p = flops.masked_fraction(cfg.masking, cfg.data.max_seq_length)
  train = flops.mlm_forward(model, cfg.data.max_seq_length, p)
  if cfg.objective.sbo_weight:
    train += p * flops.sbo_head_forward(model)
  return 3 * train


def make_task(cfg, vocab_size: int) -> base.Task:
  """The encoder with its MLM, sentence-pair (NSP/SOP) and SBO heads."""
  model_cfg = encoder_config(cfg, vocab_size)
  model = bert_lib.BertForPreTraining(model_cfg)
  o = cfg.objective

  def init(key, batch):
    return model.init(key, *base.model_inputs(batch))['params']

  def loss(params, batch, key, deterministic):
    outputs = model.apply({'params': params}, *base.model_inputs(batch),
                          deterministic=deterministic,
                          rngs=None if deterministic else {'dropout': key})
    return losses.bert_pretraining(outputs, batch, o.mlm_weight,
                                   o.nsp_weight, o.sbo_weight,
                                   o.sbo_count_offset)

  return base.Task(init, loss,
                   flops_per_token=flops_per_token(cfg, model_cfg))


def export_family(cfg) -> str:
  """ALBERT with shared layers or a factorized embedding; RoBERTa with no
  NSP, packed full sentences and fairseq's exact GELU; BERT otherwise.
  SpanBERT's runs (span masking, with or without SBO) are BERTs, as
  SpanBERT released them."""
  if cfg.model.num_layer_groups or cfg.model.embedding_size:
    return 'albert'
  if (cfg.objective.nsp_weight == 0 and cfg.data.layout == 'full_sentences'
      and cfg.model.gelu == 'exact' and not cfg.objective.sbo_weight
      and cfg.masking.strategy != 'span'):
    return 'roberta'
  return 'bert'


OBJECTIVE = registry.register(base.Objective(
    name=NAME, make_task=make_task, encoder_config=encoder_config,
    export_family=export_family))
