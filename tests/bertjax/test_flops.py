"""Analytic FLOPs per token against hand derivations."""

import dataclasses

import pytest

from bertjax import config_lib
from bertjax import flops
from bertjax.models import bert
from bertjax.models import electra as electra_model
from bertjax.objectives import bert as bert_objective
from bertjax.objectives import distillation
from bertjax.objectives import electra


def _cfg(objective='bert', seq=128, predictions=20, **objective_fields):
  c = config_lib.base_config()
  c.objective.name = objective
  c.data.max_seq_length = seq
  c.masking.max_predictions_per_seq = predictions
  c.objective.update(objective_fields)
  return c


def test_layer_by_hand():
  # d = 2, f = 8, s = 3: Q, K, V, O 4 x 2 d^2 = 32; scores and AV
  # 2 x 2 s d = 24; FFN 2 x 2 d f = 64.
  assert flops.layer_forward(2, 8, 3) == 32 + 24 + 64


def test_a_pruned_layer_costs_only_its_heads():
  # BERT-base with layer 0 down to 4 of its 12 heads (a = 4 x 64 = 256):
  # its Q, K, V, O cost 4 x 2 d a and its scores and AV 2 x 2 s a.
  model = bert.BertConfig.from_size('base', vocab_size=30522)
  pruned = dataclasses.replace(
      model, pruned_heads=(tuple(range(8)),) + ((),) * 11)
  d, a, s = 768, 256, 128
  saved = 8 * d * (d - a) + 4 * s * (d - a)
  assert flops.encoder_forward(model, s) - flops.encoder_forward(
      pruned, s) == saved


@pytest.mark.parametrize('size, seq, predictions, expected', [
    ('base', 128, 20, 0.545e9), ('large', 512, 80, 1.99e9)])
def test_bert_matches_the_published_figures(size, seq, predictions,
                                            expected):
  model = bert.BertConfig.from_size(size, vocab_size=30522)
  got = bert_objective.flops_per_token(_cfg(seq=seq, predictions=predictions),
                                       model)
  assert got == pytest.approx(expected, rel=0.005)
  # And the closed form 72 L d^2 + 12 L s d + 6 p (d^2 + d V).
  layers, d, v = model.num_layers, model.hidden_size, 30522
  closed = 72 * layers * d**2 + 12 * layers * seq * d + 6 * 0.15 * (
      d**2 + d * v)
  assert got == pytest.approx(closed, rel=1e-12)


def test_the_mlm_fraction_is_capped_by_the_prediction_slots():
  model = bert.BertConfig.from_size('base', vocab_size=30522)
  few = bert_objective.flops_per_token(_cfg(predictions=5), model)
  enough = bert_objective.flops_per_token(_cfg(predictions=20), model)
  head = 6 * (768**2 + 768 * 30522)
  assert enough - few == pytest.approx((0.15 - 5 / 128) * head, rel=1e-9)


def test_albert_projection_and_head_by_hand():
  model = bert.BertConfig.from_size('base', vocab_size=30000,
                                    embedding_size=128, num_layer_groups=1)
  got = bert_objective.flops_per_token(_cfg(), model)
  d, e, v, s = 768, 128, 30000, 128
  # Shared layers still run 12 times; E -> d projection; head d->E, E->V.
  expected = 3 * (2 * e * d + 12 * (24 * d * d + 4 * s * d)
                  + 0.15 * 2 * (d * e + e * v))
  assert got == pytest.approx(expected, rel=1e-12)


