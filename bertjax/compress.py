"""A trained run made smaller, written as a workdir of its own.

The operations of bertjax/pruning.py applied to a ``bert`` run: its heads
pruned by importance on its own held-out pretraining batches, or the
layers a LayerDrop run keeps. The result is a directory as
experiments/import_hf.py writes (``config.json`` with ``init_from``
pointing to it, ``tokenizer.model``, the parameters as a step-0
checkpoint), so fine-tuning (``init=DIR``), export and continued
pretraining (``experiments/configs/imported.py:DIR/config.json``) take it
like any run. experiments/compress.py is its command line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np

from bertjax import config_lib
from bertjax import pruning
from bertjax import runs
from bertjax import storage
from bertjax import train
from bertjax.interop import hf_convert
from bertjax.models import bert as bert_lib
from bertjax.objectives import auxiliary
from bertjax.objectives import base
from bertjax.objectives import bert as bert_objective
from bertjax.objectives import losses
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

# What a compressed workdir records of how it was made.
SOURCE_FILE = 'compression.json'


class CompressError(ValueError):
  """A run or request that cannot be compressed; says what to do."""


def _load(workdir: str, step: int | None):
  """The run at ``step`` with its encoder config and layers unstacked."""
  try:
    run = runs.load_run(workdir, step)
  except ValueError as e:
    raise CompressError(str(e)) from e
  cfg = run.config
  if cfg.objective.name != bert_objective.NAME:
    raise CompressError(
        f'{workdir!r} trains objective.name={cfg.objective.name!r}; heads '
        "and layers are pruned from the bert objective's encoder (BERT, "
        'RoBERTa, SpanBERT, ERNIE, ALBERT without shared layers).')
  if cfg.model.num_layer_groups:
    raise CompressError(
        f'{workdir!r} shares its layers (model.num_layer_groups='
        f'{cfg.model.num_layer_groups}): a shared layer cannot lose heads '
        'or be dropped alone.')
  model = bert_objective.encoder_config(cfg, run.vocab_size)
  params = hf_convert._unscanned(run.params, model.num_layers)  # pylint: disable=protected-access
  model = dataclasses.replace(model, scan_layers=False)
  return run, model, params


def _write(run, cfg, model: bert_lib.BertConfig, params: dict, out_dir: str,
           record: dict) -> str:
  """``params`` of ``model`` as a workdir in ``out_dir`` (new), with the
  run's config less what changed; returns ``out_dir``."""
  cfg = config_lib.from_saved(cfg.to_dict())
  cfg.model.scan_layers = False
  cfg.model.num_layers = model.num_layers
  cfg.model.num_heads = model.num_heads
  cfg.model.pruned_heads = model.pruned_heads
  imported = hf_convert.Imported(hf_convert.family_of(cfg), cfg, params,
                                 run.vocab_size)
  tokenizer = tokenizer_lib.Tokenizer.load(run.tokenizer_path)
  try:
    hf_convert.write_import(imported, tokenizer, out_dir,
                            f'{run.workdir} step {run.step}')
  except hf_convert.ConversionError as e:
    raise CompressError(str(e)) from e
  storage.write_text(os.path.join(out_dir, SOURCE_FILE),
                     json.dumps({'workdir': run.workdir, 'step': run.step,
                                 **record}, indent=2, sort_keys=True))
  return out_dir


def _check_out(out_dir: str) -> None:
  if storage.exists(out_dir):
    unfinished = not storage.isfile(os.path.join(out_dir, SOURCE_FILE))
    raise CompressError(
        f'{out_dir!r} exists; write into a new directory (nothing is '
        'overwritten)' + (f'. It has no {SOURCE_FILE}: if it is an '
                          'unfinished compression, remove it and rerun.'
                          if unfinished else '.'))


