r"""A CPU-scale comparison at a budget where pretraining pays off downstream.

``arg`` is ``objective=NAME`` (bert, roberta, spanbert, albert, electra):
that family's preset (``experiments/configs/NAME.py``: its objective, data
layout, masking and optimizer family) shrunk to one small recipe; or
``finetune``: the downstream fine-tuning every arm and the random-init
control share.

  python experiments/compare.py --out=runs/compare_small \
      --results=experiments/results/compare_small --seeds=3 \
      --budget=steps:6000 --finetune=experiments/configs/compare_small.py:finetune \
      --finetune_lrs=3e-4,1e-3 --control_repeats=4 \
      --run bert=experiments/configs/compare_small.py:objective=bert \
      --run roberta=experiments/configs/compare_small.py:objective=roberta \
      --run electra=experiments/configs/compare_small.py:objective=electra \
      --run albert=experiments/configs/compare_small.py:objective=albert \
      --run spanbert=experiments/configs/compare_small.py:objective=spanbert

The recipe (shared by every arm; departures from the presets, for size):

- model: L2/H128/A2, FFN 512 (Turc et al. 2019's tiny), 128 positions;
  ALBERT keeps E 128 and one shared layer group, ELECTRA its generator at
  a quarter of the width; RoBERTa its exact GELU;
- data: the embedded corpus (CPython's documentation, about 0.4M tokens of
  a 2000-piece unigram SentencePiece vocabulary, one tokenizer for all),
  128-token sequences, batch 32;
- optimization: 6000 steps (about 60 passes over the corpus; 20 minutes on
  a 2-core CPU), 500 warmup, peak lr 1e-3 for every arm with the preset's
  own optimizer (BERT's AdamWeightDecay, fairseq's Adam for RoBERTa, LAMB
  for ALBERT, ELECTRA's schedule). The papers' peak rates (1e-4 and below)
  are for batches of 256 and more and a million steps; at this batch they
  leave a tiny model near the unigram baseline. Why 6000: pretrained minus
  scratch against pretraining steps (experiments/results/
  compare_small_steps, 3 seeds) is -0.169 [-0.200, -0.139] at 1500,
  -0.000 [-0.075, +0.075] at 3000 and +0.207 [+0.147, +0.268] at 6000; a
  shorter run leaves an encoder that fine-tunes worse than random weights
  (README, "Why the demo checkpoint fine-tunes worse than random
  weights").

Reference code: each arm's preset's (its docstring names it; the
optimizer, schedule and loss follow it step for step,
tests/experiments/test_fidelity.py). The committed figures in
experiments/results/compare_small predate three fidelity changes (the
vocabulary softmax over the tokenizer's 2000 ids only, not the table's
2048 rows; fairseq's Adam with every parameter decayed for RoBERTa; for
SpanBERT, its head's 15 x 200 position embeddings, exact GELU, SBO
normalisation and schedule), so a rerun trains differently.

Fine-tuning (``finetune``): the embedded task (which standard-library
package a docstring paragraph comes from, 8 classes, 930 held-out) in its
low-resource form, 40 training examples per class drawn from the seed (a
fifth of them the dev split that chooses the learning rate), 20 epochs of
full fine-tuning at batch 32 from the [CLS] pooler. With 256 examples per
class a randomly initialized tiny encoder learns the package vocabulary
nearly as well as a pretrained one, so the task stops measuring
pretraining; with few examples, what pretraining put into the encoder is
what the classifier can use.
"""

import os

from bertjax import config_lib
from bertjax import finetune as finetune_lib
from bertjax.models import electra as electra_lib

OBJECTIVES = ('bert', 'roberta', 'spanbert', 'albert', 'electra')
_PRESET_ARG = {'bert': 'size=base', 'roberta': 'size=base',
               'spanbert': None, 'albert': 'size=base',
               'electra': 'size=small'}


def _preset(name: str):
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      f'{name}.py')
  arg = _PRESET_ARG[name]
  return config_lib.load_config_file(f'{path}:{arg}' if arg else path)


# The demo's scale (config_lib.demo_config): size, tokenizer, data, batch,
# schedule and logging.
_FROM_DEMO = ('model.size', 'model.max_position_embeddings',
              'data.tokenizer.vocab_size', 'data.eval_fraction',
              'data.max_seq_length', 'data.num_threads', 'batch_size',
              'optimizer.learning_rate', 'log_every_steps', 'eval_every_steps',
              'checkpoint_every_steps', 'eval.num_batches')


def finetune_config():
  c = finetune_lib.base_config()
  c.task.name = 'embedded'
  c.task.examples_per_class = 40
  c.task.dev_fraction = 0.2
  c.num_epochs = 20.0
  c.optimizer.learning_rate = 3e-4
  c.log_every_steps = 40
  return c


def get_config(arg=None):
  if arg == 'finetune':
    return finetune_config()
  args = config_lib.parse_arg(arg, objective='bert')
  name = args['objective']
  if name not in OBJECTIVES:
    raise ValueError(f'objective={name!r}; use one of {OBJECTIVES}.')
  c = _preset(name)
  demo = config_lib.demo_config()
  for key in _FROM_DEMO:
    section, leaf = _parent(c, key), key.split('.')[-1]
    section[leaf] = _parent(demo, key)[leaf]
  m = c.model
  m.num_layers, m.hidden_size, m.num_heads = 2, 128, 2   # The tiny size,
  m.intermediate_size = 512                              # over a preset's.
  if name == 'electra':
    m.embedding_size = 0
  c.data.tokenizer.model_type = 'unigram'
  c.masking.max_predictions_per_seq = (
      electra_lib.num_slots(c.electra.mask_prob, 128) if name == 'electra'
      else 20)
  # Where pretraining pays off here (experiments/results/compare_small_steps):
  # 5x the demo's schedule, the same warmup fraction.
  c.total_steps = 6000
  c.num_train_steps = 0
  c.optimizer.warmup_steps = 500
  return c


def _parent(cfg, dotted: str):
  for part in dotted.split('.')[:-1]:
    cfg = cfg[part]
  return cfg