def test_mobilebert_by_hand():
  # MobileBERT (Sun et al. 2020): H 512, I 128, E 128, 4 FFNs of 512, Q and
  # K from the shared bottleneck, V from the 512-wide input.
  model = bert.BertConfig(
      vocab_size=30522, hidden_size=512, num_layers=24, num_heads=4,
      intermediate_size=512, embedding_size=128, trigram_input=True,
      intra_bottleneck_size=128, key_query_shared_bottleneck=True,
      num_feedforward_networks=4)
  d, i, f, s, e, v = 512, 128, 512, 128, 128, 30522
  layer = (3 * 2 * d * i           # Input, shared Q/K and output bottlenecks.
           + 2 * 2 * i * i + 2 * d * i   # Q and K from I, V from H.
           + 4 * s * i + 2 * i * i       # Scores and AV; the output.
           + 4 * 4 * i * f)              # The 4 FFNs.
  assert layer == 1_736_704
  assert flops.encoder_forward(model, s) == 2 * 3 * e * d + 24 * layer
  # TINY: Q, K and V from the bottleneck, 2 FFNs.
  tiny = dataclasses.replace(model, key_query_shared_bottleneck=False,
                             bottleneck_attention=True,
                             num_feedforward_networks=2)
  tiny_layer = (2 * 2 * d * i + 3 * 2 * i * i + 4 * s * i + 2 * i * i
                + 2 * 4 * i * f)
  assert flops.encoder_forward(tiny, s) == 2 * 3 * e * d + 24 * tiny_layer
  # The decoder is H wide: the word table's E and the extra H - E.
  assert flops.mlm_head_forward(model) == 2 * (d * d + d * v)
  # Without the bottleneck: BERT's layer and one more FFN.
  stacked = bert.BertConfig.from_size('base', vocab_size=30522,
                                      num_feedforward_networks=2)
  assert flops.encoder_forward(stacked, s) == 12 * (
      flops.layer_forward(768, 3072, s) + 4 * 768 * 3072)


def test_sbo_adds_its_head_on_the_predictions():
  model = bert.BertConfig.from_size('base', vocab_size=30522)
  plain = bert_objective.flops_per_token(_cfg(seq=512, predictions=80),
                                         model)
  sbo = bert_objective.flops_per_token(
      _cfg(seq=512, predictions=80, sbo_weight=1.0), model)
  d, v = 768, 30522
  assert sbo - plain == pytest.approx(
      3 * 0.15 * 2 * (3 * d * d + d * d + d * v), rel=1e-9)


def test_electra_is_generator_plus_discriminator():
  c = _cfg('electra')
  model = bert.BertConfig.from_size('base', vocab_size=30522, hidden_size=256,
                                    num_heads=4, intermediate_size=1024,
                                    embedding_size=128)
  generator = electra_model.generator_config(model, 0.25)
  got = electra.flops_per_token(c, model, generator)
  s, d, dg, e, v = 128, 256, 64, 128, 30522
  p = int(0.155 * s) / s   # ELECTRA masks int((0.15 + 0.005) * L) tokens.
  generator = (2 * e * dg + 12 * (24 * dg * dg + 4 * s * dg)
               + p * 2 * (dg * e + e * v))
  discriminator = 2 * e * d + 12 * (24 * d * d + 4 * s * d) + 2 * (d * d + d)
  assert got == pytest.approx(3 * (generator + discriminator), rel=1e-12)


def test_distillation_adds_the_teachers_forward_only():
  teacher = bert.BertConfig.from_size('base', vocab_size=30522)
  student = dataclasses.replace(teacher, num_layers=6)
  c = _cfg('distillation')
  got = distillation.flops_per_token(c, student, teacher)
  alone = bert_objective.flops_per_token(_cfg(), student)
  teacher_forward = bert_objective.flops_per_token(_cfg(), teacher) / 3
  assert got == pytest.approx(alone + teacher_forward, rel=1e-12)


@pytest.mark.parametrize('kind, peak', [
    ('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H200', 989e12),
    ('NVIDIA H100 PCIe', 756e12),
    ('NVIDIA A100-SXM4-40GB', 312e12), ('TPU v4', 275e12),
    ('TPU v5 lite', 197e12), ('TPU v5p', 459e12), ('TPU v6 lite', 918e12),
    ('TPU v5', 459e12),   # What jax reports for a v5p (its topology's).
    ('cpu', None)])
def test_peak_by_device_kind(kind, peak):
  assert flops.peak_flops(kind) == peak
