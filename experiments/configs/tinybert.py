r"""TinyBERT general distillation: a BERT teacher into a TinyBERT student.

Jiao et al. 2020, "TinyBERT: Distilling BERT for Natural Language
Understanding", Sec. 3-4, and huawei-noah/Pretrained-Language-Model's
TinyBERT/general_distill.py (its flags and the README's command).
``arg`` is ``size=4`` (default), ``6`` or ``demo``, and ``objective=``
``tinybert`` (default) or ``bert`` (the same student trained with MLM
alone, the control of experiments/results/tinybert):

- teacher: a finished bertjax BERT run, or an import of a transformers
  BERT (experiments/import_hf.py), in ``tinybert.teacher_workdir``; the
  student reads its tokenizer;
- student: TinyBERT-4 (4 layers, H 312, FFN 1200, 12 heads; 14.5M
  parameters) or TinyBERT-6 (6 / 768 / 3072 / 12; 67M), random init;
- losses: embedding, hidden-state (through one learned projection, the
  code's fit_dense) and attention-score MSE, student layer m against
  teacher layer m N / M (3, 6, 9, 12 for TinyBERT-4 under BERT-base),
  weights 1; general distillation is the intermediate-layer stage alone
  (``tinybert.intermediate_steps = total_steps``); the prediction-layer
  stage (soft cross-entropy at temperature 1) follows it when
  ``intermediate_steps`` is smaller;
- data: sequences of 128 tokens with BERT's masking (15%, 80/10/10, up to
  20 predictions), as the pregenerated data the script reads; no NSP;
- optimizer: BertAdam (Adam without bias correction, decoupled weight
  decay 0.01 except biases and LayerNorms, each gradient tensor clipped to
  norm 1.0 on its own), peak lr 5e-5 (the script's default), 10% warmup
  then linear decay to 0 (``WarmupLinearSchedule``), batch 256,
  300k steps (3 epochs, ``--num_train_epochs 3``, of English Wikipedia:
  about 2.5B words, 25M sequences of 128 tokens).

  python -m bertjax.train --config=experiments/configs/tinybert.py:size=4 \
      --workdir=$WORK/tinybert4 \
      --config.tinybert.teacher_workdir=$WORK/bert-base \
      --config.data.corpus.source=files \
      --config.data.corpus.path='/data/wiki/*.txt'

``size=demo`` is the CPU comparison's student under the demo's teacher
(experiments/configs/demo.py, L2/H128/A2): 1 layer, H 64, 2 heads, FFN
256, the demo's data, batch and peak lr 1e-3; half the steps the
intermediate stage, half the prediction stage.

Reference code, followed step for step (tests/experiments/
test_fidelity.py): general_distill.py (``att_loss + rep_loss`` with
``MSELoss``, the -1e2 score mask, ``teacher_reps[i * layers_per_block]``,
BertAdam with ``no_decay = ['bias', 'LayerNorm.bias',
'LayerNorm.weight']``) and transformer/optimization.py (``BertAdam.step``:
per-parameter ``clip_grad_norm_``; a parameter without a gradient is
skipped, so the student's pooler and NSP head never change and its MLM
head is still only in the prediction stage, the projection only in the
intermediate one).

Departures: sequences are packed from whole sentences (RoBERTa's full
sentences) rather than the script's NSP pairs, whose labels it never
uses; the tokenizer is the teacher's SentencePiece model.
"""

from bertjax import config_lib

# layers, hidden, FFN, heads.
SIZES = {'4': (4, 312, 1200, 12), '6': (6, 768, 3072, 12),
         'demo': (1, 64, 256, 2)}
OBJECTIVES = ('tinybert', 'bert')


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='4', objective='tinybert')
  if args['size'] not in SIZES or args['objective'] not in OBJECTIVES:
    raise ValueError(f'tinybert.py:{arg}: use size= one of {sorted(SIZES)} '
                     f'and objective= one of {OBJECTIVES}.')
  demo = args['size'] == 'demo'
  c = config_lib.demo_config() if demo else config_lib.base_config()
  c.objective.name = args['objective']
  c.objective.nsp_weight = 0.0
  c.data.layout = 'full_sentences'
  m = c.model
  m.size = 'base'
  m.num_layers, m.hidden_size, m.intermediate_size, m.num_heads = SIZES[
      args['size']]
  # BertAdam: no bias correction, each gradient tensor clipped to norm 1,
  # warmup then linear decay to 0 (WarmupLinearSchedule).
  c.optimizer.grad_clip = 'per_tensor'
  c.optimizer.schedule = 'warmup_linear'
  if not demo:
    c.data.max_seq_length = 128
    c.masking.max_predictions_per_seq = 20
    c.batch_size = 256
    c.total_steps = 300_000
    c.optimizer.learning_rate = 5e-5
    c.optimizer.warmup_steps = c.get_ref('total_steps') // 10
  t = c.tinybert
  t.embedding_weight = t.hidden_weight = t.attention_weight = 1.0
  t.prediction_weight, t.temperature = 1.0, 1.0
  # General distillation: the intermediate-layer stage throughout; the demo
  # gives the prediction stage the second half.
  t.intermediate_steps = (c.get_ref('total_steps') // 2 if demo
                          else c.get_ref('total_steps'))
  return c
