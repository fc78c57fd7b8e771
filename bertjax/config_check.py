"""Mixes of settings that no paper used (traps), and impossible mixes.

``config_lib.validate`` checks each value against its allowed range. This
module looks at how values combine: ``warnings_for`` finds settings that are
each valid but together depart from every paper that the presets in
``experiments/configs/`` reproduce (a SpanBERT span masker with BERT's
per-token corruption, BERT's optimizer with RoBERTa's beta2, ...);
``errors_for`` finds mixes that cannot train as meant and that ``validate``
does not already reject. Every message names the
fields and their values, the paper the setting departs from (or why it is
impossible), and what to set instead.

Both functions are pure: they read a config shaped like
``config_lib.base_config()`` and return messages; the caller logs the
warnings and raises on the errors.
"""

from __future__ import annotations

import math
from typing import Callable

from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from data_pipelines import continual as continual_lib
from data_pipelines import instances as instances_lib

# Layouts of [CLS] A [SEP] B [SEP] pairs with a pair label
# (data_pipelines.instances).
_PAIR_LAYOUTS = ('nsp', 'sop', 'sentence_distance', 'discourse')
_PAIR_TASKS = {'nsp': 'next-sentence', 'sop': 'sentence-order'}
# ALBERT's repo (run_pretraining.py flags) masks at most 20 tokens in its
# 512-token SOP rows, and so does MobileBERT's (its README's command): a
# paper's setting, so not a trap.
_ALBERT_MAX_PREDICTIONS = 20


def _hidden_size(m) -> int | None:
  """The encoder width H, or None when ``model.size`` is unknown."""
  if m.hidden_size:
    return m.hidden_size
  size = bert_lib.SIZES.get(m.size)
  return size[1] if size else None


def _num_layers(m) -> int | None:
  """The encoder depth, or None when ``model.size`` is unknown."""
  if m.num_layers:
    return m.num_layers
  size = bert_lib.SIZES.get(m.size)
  return size[0] if size else None


# ---- Traps: each returns one message, or None when the trap is absent.


def _pairs_without_pair_loss(cfg) -> str | None:
  """RoBERTa and SpanBERT drop NSP by changing the data, not the weight."""
  layout = cfg.data.layout
  # The ERNIE 2.0 layouts' labels are their tasks' (tasks.*), not NSP's.
  if layout not in _PAIR_TASKS or cfg.objective.nsp_weight:
    return None
  return (f'data.layout={layout!r} builds sentence pairs with '
          f'{_PAIR_TASKS[layout]} labels, but objective.nsp_weight='
          f'{cfg.objective.nsp_weight} leaves the labels unused: RoBERTa and '
          'SpanBERT, which drop the pair objective, train on single packed '
          "segments instead. Set data.layout='full_sentences', or "
          'objective.nsp_weight=1.0 to train the pair head.')


def _span_geometry(cfg) -> str | None:
  """SpanBERT's paper run: Geometric(0.2) over [1, 10] words."""
  k = cfg.masking
  if k.strategy != 'span' or (
      math.isclose(k.span_geometric_p, 0.2) and
      (k.span_lower, k.span_upper) == (1, 10)):
    return None
  code_default = (" (p=0.3 is SpanBERT's released code's default, not its "
                  "paper's)" if math.isclose(k.span_geometric_p, 0.3) else '')
  return (f"masking.strategy='span' with masking.span_geometric_p="
          f'{k.span_geometric_p}, masking.span_lower={k.span_lower}, '
          f'masking.span_upper={k.span_upper}: SpanBERT\'s paper run draws '
          'span lengths from Geometric(p=0.2) clipped to [1, 10] words (mean '
          f'3.8){code_default}. Set masking.span_geometric_p=0.2, '
          'masking.span_lower=1, masking.span_upper=10.')


def _span_corruption_per_token(cfg) -> str | None:
  k = cfg.masking
  if k.strategy != 'span' or k.corruption_unit != 'token':
    return None
  return ("masking.strategy='span' with masking.corruption_unit='token' "
          'decides 80/10/10 per token: SpanBERT decides it once per span, so '
          'a span is all [MASK], all random or all kept. Set '
          "masking.corruption_unit='unit'.")


def _span_uniform_random_tokens(cfg) -> str | None:
  k = cfg.masking
  if k.strategy != 'span' or k.random_source != 'uniform':
    return None
  return ("masking.strategy='span' with masking.random_source='uniform': "
          'SpanBERT draws its random replacement tokens from the corpus '
          "unigram distribution. Set masking.random_source='unigram'.")


