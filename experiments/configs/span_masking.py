"""SpanBERT's span masking and data on the BERT encoder, without SBO.

Joshi et al. 2020, "SpanBERT", Sec. 3.1 and 4 (the paper's run, not the
code's defaults, which use geometric p 0.3): span lengths in words ~
Geometric(0.2) clipped to [1, 10] (mean 3.8), uniform starts, whole words,
until 15% of the tokens are covered; 80/10/10 decided once per span, random
tokens drawn from the corpus unigram distribution; no NSP, one contiguous
segment of up to 512 tokens (full-sentence packing), short_seq_prob 0; Adam
lr 1e-4, beta (0.9, 0.999), epsilon 1e-8, weight decay 0.01, clip 1.0,
warmup 10k, linear decay, batch 256, 2.4M steps; the exact (erf) GELU of
its BERT port.

Reference code: facebookresearch/SpanBERT's fork of fairseq, as its README's
pretraining command runs it: pretraining/fairseq/optim/adam.py ``Adam.step``
(optimizer.name='fairseq_adam', every parameter decayed:
optimizer.decay_mask='all'); pretraining/fairseq/optim/lr_scheduler/
polynomial_decay_schedule.py ``step_update`` with its trainer
(schedule 'spanbert': the first update at the peak lr, then warmup from
peak / W, and decay measured from step 0); pretraining/fairseq/models/
pair_bert.py (the model, ``gelu`` = erf).

  python -m bertjax.train --config=experiments/configs/span_masking.py \
      --workdir=$WORK/span-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Departures: no span boundary objective (SBO; spanbert.py adds it, and this
preset is the paper's own no-SBO ablation); dynamic masking (SpanBERT masks
each epoch anew through fairseq); spans start uniformly over words rather
than over tokens.
"""

from bertjax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base')
  c = config_lib.base_config()
  c.model.size = args['size']
  c.batch_size = 256
  c.total_steps = 2_400_000
  c.data.layout = 'full_sentences'
  c.data.max_seq_length = 512
  c.data.short_seq_prob = 0.0
  c.objective.nsp_weight = 0.0
  c.masking.strategy = 'span'
  c.masking.max_predictions_per_seq = 80
  c.masking.span_geometric_p = 0.2
  c.masking.span_lower = 1
  c.masking.span_upper = 10
  c.masking.corruption_unit = 'unit'
  c.masking.random_source = 'unigram'
  c.masking.dynamic = True
  c.model.gelu = 'exact'
  c.optimizer.name = 'fairseq_adam'     # SpanBERT's fairseq optim/adam.py.
  c.optimizer.decay_mask = 'all'
  c.optimizer.schedule = 'spanbert'
  c.optimizer.learning_rate = 1e-4
  c.optimizer.eps = 1e-8
  c.optimizer.warmup_steps = 10_000
  return c
