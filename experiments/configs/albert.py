"""ALBERT: factorized embeddings, shared layers, SOP, n-gram masking, LAMB.

Lan et al. 2020, "ALBERT: A Lite BERT for Self-supervised Learning of
Language Representations": Table 1 (model sizes), Sec. 4.1 (setup) and
google-research/albert (run_pretraining.py, create_pretraining_data.py,
lamb_optimizer.py, the v2 model configs):

- model: base = 12 layers, H 768, 12 heads, FFN 3072; large = 24 layers,
  H 1024, 16 heads, FFN 4096; xlarge = 24 layers, H 2048, 16 heads, FFN
  8192; xxlarge = 12 layers, H 4096, 64 heads, FFN 16384 (the heads and
  FFN widths from the v2 configs); embedding size E = 128 projected to H; one set
  of layer weights shared by all layers (num_hidden_groups = 1); dropout 0
  (Sec. 4.9 and the v2 configs); vocabulary 30,000 SentencePiece pieces;
- data: sentence-order prediction pairs (consecutive segments, swapped with
  probability 0.5), 512 tokens, shorter with probability 0.1; n-gram masking
  with n <= 3, P(n) proportional to 1/n; 20 predictions per sequence;
  static masking, 40 differently masked copies (dupe_factor 40);
- optimizer: LAMB, learning rate 0.00176, batch 4096, 125,000 steps, 3,125
  warmup steps then linear decay to 0, weight decay 0.01 (biases and
  LayerNorm excluded from decay and from the layer adaptation), epsilon
  1e-6, gradients clipped to a global norm of 1.0.

Reference code (google-research/albert), followed step for step
(tests/experiments/test_fidelity.py): lamb_optimizer.py
``LAMBOptimizer.apply_gradients`` (raw moments, the trust ratio per
tensor: the query, key and value kernels each their own, although bertjax
fuses them); optimization.py ``create_optimizer`` (BERT's warmup and
decay, the clip); run_pretraining.py ``get_masked_lm_output`` and
``get_sentence_order_output``, added with weight 1.

  python -m bertjax.train --config=experiments/configs/albert.py:size=base \
      --workdir=$WORK/albert-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Departure: a one-sentence chunk's random B comes from another document in
one draw (albert tries 10 times).
The sentence-pair head and its metrics keep the trunk's ``nsp`` names.
"""

from bertjax import config_lib
from bertjax.models import bert as bert_lib

# (layers, hidden, heads, FFN) per size, Table 1; E = 128 for all.
SIZES = {'base': (12, 768, 12, 3072), 'large': (24, 1024, 16, 4096),
         'xlarge': (24, 2048, 16, 8192), 'xxlarge': (12, 4096, 64, 16384)}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base')
  if args['size'] not in SIZES:
    raise ValueError(f'size={args["size"]!r}; use one of {sorted(SIZES)}.')
  layers, hidden, heads, ffn = SIZES[args['size']]
  c = config_lib.base_config()
  m = c.model
  # model.size names a BERT size (the dimensions left at 0 come from it);
  # ALBERT's larger sizes set every dimension.
  m.size = args['size'] if args['size'] in bert_lib.SIZES else 'large'
  m.num_layers, m.hidden_size, m.num_heads = layers, hidden, heads
  m.intermediate_size = ffn
  m.embedding_size = 128
  m.num_layer_groups = 1
  m.hidden_dropout_rate = m.attention_dropout_rate = 0.0
  c.data.tokenizer.vocab_size = 30_000
  c.data.layout = 'sop'
  c.data.max_seq_length = 512
  c.data.short_seq_prob = 0.1
  c.objective.nsp_weight = 1.0          # The SOP loss, on the pair head.
  c.masking.strategy = 'ngram'
  c.masking.max_ngram = 3
  c.masking.max_predictions_per_seq = 20
  c.masking.dynamic = False
  c.data.dupe_factor = 40
  c.batch_size = 4096
  c.total_steps = 125_000
  o = c.optimizer
  o.name = 'lamb'
  o.schedule = 'bert_linear'
  o.learning_rate = 0.00176
  o.warmup_steps = 3125
  o.b1, o.b2, o.eps = 0.9, 0.999, 1e-6
  o.weight_decay = 0.01
  o.grad_clip_norm = 1.0
  return c
