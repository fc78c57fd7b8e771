"""Training-step speed: bertjax's train step vs Hugging Face PyTorch.

  python experiments/benchmarks/step.py --size=cpu            # L4/H256, 128 x 32
  python experiments/benchmarks/step.py --size=base --seq=128 --batch=256
  python experiments/benchmarks/step.py --size=large --seq=512 --batch=32

Needs the ``bench`` extra (``pip install '.[bench]'``: torch, transformers).

bertjax: the trainer's own step (``bertjax.train.make_steps``: MLM + NSP,
the paper's AdamW, gradient clipping, dropout at the paper's 0.1), sharded
and compiled as the trainer does it (data parallel over every local device),
fed a synthetic batch. The peer: transformers' ``BertForPreTraining`` with
the same configuration, batch and objective (MLM labels at the same
``max_predictions`` positions, NSP labels), SDPA attention, AdamW (fused on
GPU), bf16 autocast on GPU, and ``torch.compile`` when it is faster (both
are timed; ``--peer_compile`` forces one), in two forms timed side by
side: as shipped, its MLM head projecting every position onto the
vocabulary (the unmasked ones labelled -100), and with the head applied to
the gathered masked positions only, as google-research/bert and bertjax do
(the same loss, checked at the initial weights; at seq 128 and 20
predictions the shipped head is 2.4x the step's FLOPs). Sizes: ``cpu``
is L4/H256/A4, FFN 1024 (BERT-mini), ``base`` and ``large`` are BERT's;
vocabulary 30522.

``--input=pipeline`` feeds bertjax's step from the real input pipeline
instead (the embedded corpus, its 2000-piece demo tokenizer, NSP pairs at
``--seq``, dynamic masking, fetched and put on the devices per step as the
trainer does), to show whether the pipeline keeps up; it reports real
tokens/s (padding excluded) and step time next to the synthetic figures,
and times no peer.

Both sides run ``--steps`` steps per round after warm-up, synchronised at
the end of each round, alternating for ``--rounds`` rounds so that both see
the same machine; the median round is reported. Every token of the
synthetic batch is real (no padding), so tokens/s counts real tokens.
Prints a table and writes it, with every figure and the software versions,
to ``--out`` (``.json`` and ``.md``).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import flax.linen as nn  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bertjax import config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import flops  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import objectives  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.models import config as model_config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments.benchmarks import profile_summary  # pylint: disable=g-import-not-at-top,wrong-import-position
from data_pipelines import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from data_pipelines import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

VOCAB_SIZE = 30522
# --size -> bertjax model size.
SIZES = {'cpu': 'mini', 'base': 'base', 'large': 'large'}
# BERT's max_predictions_per_seq for its two sequence lengths.
PREDICTIONS = {128: 20, 512: 80}


def bertjax_config(args):
  cfg = config_lib.base_config()
  cfg.model.size = SIZES[args.size]
  cfg.model.dtype = args.dtype
  cfg.model.remat = args.remat
  cfg.model.scan_layers = args.scan_layers
  cfg.step_rng = args.step_rng
  cfg.model.attention = args.attention
  if not args.dropout:
    cfg.model.hidden_dropout_rate = cfg.model.attention_dropout_rate = 0.0
  cfg.model.max_position_embeddings = max(512, args.seq)
  cfg.data.max_seq_length = args.seq
  cfg.masking.max_predictions_per_seq = args.predictions
  cfg.batch_size = args.batch
  cfg.total_steps = 1_000_000
  config_lib.validate(cfg)
  return cfg


def synthetic_batch(args, seed: int = 0) -> dict:
  """A BERT batch with every token real: [CLS] A [SEP] B [SEP]."""
  rng = np.random.default_rng(seed)
  b, l, p = args.batch, args.seq, args.predictions
  ids = rng.integers(1000, VOCAB_SIZE, (b, l)).astype(np.int32)
  ids[:, 0] = tokenizer_lib.CLS_ID
  ids[:, l // 2] = tokenizer_lib.SEP_ID
  ids[:, -1] = tokenizer_lib.SEP_ID
  types = (np.arange(l)[None, :] > l // 2).astype(np.int32).repeat(b, 0)
  positions = np.sort(np.stack([rng.choice(np.arange(1, l - 1), p,
                                           replace=False) for _ in range(b)]),
                      axis=1).astype(np.int32)
  return {
      'input_ids': ids, 'token_type_ids': types,
      'attention_mask': np.ones((b, l), np.int32),
      'masked_positions': positions,
      'masked_ids': np.take_along_axis(ids, positions, 1),
      'masked_weights': np.ones((b, p), np.float32),
      'masked_unit_start': positions,
      'next_sentence_labels': rng.integers(0, 2, b).astype(np.int32),
  }


class Bertjax:
  """The trainer's step, sharded over the local devices and compiled;
  fed one synthetic batch, or the input pipeline's (``feed``)."""

  def __init__(self, args, feed: bool = False):
    cfg = bertjax_config(args)
    task = objectives.get(cfg.objective.name).make_task(cfg, VOCAB_SIZE)
    self.flops_per_token = task.flops_per_token
    spec = pipeline.batch_spec(cfg)
    steps = train.make_steps(cfg, task, spec)
    mesh = sharding.make_mesh((-1, 1, 1))
    rules = sharding.logical_rules(cfg)
    batch_sh = sharding.batch_sharding(mesh)
    self.device = jax.local_devices()[0]
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      abstract, state_sh = sharding.state_shardings(steps.init_state, mesh,
                                                    rules)
      abstract_batch = {k: jax.ShapeDtypeStruct(s, d, sharding=batch_sh)
                        for k, (s, d) in spec.items()}
      t0 = time.perf_counter()
      self._step = train.compile_train_step(steps, mesh, state_sh, batch_sh,
                                            abstract, abstract_batch)
      self.compile_seconds = time.perf_counter() - t0
      self.memory_text, self.memory = sharding.memory_report(
          self._step, self.device)
      self._state = sharding.create_sharded(steps.init_state, state_sh)
      self._batch = sharding.make_global_batch(synthetic_batch(args),
                                               batch_sh, args.batch)
    self.parameters = train.trainable_parameters(abstract.params)
    self._feed = None
    if feed:
      self._feed = _pipeline_batches(args, cfg, sharding.process_batch_rows(
          batch_sh, args.batch))
      self._to_global = lambda b: sharding.make_global_batch(
          {k: b[k] for k in spec}, batch_sh, args.batch)
    self.real_tokens = 0

  def run(self, n: int) -> float:
    """Seconds for ``n`` steps, synchronised at the end."""
    t0 = time.perf_counter()
    self.real_tokens = 0
    for _ in range(n):
      batch = self._batch
      if self._feed is not None:   # As the trainer's loop does.
        local = next(self._feed)
        self.real_tokens += int(local['attention_mask'].sum())
        batch = self._to_global(local)
      self._state, metrics = self._step(self._state, batch)
    jax.block_until_ready((self._state.step, metrics['loss']))
    return time.perf_counter() - t0

  def peak_memory(self) -> int | None:
    stats = self.device.memory_stats() or {}
    return stats.get('peak_bytes_in_use')


