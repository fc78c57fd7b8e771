r"""Why does a pretrained encoder fine-tune as it does? Checks for defects.

  python experiments/diagnose_transfer.py --init=runs/demo \
      --finetune=experiments/configs/compare_small.py:finetune

Puts the run's encoder and random weights of the same architecture (the
random-init control's, from the fine-tuning seed) side by side, on the
fine-tuning task's training inputs, and prints a markdown table of:

- inputs: whether the downstream rows are laid out as pretraining's
  ([CLS] first, [SEP] after the real tokens, the token types used, real
  lengths, unknown pieces), against the run's held-out pretraining batches;
- representations: how alike the [CLS] states, what the classifier reads
  (the pooler's output, or the [CLS] state with ``pooling='first'``) and
  the mean-pooled states are across different inputs (mean pairwise
  cosine; a collapsed representation is near 1), and how saturated the
  tanh pooler is;
- scales: word-embedding norms, LayerNorm gains, the final states' spread;
- the first fine-tuning step: the task loss and each block's gradient norm
  (what the first update sees), and what the fine-tuning optimizer starts
  from.
"""

from __future__ import annotations

import argparse
import os
import sys

import flax
from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:   # Run as a script from a checkout.
  sys.path.insert(0, _ROOT)

from bertjax import config_lib  # pylint: disable=g-import-not-at-top
from bertjax import finetune  # pylint: disable=g-import-not-at-top
from bertjax import runs  # pylint: disable=g-import-not-at-top
from bertjax import train  # pylint: disable=g-import-not-at-top
from bertjax.models import bert as bert_lib  # pylint: disable=g-import-not-at-top
from data_pipelines import pipeline  # pylint: disable=g-import-not-at-top
from data_pipelines import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

DEFAULT_FINETUNE = os.path.join(_ROOT, 'experiments', 'configs',
                                'finetune.py')
NUM_INPUTS = 256


def layout(rows: dict) -> dict[str, float]:
  """Layout statistics of ``[N, L]`` input rows."""
  ids, types, mask = (np.asarray(rows[k]) for k in (
      'input_ids', 'token_type_ids', 'attention_mask'))
  lengths = mask.sum(1)
  last = ids[np.arange(len(ids)), lengths - 1]
  real = ids[mask.astype(bool)]
  return {
      'rows starting with [CLS]': float(np.mean(ids[:, 0] == tokenizer_lib.CLS_ID)),
      'rows ending (last real token) with [SEP]': float(
          np.mean(last == tokenizer_lib.SEP_ID)),
      'token type 1 share of real tokens': float(
          np.mean(types[mask.astype(bool)] == 1)),
      'real tokens per row (mean)': float(lengths.mean()),
      'rows filled to max_seq_length': float(np.mean(lengths == ids.shape[1])),
      'unknown-piece share': float(np.mean(real == tokenizer_lib.UNK_ID)),
  }


def _mean_cosine(x: np.ndarray) -> float:
  x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  sim = x @ x.T
  n = len(x)
  return float((sim.sum() - np.trace(sim)) / (n * (n - 1)))


def _head_input(model, params, args) -> jax.Array:
  """What the classifier reads: the model's own pooling (``cfg.pooling``,
  the layer mix) on the way, caught as the classifier is called."""
  seen = []

  def catch(next_fun, call_args, kwargs, context):
    if (context.module.name == 'classifier' and
        context.method_name == '__call__'):
      seen.append(call_args[0])
    return next_fun(*call_args, **kwargs)

  with nn.intercept_methods(catch):
    model.apply({'params': params}, *args)
  return seen[-1]


# What the classifier reads, per pooling (heads.DownstreamModel).
_HEAD_INPUT = {'cls': 'pooler output of [CLS]',
               'mean': 'pooler output of the mean state',
               'first': '[CLS] state, no pooler'}


def representations(model, params, rows: dict) -> dict[str, float]:
  """Similarity of what the head reads, across inputs."""
  args = [jnp.asarray(rows[k]) for k in ('input_ids', 'token_type_ids',
                                          'attention_mask')]
  cfg = model.cfg

  def encode(params):
    bound = model.bind({'params': params})
    x = bound.embeddings(args[0], args[1], True)
    states = bert_lib.run_layers(cfg, bound.layers, x, args[0], args[2],
                                 True, all_layers=False)
    return states, _head_input(model, params, args)

  states, head = (np.asarray(x) for x in jax.jit(encode)(params))
  mask = np.asarray(rows['attention_mask'])[..., None]
  cls = states[:, 0]
  mean = (states * mask).sum(1) / mask.sum(1)
  read = _HEAD_INPUT[model.pooling] + (
      ', layer mix' if model.layer_mix else '')
  out = {
      '[CLS] state: mean pairwise cosine': _mean_cosine(cls),
      f'head input ({read}): mean pairwise cosine': _mean_cosine(head),
  }
  if model.pooling != 'first':   # tanh(pooler(...)).
    out['head input: share saturated (abs > 0.99)'] = float(
        np.mean(np.abs(head) > 0.99))
  out.update({
      'mean-pooled state: mean pairwise cosine': _mean_cosine(mean),
      'final states: std over inputs, per feature (mean)': float(
          cls.std(0).mean()),
  })
  return out


