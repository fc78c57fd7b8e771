r"""MobileBERT: an IB-BERT teacher, then MobileBERT distilled from it.

Sun et al. 2020, "MobileBERT: a Compact Task-Agnostic BERT for
Resource-Limited Devices", and google-research/mobilebert (its
README's distillation command and config/*.json). ``arg`` is ``model=``
``teacher``, ``mobilebert`` (default) or ``tiny``, and ``size=`` ``paper``
(default) or ``demo``:

- ``model=teacher``: IB-BERT_LARGE (uncased_L-24_H-1024_B-512_A-4.json:
  24 layers, H 512, intra-block width 1024 that Q, K and V project to
  from H, FFN 4096, 4 heads, E 128 with the trigram, LayerNorm, GELU,
  dropout 0.1; 294.2M parameters), trained as a BERT (``objective.name=
  bert``: MLM + NSP, sequences of 512 tokens, at most 20 predictions).
  Its optimizer recipe is a guess: the reference code trains only the
  student, and these notes do not record the paper's teacher run. Here:
  LAMB, the student's peak lr 1.5e-3 and 10k warmup steps, batch 4096,
  500k steps.
- ``model=mobilebert``: MobileBERT (..._F-4_OPT.json: Q and K from a
  shared bottleneck, 4 stacked FFNs, NoNorm, ReLU; 24.6M without the
  pooler), ``objective.name=mobilebert`` from the teacher in
  ``mobilebert.teacher_workdir``; the student reads its tokenizer.
  ``model=tiny``: MobileBERT-TINY (..._F-2_tiny_OPT.json: Q, K and V from
  the bottleneck, 2 FFNs; 15.5M).
- The student's recipe, the README's command: 24 phases of 10k steps of
  progressive transfer (feature maps x100, attention x1, means x5000,
  variances x5; the phase's layer at 3x the lr, the layers below at 0.3x),
  the lr held at 1.5e-3 through them (``optimizer.hold_steps``, tied to
  ``mobilebert.steps_per_layer`` x ``model.num_layers``), then 500k steps
  of pretraining distillation (0.5 MLM + 0.5 the teacher's distribution,
  + NSP) with 10k warmup steps and linear decay; LAMB (weight decay 0.01,
  global clip 1.0), batch 2048, sequences of 512 tokens with at most 20
  predictions, no dropout (the reference builds the student with
  ``is_training=False`` whenever a teacher is present).

  python -m bertjax.train \
      --config=experiments/configs/mobilebert.py:model=teacher \
      --workdir=$WORK/ib-bert --config.data.corpus.source=files \
      --config.data.corpus.path='/data/wiki/*.txt'
  python -m bertjax.train --config=experiments/configs/mobilebert.py \
      --workdir=$WORK/mobilebert \
      --config.mobilebert.teacher_workdir=$WORK/ib-bert \
      --config.data.corpus.source=files \
      --config.data.corpus.path='/data/wiki/*.txt'
  python experiments/export.py --workdir=$WORK/mobilebert \
      --out=$WORK/mobilebert-hf

``size=demo`` is the same recipe on the demo's data, batch, 1200 steps and
optimizer (experiments/configs/demo.py: google-research/bert's AdamW at a
peak lr of 1e-3; LAMB at that lr left the demo teacher at 1.3x the
majority's held-out MLM accuracy, AdamW at 4.4x) with 2 layers: the teacher H 128, I
256, FFN 1024, E 32, 2 heads; the students H 128, I 32, FFN 128, E 32, 2
heads; 200 steps per layer (400 of transfer, 800 of distillation).

Departures from the reference: bertjax/objectives/mobilebert.py lists
them (one run, so Adam's moments carry into the distillation; a hard
attention mask; the same-layer mean and variance terms; each phase's
no-update step first, not last).
"""

from bertjax import config_lib

_COMMON = dict(num_layers=24, hidden_size=512, num_heads=4,
               embedding_size=128, trigram_input=True)
MODELS = {
    'teacher': dict(_COMMON, intermediate_size=4096,
                    intra_bottleneck_size=1024),
    'mobilebert': dict(_COMMON, intermediate_size=512,
                       intra_bottleneck_size=128,
                       key_query_shared_bottleneck=True,
                       num_feedforward_networks=4, normalization='no_norm',
                       hidden_act='relu'),
    'tiny': dict(_COMMON, intermediate_size=512, intra_bottleneck_size=128,
                 bottleneck_attention=True, num_feedforward_networks=2,
                 normalization='no_norm', hidden_act='relu'),
}
# The demo's shapes: 2 layers, H 128, 2 heads (experiments/configs/demo.py).
_DEMO_COMMON = dict(num_layers=2, hidden_size=128, num_heads=2,
                    embedding_size=32)
DEMO_MODELS = {
    'teacher': dict(_DEMO_COMMON, intermediate_size=1024,
                    intra_bottleneck_size=256),
    'student': dict(_DEMO_COMMON, intermediate_size=128,
                    intra_bottleneck_size=32),
}
SIZES = ('paper', 'demo')
# Steps of each layer's phase of the progressive transfer.
STEPS_PER_LAYER = {'paper': 10_000, 'demo': 200}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, model='mobilebert', size='paper')
  model, size = args['model'], args['size']
  if model not in MODELS or size not in SIZES:
    raise ValueError(f'mobilebert.py:{arg}: use model= one of '
                     f'{sorted(MODELS)} and size= one of {SIZES}.')
  demo = size == 'demo'
  c = config_lib.demo_config() if demo else config_lib.base_config()
  m, o = c.model, c.optimizer
  m.update(MODELS[model])
  if demo:
    m.update(DEMO_MODELS['teacher' if model == 'teacher' else 'student'])
  if not demo:
    # LAMB (lamb_optimizer.py: raw moments, decay 0.01 but for biases and
    # norms, the global clip at 1.0 of base_config).
    o.name = 'lamb'
    m.max_position_embeddings = 512
    c.data.max_seq_length = 512
    c.masking.max_predictions_per_seq = 20
    o.learning_rate = 1.5e-3
    o.warmup_steps = 10_000
  if model == 'teacher':
    if not demo:   # A guess (see above).
      c.batch_size = 4096
      c.total_steps = 500_000
    return c
  c.objective.name = 'mobilebert'
  m.hidden_dropout_rate = m.attention_dropout_rate = 0.0
  t = c.mobilebert
  t.steps_per_layer = STEPS_PER_LAYER[size]
  # The lr is held through the transfer; the warmup and decay follow it.
  o.hold_steps = t.get_ref('steps_per_layer') * m.get_ref('num_layers')
  if not demo:
    c.batch_size = 2048
    c.total_steps = o.get_ref('hold_steps') + 500_000
  # data.tokenizer.model_path stays '': the trainer sets it to the
  # teacher's (the student must read the teacher's tokens).
  return c
