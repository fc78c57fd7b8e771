r"""Are pruned heads and dropped layers faster, or only smaller?

  python experiments/benchmarks/pruning.py \
      --out=experiments/benchmarks/results/pruning_cpu_2026-11-26.txt
  python experiments/benchmarks/pruning.py --layers=2 --hidden=128 --heads=4

One encoder (default BERT-base: L12/H768/A12, FFN 3072, vocabulary 30522,
128 tokens, fp32, random weights) in four forms, measured side by side in
one process, the forms alternating within each round:

- ``full``: the model as trained;
- ``masked``: the same tensors with half of each layer's heads gated to 0
  (``pruning.GATES``), which is how a mask over full tensors prunes: the
  peer that removing heads is meant to beat;
- ``heads50``: half of each layer's heads removed (``pruning.remove_heads``:
  the stored model, as experiments/compress.py writes it);
- ``layers50``: half of the layers kept (``pruning.keep_layers``, every
  other one: LayerDrop's pruning at inference).

For each: parameters, and the median over ``--rounds`` rounds of the time
of (a) inference, ``BertForPreTraining`` forward at batch 1 and at
``--batch`` (per sequence), and (b) a training step's gradient (forward and
backward of the MLM loss at 20 positions, ``--batch`` rows), each jitted,
warmed up and ended by ``jax.block_until_ready``. Prints the table and
writes it, with the machine and the load on it (experiments/benchmarks/
tasks.py's lines), to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import flax.linen as nn  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bertjax import pruning  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.models import bert as bert_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments.benchmarks import tasks as tasks_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

PREDICTIONS = 20


def forms(cfg: bert_lib.BertConfig, params: dict) -> dict:
  """name -> (config, variables) of the four forms."""
  half = {i: list(range(0, cfg.num_heads, 2)) for i in range(cfg.num_layers)}
  gates = {f'layer_{i}': {'attention': {'gate': np.asarray(
      [0.0 if h in half[i] else 1.0 for h in range(cfg.num_heads)],
      np.float32)}} for i in range(cfg.num_layers)}
  pruned_params, pruned = pruning.remove_heads(params, cfg, half)
  kept = list(range(1, cfg.num_layers, 2))
  kept_params, shallow = pruning.keep_layers(params, cfg, kept)
  return {'full': (cfg, {'params': params}),
          'masked': (cfg, {'params': params, pruning.GATES: gates}),
          'heads50': (pruned, {'params': pruned_params}),
          'layers50': (shallow, {'params': kept_params})}


def programs(cfg: bert_lib.BertConfig):
  """(forward, gradient) jitted for ``cfg``: forward logits of every
  position; the MLM loss's gradient with respect to the parameters."""
  model = bert_lib.BertForPreTraining(cfg)

  def forward(variables, ids):
    return model.apply(variables, ids, jnp.zeros_like(ids),
                       jnp.ones_like(ids), ids[:, :PREDICTIONS])['mlm_logits']

  def loss(params, rest, ids):
    logits = forward({'params': params, **rest}, ids)
    labels = jax.nn.one_hot(ids[:, :PREDICTIONS], logits.shape[-1])
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), -1))

  return jax.jit(forward), jax.jit(jax.grad(loss))


def timed(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def measure(args) -> list[str]:
  cfg = bert_lib.BertConfig(
      vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
      num_heads=args.heads, intermediate_size=4 * args.hidden,
      max_position_embeddings=args.length, hidden_dropout_rate=0.0,
      attention_dropout_rate=0.0)
  ids = np.random.default_rng(0).integers(5, args.vocab, (args.batch,
                                                          args.length))
  one, many = jnp.asarray(ids[:1], jnp.int32), jnp.asarray(ids, jnp.int32)
  abstract = jax.eval_shape(bert_lib.BertForPreTraining(cfg).init,
                            jax.random.key(0), one, one, one,
                            one[:, :PREDICTIONS])['params']
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda x: rng.normal(0, 0.02, x.shape).astype(
      np.float32), nn.unbox(abstract))
  built = {}
  for name, (form_cfg, variables) in forms(cfg, params).items():
    forward, gradient = programs(form_cfg)
    rest = {k: v for k, v in variables.items() if k != 'params'}
    calls = {'infer 1': (forward, variables, one),
             f'infer {args.batch}': (forward, variables, many),
             f'grad {args.batch}': (gradient, variables['params'], rest,
                                    many)}
    for fn, *inputs in calls.values():   # Compile and warm up.
      for _ in range(2):
        timed(fn, *inputs)
    size = sum(int(np.prod(np.shape(x)))
               for x in jax.tree.leaves(variables['params']))
    built[name] = (size, calls)
  times = {name: {call: [] for call in calls}
           for name, (_, calls) in built.items()}
  for _ in range(args.rounds):
    for name, (_, calls) in built.items():
      for call, (fn, *inputs) in calls.items():
        times[name][call].append(timed(fn, *inputs))
  columns = list(next(iter(times.values())))
  lines = ['| form | parameters | ' + ' | '.join(
      f'{c} (ms/seq)' for c in columns) + ' | vs full |',
           '| --- | --- | ' + ' | '.join('---' for _ in columns) + ' | --- |']
  full = {c: statistics.median(times['full'][c]) for c in columns}
  for name, (size, _) in built.items():
    medians = {c: statistics.median(times[name][c]) for c in columns}
    per_seq = [medians[c] * 1e3 / (1 if c == 'infer 1' else args.batch)
               for c in columns]
    speedups = ', '.join(f'{full[c] / medians[c]:.2f}x' for c in columns)
    lines.append(f'| {name} | {size / 1e6:.1f}M | ' + ' | '.join(
        f'{t:.2f}' for t in per_seq) + f' | {speedups} |')
  return lines


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', type=int, default=12)
  parser.add_argument('--hidden', type=int, default=768)
  parser.add_argument('--heads', type=int, default=12)
  parser.add_argument('--vocab', type=int, default=30522)
  parser.add_argument('--length', type=int, default=128)
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  header = tasks_bench.machine() + [tasks_bench.load_line('before')]
  start = tasks_bench.cpu_seconds()
  table = measure(args)
  footer = [tasks_bench.load_line('after'), tasks_bench.others_line(start)]
  text = '\n'.join(
      header + [f'L{args.layers}/H{args.hidden}/A{args.heads}, vocabulary '
                f'{args.vocab}, {args.length} tokens, batch {args.batch}, '
                f'fp32, median of {args.rounds} rounds', ''] + table
      + [''] + footer) + '\n'
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  main()
