"""DistilBERT: a 6-layer student distilled from a 12-layer BERT teacher.

Sanh et al. 2019, "DistilBERT, a distilled version of BERT: smaller,
faster, cheaper and lighter", Sec. 2-3, and Hugging Face's
examples/research_projects/distillation (train.py's flags, distiller.py,
the README's training command, scripts/extract_distilbert.py):

- teacher: a finished bertjax run of BERT-base (experiments/configs/bert.py)
  in ``distillation.teacher_workdir``; the student reads the teacher's
  tokenizer (``data.tokenizer.model_path`` follows the teacher's workdir);
- student: the teacher's width (H 768, 12 heads, FFN 3072) and 6 layers, no
  token-type embeddings, no pooler, no NSP; initialised from the teacher's
  embeddings, its layers 0, 2, 4, 7, 9, 11 and its MLM head; dropout 0.1;
- loss: 5.0 x KL(teacher || student) at temperature 2 (times T^2) + 2.0 x
  MLM + 1.0 x cosine loss between the last hidden states (``--alpha_ce 5.0
  --alpha_mlm 2.0 --alpha_cos 1.0 --temperature 2.0``);
- data: no NSP; sequences of up to 512 tokens; dynamic masking (a new mask
  each time a sequence is seen) of 15% of the tokens, 80% [MASK], 10%
  random, 10% kept;
- optimizer: Adam with bias correction (PyTorch's AdamW), beta (0.9, 0.98),
  epsilon 1e-6, weight decay 0, gradients clipped to a global norm of 5.0;
  peak lr 5e-4, linear warmup over 5% of the steps, then linear decay to 0
  (``get_linear_schedule_with_warmup``); batches of 4K sequences.

Reference code (huggingface/transformers, examples/research_projects/
distillation), followed step for step (tests/experiments/
test_fidelity.py): distiller.py ``Distiller.step`` (``KLDivLoss
(reduction='batchmean')`` x T^2 on the masked positions,
``CrossEntropyLoss``, ``CosineEmbeddingLoss`` over the last hidden states
of the real tokens), ``Distiller.optimize`` (``clip_grad_norm_``) and its
``torch.optim.AdamW`` with ``no_decay = ["bias", "LayerNorm.weight"]``
(optimizer.name='adamw', torch's formula) and
``get_linear_schedule_with_warmup``; train.py's flags.

  python -m bertjax.train --config=experiments/configs/distilbert.py \
      --workdir=$WORK/distilbert \
      --config.distillation.teacher_workdir=$WORK/bert-base \
      --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Without a teacher the run stops at once, before reading any data, with a
message naming ``distillation.teacher_workdir``. Setting ``total_steps`` moves the warmup with it (5%).
``objective.mlm_weight`` and ``objective.nsp_weight`` are not used by
distillation (its weights are ``distillation.*``), nor are the ``model``
section's architecture fields: the student's architecture is the
teacher's.

Departures:
- batch 4096 is one step: bertjax has no gradient accumulation, which is
  how the paper reaches "up to 4K examples per batch" (Hugging Face's
  defaults: 5 sequences x 50 accumulation steps per GPU, on 8 GPUs);
- steps: the paper gives none (about 90 hours on 8 V100s; Hugging Face's
  train.py runs 3 epochs). 6,000 steps is about 3 passes over BERT's 3.3B
  words (about 1.3 pieces per word) in full 4096 x 512-token batches; set
  ``total_steps`` to 3 passes over your corpus;
- sequences are packed from whole sentences up to 512 tokens (RoBERTa's
  full sentences); Hugging Face's data is one or more sentences per line,
  batched by length, unpacked;
- the KL is over the masked positions only (``--restrict_ce_to_mask``; the
  README's command takes it over every token), as the MLM head projects
  only the masked positions onto the vocabulary;
- tokens to mask are chosen uniformly, not with the XLM-style smoothing
  towards rare tokens of Hugging Face's distiller (``mlm_smoothing`` 0.7),
  each row taking round(0.15 x its tokens) (the distiller takes
  ceil(0.15 x the batch's tokens) over the whole batch), and [UNK] may be
  masked (the distiller never masks a special id);
- the student's position embeddings train. The distiller's student config
  sets ``sinusoidal_pos_embds``, which in the transformers of its time
  froze the position table (``requires_grad=False``), so its student kept
  the teacher's positions as loaded; transformers 5 leaves them trainable;
- the teacher's layers 0, 2, 4, 7, 9, 11 are extract_distilbert.py's; the
  paper says "one layer out of two".
"""

from bertjax import config_lib


def get_config(arg=None):
  config_lib.parse_arg(arg)   # It takes none: refuses one.
  c = config_lib.base_config()
  c.objective.name = 'distillation'
  c.objective.nsp_weight = 0.0
  d = c.distillation
  d.student_layers = 6
  d.temperature = 2.0
  d.kl_weight, d.mlm_weight, d.cosine_weight = 5.0, 2.0, 1.0
  # data.tokenizer.model_path stays '': the trainer sets it to the
  # teacher's saved tokenizer (the student must read the teacher's tokens).
  c.data.layout = 'full_sentences'
  c.data.max_seq_length = 512
  c.masking.dynamic = True
  c.masking.rate = 0.15
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  c.masking.max_predictions_per_seq = 80     # 15% of 512 is 76.8.
  c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.1
  c.batch_size = 4096
  c.total_steps = 6_000
  o = c.optimizer
  o.name = 'adamw'
  o.schedule = 'warmup_linear'
  o.learning_rate = 5e-4
  # ceil(5% of total_steps), as distiller.py; follows total_steps.
  o.warmup_steps = (c.get_ref('total_steps') + 19) // 20
  o.b1, o.b2, o.eps = 0.9, 0.98, 1e-6
  o.weight_decay = 0.0
  o.grad_clip_norm = 5.0
  return c
