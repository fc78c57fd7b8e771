"""Analytic training FLOPs per token, and MFU.

Dense matmul FLOPs only (2 per multiply-add), as MFU is usually counted
(PaLM, Megatron): embedding lookups, softmax, LayerNorm, GELU and the
per-sequence heads (pooler, NSP/SOP) are left out. Training costs three
forward passes (forward, and backward for activations and for weights).

Per token of one encoder layer of width d, FFN width f, at sequence length
s, forward:

  Q, K, V and output projections   8 d^2
  scores QK^T and the sum AV       4 s d
  FFN                              4 d f

so with f = 4d a layer costs 24 d^2 + 4 s d forward, and the dense encoder
72 L d^2 + 12 L s d to train. A prediction through the MLM head (transform
d -> E, tied decoder E -> V) costs 2 (d E + E V) forward; the head sees the
masked fraction p of the tokens. BERT-base at s = 128 comes to 0.545
GFLOP/token, BERT-large at s = 512 to 1.99 (tested).

A MobileBERT layer (inter-block width d, intra-block width i, F FFNs)
costs, forward, its bottlenecks 2 d i in and 2 i d out (and 2 d i more for
the shared key/query bottleneck), Q and K 2 i each per input dimension
(i, or d where they read the layer input), V likewise, the scores and AV
4 s i, the attention's output 2 i^2 and the FFNs 4 F i f. Without the
bottleneck i = d and nothing reads d otherwise: 8 d^2 + 4 s d + 4 F d f,
BERT's layer when F = 1. The trigram embedding projects 3E -> d
(6 E d).

Each objective composes these into its own FLOPs per token, in its module
(bertjax/objectives/): BERT's encoder with the factorized-embedding
projection (E -> d) if any, the MLM head on p = min(rate, P / s) and
SpanBERT's SBO head (3d -> d, d -> E, decoder) when it is on; ELECTRA's
generator and discriminator; distillation's student trained plus its
teacher's forward pass.

The MLM head counts the predictions made, p = min(rate, P / s) of the
tokens, not the P slots a sequence's head computes on, padding slots
included (P / s; ELECTRA's flops_computation.py counts those, its
output_frac 0.15625 = 80 / 512). The two differ by (P / s - rate) of a
head pass: at s = 128, P = 20, rate 0.15 that is 0.17% of BERT-base's
training FLOPs per token and 0.34% of the L2/H128 comparison model's.
The count stays as it is, since every FLOPs-budgeted comparison's step
counts (and so its committed rows' keys) derive from it.
"""

from __future__ import annotations

from bertjax.models import bert as bert_lib

# Dense bf16 peak FLOP/s per chip, by substrings of jax's ``device_kind``
# (the vendors' dense bf16 figures, no sparsity); first match wins.
PEAK_BF16_FLOPS = (
    ('H200', 989e12), ('H100 PCIe', 756e12), ('H100', 989e12),
    ('A100', 312e12),
    ('TPU v6', 918e12), ('TPU v5p', 459e12), ('TPU v5 lite', 197e12),
    ('TPU v5e', 197e12), ('TPU v5', 459e12),   # v5p reports 'TPU v5'.
    ('TPU v4', 275e12),
)


def layer_forward(d: int, f: int, s: int, a: int | None = None) -> float:
  """Forward FLOPs per token of one encoder layer whose attention is ``a``
  wide (its heads times their width; None = d, no head pruned)."""
  a = d if a is None else a
  return 8 * d * a + 4 * s * a + 4 * d * f


def mobilebert_layer_forward(cfg: bert_lib.BertConfig, s: int) -> float:
  """Forward FLOPs per token of one of ``cfg``'s MobileBERT layers."""
  d, i, f = cfg.hidden_size, cfg.intra_width, cfg.intermediate_size
  bottlenecks = 0
  query_key_input = value_input = d
  if cfg.bottleneck:
    bottlenecks = 4 * d * i   # In and out.
    if cfg.bottleneck_attention:
      query_key_input = value_input = i
    elif cfg.key_query_shared_bottleneck:
      bottlenecks += 2 * d * i
      query_key_input = i
  attention = (2 * i * (2 * query_key_input + value_input) + 4 * s * i
               + 2 * i * i)
  return bottlenecks + attention + cfg.num_feedforward_networks * 4 * i * f


def encoder_forward(cfg: bert_lib.BertConfig, s: int) -> float:
  """Forward FLOPs per token of the embedding projection and the layers
  (shared layers cost each time they run; a pruned layer's attention
  only for the heads it keeps)."""
  projection = 2 * cfg.embedding_width * cfg.hidden_size if (
      cfg.factorized) else 0
  if cfg.trigram_input:
    projection = 2 * 3 * cfg.word_width * cfg.hidden_size
  if cfg.mobilebert_layers:
    return projection + cfg.num_layers * mobilebert_layer_forward(cfg, s)
  return projection + sum(
      layer_forward(cfg.hidden_size, cfg.intermediate_size, s,
                    cfg.layer_heads(i) * cfg.head_dim)
      for i in range(cfg.num_layers))


def mlm_head_forward(cfg: bert_lib.BertConfig) -> float:
  """Forward FLOPs per prediction of the MLM head (transform + decoder;
  MobileBERT's decoder, the word table and its extra rows, is H wide)."""
  e = cfg.embedding_width
  return 2 * (cfg.hidden_size * e + e * cfg.vocab_size)


def sbo_head_forward(cfg: bert_lib.BertConfig) -> float:
  """Forward FLOPs per prediction of SpanBERT's SBO head."""
  d, e = cfg.hidden_size, cfg.embedding_width
  return 2 * ((2 * d + cfg.sbo_width) * d + d * e + e * cfg.vocab_size)


def masked_fraction(masking, max_seq_length: int) -> float:
  """Fraction of tokens the MLM head predicts: the ``masking`` section's
  rate, capped by P / s."""
  return min(masking.rate, masking.max_predictions_per_seq / max_seq_length)


def mlm_forward(model: bert_lib.BertConfig, s: int, p: float) -> float:
  """Forward FLOPs per token of the encoder and its MLM head predicting a
  fraction ``p`` of the tokens."""
  return encoder_forward(model, s) + p * mlm_head_forward(model)


def peak_flops(device_kind: str) -> float | None:
  """Dense bf16 peak FLOP/s of one device, or None when unknown (CPU)."""
  for name, peak in PEAK_BF16_FLOPS:
    if name.lower() in device_kind.lower():
      return peak
  return None
