"""RoBERTa: BERT without NSP, on full sentences, dynamically masked.

Liu et al. 2019, "RoBERTa: A Robustly Optimized BERT Pretraining Approach",
Sec. 4 and Table 9 (pretraining hyperparameters), and fairseq's RoBERTa
README:

- data: FULL-SENTENCES, up to 512 tokens packed across document boundaries
  (a separator between documents), no NSP; dynamic masking (a new mask each
  time a sequence is seen), 15% of tokens, 80/10/10;
- model: BERT's (base: 12 layers, H 768; large: 24 layers, H 1024), dropout
  0.1, a 50K vocabulary, fairseq's exact (erf) GELU rather than BERT's tanh
  approximation;
- optimizer: Adam (bias-corrected) with beta (0.9, 0.98), epsilon 1e-6,
  weight decay 0.01, no gradient clipping; linear warmup then linear decay
  to 0; the final run: batch 8K sequences, 500K steps, peak lr 6e-4 (base)
  / 4e-4 (large), warmup 24K / 30K steps.

Reference code (facebookresearch/fairseq), which the optimizer, schedule
and loss follow step for step (tests/experiments/test_fidelity.py):
fairseq/optim/adam.py ``Adam.step`` (optimizer.name='fairseq_adam':
epsilon on the raw sqrt(v), the bias correction in the step size,
decoupled weight decay on every parameter: optimizer.decay_mask='all');
fairseq/optim/lr_scheduler/polynomial_decay_schedule.py ``step_update``,
stepped to 0 before the first update by fairseq/trainer.py
(schedule 'warmup_linear'); fairseq/criterions/masked_lm.py (the summed
cross-entropy over the masked tokens, divided by their number).

  python -m bertjax.train --config=experiments/configs/roberta.py:size=base \
      --workdir=$WORK/roberta-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Departures: the vocabulary is a 50,265-piece SentencePiece BPE trained on
the corpus, not GPT-2's byte-level BPE; at most 80 predictions per 512-token
row (15% of 512 is 76.8, so the cap never binds); the MLM mean divides by
the count + 1e-5 (BERT's), fairseq's by the count. From fairseq's
MaskTokensDataset and model: a row masks round(0.15 n) tokens (fairseq
int(0.15 n + u), u ~ U[0, 1): 76 or 77 at 512), never [CLS], [SEP] or
padding (fairseq may mask <s> and </s>), and replaces with a uniform draw
that excludes [MASK] (fairseq's may draw <mask>); the model keeps BERT's
2-row token-type table (every row reads row 0, a learned constant fairseq
does not have) and truncated-normal initialisation (fairseq's is
untruncated, with zeroed padding rows); [SEP] goes between documents only
(fairseq ends every input line with </s>).
"""

from bertjax import config_lib

# Peak lr and warmup steps of the final run, per size (Table 9).
RUNS = {'base': (6e-4, 24_000), 'large': (4e-4, 30_000)}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base')
  if args['size'] not in RUNS:
    raise ValueError(f'size={args["size"]!r}; use one of {sorted(RUNS)}.')
  learning_rate, warmup = RUNS[args['size']]
  c = config_lib.base_config()
  c.model.size = args['size']
  c.model.gelu = 'exact'           # fairseq's gelu; also RobertaLMHead's.
  c.model.layer_norm_epsilon = 1e-5   # fairseq's LayerNorm default.
  c.data.tokenizer.vocab_size = 50_265
  c.data.tokenizer.model_type = 'bpe'
  c.data.layout = 'full_sentences'
  c.data.max_seq_length = 512
  c.objective.nsp_weight = 0.0
  c.masking.dynamic = True
  c.masking.max_predictions_per_seq = 80
  c.batch_size = 8192
  c.total_steps = 500_000
  o = c.optimizer
  o.name = 'fairseq_adam'          # fairseq/optim/adam.py.
  o.schedule = 'warmup_linear'
  o.learning_rate = learning_rate
  o.warmup_steps = warmup
  o.b1, o.b2, o.eps = 0.9, 0.98, 1e-6
  o.weight_decay = 0.01
  o.decay_mask = 'all'             # fairseq decays every parameter.
  o.grad_clip_norm = 0.0
  return c