def _word_units_corrupted_per_unit(cfg) -> str | None:
  """BERT-wwm and ALBERT choose whole words but corrupt token by token."""
  k = cfg.masking
  if k.strategy not in ('whole_word', 'ngram') or k.corruption_unit != 'unit':
    return None
  paper = 'BERT-wwm' if k.strategy == 'whole_word' else 'ALBERT'
  return (f'masking.strategy={k.strategy!r} with masking.corruption_unit='
          f"'unit': {paper} decides 80/10/10 per token; once per unit is "
          "SpanBERT's rule for spans. Set masking.corruption_unit='token'.")


def _unigram_random_tokens_outside_span(cfg) -> str | None:
  """Unigram replacement tokens are SpanBERT's alone."""
  k = cfg.masking
  papers = {'token': 'BERT', 'whole_word': 'BERT-wwm', 'ngram': 'ALBERT'}
  if k.strategy not in papers or k.random_source != 'unigram':
    return None
  return (f'masking.strategy={k.strategy!r} with masking.random_source='
          f"'unigram': {papers[k.strategy]} draws random replacement tokens "
          'uniformly from the vocabulary; unigram draws are SpanBERT\'s, '
          "with span masking. Set masking.random_source='uniform'.")


def _ngram_length(cfg) -> str | None:
  k = cfg.masking
  if k.strategy != 'ngram' or k.max_ngram == 3:
    return None
  return (f"masking.strategy='ngram' with masking.max_ngram={k.max_ngram}: "
          'ALBERT masks n-grams of n <= 3 words with P(n) proportional to 1/n '
          '(6/11, 3/11, 2/11). Set masking.max_ngram=3.')


def _prediction_cap_lowers_rate(cfg) -> str | None:
  """BERT sizes the prediction slots to max_seq_length x rate (20 at 128,
  80 at 512); fewer slots silently lower the masking rate of full rows."""
  d, k = cfg.data, cfg.masking
  # BERT's count rule on a full row; Python's round is numpy's (half even).
  budget = max(1, round(d.max_seq_length * k.rate))
  if k.max_predictions_per_seq >= budget:
    return None
  if ((d.layout == 'sop' or model_config_lib.mobilebert_options(cfg.model))
      and k.max_predictions_per_seq == _ALBERT_MAX_PREDICTIONS):
    return None
  effective = k.max_predictions_per_seq / d.max_seq_length
  return (f'masking.max_predictions_per_seq={k.max_predictions_per_seq} '
          f'caps the masking.rate={k.rate} budget of a full '
          f'data.max_seq_length={d.max_seq_length} row ({budget} tokens): '
          f'full rows get {effective:.1%} of their tokens masked. BERT sets '
          'it to about max_seq_length x rate (20 at 128, 80 at 512). Set '
          f'masking.max_predictions_per_seq={budget} or more.')


def _raw_moments_with_other_beta2(cfg) -> str | None:
  """bert_adamw and lamb keep raw moments; their papers use beta2 0.999."""
  o = cfg.optimizer
  if o.name not in ('bert_adamw', 'lamb') or math.isclose(o.b2, 0.999):
    return None
  paper = ("BERT's AdamWeightDecay" if o.name == 'bert_adamw'
           else "ALBERT's LAMB")
  return (f'optimizer.name={o.name!r} with optimizer.b2={o.b2}: {paper} '
          'keeps raw (not bias-corrected) moments and uses beta2 0.999; '
          "beta2 0.98 is RoBERTa's, with fairseq's bias-corrected Adam. Set "
          "optimizer.b2=0.999, or optimizer.name='fairseq_adam' for "
          "RoBERTa's optimizer.")


def _bert_optimizer_on_packed_data(cfg) -> str | None:
  """Among MLM models only BERT uses raw-moment Adam, and only on its NSP
  pairs (ELECTRA, which uses it too, trains another objective; TinyBERT's
  BertAdam, clipping per tensor, trains on packed rows, and so does its
  MLM-alone control)."""
  if (cfg.data.layout not in instances_lib.PACKED_LAYOUTS or
      cfg.optimizer.name != 'bert_adamw' or cfg.objective.name != 'bert' or
      cfg.optimizer.grad_clip == 'per_tensor'):
    return None
  return (f"data.layout='{cfg.data.layout}' with optimizer.name="
          "'bert_adamw' is BERT's optimizer (no bias correction) on "
          "RoBERTa's data: RoBERTa and SpanBERT, which train on packed "
          'single segments, use '
          "fairseq's bias-corrected Adam. Set optimizer.name='fairseq_adam' "
          "(with optimizer.schedule='warmup_linear', as "
          'experiments/configs/roberta.py).')


