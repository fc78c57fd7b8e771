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
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import qwix
from safetensors import numpy as st_numpy

from bertjax import config_lib
from bertjax import errors
from bertjax import finetune
from bertjax import pruning
from bertjax import quantization
from bertjax import runs
from bertjax import storage
from bertjax import train
from bertjax.interop import hf_convert
from bertjax.models import bert as bert_lib
from bertjax.models import heads
from bertjax.objectives import auxiliary
from bertjax.objectives import base
from bertjax.objectives import bert as bert_objective
from bertjax.objectives import losses
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

# What a compressed workdir records of how it was made.
SOURCE_FILE = 'compression.json'
_INPUTS = ('input_ids', 'token_type_ids', 'attention_mask')


class CompressError(errors.UserError, ValueError):
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
  params = hf_convert.unscanned(run.params, model.num_layers)
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
  NSP, SBO) loss, deterministic, the gates as a collection; through the
  fake-quantized layers of a run trained with them (``model.quantize``),
  so an 8-bit run's heads are scored on the model it trained."""
  network = quantization.quantized(bert_lib.BertForPreTraining(model))
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


def _check_rounds(model: bert_lib.BertConfig, fraction: float,
                  rounds: int) -> None:
  """Every round of ``fraction`` in ``rounds`` removes a head, and the
  last leaves one per layer: a CompressError before any round runs."""
  total = model.num_layers * model.num_heads
  removed = total - sum(model.layer_heads(i) for i in range(model.num_layers))
  for r in range(1, rounds + 1):
    target = int(round(fraction * r / rounds * total))
    if 0 < fraction < 1 and target <= removed:
      raise CompressError(
          f'fraction={fraction} in rounds={rounds}: round {r} would remove '
          f'no head ({target} of the {total} removed by its end, '
          f'{removed} before it); use fewer rounds or a larger fraction.')
    removed = target
  _check_fraction(model, fraction)


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
  if model.mobilebert_layers:
    raise CompressError(f"{workdir!r} has MobileBERT's layers (bottlenecks "
                        'or stacked feed-forward networks); head pruning is '
                        "built for BERT's layers only.")
  _check_rounds(model, fraction, rounds)
  original = pruning.attention_parameters(params)
  source_step = run.step
  # What a finished round was made from: a rerun reuses only its own.
  request = {'workdir': storage.absolute(workdir), 'step': source_step,
             'fraction': fraction, 'rounds': rounds,
             'num_batches': num_batches, 'train_steps': train_steps}
  work = f'{out_dir.rstrip(os.sep)}.rounds'
  history = []
  for r in range(1, rounds + 1):
    last = r == rounds
    target = out_dir if last else os.path.join(work, f'round_{r}')
    if storage.isfile(os.path.join(target, SOURCE_FILE)):   # Done before.
      record = json.loads(storage.read_text(os.path.join(target,
                                                         SOURCE_FILE)))
      if record.get('request') != request:
        raise CompressError(
            f'{target!r} is a round of another request '
            f"({record.get('request')}), not of this one ({request}): rerun "
            f'with its arguments, or remove {work!r} to start again.')
    else:
      if not last:   # An earlier attempt's unfinished round: ours to redo
        storage.rmtree(target)   # (and the run trained from it, if any).
        storage.rmtree(os.path.join(work, f'round_{r}_trained'))
      record = _prune_round(run, model, params, target,
                            fraction * r / rounds, num_batches,
                            request)
    history.append({k: v for k, v in record.items() if k != 'importance'})
    if last:
      break
    source = target
    if train_steps:
      source = os.path.join(work, f'round_{r}_trained')
      train.train_unless_finished(_continued_config(target, train_steps),
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
                 out_dir: str, fraction: float, num_batches: int,
                 request: dict) -> dict:
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
      'request': request,
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
  return sorted({num_layers - 1 - i * num_layers // keep
                 for i in range(keep)})


# ---------------------------------------------------------------------------
# The int8 export: the kernels and tables as int8 with their scales.

INT8_WEIGHTS = 'int8.safetensors'
INT8_CONFIG = 'int8_config.json'
_DTYPES = ('dtype', 'param_dtype')


def _flat(tree) -> dict[str, np.ndarray]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path, simple=True, separator='/'):
          np.asarray(leaf) for path, leaf in leaves}


def _serialized(params) -> bytes:
  """``params`` (float, or ``quantization.int8_params``) as the bytes of
  a safetensors file: what they take on disk."""
  return st_numpy.save(_flat(params))


def float32_bytes(params) -> int:
  """The bytes of ``params`` as a float32 safetensors file."""
  return len(_serialized(jax.tree.map(
      lambda x: np.asarray(x, np.float32), params)))


def _model_json(model) -> dict:
  cfg = {f.name: getattr(model.cfg, f.name)
         for f in dataclasses.fields(model.cfg)}
  for name in _DTYPES:
    cfg[name] = jnp.dtype(cfg[name]).name
  return {'model': cfg, 'kind': model.kind, 'num_labels': model.num_labels,
          'layer_mix': model.layer_mix, 'pooling': model.pooling,
          'qwix': qwix.__version__}


def _model_from_json(meta: dict):
  cfg = dict(meta['model'])
  for name in _DTYPES:
    cfg[name] = jnp.dtype(cfg[name])
  cfg['pruned_heads'] = tuple(tuple(layer) for layer in cfg['pruned_heads'])
  return heads.DownstreamModel(
      bert_lib.BertConfig(**cfg), meta['kind'], meta['num_labels'],
      layer_mix=meta['layer_mix'], pooling=meta['pooling'])