def _pipeline_batches(args, cfg, rows):
  """The trainer's input pipeline on the embedded corpus at ``cfg``'s
  sequence length, batch and masking (demo tokenizer)."""
  from data_pipelines import pretokenize  # pylint: disable=g-import-not-at-top
  data = config_lib.demo_config().data   # Its cache, if built, is reused.
  data.max_seq_length = args.seq
  data.num_threads = max(1, os.cpu_count() // 2)
  cfg.data = data
  cfg.masking.dynamic = True
  prepared = pretokenize.prepare(cfg.data)
  return iter(pipeline.train_dataset(prepared, cfg, rows))


def _masked_head(torch, model):
  """``model`` (a ``BertForPreTraining``) with its MLM head applied to the
  gathered masked positions only; returns MLM + NSP loss."""
  functional = torch.nn.functional

  class MaskedHead(torch.nn.Module):
    """google-research/bert's ``get_masked_lm_output`` gather."""

    def __init__(self):
      super().__init__()
      self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask,
                masked_positions, masked_ids, next_sentence_label):
      out = self.model.bert(input_ids=input_ids,
                            token_type_ids=token_type_ids,
                            attention_mask=attention_mask)
      sequence, pooled = out[0], out[1]
      gathered = torch.gather(sequence, 1, masked_positions[..., None]
                              .expand(-1, -1, sequence.shape[-1]))
      scores = self.model.cls.predictions(gathered)
      mlm = functional.cross_entropy(scores.flatten(0, 1).float(),
                                     masked_ids.flatten())
      nsp = functional.cross_entropy(
          self.model.cls.seq_relationship(pooled).float(),
          next_sentence_label)
      return mlm + nsp

  return MaskedHead()


