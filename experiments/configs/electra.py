"""ELECTRA: a small generator's replacements, detected by the discriminator.

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators
Rather Than Generators", Table 6 (pre-training hyperparameters) and
google-research/electra (configure_pretraining.py, run_pretraining.py,
pretrain/pretrain_helpers.py, model/optimization.py):

- model: small = 12 layers, H 256, 4 heads, FFN 1024, embedding size
  E = 128; base = 12 layers, H 768, 12 heads, FFN 3072, E = 768; GELU (the
  exact erf form), dropout 0.1. The generator has the same depth and 1/4
  (small) or 1/3 (base) of the width (heads width // 64, FFN 4 x width) and
  shares the token, position and token-type embeddings;
- objective: 1.0 x generator MLM + 50.0 x discriminator loss; masking in the
  step: int((0.15 + 0.005) x L) prediction slots, 85% [MASK], 15% kept, no
  random tokens; replacements sampled from the generator at temperature 1;
- data: BERT's data without NSP, 128 tokens (small), 512 (base: the
  repo's settings for the larger models);
- optimizer: BERT's AdamW (no bias correction), beta 0.9/0.999, epsilon
  1e-6, weight decay 0.01, gradients clipped to a global norm of 1.0; lr
  5e-4 (small) / 2e-4 (base), 10k warmup steps, linear decay with ELECTRA's
  multiplicative warmup (schedule 'electra'); batch 128 / 256, 1M / 766k
  steps.

Reference code (google-research/electra), followed step for step
(tests/experiments/test_fidelity.py): model/optimization.py
``create_optimizer`` (the schedule, the clip, ``exclude_from_weight_decay``)
and ``AdamWeightDecayOptimizer``; run_pretraining.py ``PretrainingModel``:
``_get_masked_lm_output`` (sum / (count + 1e-6)), ``_get_fake_data`` (a
sample equal to the original is not "replaced"),
``_get_discriminator_output`` (sum over the real tokens / (count + 1e-6)),
and the generator sharing the discriminator's "electra/embeddings" scope
(tables and their LayerNorm). [PAD] and the other specials can be sampled,
as there; TensorFlow's lookup trains their rows when they are.

  python -m bertjax.train --config=experiments/configs/electra.py:size=small \
      --workdir=$WORK/electra-small --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Fine-tune the discriminator with ELECTRA's recipe (layer-wise lr decay, no
pooler, summed loss: experiments/configs/finetune.py says each piece):

  python experiments/finetune.py \
      --config=experiments/configs/finetune.py:task=glue/mrpc,recipe=electra,size=small \
      --config.init=$WORK/electra-small --workdir=$WORK/electra-small-mrpc

Departures:
- data: data.layout='full_sentences' with objective.nsp_weight=0: sentences
  packed across documents into one segment. electra's builder packs
  sentences of one document into two segments (token types 0 and 1; one
  segment 10% of the time) and makes 5% of examples shorter.
- the host pipeline still masks each batch for BERT; the step undoes it
  from ``masked_ids`` and masks anew (wasted host work; the host masking's
  rate and slots are set to ELECTRA's so its telemetry and the
  most-frequent-token baseline describe comparable positions).
- masked positions are drawn without replacement (electra's draw may repeat
  a position); see bertjax/objectives/electra.py.
- vocabulary: a 30522-piece SentencePiece model trained on the corpus
  (electra uses BERT's uncased WordPiece vocabulary of 30522), padded to a
  multiple of 128.
"""

from bertjax import config_lib
from bertjax.models import electra as electra_lib

# Table 6: (layers, hidden, heads, FFN, E, generator width fraction, batch,
# peak lr, steps, seq length). The base generator's 1/3 is the repo's
# 0.33333; both give 256.
SIZES = {
    'small': (12, 256, 4, 1024, 128, 0.25, 128, 5e-4, 1_000_000, 128),
    'base': (12, 768, 12, 3072, 768, 1 / 3, 256, 2e-4, 766_000, 512),
}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='small')
  if args['size'] not in SIZES:
    raise ValueError(f'size={args["size"]!r}; use one of {sorted(SIZES)}.')
  (layers, hidden, heads, ffn, embedding, generator_fraction, batch, lr,
   steps, seq_len) = SIZES[args['size']]
  c = config_lib.base_config()
  m = c.model
  m.size = args['size']
  m.num_layers, m.hidden_size, m.num_heads = layers, hidden, heads
  m.intermediate_size = ffn
  m.embedding_size = embedding
  m.hidden_dropout_rate = m.attention_dropout_rate = 0.1
  c.objective.name = 'electra'
  c.objective.nsp_weight = 0.0
  e = c.electra
  e.generator_hidden_fraction = generator_fraction
  e.generator_layers_fraction = 1.0
  e.mask_prob = 0.15
  e.mask_token_prob = 0.85
  e.temperature = 1.0
  e.generator_weight = 1.0
  e.discriminator_weight = 50.0
  c.data.tokenizer.vocab_size = 30522
  c.data.layout = 'full_sentences'
  c.data.max_seq_length = seq_len
  # The host's masking, undone in the step: ELECTRA's rate and slots.
  c.masking.rate = e.mask_prob
  c.masking.max_predictions_per_seq = electra_lib.num_slots(e.mask_prob,
                                                           seq_len)
  c.masking.dynamic = True
  c.batch_size = batch
  c.total_steps = steps
  o = c.optimizer
  o.name = 'bert_adamw'
  o.schedule = 'electra'
  o.learning_rate = lr
  o.warmup_steps = 10_000
  o.b1, o.b2, o.eps = 0.9, 0.999, 1e-6
  o.weight_decay = 0.01
  o.grad_clip_norm = 1.0
  return c
