r"""Each preset trains as its paper's code does: reference trajectories.

For each family, bertjax's own compiled train step (bertjax.train's
``make_steps``, the preset's optimizer, schedule, clipping, loss and loss
weights) runs ``STEPS`` steps of a tiny model, and a PyTorch reference runs
the same steps: it loads bertjax's Hugging Face export of the same initial
weights into the transformers class, and implements the paper's loss and
optimizer from its code, transcribed here with the file and function they
come from. Both sides get the same precomputed batches, dropout 0, float32;
where the reference draws inside the step (ELECTRA's masking and its
generator's samples), it gets bertjax's draws. The table compares the
learning rate and the loss at every step and every final tensor.

| family | preset | reference code |
| --- | --- | --- |
| BERT | bert.py | google-research/bert: optimization.py (``create_optimizer``, ``AdamWeightDecayOptimizer``), run_pretraining.py (``get_masked_lm_output``, ``get_next_sentence_output``) |
| RoBERTa | roberta.py | facebookresearch/fairseq: optim/adam.py (``Adam.step``), optim/lr_scheduler/polynomial_decay_schedule.py, criterions/masked_lm.py, trainer.py |
| ALBERT | albert.py | google-research/albert: lamb_optimizer.py (``LAMBOptimizer``), optimization.py (``create_optimizer``), run_pretraining.py |
| ELECTRA | electra.py | google-research/electra: model/optimization.py, run_pretraining.py (``PretrainingModel``) |
| SpanBERT | spanbert.py | facebookresearch/SpanBERT: pretraining/fairseq/optim/adam.py, optim/lr_scheduler/polynomial_decay_schedule.py, models/pair_bert.py (``BertPairTargetPredictionHead``), criterions/spanbert_loss.py |
| DistilBERT | distilbert.py | huggingface/transformers: examples/research_projects/distillation/distiller.py (``Distiller``), train.py |
| TinyBERT | tinybert.py | huawei-noah/Pretrained-Language-Model: TinyBERT/general_distill.py, transformer/optimization.py (``BertAdam``) |

Every preset is shrunk the same way (``TINY``: 2 layers of width 32, 500
vocabulary ids in a table padded to 512, 32 tokens, batch 4) and trained
at peak lr 1e-2 with 5 warmup steps of 20 and weight decay 0.1: every
tensor moves, both the warmup and the decay are crossed, and weight decay
on a tensor that should not decay, or none on one that should, shows: it
scales the tensor by about 1 - 0.1 x (the sum of the 20 learning rates,
about 0.08), 8e-3 of its size, against the test's 1e-3 (at the presets'
0.01 it would be 8e-4, under it), DistilBERT's 0 excepted (see
``FAMILIES``); all else is the preset's.

  python experiments/fidelity.py --out=experiments/results/fidelity.md

prints the table (and writes it to ``--out``); tests/experiments/
test_fidelity.py runs the same trajectories and bounds each difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import torch
import transformers

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from bertjax.interop import hf_convert
from bertjax.models import electra as electra_lib
from bertjax.objectives import distillation
from bertjax.objectives import electra as electra_objective
from bertjax.objectives import tinybert
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs')
VOCAB = 500               # Not a multiple of 128: the table has 512 rows.
STEPS = 20
TINY = {
    'model.num_layers': 2, 'model.hidden_size': 32, 'model.num_heads': 2,
    'model.intermediate_size': 64, 'model.max_position_embeddings': 32,
    'model.hidden_dropout_rate': 0.0, 'model.attention_dropout_rate': 0.0,
    'data.tokenizer.vocab_size': VOCAB, 'data.max_seq_length': 32,
    'masking.max_predictions_per_seq': 5, 'batch_size': 4,
    'total_steps': STEPS, 'optimizer.warmup_steps': 5,
    'optimizer.learning_rate': 1e-2, 'optimizer.weight_decay': 0.1,
}


@dataclasses.dataclass
class Trajectory:
  """One side's learning rate and loss at each step, and its final tensors
  by the reference's names."""
  learning_rates: list[float]
  losses: list[float]
  tensors: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  preset: str                    # experiments/configs/NAME.py[:arg]
  reference: str                 # Repository and files.
  fields: dict                   # Beyond TINY.
  # (cfg, bertjax's initial params, batches, workdir) -> the reference's
  # Trajectory.
  run_reference: Callable
  # bertjax params -> tensors by the reference's names.
  tensors: Callable


# ---------------------------------------------------------------------------
# Batches: what the input pipeline gives the step, drawn once.