class HuggingFace:
  """transformers' BertForPreTraining on the same batch and objective.

  ``head='all'``: the model's own forward and loss, which project every
  position onto the vocabulary and ignore the unmasked ones (label -100).
  ``head='masked'``: the same modules, the MLM head applied to the masked
  positions only, gathered first as google-research/bert's
  ``get_masked_lm_output`` and bertjax do: the same loss, a fifth of the
  vocabulary projection at seq 128."""

  def __init__(self, args, compiled: bool, head: str = 'all',
               warm: bool = True):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.cuda = torch.cuda.is_available()
    device = torch.device('cuda' if self.cuda else 'cpu')
    layers, hidden, heads = {'cpu': (4, 256, 4), 'base': (12, 768, 12),
                             'large': (24, 1024, 16)}[args.size]
    config = transformers.BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden,
        max_position_embeddings=max(512, args.seq),
        attn_implementation='sdpa',
        **({} if args.dropout else {'hidden_dropout_prob': 0.0,
                                    'attention_probs_dropout_prob': 0.0}))
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config).to(device).train()
    self.parameters = sum(p.numel() for p in model.parameters())
    self._optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6,
        **({'fused': True} if self.cuda else {'foreach': True}))
    self.head = head
    self.model = model
    self.module = model if head == 'all' else _masked_head(torch, model)
    self._model = torch.compile(self.module) if compiled else self.module
    batch = synthetic_batch(args)
    labels = np.full(batch['input_ids'].shape, -100, np.int64)
    np.put_along_axis(labels, batch['masked_positions'],
                      batch['masked_ids'], 1)
    as_tensor = lambda x: torch.as_tensor(np.asarray(x, np.int64),
                                          device=device)
    self.inputs = {
        'input_ids': as_tensor(batch['input_ids']),
        'token_type_ids': as_tensor(batch['token_type_ids']),
        'attention_mask': as_tensor(batch['attention_mask']),
        'labels': as_tensor(labels),
        'next_sentence_label': as_tensor(batch['next_sentence_labels']),
    }
    if head == 'masked':
      del self.inputs['labels']
      self.inputs |= {'masked_positions': as_tensor(
          batch['masked_positions']), 'masked_ids': as_tensor(
              batch['masked_ids'])}
    self._dtype = torch.bfloat16 if args.dtype == 'bfloat16' else None
    self.compile_seconds = 0.0
    if not warm:
      return
    if self.cuda:
      torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    self.run(1)   # torch.compile compiles on the first call.
    self.compile_seconds = time.perf_counter() - t0

  def _step(self):
    torch = self.torch
    self._optimizer.zero_grad(set_to_none=True)
    with torch.autocast('cuda' if self.cuda else 'cpu', dtype=self._dtype,
                        enabled=self._dtype is not None):
      out = self._model(**self.inputs)
      loss = out.loss if self.head == 'all' else out
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self._model.parameters(), 1.0)
    self._optimizer.step()
    return loss

  def run(self, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
      loss = self._step()
    loss.item()    # Waits for the device.
    if self.cuda:
      self.torch.cuda.synchronize()
    return time.perf_counter() - t0

  def peak_memory(self) -> int | None:
    return self.torch.cuda.max_memory_allocated() if self.cuda else None


def _median_rate(seconds: list[float], tokens: int) -> float:
  return tokens / statistics.median(seconds)


def measure_pipeline(args) -> dict:
  """Synthetic vs pipeline-fed, alternating; no peer."""
  tokens = args.batch * args.seq * args.steps
  synthetic, fed = Bertjax(args), Bertjax(args, feed=True)
  synthetic.run(args.warmup)
  fed.run(args.warmup)
  times = {'synthetic': [], 'pipeline': []}
  real = []
  for r in range(args.rounds):
    times['synthetic'].append(synthetic.run(args.steps))
    times['pipeline'].append(fed.run(args.steps))
    real.append(fed.real_tokens)
    ms = {k: v[-1] / args.steps * 1e3 for k, v in times.items()}
    print(f'round {r + 1}: synthetic {ms["synthetic"]:.1f} ms/step, '
          f'pipeline {ms["pipeline"]:.1f} ms/step '
          f'({real[-1] / times["pipeline"][-1]:,.0f} real tokens/s)',
          flush=True)
  step = {k: statistics.median(v) / args.steps for k, v in times.items()}
  return {
      'size': args.size, 'seq': args.seq, 'batch': args.batch,
      'predictions': args.predictions, 'dtype': args.dtype,
      'device': synthetic.device.device_kind,
      'devices': jax.local_device_count(),
      'synthetic': {'step_seconds': step['synthetic'],
                    'tokens_per_second': tokens / (step['synthetic']
                                                   * args.steps)},
      'pipeline': {'step_seconds': step['pipeline'],
                   'real_tokens_per_second': statistics.median(
                       [n / t for n, t in zip(real, times['pipeline'])]),
                   'real_token_fraction': sum(real) / (
                       tokens * args.rounds)},
      'step_time_ratio': step['pipeline'] / step['synthetic'],
  }


def pipeline_table(result: dict) -> str:
  s, p = result['synthetic'], result['pipeline']
  return '\n'.join([
      f'{result["size"]} (seq {result["seq"]}, batch {result["batch"]}, '
      f'{result["dtype"]}) on {result["devices"]} x {result["device"]}',
      '',
      '| input | step time | tokens/s |',
      '| --- | --- | --- |',
      f'| synthetic batch | {s["step_seconds"] * 1e3:.1f} ms | '
      f'{s["tokens_per_second"]:,.0f} (all real) |',
      f'| input pipeline | {p["step_seconds"] * 1e3:.1f} ms | '
      f'{p["real_tokens_per_second"]:,.0f} real '
      f'({p["real_token_fraction"]:.1%} of positions) |',
      f'| pipeline / synthetic step time | {result["step_time_ratio"]:.3f} | |',
  ])


def heads_agree(args) -> float:
  """|loss difference| between the peer's two heads on one model at its
  initial weights, dropout off: 0 up to rounding when both compute the
  same objective."""
  import torch  # pylint: disable=g-import-not-at-top
  peer = HuggingFace(args, compiled=False, head='all', warm=False)
  masked = HuggingFace(args, compiled=False, head='masked', warm=False)
  with torch.no_grad():
    a = peer.module.eval()(**peer.inputs).loss
    masked.model.load_state_dict(peer.model.state_dict())
    b = masked.module.eval()(**masked.inputs)
  return abs(float(a) - float(b))


def _peer_name(compiled: bool, head: str) -> str:
  return f'hf_head={head}_compile={compiled}'


def measure(args) -> dict:
  tokens = args.batch * args.seq * args.steps   # Every token is real.
  ours = Bertjax(args)
  print(f'bertjax compiled in {ours.compile_seconds:.1f}s; '
        f'{ours.memory_text}', flush=True)
  peers = {}
  for compiled in {'auto': (False, True), 'on': (True,), 'off': (False,),
                   'none': ()}[args.peer_compile]:
    for head in ('all', 'masked'):
      peers[compiled, head] = HuggingFace(args, compiled, head)
      print(f'peer (head={head}, torch.compile={compiled}) ready in '
            f'{peers[compiled, head].compile_seconds:.1f}s', flush=True)
  agree = heads_agree(args) if peers else None
  if peers:
    print(f"the peer's two heads' losses differ by {agree:.1e}", flush=True)
  ours.run(args.warmup)
  for peer in peers.values():
    peer.run(args.warmup)
  times = {'bertjax': []} | {_peer_name(*k): [] for k in peers}
  for r in range(args.rounds):   # Alternating: same machine state.
    times['bertjax'].append(ours.run(args.steps))
    for key, peer in peers.items():
      times[_peer_name(*key)].append(peer.run(args.steps))
    print(f'round {r + 1}: ' + ', '.join(
        f'{name} {tokens / t[-1]:,.0f} tokens/s'
        for name, t in times.items()), flush=True)
  ours_rate = _median_rate(times['bertjax'], tokens)
  peak = flops.peak_flops(ours.device.device_kind)
  tflops = ours_rate * ours.flops_per_token / 1e12
  n = jax.local_device_count()
  result = {
      'size': args.size, 'seq': args.seq, 'batch': args.batch,
      'predictions': args.predictions, 'dtype': args.dtype,
      'remat': args.remat, 'scan_layers': args.scan_layers,
      'dropout': args.dropout, 'step_rng': args.step_rng,
      'attention': model_config_lib.attention_impl(bertjax_config(args).model),
      'steps_per_round': args.steps,
      'rounds': args.rounds,
      'device': ours.device.device_kind, 'devices': n,
      'bertjax': {
          'tokens_per_second': ours_rate,
          'step_seconds': statistics.median(times['bertjax']) / args.steps,
          'compile_seconds': ours.compile_seconds,
          'flops_per_token': ours.flops_per_token,
          'tflops_per_second': tflops,
          'mfu': tflops * 1e12 / (peak * n) if peak else None,
          'parameters': ours.parameters,
          'peak_memory_bytes': ours.peak_memory(),
          'compiled_memory_bytes': ours.memory,
          'round_seconds': times['bertjax'],
      },
      'peer': None, 'ratio': None,
  }
  if args.profile:
    result['profile'] = profile(ours, args)
  if not peers:
    return result

  def best_of(head: str) -> dict:
    key = max((k for k in peers if k[1] == head), key=lambda k: _median_rate(
        times[_peer_name(*k)], tokens))
    peer, seconds = peers[key], times[_peer_name(*key)]
    return {
        'name': 'transformers BertForPreTraining (SDPA'
                + (', bf16 autocast' if args.dtype == 'bfloat16' else '')
                + (', fused AdamW' if peer.cuda else ', foreach AdamW')
                + (', MLM head at every position, as shipped)'
                   if head == 'all' else ', MLM head at the masked '
                   'positions, gathered as google-research/bert does)'),
        'torch_compile': key[0],
        'tokens_per_second': _median_rate(seconds, tokens),
        'step_seconds': statistics.median(seconds) / args.steps,
        'compile_seconds': peer.compile_seconds,
        'parameters': peer.parameters,
        'peak_memory_bytes': peer.peak_memory(),
    }

  shipped, gathered = best_of('all'), best_of('masked')
  return result | {
      'peer': shipped | {'all': {
          name: {'tokens_per_second': _median_rate(t, tokens),
                 'round_seconds': t}
          for name, t in times.items() if name != 'bertjax'}},
      'ratio': ours_rate / shipped['tokens_per_second'],
      'peer_masked_head': gathered | {'loss_difference': agree},
      'ratio_masked_head': ours_rate / gathered['tokens_per_second'],
  }


def profile(ours: Bertjax, args) -> dict:
  """Traces ``args.steps`` steps with the JAX profiler (the trace goes to
  ``args.profile``) and sums the device's kernels by name."""
  ours.run(1)
  jax.profiler.start_trace(args.profile)
  ours.run(args.steps)
  jax.profiler.stop_trace()
  traces = sorted(glob.glob(os.path.join(args.profile, '**', '*.xplane.pb'),
                            recursive=True), key=os.path.getmtime)
  summary = profile_summary.summarize(
      jax.profiler.ProfileData.from_file(traces[-1]))
  return summary | {'steps': args.steps, 'trace': traces[-1]}


def versions() -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  return {'date': datetime.date.today().isoformat(),
          'python': platform.python_version(), 'machine': platform.machine(),
          'cpu_count': os.cpu_count(), 'jax': jax.__version__,
          'jaxlib': jaxlib.__version__, 'torch': torch.__version__,
          'cuda': torch.version.cuda, 'transformers': transformers.__version__,
          'jax_devices': [str(d) for d in jax.local_devices()]}


def table(result: dict) -> str:
  ours, peer = result['bertjax'], result['peer']
  missing = {'tokens_per_second': float('nan'), 'torch_compile': 'not run',
             'step_seconds': float('nan'), 'compile_seconds': float('nan'),
             'peak_memory_bytes': None, 'parameters': 0}
  peer = peer or missing
  gathered = result.get('peer_masked_head') or missing
  gib = lambda b: f'{b / 2**30:.2f} GiB' if b else 'n/a'
  mfu = f'{ours["mfu"]:.1%}' if ours['mfu'] is not None else 'n/a (CPU)'
  return '\n'.join([
      f'{result["size"]} (seq {result["seq"]}, batch {result["batch"]}, '
      f'{result["predictions"]} predictions, {result["dtype"]}) on '
      f'{result["devices"]} x {result["device"]}',
      '',
      '| | bertjax | Hugging Face, as shipped (MLM head at every '
      'position) | Hugging Face, MLM head at the masked positions |',
      '| --- | --- | --- | --- |',
      f'| tokens/s | {ours["tokens_per_second"]:,.0f} | '
      f'{peer["tokens_per_second"]:,.0f} (torch.compile='
      f'{peer["torch_compile"]}) | {gathered["tokens_per_second"]:,.0f} '
      f'(torch.compile={gathered["torch_compile"]}) |',
      f'| bertjax / peer | | {result["ratio"] or float("nan"):.2f}x | '
      f'{result.get("ratio_masked_head") or float("nan"):.2f}x |',
      f'| step time | {ours["step_seconds"] * 1e3:.1f} ms | '
      f'{peer["step_seconds"] * 1e3:.1f} ms | '
      f'{gathered["step_seconds"] * 1e3:.1f} ms |',
      f'| achieved TFLOP/s (analytic) | {ours["tflops_per_second"]:.3f} '
      '| | |',
      f'| MFU | {mfu} | | |',
      f'| compile | {ours["compile_seconds"]:.1f} s | '
      f'{peer["compile_seconds"]:.1f} s | '
      f'{gathered["compile_seconds"]:.1f} s |',
      f'| peak device memory | {gib(ours["peak_memory_bytes"])} | '
      f'{gib(peer["peak_memory_bytes"])} | '
      f'{gib(gathered["peak_memory_bytes"])} |',
      f'| parameters | {ours["parameters"]:,} | {peer["parameters"]:,} | '
      f'{gathered["parameters"]:,} |',
  ] + ([] if result.get('peer_masked_head') is None else [
      '', "The peer's two heads give the same loss at its initial weights "
      f'(difference {gathered["loss_difference"]:.1e}); the shipped one '
      'projects every position onto the vocabulary, the gathered one and '
      "bertjax's only the masked ones."]) + (
          [] if 'profile' not in result else [
              '', profile_summary.table(result['profile'],
                                        result['profile']['steps'])]))


def fill_defaults(args):
  """``args`` with the defaults that depend on others: the dtype on the
  backend (bfloat16 on GPU/TPU, float32 on CPU), the predictions per
  sequence on its length (BERT's 20 at 128, 80 at 512)."""
  on_cpu = jax.default_backend() == 'cpu'
  args.dtype = args.dtype or ('float32' if on_cpu else 'bfloat16')
  args.predictions = args.predictions or PREDICTIONS.get(
      args.seq, round(0.15 * args.seq))
  return args


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', choices=sorted(SIZES), default='cpu')
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--predictions', type=int, default=0,
                      help='masked positions per sequence (0: BERT\'s 20 '
                      'at 128, 80 at 512).')
  parser.add_argument('--dtype', choices=('float32', 'bfloat16'),
                      default='', help='default: bfloat16 on GPU/TPU, '
                      'float32 on CPU.')
  parser.add_argument('--remat', choices=('none', 'full', 'dots'),
                      default='none', help="bertjax's model.remat.")
  parser.add_argument('--scan_layers', action='store_true',
                      help="bertjax's model.scan_layers.")
  parser.add_argument('--dropout', action=argparse.BooleanOptionalAction,
                      default=True, help='the paper\'s dropout (0.1) on '
                      'both sides; --no-dropout turns it off on both.')
  parser.add_argument('--attention', choices=('auto', 'xla', 'cudnn'),
                      default='auto', help="bertjax's model.attention (the "
                      'kernel where no attention dropout is active).')
  parser.add_argument('--step_rng', choices=('threefry', 'rbg'),
                      default='threefry', help="bertjax's config.step_rng.")
  parser.add_argument('--profile', default='',
                      help='trace --steps steps into this directory and '
                      'print the top device kernels.')
  parser.add_argument('--steps', type=int, default=10,
                      help='steps per timed round.')
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--input', choices=('synthetic', 'pipeline'),
                      default='synthetic', help='pipeline: synthetic vs '
                      'the real input pipeline feeding the step, no peer.')
  parser.add_argument('--peer_compile', choices=('auto', 'on', 'off', 'none'),
                      default='auto', help='auto: time the peer eager and '
                      'with torch.compile, report the faster; none: no '
                      'peer.')
  parser.add_argument('--out', default='',
                      help='write OUT.json and OUT.md (default: print only).')
  args = fill_defaults(parser.parse_args(argv))
  if args.batch % jax.local_device_count():
    parser.error(f'--batch={args.batch} must divide over the '
                 f'{jax.local_device_count()} local devices.')
  info = versions()
  print(json.dumps(info), flush=True)
  if args.input == 'pipeline':
    result = measure_pipeline(args) | {'versions': info}
    text = pipeline_table(result)
  else:
    result = measure(args) | {'versions': info}
    text = table(result)
  print('\n' + text, flush=True)
  if args.out:
    with open(f'{args.out}.json', 'w') as f:
      json.dump(result, f, indent=2)
    with open(f'{args.out}.md', 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  main()