def _abstract_int8(model, seq_length: int):
  ids = jnp.zeros((1, seq_length), jnp.int32)
  inputs = (ids, ids, ids + 1)
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), *inputs)
  return jax.eval_shape(lambda p: quantization.int8_params(model, p, *inputs),
                        nn.unbox(boxed['params']))


def save_int8(directory: str, model, params) -> None:
  """``quantization.int8_params`` of ``model`` (a ``DownstreamModel``)
  into ``directory`` (which exists): ``INT8_WEIGHTS`` and ``INT8_CONFIG``,
  which ``load_int8`` reads back."""
  storage.write_bytes(os.path.join(directory, INT8_WEIGHTS),
                      _serialized(params))
  storage.write_text(os.path.join(directory, INT8_CONFIG),
                     json.dumps(_model_json(model), indent=2, sort_keys=True))


def load_int8(directory: str):
  """(``quantization.int8_model``, its int8 parameters) from ``save_int8``'s
  ``directory``: ``model.apply({'params': params}, input_ids,
  token_type_ids, attention_mask)`` gives the logits.

  Raises:
    ValueError: the files do not hold that model's int8 parameters.
  """
  meta = json.loads(storage.read_text(os.path.join(directory, INT8_CONFIG)))
  model = _model_from_json(meta)
  abstract = _abstract_int8(model, 8)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  keys = [jax.tree_util.keystr(p, simple=True, separator='/')
          for p, _ in leaves]
  tensors = st_numpy.load(storage.read_bytes(
      os.path.join(directory, INT8_WEIGHTS)))
  missing, unexpected = set(keys) - set(tensors), set(tensors) - set(keys)
  wrong = [k for (_, leaf), k in zip(leaves, keys) if k in tensors and (
      tensors[k].shape != leaf.shape or tensors[k].dtype != leaf.dtype)]
  if missing or unexpected or wrong:
    raise ValueError(
        f'{directory!r} does not hold the int8 parameters of its '
        f'{INT8_CONFIG}: missing {sorted(missing)}, unexpected '
        f'{sorted(unexpected)}, of another shape or type {wrong}; write it '
        'again with experiments/compress.py int8.')
  params = jax.tree_util.tree_unflatten(
      treedef, [jnp.asarray(tensors[k]) for k in keys])
  return quantization.int8_model(model), params


def _logits(model, params, data: dict, batch_size: int) -> np.ndarray:
  """``model``'s logits on every row of ``data`` (its inputs)."""
  apply = jax.jit(lambda p, *inputs: model.apply({'params': p}, *inputs))
  n = len(data['input_ids'])
  return np.concatenate([np.asarray(apply(params, *(
      jnp.asarray(data[k][start:start + batch_size]) for k in _INPUTS)))
                         for start in range(0, n, batch_size)])


def int8(workdir: str, out_dir: str) -> dict:
  """Q8BERT's int8 model of ``workdir`` (a fine-tuning run trained with
  ``model.quantize=int8``), written to ``out_dir`` (new) with its
  tokenizer; ``load_int8(out_dir)`` reads it back. Returns (and writes to
  ``SOURCE_FILE``) what it measured on the task's held-out set: the
  largest difference between the int8 path's logits and the training
  forward's, both models' metrics, the int8 model's predictions
  (``eval_predictions``, ``eval_labels``), and the bytes of the float32
  and the int8 parameters as safetensors files."""
  _check_out(out_dir)
  try:
    run = finetune.read_run(workdir)
  except finetune.FinetuneError as e:
    raise CompressError(str(e)) from e
  if run.model.cfg.quantize == 'none':
    raise CompressError(
        f'{workdir!r} was fine-tuned in float: fine-tune with '
        "--config.model.quantize=int8 (Q8BERT's quantization-aware "
        'training) and convert that run.')
  if run.task.kind not in ('classification', 'regression'):
    raise CompressError(f'{workdir!r} is a {run.task.kind} task; the int8 '
                        'export covers classification and regression.')
  data = finetune.encode_task(run.config, run.pretrained.tokenizer).eval
  first = tuple(jnp.asarray(data[k][:1]) for k in _INPUTS)
  params8 = quantization.int8_params(run.model, run.params, *first)
  batch = run.config.batch_size
  trained = _logits(run.model, run.params, data, batch)
  served = _logits(quantization.int8_model(run.model), params8, data, batch)
  record = {
      'workdir': workdir, 'step': run.step, 'method': 'int8',
      'max_abs_logit_difference': float(np.abs(trained - served).max()),
      'fake_quantized_metrics': finetune.evaluate_task(
          run.task, trained, data, run.config),
      'int8_metrics': finetune.evaluate_task(run.task, served, data,
                                             run.config),
      'float32_bytes': float32_bytes(run.params),
      'int8_bytes': len(_serialized(params8)),
  }
  record['int8_fraction_of_float32'] = (record['int8_bytes']
                                        / record['float32_bytes'])
  # The int8 model's held-out predictions, for intervals over examples.
  record.update(finetune.per_example_predictions(run.task.kind, served,
                                                 data['label']))
  storage.makedirs(out_dir)
  save_int8(out_dir, run.model, params8)
  run.pretrained.tokenizer.save(os.path.join(out_dir, 'tokenizer.model'))
  storage.write_text(os.path.join(out_dir, SOURCE_FILE),
                     json.dumps(record, indent=2, sort_keys=True))
  return record