def scales(params: dict) -> dict[str, float]:
  flat = flax.traverse_util.flatten_dict(params)
  words = flat[('embeddings', 'word', 'embedding')]
  gains = [np.asarray(v) for k, v in flat.items()
           if k[-1] == 'scale' and 'norm' in '/'.join(k).lower()]
  return {
      'word embeddings: mean row norm': float(
          np.linalg.norm(np.asarray(words), axis=-1).mean()),
      'LayerNorm gains: mean': float(np.mean([g.mean() for g in gains])),
      'LayerNorm gains: min': float(min(g.min() for g in gains)),
  }


def first_step(model, params, rows: dict) -> dict[str, float]:
  """The task loss at the start and each top-level block's gradient norm
  on one batch of training rows."""
  batch = {k: jnp.asarray(rows[k]) for k in ('input_ids', 'token_type_ids',
                                              'attention_mask', 'label')}

  def loss_fn(p):
    logits = model.apply({'params': p}, batch['input_ids'],
                         batch['token_type_ids'], batch['attention_mask'])
    return finetune.task_loss('classification', logits, batch)

  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  out = {'task loss at the start': float(loss)}
  for name in sorted(grads):
    leaves = jax.tree.leaves(grads[name])
    out[f'gradient norm: {name}'] = float(np.sqrt(sum(
        float(jnp.sum(g.astype(jnp.float32) ** 2)) for g in leaves)))
  return out


def diagnose(init: str, cfg) -> str:
  """The markdown tables for ``init`` against random weights, on the
  classification task of fine-tuning config ``cfg``."""
  cfg = cfg.copy_and_resolve_references()
  cfg.init = init
  pretrained = finetune.load_pretrained(init)
  model_cfg = finetune.downstream_config(cfg, pretrained)
  task, _ = finetune.load_task(cfg)
  if task.kind != 'classification':
    raise ValueError(f'{task.name} is {task.kind}; this reads classification '
                     'tasks.')
  data = finetune.encode_examples(cfg, task, task.train[:NUM_INPUTS],
                                  pretrained.tokenizer)
  # As finetune.py builds and initializes it: the random-init control.
  model = finetune.downstream_model(cfg, model_cfg, task)
  dummy = jnp.zeros((1, cfg.max_seq_length), jnp.int32)
  random = model.init(jax.random.fold_in(jax.random.key(cfg.seed),
                                         finetune.INIT_KEY),
                      dummy, dummy, dummy + 1)['params']
  random = flax.core.meta.unbox(random)   # Drop the logical-axis boxes.
  # The encoder (and the pooler, where the head has one) as finetune.py
  # puts it in.
  loaded = finetune.load_encoder(random, random, pretrained.params)
  if cfg.pooling == 'first':
    pooler = 'not used (pooling=\'first\').'
  elif 'pooler' in pretrained.params:
    pooler = 'the run\'s (trained by NSP/SOP).'
  else:
    pooler = ('random: the run trained none (no NSP/SOP), as in Hugging '
              'Face\'s from_pretrained.')
  first_batch = {k: v[:cfg.batch_size] for k, v in data.items()}

  run = runs.load_run(init)
  _, prepared = train.prepare_data(run.config, None, init)
  pretraining_rows = pipeline.eval_batches(prepared, run.config)[0]

  sections = [
      ('Inputs', layout(data),
       layout(pretraining_rows),
       'downstream rows', 'pretraining rows (held out)'),
      ('Representations', representations(model, loaded, data),
       representations(model, random, data), 'pretrained', 'random'),
      ('Scales', scales(loaded), scales(random), 'pretrained', 'random'),
      ('First fine-tuning step (one batch)',
       first_step(model, loaded, first_batch), first_step(
           model, random, first_batch), 'pretrained', 'random'),
  ]
  lines = [f'# Transfer diagnosis: {init} (step {pretrained.step}, '
           f'{pretrained.objective}) on {task.name}', '',
           f'{len(data["input_ids"])} training inputs of {task.name}, '
           f'max_seq_length {cfg.max_seq_length}; random weights from the '
           f'fine-tuning seed {cfg.seed}. The pretrained pooler is '
           + pooler,
           'The fine-tuning optimizer starts fresh: Adam moments at 0 and '
           'the schedule at step 0 (finetune.py initializes it on the '
           'trainable parameters; the pretraining optimizer state is not '
           'read).', '']
  for title, a, b, name_a, name_b in sections:
    lines += [f'## {title}', '', f'| | {name_a} | {name_b} |',
              '| --- | --- | --- |']
    lines += [f'| {k} | {a[k]:.4g} | {b.get(k, float("nan")):.4g} |'
              for k in a]
    lines.append('')
  return '\n'.join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--init', required=True,
                      help='the pretrained workdir.')
  parser.add_argument('--finetune', default=DEFAULT_FINETUNE,
                      help='the fine-tuning config (path.py[:arg]).')
  parser.add_argument('--out', default='', help='also write the table here.')
  args = parser.parse_args(argv)
  text = diagnose(args.init, config_lib.load_config_file(args.finetune))
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  main()