def make_batches(cfg, seed: int = 0) -> list[dict]:
  """``STEPS`` batches of ``cfg``'s layout: rows of 24 to 32 real tokens,
  [CLS] A [SEP] (B [SEP]), 80/10/10-corrupted prediction slots (the last
  slot of some rows unused); with span masking, the slots are spans of 1
  to 3 tokens and ``masked_unit_start`` is each span's first position."""
  spec = pipeline.batch_spec(cfg)
  (b, l), p = spec['input_ids'][0], spec['masked_ids'][0][1]
  pairs = cfg.data.layout in ('nsp', 'sop')
  spans = cfg.masking.strategy == 'span'
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(STEPS):
    batch = {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
    for r in range(b):
      n = int(rng.integers(3 * l // 4, l + 1))
      tokens = rng.integers(tokenizer_lib.NUM_SPECIAL, VOCAB, n)
      tokens[0], tokens[n - 1] = tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID
      if pairs:
        tokens[n // 2] = tokenizer_lib.SEP_ID
        batch['token_type_ids'][r, n // 2 + 1:n] = 1
      batch['input_ids'][r, :n] = tokens
      batch['attention_mask'][r, :n] = 1
      used = p - int(rng.integers(0, 2))
      positions, starts = _slots(rng, tokens, used, spans)
      batch['masked_positions'][r, :used] = positions
      batch['masked_unit_start'][r, :used] = starts
      batch['masked_ids'][r, :used] = tokens[positions]
      batch['masked_weights'][r, :used] = 1.0
      for i in positions:
        u = rng.random()
        if u < 0.8:
          batch['input_ids'][r, i] = tokenizer_lib.MASK_ID
        elif u < 0.9:
          batch['input_ids'][r, i] = rng.integers(tokenizer_lib.NUM_SPECIAL,
                                                  VOCAB)
      batch['next_sentence_labels'][r] = rng.integers(0, 2)
    batches.append(batch)
  return batches


def _slots(rng, tokens, count: int, spans: bool):
  """``count`` sorted positions of non-special tokens, and each one's unit
  start (itself, or its span's first position)."""
  real = [i for i in range(1, len(tokens) - 1)
          if tokens[i] >= tokenizer_lib.NUM_SPECIAL]
  if not spans:
    positions = np.sort(rng.choice(real, count, replace=False))
    return positions, positions
  positions, starts, taken = [], [], set()
  while len(positions) < count:
    length = min(int(rng.integers(1, 4)), count - len(positions))
    start = int(rng.choice(real))
    span = range(start, start + length)
    # Spans apart (a token between them) and inside the real tokens.
    if any(i not in real or i in taken or i - 1 in taken or i + 1 in taken
           for i in span):
      continue
    taken.update(span)
    positions += list(span)
    starts += [start] * length
  order = np.argsort(positions)
  return np.asarray(positions)[order], np.asarray(starts)[order]


# ---------------------------------------------------------------------------
# bertjax's side.


def load_config(family: Family):
  path, _, arg = family.preset.partition(':')
  cfg = config_lib.load_config_file(
      os.path.join(CONFIGS, path) + (f':{arg}' if arg else ''))
  for key, value in {**TINY, **family.fields}.items():
    section = cfg
    *parents, leaf = key.split('.')
    for name in parents:
      section = section[name]
    section[leaf] = value
  return cfg


def bertjax_trajectory(cfg, batches: list[dict], tensors: Callable):
  """bertjax's compiled step over ``batches``: (initial params,
  Trajectory)."""
  task = objectives.get(cfg.objective.name).make_task(cfg, VOCAB)
  steps = train.make_steps(cfg, task, pipeline.batch_spec(cfg))
  state = jax.jit(steps.init_state)(*train.init_inputs(steps))
  initial = jax.device_get(nn.unbox(state.params))
  step = jax.jit(steps.train_step)
  rates, losses = [], []
  for batch in batches:
    state, metrics = step(state, batch)
    rates.append(float(metrics['learning_rate']))
    losses.append(float(metrics['loss']))
  final = jax.device_get(nn.unbox(state.params))
  return initial, Trajectory(rates, losses, tensors(cfg, final))


def exported(params, cfg, family: str, part: str | None = None) -> dict:
  """``params`` as the transformers class's tensors (bertjax's export)."""
  return hf_convert.hf_state_dict(params, cfg, family, VOCAB, part)


def untied(state: dict) -> dict:
  """``state`` without the decoder weights that the export writes as
  copies of the word embeddings (torch holds them once)."""
  tied = {name for names in hf_convert.TIED.values() for name in names}
  return {k: v for k, v in state.items() if k not in tied}


def load_reference(directory: str, params, cfg, family: str,
                   part: str | None = None):
  """The transformers model of ``family`` (``part``) holding ``params``,
  loaded from bertjax's export written to ``directory``."""
  return load_model(directory, exported(params, cfg, family, part),
                    hf_convert.hf_config(cfg, family, VOCAB, part=part))


def load_model(directory: str, state: dict, config: dict):
  """``config``'s transformers architecture holding ``state``, through
  files in ``directory``; every tensor must be used and none missing."""
  hf_convert.write_model(directory, state, config)
  architecture = config['architectures'][0]
  model, info = getattr(transformers, architecture).from_pretrained(
      directory, output_loading_info=True, attn_implementation='eager')
  if info['missing_keys'] or info['unexpected_keys']:
    raise AssertionError(f'{architecture}: {info}')
  return model.float().eval()   # Dropout off (ALBERT's SOP head has its own).


def torch_state(model: torch.nn.Module, prefix: str = '') -> dict:
  """Every parameter of ``model`` as numpy, by name (tied ones once)."""
  return {prefix + name: p.detach().numpy().copy()
          for name, p in model.named_parameters()}


def _t(x) -> torch.Tensor:
  return torch.from_numpy(np.array(x))


def _long(batch: dict, key: str) -> torch.Tensor:
  return _t(batch[key]).long()


def gather(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
  """``x`` [B, L, ...] at ``positions`` [B, P]."""
  index = positions.view(*positions.shape, *([1] * (x.dim() - 2)))
  return torch.gather(x, 1, index.expand(*positions.shape, *x.shape[2:]))


# ---------------------------------------------------------------------------
# The references' optimizers and schedules, transcribed.


def bert_schedule(peak: float, warmup: int, total: int) -> Callable:
  """google-research/bert optimization.py ``create_optimizer`` (and
  albert's): ``polynomial_decay`` from step 0 to ``total``, replaced by
  ``peak * step / warmup`` while ``step < warmup``."""
  return lambda t: (peak * t / warmup if t < warmup
                    else peak * (1 - min(t, total) / total))


def electra_schedule(peak: float, warmup: int, total: int) -> Callable:
  """google-research/electra model/optimization.py ``create_optimizer``:
  ``polynomial_decay`` times ``min(1, step / warmup)``."""
  return lambda t: peak * (1 - min(t, total) / total) * min(1.0, t / warmup)


def fairseq_schedule(peak: float, warmup: int, total: int) -> Callable:
  """fairseq polynomial_decay_schedule.py ``step_update(num_updates)``,
  which fairseq/trainer.py calls with 0 before the first update and with
  the new count after each."""
  def lr(t):
    if warmup > 0 and t <= warmup:
      return peak * t / warmup
    if t >= total:
      return 0.0
    return peak * (1 - (t - warmup) / (total - warmup))
  return lr


def spanbert_schedule(peak: float, warmup: int, total: int) -> Callable:
  """SpanBERT's polynomial_decay_schedule.py: ``__init__`` sets no lr, so
  the first update runs at the optimizer's, the peak; ``step_update(t)``,
  called after each update, gives ``peak * t / warmup`` up to ``warmup``,
  then ``peak * (1 - t / total)``."""
  def lr(t):
    if t == 0:
      return peak
    if t <= warmup:
      return peak * t / warmup
    return peak * (1 - t / total)
  return lr


def linear_with_warmup(peak: float, warmup: int, total: int) -> Callable:
  """transformers ``get_linear_schedule_with_warmup``'s ``lr_lambda``."""
  return lambda t: peak * (t / max(1, warmup) if t < warmup else max(
      0.0, (total - t) / max(1, total - warmup)))


def _exclude(name: str) -> bool:
  """google-research/bert's ``exclude_from_weight_decay`` (and albert's,
  electra's): a ``re.search`` of "LayerNorm", "layer_norm" or "bias"."""
  return any(s in name for s in ('LayerNorm', 'layer_norm', 'bias'))


class AdamWeightDecay:
  """google-research/bert optimization.py ``AdamWeightDecayOptimizer.
  apply_gradients`` (electra's model/optimization.py is the same): raw
  moments, ``update = m / (sqrt(v) + eps) + wd * param`` where the name is
  not excluded, ``param -= lr * update``. With ``lamb``, albert
  lamb_optimizer.py ``LAMBOptimizer.apply_gradients``: the update is
  scaled by ``||param|| / ||update||`` (1 if either is 0) for the same
  names (``exclude_from_layer_adaptation`` defaults to them)."""

  def __init__(self, named: dict, b1: float, b2: float, eps: float,
               weight_decay: float, lamb: bool = False):
    self.named, self.lamb = named, lamb
    self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
    self.m = {k: torch.zeros_like(p) for k, p in named.items()}
    self.v = {k: torch.zeros_like(p) for k, p in named.items()}

  @torch.no_grad()
  def step(self, lr: float) -> None:
    for name, p in self.named.items():
      g = p.grad if p.grad is not None else torch.zeros_like(p)
      self.m[name] = self.b1 * self.m[name] + (1 - self.b1) * g
      self.v[name] = self.b2 * self.v[name] + (1 - self.b2) * g * g
      update = self.m[name] / (self.v[name].sqrt() + self.eps)
      if not _exclude(name):
        update = update + self.wd * p
      ratio = 1.0
      if self.lamb and not _exclude(name):
        w_norm, u_norm = p.norm(), update.norm()
        ratio = torch.where(w_norm > 0, torch.where(
            u_norm > 0, w_norm / u_norm, 1.0), 1.0)
      p -= ratio * lr * update


class FairseqAdam:
  """fairseq optim/adam.py ``Adam.step`` (SpanBERT's fork has the same):
  ``denom = sqrt(v) + eps``, ``step_size = lr * sqrt(1 - b2^t) / (1 -
  b1^t)``, ``p -= wd * lr * p`` on every parameter, then ``p -= step_size
  * m / denom``."""

  def __init__(self, named: dict, b1: float, b2: float, eps: float,
               weight_decay: float):
    self.named = named
    self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
    self.m = {k: torch.zeros_like(p) for k, p in named.items()}
    self.v = {k: torch.zeros_like(p) for k, p in named.items()}
    self.t = 0

  @torch.no_grad()
  def step(self, lr: float) -> None:
    self.t += 1
    for name, p in self.named.items():
      g = p.grad if p.grad is not None else torch.zeros_like(p)
      self.m[name].mul_(self.b1).add_(g, alpha=1 - self.b1)
      self.v[name].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
      denom = self.v[name].sqrt().add_(self.eps)
      step_size = lr * math.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
      if self.wd:
        p.add_(p, alpha=-self.wd * lr)
      p.addcdiv_(self.m[name], denom, value=-step_size)


def clip_tf(named: dict, clip: float) -> None:
  """``tf.clip_by_global_norm``: ``g * clip / max(norm, clip)``."""
  grads = [p.grad for p in named.values() if p.grad is not None]
  norm = torch.sqrt(sum(torch.sum(g * g) for g in grads))
  for g in grads:
    g.mul_(clip / torch.maximum(norm, torch.tensor(clip)))


def parameters(*models) -> dict:
  """Named parameters of ``models``, a shared one once."""
  named, seen = {}, set()
  for prefix, model in models:
    for name, p in model.named_parameters():
      if id(p) not in seen:
        seen.add(id(p))
        named[prefix + name] = p
  return named


def run_steps(cfg, batches, named: dict, loss_fn: Callable, optimizer,
              schedule: Callable, clip: Callable | None = None
              ) -> tuple[list[float], list[float]]:
  """The reference's loop: the loss (``loss_fn(t, batch)``), backward,
  clipping, the optimizer at the step's lr."""
  rates, losses = [], []
  peak, warmup, total = (cfg.optimizer.learning_rate,
                         cfg.optimizer.warmup_steps, cfg.total_steps)
  lr_of = schedule(peak, warmup, total)
  for t, batch in enumerate(batches):
    for p in named.values():
      p.grad = None
    loss = loss_fn(t, batch)
    loss.backward()
    if clip:
      clip(named)
    lr = lr_of(t)
    optimizer.step(lr)
    rates.append(lr)
    losses.append(loss.item())
  return rates, losses


def mlm_loss(logits, batch):
  """google-research/bert run_pretraining.py ``get_masked_lm_output``:
  ``sum(w * -log p(label)) / (sum(w) + 1e-5)``."""
  log_probs = torch.log_softmax(gather(logits, _long(batch,
                                                     'masked_positions')), -1)
  nll = -log_probs.gather(-1, _long(batch, 'masked_ids')[..., None])[..., 0]
  w = _t(batch['masked_weights'])
  return (w * nll).sum() / (w.sum() + 1e-5)


def pair_loss(logits, batch):
  """``get_next_sentence_output``: the mean cross-entropy."""
  return torch.nn.functional.cross_entropy(
      logits, _long(batch, 'next_sentence_labels'))


def model_inputs(batch: dict) -> dict:
  return {'input_ids': _long(batch, 'input_ids'),
          'attention_mask': _long(batch, 'attention_mask'),
          'token_type_ids': _long(batch, 'token_type_ids')}


# ---------------------------------------------------------------------------
# The six references.


def _reference_sentence_pairs(cfg, params, batches, workdir, family: str,
                               pair_logits: str, lamb: bool):
  """MLM + the sentence-pair loss, weight 1 each, google-research/bert's
  optimizer (albert's LAMB with ``lamb``) and schedule, clip 1.0."""
  model = load_reference(workdir, params, cfg, family)
  named = parameters(('', model))

  def loss_fn(t, batch):
    out = model(**model_inputs(batch))
    loss = mlm_loss(out.prediction_logits, batch) + pair_loss(
        getattr(out, pair_logits), batch)
    return loss

  o = cfg.optimizer
  rates, losses = run_steps(
      cfg, batches, named, loss_fn,
      AdamWeightDecay(named, o.b1, o.b2, o.eps, o.weight_decay, lamb=lamb),
      bert_schedule, lambda n: clip_tf(n, 1.0))
  return Trajectory(rates, losses, torch_state(model))


def reference_bert(cfg, params, batches, workdir):
  """google-research/bert: MLM + NSP, AdamWeightDecay."""
  return _reference_sentence_pairs(cfg, params, batches, workdir, 'bert',
                                   'seq_relationship_logits', lamb=False)


def reference_albert(cfg, params, batches, workdir):
  """google-research/albert: MLM + SOP, LAMB."""
  return _reference_sentence_pairs(cfg, params, batches, workdir, 'albert',
                                   'sop_logits', lamb=True)


def reference_roberta(cfg, params, batches, workdir):
  """fairseq: masked_lm's summed loss, the trainer's division of the
  gradient by the number of masked tokens, Adam, no clipping."""
  model = load_reference(workdir, params, cfg, 'roberta')
  named = parameters(('', model))

  def loss_fn(t, batch):
    logits = gather(model(**model_inputs(batch)).logits,
                    _long(batch, 'masked_positions'))
    w = _t(batch['masked_weights'])
    nll = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), _long(batch, 'masked_ids').flatten(),
        reduction='none')
    total, sample_size = (w.flatten() * nll).sum(), w.sum()
    # trainer.py: multiply_grads(1 / sample_size), as dividing the loss.
    return total / sample_size

  o = cfg.optimizer
  rates, losses = run_steps(
      cfg, batches, named, loss_fn,
      FairseqAdam(named, o.b1, o.b2, o.eps, o.weight_decay),
      fairseq_schedule)
  return Trajectory(rates, losses, torch_state(model))


class SpanBoundaryHead(torch.nn.Module):
  """SpanBERT pair_bert.py ``BertPairTargetPredictionHead`` with
  ``MLPWithLayerNorm``: [x_left; x_right; p_i] -> Linear -> GELU ->
  LayerNorm -> Linear -> GELU -> LayerNorm -> the decoder tied to the word
  embeddings, plus its own bias."""

  def __init__(self, hidden: int, positions: int, width: int,
               word_embeddings: torch.nn.Parameter, vocab: int):
    super().__init__()
    self.position_embeddings = torch.nn.Embedding(positions, width)
    self.linear1 = torch.nn.Linear(2 * hidden + width, hidden)
    self.layer_norm1 = torch.nn.LayerNorm(hidden, eps=1e-12)
    self.linear2 = torch.nn.Linear(hidden, hidden)
    self.layer_norm2 = torch.nn.LayerNorm(hidden, eps=1e-12)
    self.decoder_weight = word_embeddings
    self.bias = torch.nn.Parameter(torch.zeros(vocab))

  def forward(self, hidden, left, right, offset):
    gelu = lambda x: torch.nn.functional.gelu(x)   # hf_bert.py's erf gelu.
    h = torch.cat([gather(hidden, left), gather(hidden, right),
                   self.position_embeddings(offset)], -1)
    h = self.layer_norm1(gelu(self.linear1(h)))
    h = self.layer_norm2(gelu(self.linear2(h)))
    return h @ self.decoder_weight.T + self.bias


def _spans(batch):
  """Each prediction slot's (left boundary, right boundary, offset in its
  span), from its span: the slots sharing a unit start (0 for unused
  slots)."""
  positions, starts = batch['masked_positions'], batch['masked_unit_start']
  left, right = np.zeros_like(positions), np.zeros_like(positions)
  for r in range(positions.shape[0]):
    for j in np.nonzero(batch['masked_weights'][r])[0]:
      span = positions[r][starts[r] == starts[r, j]]
      left[r, j], right[r, j] = starts[r, j] - 1, span.max() + 1
  return left, right, np.maximum(positions - starts, 0)


def sbo_tensors(params) -> dict:
  """bertjax's SBO head by the reference module's names."""
  s = params['sbo']
  return {
      'sbo.position_embeddings.weight': np.asarray(s['position']['embedding']),
      'sbo.linear1.weight': np.asarray(s['dense_0']['kernel']).T,
      'sbo.linear1.bias': np.asarray(s['dense_0']['bias']),
      'sbo.layer_norm1.weight': np.asarray(s['norm_0']['LayerNorm_0']['scale']),
      'sbo.layer_norm1.bias': np.asarray(s['norm_0']['LayerNorm_0']['bias']),
      'sbo.linear2.weight': np.asarray(s['dense_1']['kernel']).T,
      'sbo.linear2.bias': np.asarray(s['dense_1']['bias']),
      'sbo.layer_norm2.weight': np.asarray(s['norm_1']['LayerNorm_0']['scale']),
      'sbo.layer_norm2.bias': np.asarray(s['norm_1']['LayerNorm_0']['bias']),
      'sbo.bias': np.asarray(params['sbo_output_bias'])[:VOCAB],
  }


def reference_spanbert(cfg, params, batches, workdir):
  """SpanBERT: ``NoNSPPairLoss`` (MLM sum / targets + SBO sum / (targets +
  1)), its fork's fairseq Adam and schedule, clip 1.0."""
  model = load_reference(workdir, params, cfg, 'bert')
  m = cfg.model
  head = SpanBoundaryHead(m.hidden_size, m.sbo_positions, m.sbo_position_width,
                          model.bert.embeddings.word_embeddings.weight, VOCAB)
  with torch.no_grad():
    for name, value in sbo_tensors(params).items():
      dict(head.named_parameters())[name[len('sbo.'):]].copy_(_t(value))
  named = parameters(('', model), ('sbo.', head))

  def loss_fn(t, batch):
    hidden = model.bert(**model_inputs(batch)).last_hidden_state
    logits = model.cls.predictions(hidden)
    w = _t(batch['masked_weights']).flatten()
    labels = _long(batch, 'masked_ids').flatten()
    ce = lambda x: (w * torch.nn.functional.cross_entropy(
        x.flatten(0, 1), labels, reduction='none')).sum()
    lm = ce(gather(logits, _long(batch, 'masked_positions')))
    left, right, offset = (_t(x).long() for x in _spans(batch))
    pair = ce(head(hidden, left, right, offset))
    loss = lm / w.sum() + cfg.objective.sbo_weight * pair / (w.sum() + 1)
    return loss

  o = cfg.optimizer
  rates, losses = run_steps(
      cfg, batches, named, loss_fn,
      FairseqAdam(named, o.b1, o.b2, o.eps, o.weight_decay),
      spanbert_schedule,
      lambda n: torch.nn.utils.clip_grad_norm_(list(n.values()),
                                               o.grad_clip_norm))
  head_state = {k: v for k, v in torch_state(head, 'sbo.').items()
                if k != 'sbo.decoder_weight'}   # The word embeddings.
  return Trajectory(rates, losses, {**torch_state(model), **head_state})


def spanbert_tensors(cfg, params) -> dict:
  return {**untied(exported(params, cfg, 'bert')), **sbo_tensors(params)}


def reference_electra(cfg, params, batches, workdir):
  """google-research/electra: the generator's MLM (weight 1) and the
  discriminator's loss (weight 50) over shared embeddings; the step's
  masking and Gumbel noise are bertjax's draws."""
  discriminator = load_reference(os.path.join(workdir, 'discriminator'),
                                 params, cfg, 'electra', 'discriminator')
  generator = load_reference(os.path.join(workdir, 'generator'), params, cfg,
                             'electra', 'generator')
  # run_pretraining.py: the generator reuses the "electra/embeddings" scope
  # (tables and their LayerNorm); its decoder is tied to the shared table.
  generator.electra.embeddings = discriminator.electra.embeddings
  # TensorFlow's lookup has no padding_idx: a [PAD] the generator samples
  # into a real position trains its row, as in bertjax.
  discriminator.electra.embeddings.word_embeddings.padding_idx = None
  generator.generator_lm_head.weight = (
      discriminator.electra.embeddings.word_embeddings.weight)
  named = parameters(('discriminator.', discriminator),
                     ('generator.', generator))
  e = cfg.electra
  padded = tokenizer_lib.padded_vocab_size(VOCAB)

  def loss_fn(t, batch):
    draw = electra_objective.corrupt(train.step_key(cfg, t), batch, e)
    positions = _t(draw.positions).long()
    gumbel = _t(electra_objective.gumbel_noise(
        draw.sample_key, (*draw.positions.shape, padded)))[..., :VOCAB]
    inputs = model_inputs(batch)
    inputs['input_ids'] = _t(draw.masked).long()
    logits = gather(generator(**inputs).logits, positions)
    mlm = _electra_mlm(logits, draw)
    sampled = torch.argmax(logits.detach() / e.temperature + gumbel, -1)
    original = _t(draw.ids).long()
    fake = original.clone()
    rows = torch.arange(fake.shape[0])[:, None].expand_as(positions)
    used = _t(draw.weights) > 0
    fake[rows[used], positions[used]] = sampled[used]
    labels = (fake != original).float()
    inputs['input_ids'] = fake
    disc_logits = discriminator(**inputs).logits
    mask = _t(batch['attention_mask']).float()
    disc = (torch.nn.functional.binary_cross_entropy_with_logits(
        disc_logits, labels, reduction='none') * mask).sum() / (
            1e-6 + mask.sum())
    loss = e.generator_weight * mlm + e.discriminator_weight * disc
    return loss

  o = cfg.optimizer
  rates, losses = run_steps(
      cfg, batches, named, loss_fn,
      AdamWeightDecay(named, o.b1, o.b2, o.eps, o.weight_decay),
      electra_schedule, lambda n: clip_tf(n, 1.0))
  return Trajectory(rates, losses, {
      **torch_state(discriminator, 'discriminator.'),
      **torch_state(generator, 'generator.')})


def _electra_mlm(logits, draw):
  """run_pretraining.py ``_get_masked_lm_output``: ``sum(w * nll) /
  (sum(w) + 1e-6)`` over the step's slots."""
  log_probs = torch.log_softmax(logits, -1)
  nll = -log_probs.gather(-1, _t(draw.labels).long()[..., None])[..., 0]
  w = _t(draw.weights)
  return (w * nll).sum() / (w.sum() + 1e-6)


def electra_tensors(cfg, params) -> dict:
  return {f'{part}.{k}': v for part in ('discriminator', 'generator')
          for k, v in untied(exported(params, cfg, 'electra', part)).items()}


TEACHER_LAYERS = 4


def write_teacher(workdir: str, cfg) -> str:
  """A teacher run in ``workdir`` (run metadata, tokenizer file, a
  checkpoint of a randomly initialised 4-layer BERT of ``cfg``'s width);
  returns the tokenizer's path."""
  teacher_cfg = load_config(FAMILIES['bert'])
  teacher_cfg.model.num_layers = TEACHER_LAYERS
  tokenizer = os.path.join(workdir, distillation.TOKENIZER_MODEL)
  with open(tokenizer, 'wb') as f:
    f.write(b'teacher pieces')
  task = objectives.get('bert').make_task(teacher_cfg, VOCAB)
  dummy = {k: jnp.zeros(shape, dtype) for k, (shape, dtype)
           in pipeline.batch_spec(teacher_cfg, num_rows=1).items()}
  params = nn.unbox(jax.jit(lambda: task.init(jax.random.key(7), dummy))())
  with open(os.path.join(workdir, distillation.RUN_META), 'w') as f:
    json.dump({'config': teacher_cfg.to_dict(), 'vocab_size': VOCAB,
               'tokenizer_sha256': hashlib.sha256(
                   b'teacher pieces').hexdigest()}, f)
  state = train.TrainState(step=jnp.asarray(1, jnp.int32), params=params,
                           opt_state={})
  with ocp.CheckpointManager(
      os.path.join(workdir, distillation.CHECKPOINTS),
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    manager.save(1, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state)))
  return tokenizer


def load_teacher(params: dict, workdir: str):
  """The teacher of ``write_teacher`` holding ``params`` as transformers'
  ``BertForMaskedLM``. Distillation runs no pooler or NSP head: zeros
  stand in for them in the export, and the class has neither."""
  teacher_cfg = load_config(FAMILIES['bert'])
  teacher_cfg.model.num_layers = TEACHER_LAYERS
  h = teacher_cfg.model.hidden_size
  heads = {'pooler': {'kernel': np.zeros((h, h)), 'bias': np.zeros(h)},
           'nsp': {'kernel': np.zeros((h, 2)), 'bias': np.zeros(2)}}
  state = {k: v for k, v in exported(
      {**params, **heads}, teacher_cfg, 'bert').items()
           if not k.startswith(('bert.pooler', 'cls.seq'))}
  return load_model(os.path.join(workdir, 'teacher'), state, {
      **hf_convert.hf_config(teacher_cfg, 'bert', VOCAB),
      'architectures': ['BertForMaskedLM']})


def reference_distilbert(cfg, params, batches, workdir):
  """Hugging Face's distiller.py: 5 x KL at T=2 (times T^2) over the masked
  positions + 2 x MLM + 1 x cosine of the last hidden states over the real
  tokens; torch.optim.AdamW, clip 5.0, linear warmup and decay."""
  student = load_reference(os.path.join(workdir, 'student'), params, cfg,
                           'distilbert')
  teacher = load_teacher(params['teacher'], workdir)
  d = cfg.distillation
  named = parameters(('', student))
  o = cfg.optimizer
  no_decay = ('bias', 'LayerNorm.weight')
  optimizer = torch.optim.AdamW([
      {'params': [p for n, p in named.items()
                  if not any(nd in n for nd in no_decay)],
       'weight_decay': o.weight_decay},
      {'params': [p for n, p in named.items()
                  if any(nd in n for nd in no_decay)], 'weight_decay': 0.0},
  ], lr=0.0, betas=(o.b1, o.b2), eps=o.eps)

  class Stepper:
    def step(self, lr):
      for group in optimizer.param_groups:
        group['lr'] = lr
      optimizer.step()

  def loss_fn(t, batch):
    ids, mask = _long(batch, 'input_ids'), _long(batch, 'attention_mask')
    labels = torch.full_like(ids, -100)
    rows, positions = np.nonzero(batch['masked_weights'])
    labels[rows, batch['masked_positions'][rows, positions]] = _t(
        batch['masked_ids'][rows, positions]).long()
    s = student(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    with torch.no_grad():
      t_out = teacher(input_ids=ids, attention_mask=mask,
                      output_hidden_states=True)
    selected = (labels > -1).unsqueeze(-1).expand_as(s.logits)
    s_logits = torch.masked_select(s.logits, selected).view(-1, VOCAB)
    t_logits = torch.masked_select(t_out.logits, selected).view(-1, VOCAB)
    temperature = d.temperature
    loss_ce = torch.nn.KLDivLoss(reduction='batchmean')(
        torch.log_softmax(s_logits / temperature, -1),
        torch.softmax(t_logits / temperature, -1)) * temperature**2
    loss_mlm = torch.nn.CrossEntropyLoss(ignore_index=-100)(
        s.logits.view(-1, VOCAB), labels.view(-1))
    s_hidden, t_hidden = s.hidden_states[-1], t_out.hidden_states[-1]
    keep = mask.unsqueeze(-1).expand_as(s_hidden).bool()
    dim = s_hidden.shape[-1]
    s_sel = torch.masked_select(s_hidden, keep).view(-1, dim)
    t_sel = torch.masked_select(t_hidden, keep).view(-1, dim)
    loss_cos = torch.nn.CosineEmbeddingLoss(reduction='mean')(
        s_sel, t_sel, torch.ones(s_sel.shape[0]))
    loss = (d.kl_weight * loss_ce + d.mlm_weight * loss_mlm
            + d.cosine_weight * loss_cos)
    return loss

  rates, losses = run_steps(
      cfg, batches, named, loss_fn, Stepper(), linear_with_warmup,
      lambda n: torch.nn.utils.clip_grad_norm_(list(n.values()),
                                               o.grad_clip_norm))
  return Trajectory(rates, losses, torch_state(student))


class BertAdam:
  """TinyBERT transformer/optimization.py ``BertAdam.step``: a parameter
  without a gradient is skipped; each one's gradient is clipped to
  ``max_grad_norm`` on its own (``clip_grad_norm_(p, ...)``); raw moments,
  ``update = m / (sqrt(v) + e) + wd * p`` for the names general_distill.py
  decays; ``p -= lr * update``, the lr from the parameter's own step
  count."""

  def __init__(self, named: dict, b1: float, b2: float, eps: float,
               weight_decay: float, max_grad_norm: float, schedule):
    self.named, self.schedule = named, schedule
    self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
    self.clip = max_grad_norm
    self.state = {}

  @torch.no_grad()
  def step(self, lr: float) -> None:
    del lr   # Each parameter's own count gives it (the schedule's).
    no_decay = ('bias', 'LayerNorm.bias', 'LayerNorm.weight')
    for name, p in self.named.items():
      if p.grad is None:
        continue
      state = self.state.setdefault(name, {'step': 0, 'm': torch.zeros_like(
          p), 'v': torch.zeros_like(p)})
      torch.nn.utils.clip_grad_norm_(p, self.clip)
      g = p.grad
      state['m'].mul_(self.b1).add_(g, alpha=1 - self.b1)
      state['v'].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
      update = state['m'] / (state['v'].sqrt() + self.eps)
      if not any(nd in name for nd in no_decay):
        update += self.wd * p
      p.add_(-self.schedule(state['step']) * update)
      state['step'] += 1


def attention_scores(layer, hidden: torch.Tensor, mask: torch.Tensor):
  """TinyBERT modeling.py ``BertSelfAttention``'s ``attention_scores``:
  QK^T / sqrt(d) plus the extended mask, (1 - mask) * -10000."""
  attention = layer.attention.self
  b, l, _ = hidden.shape
  heads = attention.num_attention_heads
  split = lambda x: x.view(b, l, heads, -1).permute(0, 2, 1, 3)
  q, k = split(attention.query(hidden)), split(attention.key(hidden))
  scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
  return scores + (1.0 - mask[:, None, None, :].float()) * -10000.0


def reference_tinybert(cfg, params, batches, workdir):
  """general_distill.py: ``att_loss + rep_loss``, MSE of the attention
  scores (those <= -1e2 zeroed) of student layer i against teacher layer
  (i + 1) k - 1 and of ``fit_dense`` of each student representation
  (embeddings first) against teacher representation i k, k = N / M;
  BertAdam with WarmupLinearSchedule."""
  student = load_reference(os.path.join(workdir, 'student'), params, cfg,
                           'bert')
  teacher = load_teacher(params['teacher'], workdir)
  kernel = params['projection']['hidden']['kernel']
  fit = torch.nn.Linear(*kernel.shape)
  with torch.no_grad():
    fit.weight.copy_(_t(kernel).T)
    fit.bias.copy_(_t(params['projection']['hidden']['bias']))
  named = parameters(('', student), ('fit_dense.', fit))
  o = cfg.optimizer
  schedule = linear_with_warmup(o.learning_rate, o.warmup_steps,
                                cfg.total_steps)
  optimizer = BertAdam(named, o.b1, o.b2, o.eps, o.weight_decay,
                       o.grad_clip_norm, schedule)
  mse = torch.nn.MSELoss()

  def loss_fn(t, batch):
    del t
    inputs = {'input_ids': _long(batch, 'input_ids'),
              'token_type_ids': _long(batch, 'token_type_ids'),
              'attention_mask': _long(batch, 'attention_mask')}
    mask = inputs['attention_mask']
    s = student.bert(**inputs, output_hidden_states=True).hidden_states
    with torch.no_grad():
      t_reps = teacher.bert(**inputs, output_hidden_states=True
                            ).hidden_states
    layers_s, layers_t = len(s) - 1, len(t_reps) - 1
    k = layers_t // layers_s
    s_atts = [attention_scores(student.bert.encoder.layer[i], s[i], mask)
              for i in range(layers_s)]
    t_atts = [attention_scores(teacher.bert.encoder.layer[i], t_reps[i],
                               mask) for i in range(layers_t)]
    zero = lambda a: torch.where(a <= -1e2, torch.zeros_like(a), a)
    att_loss = sum(mse(zero(a), zero(t_atts[i * k + k - 1]))
                   for i, a in enumerate(s_atts))
    rep_loss = sum(mse(fit(rep), t_reps[i * k]) for i, rep in enumerate(s))
    return att_loss + rep_loss

  rates, losses = run_steps(cfg, batches, named, loss_fn, optimizer,
                            linear_with_warmup)
  return Trajectory(rates, losses, {**torch_state(student),
                                    **torch_state(fit, 'fit_dense.')})


def tinybert_tensors(cfg, params) -> dict:
  projection = params['projection']['hidden']
  return {**untied(exported(params, cfg, 'bert')),
          'fit_dense.weight': np.asarray(projection['kernel']).T,
          'fit_dense.bias': np.asarray(projection['bias'])}


FAMILIES = {f.name: f for f in (
    Family('bert', 'bert.py', 'google-research/bert optimization.py, '
           'run_pretraining.py', {}, reference_bert,
           lambda cfg, p: untied(exported(p, cfg, 'bert'))),
    Family('roberta', 'roberta.py', 'facebookresearch/fairseq optim/adam.py, '
           'optim/lr_scheduler/polynomial_decay_schedule.py, '
           'criterions/masked_lm.py', {}, reference_roberta,
           lambda cfg, p: untied(exported(p, cfg, 'roberta'))),
    Family('albert', 'albert.py', 'google-research/albert lamb_optimizer.py, '
           'optimization.py, run_pretraining.py',
           {'model.embedding_size': 16}, reference_albert,
           lambda cfg, p: untied(exported(p, cfg, 'albert'))),
    Family('electra', 'electra.py:size=small', 'google-research/electra '
           'model/optimization.py, run_pretraining.py',
           {'model.embedding_size': 16,
            'masking.max_predictions_per_seq': electra_lib.num_slots(0.15,
                                                                     32)},
           reference_electra, electra_tensors),
    Family('spanbert', 'spanbert.py', 'facebookresearch/SpanBERT '
           'pretraining/fairseq optim/adam.py, optim/lr_scheduler/'
           'polynomial_decay_schedule.py, models/pair_bert.py, '
           'criterions/spanbert_loss.py', {}, reference_spanbert,
           spanbert_tensors),
    Family('distilbert', 'distilbert.py', 'huggingface/transformers '
           'examples/research_projects/distillation/distiller.py',
           # distiller.py's weight decay is 0 (the preset's): its mask
           # matches names with 'LayerNorm.weight', which spares the
           # embeddings' norm but none of DistilBERT's own (sa_, output_,
           # vocab_layer_norm), a quirk bertjax's mask does not copy.
           {'distillation.student_layers': 2,
            'optimizer.weight_decay': 0.0}, reference_distilbert,
           lambda cfg, p: untied(exported(p, cfg, 'distilbert'))),
    Family('tinybert', 'tinybert.py', 'huawei-noah/Pretrained-Language-'
           'Model TinyBERT/general_distill.py, transformer/optimization.py',
           {'model.hidden_size': 16, 'model.intermediate_size': 32},
           reference_tinybert, tinybert_tensors),
)}


# ---------------------------------------------------------------------------
# Comparison.


def relative(a: float, b: float) -> float:
  """|a - b| / |b| (|a - b| where b is 0)."""
  return abs(a - b) / abs(b) if b else abs(a - b)


# Tensors whose gradient is identically zero: a key bias adds the same
# q . b_k to every logit of a query, which the softmax cancels. Both sides
# move them only by Adam's normalisation of rounding noise (about 1e-8), so
# they are compared absolutely.
ZERO_GRADIENT = ('key.bias', 'k_lin.bias')


def tensor_difference(name: str, a: np.ndarray, b: np.ndarray) -> float:
  """max |a - b| / max |b|: relative to the tensor's scale; absolute for a
  tensor of ``ZERO_GRADIENT`` or one that is all zeros."""
  scale = float(np.max(np.abs(b)))
  diff = float(np.max(np.abs(a - b)))
  return diff / scale if scale and not name.endswith(ZERO_GRADIENT) else diff


@dataclasses.dataclass
class Fidelity:
  family: str
  reference: str
  steps: int
  loss: list[float]              # Per step, relative.
  learning_rate: list[float]     # Per step, relative.
  tensors: dict[str, float]      # Per final tensor.
  seconds: float

  @property
  def worst_tensor(self) -> tuple[str, float]:
    name = max(self.tensors, key=self.tensors.get)
    return name, self.tensors[name]


def trajectory(name: str) -> Fidelity:
  """``name``'s bertjax trajectory against its reference."""
  family = FAMILIES[name]
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as workdir:
    cfg = load_config(family)
    if cfg.objective.name in (distillation.NAME, tinybert.NAME):
      teacher = os.path.join(workdir, 'teacher')
      os.makedirs(teacher)
      cfg[cfg.objective.name].teacher_workdir = teacher
      cfg.data.tokenizer.model_path = write_teacher(teacher, cfg)
      cfg = distillation.prepare_config(cfg, cfg.objective.name)
    batches = make_batches(cfg)
    initial, ours = bertjax_trajectory(cfg, batches, family.tensors)
    torch.manual_seed(0)
    theirs = family.run_reference(cfg, initial, batches,
                                  os.path.join(workdir, 'reference'))
  missing = set(ours.tensors) ^ set(theirs.tensors)
  if missing:
    raise AssertionError(f'{name}: tensors on one side only: '
                         f'{sorted(missing)}')
  return Fidelity(
      name, family.reference, len(batches),
      [relative(a, b) for a, b in zip(ours.losses, theirs.losses)],
      [relative(a, b) for a, b in zip(ours.learning_rates,
                                      theirs.learning_rates)],
      {k: tensor_difference(k, ours.tensors[k], theirs.tensors[k])
       for k in sorted(theirs.tensors)},
      time.perf_counter() - start)


def table(results: list[Fidelity]) -> str:
  lines = ['| family | reference | steps | worst loss difference | worst lr '
           'difference | worst final tensor (difference) |',
           '| --- | --- | --- | --- | --- | --- |']
  for r in results:
    name, diff = r.worst_tensor
    lines.append(f'| {r.family} | {r.reference} | {r.steps} | '
                 f'{max(r.loss):.1e} | {max(r.learning_rate):.1e} | '
                 f'`{name}` ({diff:.1e}) |')
  return '\n'.join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--families', default=','.join(FAMILIES),
                      help='comma-separated, of ' + ', '.join(FAMILIES))
  parser.add_argument('--out', default='',
                      help='also write the table here (markdown)')
  args = parser.parse_args(argv)
  names = [n for n in args.families.split(',') if n]
  unknown = [n for n in names if n not in FAMILIES]
  if unknown:
    parser.error(f'--families: {unknown} unknown; use {list(FAMILIES)}.')
  results = []
  for name in names:
    results.append(trajectory(name))
    r = results[-1]
    print(f'{name}: worst loss {max(r.loss):.1e}, lr '
          f'{max(r.learning_rate):.1e}, tensor {r.worst_tensor[1]:.1e} '
          f'({r.worst_tensor[0]}); {r.seconds:.1f} s', file=sys.stderr)
  text = table(results)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write('Relative differences between bertjax and each reference '
              f'({STEPS} steps; `python experiments/fidelity.py`; '
              'experiments/fidelity.py says what each side runs).\n\n'
              + text + '\n')


if __name__ == '__main__':
  main()