def importance_fns(cfg, model: bert_lib.BertConfig):
  """(loss, apply) for ``pruning.head_importance``: the run's MLM (and
  NSP, SBO) loss, deterministic, the gates as a collection."""
  network = bert_lib.BertForPreTraining(model)
  o = cfg.objective

  def apply(variables, batch, mutable):
    return network.apply(variables, *base.model_inputs(batch),
                         **base.model_kwargs(batch), deterministic=True,
                         mutable=mutable)

  def loss(variables, batch):
    outputs = network.apply(variables, *base.model_inputs(batch),
                            **base.model_kwargs(batch), deterministic=True)
    return losses.bert_pretraining(outputs, batch, o.mlm_weight,
                                   o.nsp_weight, o.sbo_weight,
                                   o.sbo_count_offset)[0]

  return loss, apply


def held_out_batches(cfg, workdir: str, num_batches: int) -> list[dict]:
  """The run's fixed held-out batches (its first ``num_batches``)."""
  _, prepared = train.prepare_data(cfg, None, workdir)
  batches = pipeline.eval_batches(prepared, cfg)[:num_batches]
  keys = pipeline.batch_spec(cfg)
  return [{k: np.asarray(v) for k, v in b.items() if k in keys}
          for b in batches]


def _check_fraction(model: bert_lib.BertConfig, fraction: float) -> int:
  """How many more heads ``fraction`` (of all the unpruned model's)
  removes from ``model``; a CompressError if it cannot."""
  total = model.num_layers * model.num_heads
  stored = sum(model.layer_heads(i) for i in range(model.num_layers))
  count = int(round(fraction * total)) - (total - stored)
  if not 0 < fraction < 1 or count <= 0:
    raise CompressError(
        f'fraction={fraction}: use a fraction in (0, 1) of the '
        f'{total} heads above the {total - stored} already removed.')
  if count > stored - model.num_layers:
    raise CompressError(
        f'fraction={fraction} removes {count} more of the {stored} heads '
        'stored; at most '
        f'{(total - model.num_layers) / total:.3f} of all can go with '
        'every layer keeping one (to remove whole layers, train with '
        'model.layerdrop and keep_layers).')
  return count


def prune_heads(workdir: str, out_dir: str, fraction: float,
                step: int | None = None, num_batches: int = 0,
                rounds: int = 1, train_steps: int = 0) -> dict:
  """Writes ``workdir``'s run with ``fraction`` of its heads removed, the
  least important on its held-out batches first; returns what was
  removed and measured.

  Args:
    workdir: a bert-objective run (or a directory this module wrote).
    out_dir: the new directory.
    fraction: of all the heads of the unpruned model, the share removed
      when done.
    step: the run's checkpoint (None = the latest).
    num_batches: held-out batches to score on (0 = ``eval.num_batches``).
    rounds: prune in this many equal rounds, scoring again each time
      (Michel et al. Sec. 4.2 prune iteratively).
    train_steps: pretraining steps between two rounds, on the run's own
      config (its data, objective and peak rate; warmup a tenth), so the
      heads left adapt before they are scored again. The rounds and their
      runs are kept under ``out_dir + '.rounds'``; a rerun resumes them.
  """
  _check_out(out_dir)
  if rounds < 1 or train_steps < 0:
    raise CompressError(f'rounds={rounds} and train_steps={train_steps}: '
                        'use rounds >= 1 and train_steps >= 0.')
  run, model, params = _load(workdir, step)
  if not run.config.objective.mlm_weight:
    raise CompressError(f'{workdir!r} has no masked-LM loss '
                        '(objective.mlm_weight=0) to score its heads on.')
  for r in range(1, rounds + 1):   # Every round must remove a head.
    _check_fraction(model, fraction * r / rounds)
  original = pruning.attention_parameters(params)
  source_step = run.step
  work = f'{out_dir.rstrip(os.sep)}.rounds'
  history = []
  for r in range(1, rounds + 1):
    last = r == rounds
    target = out_dir if last else os.path.join(work, f'round_{r}')
    if storage.isfile(os.path.join(target, SOURCE_FILE)):   # Done before.
      record = json.loads(storage.read_text(os.path.join(target,
                                                         SOURCE_FILE)))
    else:
      if not last:   # An earlier attempt's unfinished round: ours to redo.
        storage.rmtree(target)
      record = _prune_round(run, model, params, target,
                            fraction * r / rounds, num_batches)
    history.append({k: v for k, v in record.items() if k != 'importance'})
    if last:
      break
    source = target
    if train_steps:
      source = os.path.join(work, f'round_{r}_trained')
      train.train_and_evaluate(_continued_config(target, train_steps),
                               source)
    run, model, params = _load(source, None)
  record['rounds'] = history
  record['attention_parameters'] = [original,
                                    record['attention_parameters'][1]]
  storage.write_text(os.path.join(out_dir, SOURCE_FILE),
                     json.dumps({'workdir': workdir, 'step': source_step,
                                 **record}, indent=2, sort_keys=True))
  return record