def _lamb_with_dropout(cfg) -> str | None:
  m = cfg.model
  if cfg.optimizer.name != 'lamb' or not (
      m.hidden_dropout_rate or m.attention_dropout_rate):
    return None
  # MobileBERT's teacher (IB-BERT) trains with LAMB and dropout 0.1.
  if model_config_lib.mobilebert_options(m):
    return None
  return ("optimizer.name='lamb' with model.hidden_dropout_rate="
          f'{m.hidden_dropout_rate} and model.attention_dropout_rate='
          f'{m.attention_dropout_rate}: ALBERT trains with LAMB and dropout '
          '0. Set model.hidden_dropout_rate=0.0 and '
          'model.attention_dropout_rate=0.0.')


def _sharing_without_factorization(cfg) -> str | None:
  """ALBERT's models pair cross-layer sharing with E = 128 embeddings."""
  m = cfg.model
  if not m.num_layer_groups:
    return None
  hidden = _hidden_size(m)
  if m.embedding_size and m.embedding_size != hidden:
    return None
  width = f'H={hidden}' if hidden else 'H'
  return (f'model.num_layer_groups={m.num_layer_groups} with '
          f'model.embedding_size={m.embedding_size} (no factorization: the '
          f'embeddings are {width} wide): ALBERT shares layers together '
          'with factorized embeddings, E=128 projected to H. Set '
          'model.embedding_size=128.')


def _script_default_learning_rate(cfg) -> str | None:
  o = cfg.optimizer
  # TinyBERT's general_distill.py takes 5e-5 as its own default, with
  # BertAdam (per-tensor clipping), its MLM-alone control too.
  if (cfg.objective.name != 'bert' or o.name != 'bert_adamw' or
      o.grad_clip == 'per_tensor' or
      cfg.batch_size != 256 or
      not math.isclose(o.learning_rate, 5e-5)):
    return None
  return (f'optimizer.learning_rate={o.learning_rate} with '
          "optimizer.name='bert_adamw' and batch_size=256 is "
          "google-research/bert's run_pretraining.py flag default, not the "
          "paper's: BERT pretrained at peak lr 1e-4 with batch 256. Set "
          'optimizer.learning_rate=1e-4.')


def _static_masks_never_change(cfg) -> str | None:
  if cfg.masking.dynamic or cfg.data.dupe_factor != 1:
    return None
  return ('masking.dynamic=False with data.dupe_factor=1: every epoch sees '
          'the same masks. BERT makes 10 differently masked copies '
          '(dupe_factor 10; ALBERT 40) and RoBERTa masks anew each time. Set '
          'data.dupe_factor=10, or masking.dynamic=True.')


def _mobilebert_never_distils(cfg) -> str | None:
  """MobileBERT transfers every layer before it distils the predictions."""
  layers = _num_layers(cfg.model)
  if cfg.objective.name != 'mobilebert' or layers is None:
    return None
  per_layer = cfg.mobilebert.steps_per_layer
  if cfg.total_steps >= per_layer * layers:
    return None
  return (f'total_steps={cfg.total_steps} ends inside the progressive '
          f'transfer (mobilebert.steps_per_layer={per_layer} x {layers} '
          f'layers = {per_layer * layers} steps): the upper layers are '
          'never transferred and the pretraining distillation never runs. '
          f'Set total_steps >= {per_layer * layers} (MobileBERT: 240k of '
          'transfer and 500k of distillation), or fewer '
          'mobilebert.steps_per_layer.')


_TRAPS: tuple[Callable[..., str | None], ...] = (
    _pairs_without_pair_loss,
    _span_geometry,
    _span_corruption_per_token,
    _span_uniform_random_tokens,
    _word_units_corrupted_per_unit,
    _unigram_random_tokens_outside_span,
    _ngram_length,
    _prediction_cap_lowers_rate,
    _raw_moments_with_other_beta2,
    _bert_optimizer_on_packed_data,
    _lamb_with_dropout,
    _sharing_without_factorization,
    _script_default_learning_rate,
    _static_masks_never_change,
    _mobilebert_never_distils,
)


# ---- Impossible mixes that config_lib.validate does not reject.