def _continued_config(directory: str, steps: int):
  """Pretraining ``steps`` from a directory this module wrote: its run's
  config, warmup a tenth of the steps, checkpoints at the end."""
  cfg = config_lib.from_saved(json.loads(storage.read_text(
      os.path.join(directory, 'config.json'))))
  cfg.total_steps, cfg.num_train_steps = steps, 0
  cfg.optimizer.warmup_steps = steps // 10
  cfg.checkpoint_every_steps = steps
  cfg.eval_every_steps = min(cfg.eval_every_steps, steps)
  cfg.log_every_steps = min(cfg.log_every_steps, steps)
  return cfg


def _prune_round(run, model: bert_lib.BertConfig, params: dict,
                 out_dir: str, fraction: float, num_batches: int) -> dict:
  """One round: score the stored heads and remove the least important
  until ``fraction`` of all are gone; writes ``out_dir``."""
  cfg = run.config
  count = _check_fraction(model, fraction)
  encoder = auxiliary.drop_heads(params)
  batches = held_out_batches(cfg, run.workdir,
                             num_batches or cfg.eval.num_batches)
  loss, apply = importance_fns(cfg, model)
  importance = pruning.head_importance(loss, apply, encoder, batches)
  remove = pruning.least_important(importance, count)
  params, pruned = pruning.remove_heads(params, model, remove)
  record = {
      'method': 'prune_heads', 'fraction': fraction,
      'scored_batches': len(batches),
      'importance': [s.round(6).tolist() for s in importance],
      'pruned_heads': [list(h) for h in pruned.pruned_heads],
      'attention_parameters': [pruning.attention_parameters(encoder),
                               pruning.attention_parameters(params)],
  }
  _write(run, cfg, pruned, params, out_dir, record)
  return record


def keep_layers(workdir: str, out_dir: str, layers=None,
                step: int | None = None, keep: int = 0) -> dict:
  """Writes ``workdir``'s run with only ``layers`` (LayerDrop's pruning
  at inference), or with ``keep`` layers spread evenly (``every_other``);
  returns the record written beside it."""
  _check_out(out_dir)
  run, model, params = _load(workdir, step)
  if layers is None:
    layers = every_other(model.num_layers, keep)
  try:
    params, kept = pruning.keep_layers(params, model, layers)
  except ValueError as e:
    raise CompressError(str(e)) from e
  record = {'method': 'keep_layers', 'layers': list(layers),
            'layerdrop': run.config.model.layerdrop}
  _write(run, run.config, kept, params, out_dir, record)
  return record


def every_other(num_layers: int, keep: int) -> list[int]:
  """``keep`` of ``num_layers`` (N) layers spread evenly, the last one
  always kept: Fan et al.'s "every other" strategy (Sec. 4), which drops
  the layers d = 0 (mod N / (N - keep)) where that ratio is whole."""
  if not 0 < keep <= num_layers:
    raise CompressError(f'keep={keep}: use 1 to {num_layers} layers.')
  step = num_layers / keep
  return sorted({num_layers - 1 - int(math.floor(i * step))
                 for i in range(keep)})