def _token_types_out_of_range(cfg) -> str | None:
  """Pairs give segment B token type 1, in whichever stream of a continual
  run builds them; packed rows use type 0 only, and a model with no
  token-type table (``type_vocab_size=0``, DistilBERT's) ignores types."""
  size = cfg.model.type_vocab_size
  pairs = sorted({s.layout for s in continual_lib.streams(cfg)
                  if s.layout in _PAIR_LAYOUTS})
  if size >= 2 or not pairs:
    return None
  where = (f'data.layout={cfg.data.layout!r}' if pairs == [cfg.data.layout]
           else 'the continual streams with layouts ' + ', '.join(
               repr(p) for p in pairs))
  if not size:
    why = ('the model has no token-type table, so segment B is not told '
           'apart from A')
  else:
    why = ('segment B has token type 1, outside the one-row table (JAX '
           "clamps the lookup, so B silently gets A's embedding)")
  return (f'model.type_vocab_size={size} with {where}: {why}. Set '
          'model.type_vocab_size=2 (BERT).')


def _no_loss(cfg) -> str | None:
  o = cfg.objective
  # ``sbo_weight`` is SpanBERT's span boundary objective, where configured.
  weights = {name: o[name] for name in ('mlm_weight', 'nsp_weight',
                                        'sbo_weight') if name in o}
  if any(weights.values()):
    return None
  # The tasks beyond masking train alone (objectives/auxiliary.py).
  if cfg.objective.name == 'bert' and continual_lib.run_tasks(cfg):
    return None
  named = ' and '.join(f'objective.{name}={value}'
                       for name, value in weights.items())
  return (f'{named}: the loss is 0, so nothing is trained. Set '
          'objective.mlm_weight=1.0, or a task of tasks.* weight > 0.')


def _tinybert_stage_without_loss(cfg) -> str | None:
  """Each TinyBERT stage trains on its own weights; all 0 trains nothing."""
  if cfg.objective.name != 'tinybert':
    return None
  t = cfg.tinybert
  first = min(t.intermediate_steps, cfg.total_steps)
  stages = (
      ('intermediate-layer', first, ('embedding_weight', 'hidden_weight',
                                     'attention_weight')),
      ('prediction-layer', cfg.total_steps - first,
       ('prediction_weight', 'mlm_weight')))
  for stage, steps, names in stages:
    if steps > 0 and not any(t[name] for name in names):
      weights = ', '.join(f'tinybert.{name}={t[name]}' for name in names)
      return (f'the {stage} stage runs {steps} steps (tinybert.'
              f'intermediate_steps={t.intermediate_steps}, total_steps='
              f'{cfg.total_steps}) with {weights}: its loss is 0, so those '
              'steps train nothing. Give the stage a weight > 0 (TinyBERT '
              'weighs each loss 1), or set tinybert.intermediate_steps so '
              'that it has no steps.')
  return None


def _mobilebert_stage_without_loss(cfg) -> str | None:
  """The progressive transfer trains on its four weights; all 0 trains
  nothing (the distillation after it always has a loss)."""
  if cfg.objective.name != 'mobilebert':
    return None
  t = cfg.mobilebert
  names = ('hidden_weight', 'attention_weight', 'mean_weight',
           'variance_weight')
  if not t.steps_per_layer or any(t[name] for name in names):
    return None
  weights = ', '.join(f'mobilebert.{name}={t[name]}' for name in names)
  return (f'the progressive transfer runs mobilebert.steps_per_layer='
          f'{t.steps_per_layer} steps per layer with '
          f'{weights}: its loss is 0, so those steps train nothing. Give a '
          'weight > 0 (MobileBERT: 100, 1, 5000 and 5), or set '
          'mobilebert.steps_per_layer=0 to distil without it.')


_ERRORS: tuple[Callable[..., str | None], ...] = (
    _token_types_out_of_range,
    _no_loss,
    _tinybert_stage_without_loss,
    _mobilebert_stage_without_loss,
)


def warnings_for(cfg) -> list[str]:
  """Messages, one per trap in ``cfg`` (a ``config_lib.base_config()``-shaped
  ConfigDict); [] when its settings combine as some paper's did."""
  return [message for message in (trap(cfg) for trap in _TRAPS) if message]


def errors_for(cfg) -> list[str]:
  """Messages, one per impossible mix in ``cfg`` that
  ``config_lib.validate`` does not already reject; [] when none."""
  return [message for message in (check(cfg) for check in _ERRORS)
          if message]
