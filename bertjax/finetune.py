r"""Fine-tuning: a pretrained encoder on a downstream task, top to bottom.

  python experiments/finetune.py --config=experiments/configs/finetune.py \
      --config.init=runs/demo --workdir=runs/demo-finetuned

``finetune(cfg, workdir)`` reads a pretrained run (any bertjax objective,
or an import of a transformers checkpoint), puts a task head on its encoder
(``bertjax.models.heads``) and trains on the task with the run's tokenizer,
on the same mesh, optimizer and checkpoint code as pretraining. Training
modes (``MODES``):

- ``full``: every weight trains (Devlin et al., 2019, Sec. 4).
- ``frozen``: the encoder is fixed, only the head trains (feature-based);
  no gradient is computed for the encoder and its weights stay bitwise.
  It runs without dropout (the features BERT's extract_features.py
  reads); the head keeps its dropout.
- ``adapters``: Houlsby et al. (2019)'s bottleneck adapters after each
  layer's attention and FFN; only adapters and head train
  (``adapter_layer_norms`` also trains the LayerNorms, as the paper does).
- ``weighted_layers``: the encoder is fixed (no dropout, as ``frozen``)
  and the head reads a learned weighted sum of every layer's output
  (ELMo's scalar mix; BERT Sec. 5.3).
- ``gradual_unfreeze``: the head trains first; every
  ``unfreeze_every_steps`` the next layer down joins (Howard & Ruder, 2018,
  ULMFiT Sec. 3.2), the embeddings last.

Writes to ``workdir``: checkpoints (a rerun resumes), ``metrics.jsonl``
with the held-out task metrics, and ``downstream.json``: the final metrics
(the first of the task's metrics is its headline), for the compare tool.

Every random draw (head init, random weights, dropout, batch order)
derives from ``cfg.seed``; batches are a function of (seed, step).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax.runtime import checkpoint as checkpoint_lib
from bertjax import config_lib
from bertjax import errors as errors_lib
from bertjax.interop import hf_convert
from bertjax.runtime import metric_writers
from bertjax import objectives
from bertjax import optim
from bertjax import quantization
from bertjax import runs
from bertjax import sharding
from bertjax import storage
from bertjax import train as train_lib
from bertjax.models import config as model_config
from bertjax.models import heads
from data_pipelines import downstream
from data_pipelines import tokenizer as tokenizer_lib

MODES = ('full', 'frozen', 'adapters', 'weighted_layers', 'gradual_unfreeze')
# The modes whose encoder is fixed: it runs without dropout (features).
FIXED_ENCODER = ('frozen', 'weighted_layers')
LOSS_REDUCTIONS = ('mean', 'sum')
INIT_WEIGHTS = ('pretrained', 'random')
RESULT = 'downstream.json'
# A multi-task run's workdir (bertjax/multitask.py) holds this file: its
# encoder fine-tunes like a pretrained run's (``load_pretrained``).
MULTITASK_META = 'multitask_meta.json'
_say = train_lib.say  # Process 0 prints.
_META = 'finetune_meta.json'
# Keys split once from the seed: head (and random encoder) init, dropout,
# the batch order, the dev split.
INIT_KEY, DROPOUT_KEY, _ORDER_KEY, _DEV_KEY = 1, 2, 3, 4
# Kinds whose per-example held-out predictions downstream.json keeps (for
# intervals over examples): one prediction per example.
PER_EXAMPLE = ('classification', 'regression')
# The config sections a resumed fine-tuning run must share.
_IDENTITY = ('seed', 'init', 'init_step', 'init_weights', 'task', 'mode',
             'pooling', 'head_init', 'adapter_size', 'adapter_layer_norms',
             'max_seq_length', 'doc_stride', 'max_query_length',
             'batch_size', 'num_epochs', 'optimizer', 'unfreeze_every_steps',
             'model', 'loss_reduction')
# Batch features each kind trains on, besides the inputs.
_INPUTS = ('input_ids', 'token_type_ids', 'attention_mask')
_LABELS = {'classification': ('label',), 'regression': ('label',),
           'token': ('labels',), 'span': ('start_positions', 'end_positions')}


class FinetuneError(errors_lib.UserError, ValueError):
  """A config or source that fine-tuning cannot use; the message says why."""


def base_config() -> ml_collections.ConfigDict:
  """Every field, with the BERT paper's fine-tuning settings (Appendix A.3:
  batch 32, 3 epochs, 10% warmup, Adam with weight decay 0.01; learning
  rate from {5e-5, 3e-5, 2e-5})."""
  # Long: one line per field, each with what it means; reads as a list.
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.init = ''                     # Pretrained workdir (a run, or an import).
  c.init_step = 0                 # Its checkpoint; 0 = the latest.
  c.init_weights = 'pretrained'   # pretrained | random: the run's
                                  # architecture and tokenizer, random weights
                                  # (the from-scratch baseline).
  c.task = ml_collections.ConfigDict()
  c.task.name = 'embedded'        # embedded | embedded_top4 | files | a TFDS
                                  # name (glue/sst2, squad, conll2003, ...:
                                  # downstream.load_tfds)
  c.task.kind = ''                # files: classification | regression |
                                  # token | span.
  c.task.train_path = ''          # files: .jsonl or .csv.
  c.task.eval_path = ''
  c.task.text_field = 'text'
  c.task.pair_field = ''          # '' = single sentence.
  c.task.label_field = 'label'
  c.task.words_field = 'words'
  c.task.labels_field = 'labels'
  c.task.label_names = ()         # () = the sorted labels of the train file.
  c.task.examples_per_class = 0   # embedded: keep N training examples per
                                  # class (0 = all).
  c.task.tfds_data_dir = ''
  c.task.double_unordered = False  # Train on each sentence pair in both
                                  # orders (ELECTRA's MRPC and STS-B:
                                  # classification_tasks.py); not the eval
                                  # or dev sets.
  c.task.regression_normalize = ()  # (min, max): regression labels become
                                  # (label - min) / max, train and eval
                                  # (ELECTRA's STS-B: (0, 5)); () = as given.
  c.task.dev_fraction = 0.0       # Carve this fraction of the training
                                  # examples (drawn from the seed) into a dev
                                  # set, scored at the end (dev_metrics): for
                                  # choosing settings without the eval set.
  c.max_seq_length = 128
  c.doc_stride = 128              # span: tokens between the starts of a long
                                  # context's windows (less than a window's
                                  # context, so that windows overlap).
  c.max_query_length = 64
  c.max_answer_length = 30
  c.mode = 'full'                 # MODES
  c.pooling = 'cls'               # cls | mean | first: what sentence-level
                                  # heads read (mean: the real tokens'
                                  # average; first: the [CLS] state with no
                                  # pooler, ELECTRA's).
  c.head_init = 'bert'            # bert | glorot: the output layer's
                                  # initial kernel (run_classifier.py's
                                  # truncated normal | ELECTRA's Glorot).
  c.adapter_size = 64             # Houlsby et al.: 8, 64 or 256.
  c.adapter_layer_norms = False   # adapters: also train the LayerNorms.
  c.unfreeze_every_steps = 0      # gradual_unfreeze; 0 = one epoch.
  c.batch_size = 32
  c.num_epochs = 3.0
  c.loss_reduction = 'mean'       # mean | sum over a batch's examples
                                  # (sum: ELECTRA's reduce_sum; sentence-
                                  # level tasks only).
  c.model = ml_collections.ConfigDict()
  c.model.hidden_dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.dtype = ''              # '' = the pretrained run's.
  c.model.quantize = ''           # none | int8 (Q8BERT's quantization-
                                  # aware fine-tuning) | '' = the
                                  # pretrained run's.
  c.model.quantize_layers = ''    # A regular expression over module
                                  # paths; '' = the pretrained run's.
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = 'bert_adamw'
  c.optimizer.schedule = 'bert_linear'
  c.optimizer.learning_rate = 2e-5
  c.optimizer.warmup_proportion = 0.1
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.decay_mask = 'bert'   # bertjax/optim.py DECAY_MASKS.
  c.optimizer.grad_clip_norm = 1.0
  c.optimizer.grad_clip = 'global'  # | per_tensor (optim.GRAD_CLIPS).
  c.optimizer.layerwise_lr_decay = 0.0  # ELECTRA's: in (0, 1], each layer
                                  # down from the head takes this factor
                                  # more (layer_lr_scale); 0 = off.
  c.sharding = ml_collections.ConfigDict()
  c.sharding.mesh_shape = (-1, 1, 1)
  c.sharding.replicas = 1
  c.sharding.rules = config_lib.DEFAULT_RULES
  c.log_every_steps = 50
  c.eval_every_steps = 0          # 0 = at the end only.
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 1
  return c


def window_problems(cfg, kind: str) -> list[str]:
  """What is wrong with a span task's windows (``doc_stride``,
  ``max_seq_length``, ``max_query_length``); [] for other kinds."""
  context = cfg.max_seq_length - cfg.max_query_length - 3
  if kind != 'span' or 0 < cfg.doc_stride < context:
    return []
  return [f'doc_stride={cfg.doc_stride} with max_seq_length='
          f'{cfg.max_seq_length} and max_query_length='
          f'{cfg.max_query_length}: a window may hold as few as {context} '
          'context tokens (under a question of max_query_length), and '
          'windows that do not overlap lose every answer across their '
          'boundary. Use a doc_stride below that (run_squad.py: '
          'max_seq_length=384, doc_stride=128, max_query_length=64).']


def _optimizer_problems(cfg) -> list[str]:
  """What is wrong with ``cfg.optimizer`` (and its pairing with
  ``cfg.mode``); [] if nothing."""
  o = cfg.optimizer
  checks = [
      (0 <= o.warmup_proportion < 1,
       f'optimizer.warmup_proportion={o.warmup_proportion} must be in '
       '[0, 1).'),
      (o.learning_rate > 0,
       f'optimizer.learning_rate={o.learning_rate} must be > 0.'),
      (o.get('schedule', 'bert_linear') in optim.SCHEDULES,
       f'optimizer.schedule={o.get("schedule")!r}; use one of '
       f'{optim.SCHEDULES}.'),
      (o.get('schedule') != 'constant' or not o.warmup_proportion,
       f'optimizer.warmup_proportion={o.warmup_proportion} with '
       "optimizer.schedule='constant': a constant rate has no warmup; set "
       'warmup_proportion=0.'),
      *((o[field] in allowed,
         f'optimizer.{field}={o[field]!r}; use one of {allowed}.')
        for field, allowed in (('name', optim.OPTIMIZERS),
                               ('decay_mask', optim.DECAY_MASKS),
                               ('grad_clip', optim.GRAD_CLIPS))),
      (cfg.mode != 'gradual_unfreeze' or o.name == 'bert_adamw',
       f'mode=gradual_unfreeze with optimizer.name={o.name!r}: the step '
       'count its bias correction reads is shared, so a layer unfrozen '
       'late would start its fresh moments with a late step\'s correction '
       '(up to twice a fresh Adam\'s update). Use bert_adamw (no bias '
       'correction), or mode=full.'),
      (0 <= o.layerwise_lr_decay <= 1,
       f'optimizer.layerwise_lr_decay={o.layerwise_lr_decay} must be in '
       '[0, 1]: 0 is off, ELECTRA takes 0.8 (0.9 for large).'),
  ]
  return [message for ok, message in checks if not ok]


def validate(cfg, check_init: bool = True) -> None:
  """Every check that reads no data, with the field and allowed values
  (``check_init=False``: all but ``init``, for a run not trained yet)."""
  errors = []

  def check(ok: bool, message: str) -> None:
    if not ok:
      errors.append(message)

  check(bool(cfg.init) or not check_init,
        'init is empty: give the pretrained workdir (a training run, or '
        'experiments/import_hf.py\'s output); its tokenizer and '
        'architecture are used even with init_weights=random.')
  check(cfg.mode in MODES, f'mode={cfg.mode!r}; use one of {MODES}.')
  check(cfg.pooling in heads.POOLING,
        f'pooling={cfg.pooling!r}; use one of {heads.POOLING}.')
  check(cfg.head_init in heads.HEAD_INITS,
        f'head_init={cfg.head_init!r}; use one of {heads.HEAD_INITS}.')
  check(cfg.init_weights in INIT_WEIGHTS,
        f'init_weights={cfg.init_weights!r}; use one of {INIT_WEIGHTS}.')
  check(cfg.adapter_size > 0 or cfg.mode != 'adapters',
        f'adapter_size={cfg.adapter_size}; adapters need a width > 0.')
  check(cfg.batch_size > 0, f'batch_size={cfg.batch_size} must be > 0.')
  check(cfg.num_epochs > 0, f'num_epochs={cfg.num_epochs} must be > 0.')
  check(cfg.log_every_steps > 0 and cfg.checkpoint_every_steps > 0,
        f'log_every_steps={cfg.log_every_steps} and checkpoint_every_steps='
        f'{cfg.checkpoint_every_steps} must be > 0.')
  check(cfg.max_seq_length >= 8,
        f'max_seq_length={cfg.max_seq_length} must be >= 8.')
  check(cfg.unfreeze_every_steps >= 0,
        f'unfreeze_every_steps={cfg.unfreeze_every_steps} must be >= 0.')
  check(0 <= cfg.task.dev_fraction < 1,
        f'task.dev_fraction={cfg.task.dev_fraction} must be in [0, 1).')
  errors.extend(_optimizer_problems(cfg))
  check(cfg.model.dtype in ('', 'float32', 'bfloat16'),
        f'model.dtype={cfg.model.dtype!r}; use float32, bfloat16 or \'\' '
        '(the pretrained run\'s).')
  if cfg.model.quantize or cfg.model.quantize_layers:
    model_config.check_quantize(cfg.model.quantize or 'int8',
                                cfg.model.quantize_layers or '.*', errors)
  for name in ('hidden_dropout_rate', 'attention_dropout_rate'):
    rate = cfg.model[name]
    check(0 <= rate < 1, f'model.{name}={rate} must be in [0, 1).')
  check(cfg.task.name != 'files' or cfg.task.kind in heads.KINDS,
        f'task.kind={cfg.task.kind!r}; task.name=files needs one of '
        f'{heads.KINDS}.')
  kind = (cfg.task.kind if cfg.task.name == 'files'
          else downstream.tfds_kind(cfg.task.name))
  errors.extend(task_problems(cfg.task, kind, cfg.loss_reduction, 'task'))
  errors.extend(window_problems(cfg, kind))
  if check_init and cfg.init and not (
      storage.isdir(cfg.init) and checkpoint_lib.latest_step(
          os.path.join(cfg.init, 'checkpoints')) is not None):
    errors.append(f'init={cfg.init!r} holds no checkpoint: give the '
                  '--workdir of a pretraining run (or an import).')
  if errors:
    raise FinetuneError('fine-tuning config: ' + ' '.join(errors))


def task_problems(t, kind: str, loss_reduction: str, where: str
                  ) -> list[str]:
  """What is wrong with task section ``t`` (at ``where``) of ``kind`` ('':
  not known before it loads) under ``loss_reduction``."""
  problems = []
  pairs_only = ('token', 'span')
  if t.double_unordered and kind in pairs_only:
    problems.append(f'{where}.double_unordered with a {kind} task: it swaps '
                    'the texts of sentence pairs (classification or '
                    'regression); set it to False.')
  scale = tuple(t.regression_normalize)
  if scale and (len(scale) != 2 or scale[1] <= 0 or kind not in (
      'regression', '')):
    problems.append(f'{where}.regression_normalize={scale}: give (min, max) '
                    'with max > 0, for a regression task (ELECTRA\'s STS-B: '
                    '(0, 5)), or ().')
  if loss_reduction not in LOSS_REDUCTIONS:
    problems.append(f'loss_reduction={loss_reduction!r}; use one of '
                    f'{LOSS_REDUCTIONS}.')
  elif loss_reduction == 'sum' and kind in pairs_only:
    problems.append(f"loss_reduction='sum' with a {kind} task ({where}): "
                    'the sum over examples is for sentence-level tasks '
                    "(ELECTRA's classification and regression); use "
                    "'mean'.")
  return problems


# ---------------------------------------------------------------------------
# The pretrained encoder.


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """A run's encoder: its config, its parameters laid out as
  ``heads.DownstreamModel``'s (``embeddings``, ``layer_{g}``, and
  ``pooler`` where the run has one), and its tokenizer."""
  workdir: str
  step: int
  objective: str
  model: Any                  # bert.BertConfig
  params: dict                # Nested numpy arrays.
  tokenizer: tokenizer_lib.Tokenizer


def _encoder_params(params: dict, cfg, model_cfg) -> dict:
  """A run's parameters (any objective) as a BERT encoder's: the part its
  objective fine-tunes (a distilled student, ELECTRA's discriminator over
  the shared tables), layers unstacked, heads other than the pooler left
  out."""
  params = objectives.get(cfg.objective.name).encoder_params(params)
  params = hf_convert.unscanned(params, model_cfg.num_layers)
  keep = ('embeddings', 'pooler')
  return {k: v for k, v in params.items()
          if k in keep or k.startswith('layer_')}


def load_pretrained(workdir: str, step: int = 0) -> Pretrained:
  """The encoder of ``workdir``'s checkpoint at ``step`` (0: the latest):
  a pretraining run's, an import's, or a multi-task run's
  (``_load_multitask``).

  An encoder with ERNIE 2.0's task embedding (``model.task_type_vocab_size``
  > 0) keeps its table, and downstream inputs carry no task id: every token
  takes task 0, the table's first row (``bert.Embeddings`` with no
  ``task_type_ids``), as transformers' ``ErnieModel`` does without them.
  """
  if storage.isfile(os.path.join(workdir, MULTITASK_META)):
    return _load_multitask(workdir, step)
  try:
    run = runs.load_run(workdir, step or None)
    model_cfg = hf_convert.encoder_config(run.config, run.vocab_size)
  except (ValueError, hf_convert.ConversionError) as e:
    raise FinetuneError(f'init={workdir!r}: {e}') from e
  params = jax.tree.map(np.asarray, _encoder_params(run.params, run.config,
                                                    model_cfg))
  return Pretrained(workdir, run.step, run.config.objective.name,
                    dataclasses.replace(
                        model_cfg, scan_layers=False, sbo_positions=0,
                        quantize_layers=quantization.unscanned_layers(
                            model_cfg.quantize_layers)),
                    params, tokenizer_lib.Tokenizer.load(run.tokenizer_path))


def _load_multitask(workdir: str, step: int) -> Pretrained:
  """A multi-task run's (bertjax/multitask.py) shared encoder and pooler at
  ``step`` (0: the latest), with the architecture, tokenizer and objective
  of the pretrained run it started from (which must still be readable);
  its task heads are left out, as a pretraining run's are."""
  meta = json.loads(storage.read_text(os.path.join(workdir, MULTITASK_META)))
  base = load_pretrained(meta['pretrained']['workdir'],
                         meta['pretrained']['step'])
  directory = storage.absolute(os.path.join(workdir, 'checkpoints'))
  chosen, available = checkpoint_lib.choose_step(directory, step or None)
  if chosen is None:
    raise FinetuneError(f'init={workdir!r} (a multi-task run) has no '
                        f'checkpoint at step {step}; it has steps '
                        f'{available}.')
  step = chosen
  params = checkpoint_lib.restore_as_saved(directory, step)['params']
  encoder = {k: jax.tree.map(np.asarray, v) for k, v in params.items()
             if k in ('embeddings', 'pooler') or k.startswith('layer_')}
  return dataclasses.replace(base, workdir=workdir, step=step,
                             params=encoder)


@dataclasses.dataclass(frozen=True)
class Finetuned:
  """A fine-tuning run, read back: what task distillation's teacher and
  the int8 export (bertjax/compress.py) start from."""
  workdir: str
  config: Any                 # Its fine-tuning config.
  pretrained: Pretrained      # What it was fine-tuned from.
  task: downstream.Task
  model: heads.DownstreamModel   # Quantized where the run trained so.
  params: dict                # Host arrays, at ``step``.
  step: int


def read_run(workdir: str) -> Finetuned:
  """The fine-tuning run in ``workdir`` at its latest checkpoint.

  Raises:
    FinetuneError: it is no fine-tuning run, or has no checkpoint.
  """
  try:
    meta = json.loads(storage.read_text(os.path.join(workdir, _META)))
  except FileNotFoundError as e:
    raise FinetuneError(f'{workdir!r} is not a fine-tuning run\'s workdir '
                        f'(it has no {_META}): fine-tune on the task first '
                        '(experiments/finetune.py).') from e
  cfg = _with_defaults(ml_collections.ConfigDict(meta['config']),
                       base_config())
  pretrained = load_pretrained(cfg.init, cfg.init_step)
  directory = os.path.join(workdir, 'checkpoints')
  step, _ = checkpoint_lib.choose_step(directory)
  if step is None:
    raise FinetuneError(f'{workdir!r} has no checkpoint.')
  params = jax.tree.map(np.asarray, checkpoint_lib.restore_as_saved(
      directory, step)['params'])
  task, _ = load_task(cfg)
  model = downstream_model(cfg, downstream_config(cfg, pretrained), task)
  return Finetuned(workdir, cfg, pretrained, task, model, params, step)


def _with_defaults(saved, defaults):
  """``saved`` (a run's config) with the fields added since at their
  defaults."""
  for key, value in defaults.items():
    if key not in saved:
      saved[key] = value
    elif isinstance(value, ml_collections.ConfigDict):
      _with_defaults(saved[key], value)
  return saved


def downstream_config(cfg, pretrained: Pretrained):
  """The encoder's config for fine-tuning with ``cfg``."""
  m = cfg.model
  model = pretrained.model
  if m.quantize_layers and (m.quantize or model.quantize) == 'none':
    raise FinetuneError(
        f'model.quantize_layers={m.quantize_layers!r}, but the model is '
        f'float (init={cfg.init!r} trained with model.quantize=none): set '
        "--config.model.quantize=int8 to quantize those layers.")
  return dataclasses.replace(
      model, hidden_dropout_rate=m.hidden_dropout_rate,
      attention_dropout_rate=m.attention_dropout_rate,
      dtype=jnp.dtype(m.dtype) if m.dtype else model.dtype,
      adapter_size=cfg.adapter_size if cfg.mode == 'adapters' else 0,
      layerdrop=0.0,   # Pretraining's; fine-tuning trains every layer.
      quantize=m.quantize or model.quantize,
      quantize_layers=m.quantize_layers or model.quantize_layers)


def downstream_model(cfg, model_cfg, task: downstream.Task
                     ) -> heads.DownstreamModel:
  """``task``'s model for fine-tuning with ``cfg`` (quantized where
  ``model_cfg`` says: ``check_quantized_layers``)."""
  model = heads.DownstreamModel(
      model_cfg, task.kind, task.num_labels,
      layer_mix=cfg.mode == 'weighted_layers', pooling=cfg.pooling,
      head_init=cfg.head_init, fixed_encoder=cfg.mode in FIXED_ENCODER)
  check_quantized_layers(model)
  return quantization.quantized(model)


def check_quantized_layers(model: heads.DownstreamModel) -> None:
  """Raises FinetuneError where ``model`` is quantized and its
  ``quantize_layers`` covers none of its layers (from its shapes alone)."""
  if model.cfg.quantize == 'none':
    return
  ids = jnp.zeros((1, 4), jnp.int32)
  problem = quantization.uncovered(
      model.cfg.quantize_layers,
      quantization.model_weight_paths(model, ids, ids, ids + 1))
  if problem:
    raise FinetuneError(problem)


# ---------------------------------------------------------------------------
# Which parameters train.


def is_trainable(path: tuple[str, ...], cfg) -> bool:
  """Whether the parameter at ``path`` (keys) trains in ``cfg.mode``
  (gradual unfreezing: ever)."""
  if cfg.mode in ('full', 'gradual_unfreeze') or path[0] in heads.HEAD:
    return True
  if cfg.mode == 'adapters':
    return any(k.endswith('_adapter') for k in path) or (
        cfg.adapter_layer_norms and any(k.endswith(('_norm', 'layer_norm'))
                                        for k in path))
  return False


def split(params: dict, cfg) -> tuple[dict, dict]:
  """(trainable, frozen): two nested dicts that ``merge`` puts back."""
  flat = flax.traverse_util.flatten_dict(params)
  trainable = {k: v for k, v in flat.items() if is_trainable(k, cfg)}
  frozen = {k: v for k, v in flat.items() if k not in trainable}
  return (flax.traverse_util.unflatten_dict(trainable),
          flax.traverse_util.unflatten_dict(frozen))


def merge(trainable: dict, frozen: dict) -> dict:
  flat = flax.traverse_util.flatten_dict(frozen)
  flat.update(flax.traverse_util.flatten_dict(trainable))
  return flax.traverse_util.unflatten_dict(flat)


def unfreeze_depth(path: tuple[str, ...], model_cfg) -> int:
  """Gradual unfreezing's order: the head is ``num_layers + 1``, layer i
  (1-based) is i (a shared group: its top-most layer), the embeddings 0."""
  top = model_cfg.num_layers + 1
  if path[0] == 'embeddings':
    return 0
  if re.fullmatch(r'layer_\d+', path[0]):   # Not layer_mix: a head.
    group = int(path[0].split('_')[1])
    return 1 + max(i for i in range(model_cfg.num_layers)
                   if model_cfg.layer_group(i) == group)
  return top


def unfreeze_gate(tree: dict, step, model_cfg, unfreeze_every: int) -> dict:
  """``tree`` (gradients or updates, laid out as the parameters) zeroed
  where gradual unfreezing has not reached at ``step`` (a traced int): one
  more layer down every ``unfreeze_every`` steps."""
  top = model_cfg.num_layers + 1

  def unfrozen(path):
    """1.0 where gradual unfreezing has reached ``path`` at ``step``."""
    depth = unfreeze_depth(path, model_cfg)
    return (depth >= top - step // unfreeze_every).astype(jnp.float32)

  return flax.traverse_util.unflatten_dict({
      k: v * unfrozen(k).astype(v.dtype)
      for k, v in flax.traverse_util.flatten_dict(tree).items()})


def parameter_counts(params, cfg) -> tuple[int, int]:
  """(trainable in ``cfg.mode``, all): numbers of parameters (``params``
  abstract or real)."""
  sizes = {k: int(np.prod(v.shape)) for k, v in
           flax.traverse_util.flatten_dict(params).items()}
  return (sum(n for k, n in sizes.items() if is_trainable(k, cfg)),
          sum(sizes.values()))


# ---------------------------------------------------------------------------
# Data: the task, encoded once, batched as a function of (seed, step).


def load_task(cfg) -> tuple[downstream.Task, downstream.Task | None]:
  """(task, dev): the task with its training examples less the dev split,
  and the dev split as a task whose eval set it is (None without one)."""
  task = _read_task(cfg)
  dev = None
  if cfg.task.dev_fraction:
    train, dev_examples = dev_split(task.train, cfg.task.dev_fraction,
                                    cfg.seed)
    task = dataclasses.replace(task, train=train)
    dev = dataclasses.replace(task, eval=dev_examples)
  if cfg.task.double_unordered:
    task = dataclasses.replace(task, train=both_orders(task.train))
  scale = tuple(cfg.task.regression_normalize)
  if scale:
    if task.kind != 'regression':
      raise FinetuneError(f'task.regression_normalize={scale} with a '
                          f'{task.kind} task; set it for regression only.')
    task, dev = (None if t is None else dataclasses.replace(
        t, train=normalized(t.train, scale), eval=normalized(t.eval, scale))
                 for t in (task, dev))
  return task, dev


def normalized(examples: list, scale: tuple[float, float]) -> list:
  """Regression ``examples`` with labels ``(label - min) / max``:
  ELECTRA's ``RegressionTask._add_features`` (STS-B: (0, 5))."""
  low, high = scale
  return [dict(e, label=(e['label'] - low) / high) for e in examples]


def both_orders(examples: list) -> list:
  """``examples`` (sentence pairs), then each again with its two texts
  swapped: ELECTRA's ``double_unordered`` (its MRPC and STS-B ``_create_
  examples`` append the swapped training pairs after the originals)."""
  for i, e in enumerate(examples):
    if not e.get('text_pair'):
      raise FinetuneError(
          f'task.double_unordered: training example {i} has no second '
          'text; it swaps the texts of sentence pairs (MRPC, STS-B), so '
          'set it only for a pair task.')
  return list(examples) + [dict(e, text=e['text_pair'], text_pair=e['text'])
                           for e in examples]


def dev_split(examples: list, fraction: float, seed: int
              ) -> tuple[list, list]:
  """(train, dev): ``round(fraction * n)`` examples drawn from ``seed``
  (at least one) are dev, the rest train; both keep their order."""
  num_dev = max(1, round(fraction * len(examples)))
  if num_dev >= len(examples):
    raise FinetuneError(f'task.dev_fraction={fraction} leaves no training '
                        f'examples of {len(examples)}; lower it.')
  chosen = np.random.default_rng([seed, _DEV_KEY]).permutation(
      len(examples))[:num_dev]
  is_dev = np.zeros(len(examples), bool)
  is_dev[chosen] = True
  return ([e for e, d in zip(examples, is_dev) if not d],
          [e for e, d in zip(examples, is_dev) if d])


def _read_task(cfg) -> downstream.Task:
  t = cfg.task
  if t.name == downstream.EMBEDDED_NAME:
    return downstream.embedded_task(t.examples_per_class, cfg.seed)
  if t.name == downstream.EMBEDDED_TOP4_NAME:
    return downstream.embedded_top4_task(t.examples_per_class, cfg.seed)
  if t.name == 'files':
    return downstream.load_files(
        t.kind, t.train_path, t.eval_path, text_field=t.text_field,
        pair_field=t.pair_field, label_field=t.label_field,
        words_field=t.words_field, labels_field=t.labels_field,
        label_names=tuple(t.label_names))
  return downstream.load_tfds(t.name, t.tfds_data_dir or None)


def encode_examples(cfg, task, examples, tokenizer) -> dict:
  return downstream.encode(task.kind, examples, tokenizer,
                           cfg.max_seq_length, doc_stride=cfg.doc_stride,
                           max_query_length=cfg.max_query_length)


class TaskData(NamedTuple):
  """The task and its examples encoded as model rows: feature ->
  [rows, ...] numpy (``input_ids`` etc. [rows, max_seq_length])."""
  task: downstream.Task       # Its training examples less the dev split.
  dev_task: downstream.Task | None   # The dev split as its eval set.
  train: dict
  eval: dict
  dev: dict | None

  @property
  def features(self) -> tuple[str, ...]:
    """What a training batch holds: the inputs and the kind's labels."""
    return _INPUTS + _LABELS[self.task.kind]


def encode_task(cfg, tokenizer: tokenizer_lib.Tokenizer) -> TaskData:
  """``cfg.task`` (less its dev split) encoded once with ``tokenizer`` (the
  pretrained run's)."""
  try:
    task, dev_task = load_task(cfg)
  except downstream.TaskError as e:
    raise FinetuneError(f'task: {e}') from e
  return TaskData(
      task, dev_task, encode_examples(cfg, task, task.train, tokenizer),
      encode_examples(cfg, task, task.eval, tokenizer),
      (encode_examples(cfg, dev_task, dev_task.eval, tokenizer)
       if dev_task else None))


def plan_steps(cfg, num_rows: int, max_positions: int) -> tuple[int, int]:
  """(total_steps, unfreeze_every): ``cfg.num_epochs`` epochs of full
  batches over ``num_rows`` training rows, and the steps between gradual
  unfreezing's layers (default: one epoch)."""
  if num_rows < cfg.batch_size:
    raise FinetuneError(f'the task has {num_rows} training rows, fewer than '
                        f'batch_size={cfg.batch_size}: lower batch_size.')
  if cfg.max_seq_length > max_positions:
    raise FinetuneError(
        f'max_seq_length={cfg.max_seq_length} exceeds the model\'s '
        f'{max_positions} positions.')
  steps_per_epoch = num_rows // cfg.batch_size
  total_steps = max(1, math.ceil(cfg.num_epochs * steps_per_epoch))
  return total_steps, cfg.unfreeze_every_steps or steps_per_epoch


def batch_rows(seed: int, step: int, num_rows: int, batch_size: int
               ) -> np.ndarray:
  """The rows of training batch ``step``: epoch e = step // steps_per_epoch
  reads a permutation drawn from (seed, e); a partial last batch is left
  out (every batch is full, as google-research/bert's drop_remainder)."""
  per_epoch = num_rows // batch_size
  epoch, index = divmod(step, per_epoch)
  order = np.random.default_rng([seed, _ORDER_KEY, epoch]).permutation(
      num_rows)
  return order[index * batch_size:(index + 1) * batch_size]


# ---------------------------------------------------------------------------
# Losses and predictions.


def _cross_entropy(logits, labels, weights):
  """Weighted mean of softmax cross-entropy; ``labels`` int, any shape."""
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.maximum(labels, 0))
  return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def task_loss(kind: str, logits, batch, reduction: str = 'mean'
              ) -> jax.Array:
  """The task's training loss (float32 scalar) from the head's logits:
  a mean over the batch, or for a sentence-level kind with ``reduction``
  'sum' the sum over its examples (ELECTRA's ``tf.reduce_sum``)."""
  if kind in ('classification', 'regression'):
    rows = logits.shape[0]
    loss = (_cross_entropy(logits, batch['label'],
                           jnp.ones(rows, jnp.float32))
            if kind == 'classification' else
            jnp.mean((logits[:, 0] - batch['label']) ** 2))
    return loss * rows if reduction == 'sum' else loss
  if kind == 'token':
    labels = batch['labels']
    return _cross_entropy(logits, labels, (labels >= 0).astype(jnp.float32))
  # span: mean of the start and end losses, over the real tokens only.
  padding = (batch['attention_mask'] == 0)[..., None]
  logits = jnp.where(padding, -1e9, logits)
  ones = jnp.ones(logits.shape[0], jnp.float32)
  return 0.5 * (_cross_entropy(logits[..., 0], batch['start_positions'], ones)
                + _cross_entropy(logits[..., 1], batch['end_positions'], ones))


def evaluate_task(task: downstream.Task, logits: np.ndarray, features: dict,
                  cfg) -> dict[str, float]:
  """The task's metrics from the eval set's logits (host numpy)."""
  if task.kind == 'classification':
    return downstream.evaluate(task, logits.argmax(-1), features['label'])
  if task.kind == 'regression':
    return downstream.evaluate(task, logits[:, 0], features['label'])
  if task.kind == 'token':   # Every word, those the rows lost too.
    return downstream.evaluate(task, *downstream.word_tags(
        logits.argmax(-1), features, task.eval, task.label_names))
  answers = downstream.span_predictions(
      logits[..., 0], logits[..., 1], features, task.eval,
      cfg.max_answer_length)
  return downstream.evaluate(task, answers, task.eval)


# ---------------------------------------------------------------------------
# The run.


def _identity(cfg) -> dict:
  return {name: train_lib.config_section(cfg, name) for name in _IDENTITY}


def _check_resume(workdir: str, cfg) -> dict | None:
  """The metadata of the run ``workdir`` resumes (None for a new start);
  fails when it has other settings."""
  return train_lib.refuse_other_settings(
      workdir, _META, _identity(cfg), _identity(base_config()),
      FinetuneError, 'a fine-tuning run')


def started_from(saved: dict | None, pretrained: Pretrained) -> int:
  """The pretrained step a run started from: as the metadata ``saved`` of
  the run it resumes says (with ``init_step=0`` the init's latest step
  may have moved on since), else ``pretrained``'s."""
  return int((saved or {}).get('pretrained', {}).get('step',
                                                     pretrained.step))


def _place(value: np.ndarray, leaf: jax.ShapeDtypeStruct) -> jax.Array:
  """A host array onto ``leaf``'s sharding (each device takes its shard)."""
  if value.shape != leaf.shape:
    raise FinetuneError(f'a pretrained parameter has shape {value.shape}, '
                        f'the model {leaf.shape}.')
  value = value.astype(leaf.dtype)
  return jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                      lambda index: value[index])


def finetune(cfg, workdir: str) -> dict:
  """Fine-tunes per ``cfg`` in ``workdir`` (resuming if possible); returns
  ``downstream.json``'s content: ``metrics`` (the task's, held out),
  ``headline`` (the first metric's name) and what was trained."""
  # ---- Checks that read no data and write nothing.
  validate(cfg)
  saved = _check_resume(workdir, cfg)
  pretrained = load_pretrained(cfg.init, cfg.init_step)
  init_step = started_from(saved, pretrained)
  model_cfg = downstream_config(cfg, pretrained)

  # ---- Task, encoded with the pretrained run's tokenizer.
  data = encode_task(cfg, pretrained.tokenizer)
  task, dev_task = data.task, data.dev_task
  num_rows = len(data.train['input_ids'])
  total_steps, unfreeze_every = plan_steps(
      cfg, num_rows, model_cfg.max_position_embeddings)
  _say(f'task {task.name} ({task.kind}, {task.num_labels} labels): '
       f'{len(task.train)} train / {len(dev_task.eval) if dev_task else 0} '
       f'dev / {len(task.eval)} eval examples, '
       f'{num_rows} train rows of {cfg.max_seq_length} tokens; '
       f'{total_steps} steps of {cfg.batch_size}; mode {cfg.mode}; '
       f'{cfg.init_weights} weights from {cfg.init} step {init_step}')

  # ---- Mesh, and the rows of each global batch this process reads.
  place = train_lib.make_placement(cfg)

  # ---- Model and optimizer (on the trainable parameters only).
  model = downstream_model(cfg, model_cfg, task)
  steps = make_steps(cfg, model, total_steps, unfreeze_every)

  with jax.set_mesh(place.mesh), nn.logical_axis_rules(place.rules):
    # ---- Shard (the state is born sharded), compile ahead of time.
    compiled = shard_and_compile(steps, place, data, cfg.batch_size)

    # ---- Restore a checkpoint, or initialize from the pretrained encoder.
    storage.makedirs(workdir)
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, 'checkpoints'), cfg.checkpoint_every_steps,
        cfg.keep_checkpoints)
    state = restore_or_init(cfg, workdir, ckpt, steps, compiled, pretrained)
    if jax.process_index() == 0:
      train_lib.write_json_atomic(os.path.join(workdir, _META), {
          'identity': _identity(cfg), 'config': cfg.to_dict(),
          'pretrained': {'workdir': storage.absolute(cfg.init),
                         'step': init_step}})
    trained, parameters = parameter_counts(compiled.abstract_state.params,
                                           cfg)
    _say(f'{trained:,} of {parameters:,} parameters train')

    # ---- Train loop.
    loop = FinetuneLoop(cfg, workdir, place, data, compiled, ckpt,
                        total_steps, state)
    state = loop.run(state)

    # ---- Held-out evaluation (and the dev split's).
    scores = loop.held_out(state.params)

  # ---- downstream.json, for the compare tool.
  result = {'task': task.name, 'kind': task.kind, 'mode': cfg.mode,
            'init': storage.absolute(cfg.init), 'init_step': init_step,
            'init_weights': cfg.init_weights, 'steps': total_steps,
            'headline': task.metrics[0], 'trainable_parameters': trained,
            'parameters': parameters, **scores}
  if jax.process_index() == 0:
    train_lib.write_json_atomic(os.path.join(workdir, RESULT), result)
  loop.writer.message(f'{task.name}: {describe_scores(scores)}')
  loop.writer.close()
  return result


def describe_scores(scores: dict) -> str:
  """``FinetuneLoop.held_out``'s metrics (and dev metrics) in a line."""
  line = lambda metrics: ', '.join(f'{k} {v:.4f}' for k, v in metrics.items())
  dev = scores.get('dev_metrics')
  return line(scores['metrics']) + (f'; dev {line(dev)}' if dev else '')


# ---------------------------------------------------------------------------
# Model and optimizer: the init, update and predict steps.


class Steps(NamedTuple):
  """What fine-tuning runs on the devices, before it is sharded and
  compiled.

  ``init_state()`` -> ``TrainState`` (optimizer state of the trainable
  parameters only); ``train_step(state, batch)`` -> (state, metrics);
  ``predict(params, batch)`` -> the head's logits.
  """
  init_state: Callable[[], train_lib.TrainState]
  train_step: Callable[[train_lib.TrainState, dict],
                       tuple[train_lib.TrainState, dict]]
  predict: Callable[[Any, dict], jax.Array]


def warmup_steps(cfg, total_steps: int) -> float:
  """run_classifier.py's ``int(num_train_steps * warmup_proportion)``;
  with ELECTRA's schedule, ELECTRA's ``num_train_steps *
  warmup_proportion`` (optimization.py keeps the fraction)."""
  steps = cfg.optimizer.warmup_proportion * total_steps
  return steps if cfg.optimizer.schedule == 'electra' else int(steps)


def layer_lr_scale(path: tuple[str, ...], model_cfg, decay: float
                    ) -> float:
  """ELECTRA's layer-wise learning-rate decay (google-research/electra
  optimization.py ``_get_layer_lrs``): the factor on the rate of the
  parameter at ``path`` (keys). The head takes the full rate and the
  parameter at ``unfreeze_depth`` d below it ``decay ** (num_layers + 2 -
  d)``: the top layer ``decay ** 2`` (ELECTRA's table gives its head depth
  ``n_layers + 2`` and its top layer ``n_layers``), the embeddings
  ``decay ** (num_layers + 2)``. A shared group (ALBERT) takes its top
  layer's; an adapter or norm, its layer's. Every parameter has its place
  (as ELECTRA's optimizer raises on a variable its table lacks)."""
  if not (path[0] in (*heads.HEAD, 'heads', 'embeddings')
          or re.fullmatch(r'layer_\d+', path[0])):
    raise FinetuneError(f'layer-wise lr decay has no depth for parameter '
                        f'{"/".join(path)} (scanned layers are unstacked '
                        'for fine-tuning; this is another tree).')
  depth = unfreeze_depth(path, model_cfg)
  if depth == model_cfg.num_layers + 1:
    return 1.0
  return decay ** (model_cfg.num_layers + 2 - depth)


def scale_by_layer(model_cfg, decay: float) -> optax.GradientTransformation:
  """Each update times ``layer_lr_scale`` of its parameter (after the
  learning rate, and so on weight decay too, as ELECTRA's
  ``lr * (adam + decay_rate * param)``). Parameters ``finetune``'s or
  ``multitask``'s (its ``heads`` tree is head)."""
  def scale(path, update):
    keys = tuple(k.key for k in path       # Boxed leaves add a .value.
                 if isinstance(k, jax.tree_util.DictKey))
    factor = layer_lr_scale(keys, model_cfg, decay)
    return update * jnp.asarray(factor, update.dtype)
  return optax.stateless(lambda updates, params=None: (
      jax.tree_util.tree_map_with_path(scale, updates)))


def make_optimizer(cfg, model_cfg, total_steps: int, warmup: float
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """``cfg.optimizer`` over ``total_steps`` with ``warmup`` steps, and
  ELECTRA's layer-wise decay where ``optimizer.layerwise_lr_decay`` is set
  (the schedule is the head's rate)."""
  tx, schedule = optim.make_optimizer(ml_collections.ConfigDict({
      'total_steps': total_steps,
      'optimizer': dict(cfg.optimizer.to_dict(), warmup_steps=warmup)}))
  decay = cfg.optimizer.get('layerwise_lr_decay', 0.0)
  if decay:
    tx = optax.chain(tx, scale_by_layer(model_cfg, decay))
  return tx, schedule


def make_steps(cfg, model: heads.DownstreamModel, total_steps: int,
               unfreeze_every: int) -> Steps:
  """``model``'s steps with ``cfg``'s optimizer over ``total_steps`` (its
  warmup a proportion of them); only ``cfg.mode``'s trainable parameters
  train (gradual unfreezing: those reached so far)."""
  tx, schedule = make_optimizer(cfg, model.cfg, total_steps,
                                warmup_steps(cfg, total_steps))
  root_key = jax.random.key(cfg.seed)
  dropout_root = jax.random.fold_in(root_key, DROPOUT_KEY)
  length = cfg.max_seq_length

  def init_state():
    dummy = jnp.zeros((1, length), jnp.int32)
    params = model.init(jax.random.fold_in(root_key, INIT_KEY), dummy,
                        dummy, dummy + 1)['params']
    trainable, _ = split(params, cfg)
    return train_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=tx.init(trainable))

  def gate(tree, step):
    if cfg.mode != 'gradual_unfreeze':
      return tree
    return unfreeze_gate(tree, step, model.cfg, unfreeze_every)

  def train_step(state, batch):
    trainable, frozen = split(state.params, cfg)
    key = jax.random.fold_in(dropout_root, state.step)

    def loss_fn(trainable):
      logits = model.apply({'params': merge(trainable, frozen)},
                           batch['input_ids'], batch['token_type_ids'],
                           batch['attention_mask'], deterministic=False,
                           rngs={'dropout': key})
      return task_loss(model.kind, logits, batch, cfg.loss_reduction)

    loss, grads = jax.value_and_grad(loss_fn)(trainable)
    grads = gate(grads, state.step)
    updates, opt_state = tx.update(grads, state.opt_state, trainable)
    # Gated parameters take no step at all (no weight decay either).
    trainable = optax.apply_updates(trainable, gate(updates, state.step))
    metrics = {'loss': loss, 'grad_norm': optax.global_norm(grads),
               'learning_rate': schedule(state.step)}
    return train_lib.TrainState(state.step + 1, merge(trainable, frozen),
                                opt_state), metrics

  def predict(params, batch):
    return model.apply({'params': params}, batch['input_ids'],
                       batch['token_type_ids'], batch['attention_mask'])

  return Steps(init_state, train_step, predict)


# ---------------------------------------------------------------------------
# Shard and compile; restore or initialize.


class Compiled(NamedTuple):
  """The state's shardings and the steps compiled for them."""
  abstract_state: train_lib.TrainState   # Shapes, dtypes and shardings.
  state_sh: train_lib.TrainState         # The sharding of every leaf.
  train_step: Any             # (state, global batch) -> (state, metrics).
  predict: Any                # (params, global batch) -> logits.


def shard_and_compile(steps: Steps, place: train_lib.Placement,
                      data: TaskData, batch_size: int, *init_args
                      ) -> Compiled:
  """Shardings from the logical axes (the state is born sharded) and the
  update step compiled ahead of time; under ``place``'s mesh and rules.
  ``init_args``: what ``steps.init_state`` takes (shapes will do: task
  distillation's teacher)."""
  abstract_state, state_sh = sharding.state_shardings(
      steps.init_state, place.mesh, place.rules, *init_args)
  sharding.check_divisible(abstract_state, place.mesh)
  abstract_batch = {
      k: jax.ShapeDtypeStruct((batch_size,) + data.train[k].shape[1:],
                              data.train[k].dtype, sharding=place.batch_sh)
      for k in data.features}
  train_step = train_lib.compile_step(steps.train_step, place.mesh, state_sh,
                                      place.batch_sh, abstract_state,
                                      abstract_batch)
  predict = jax.jit(steps.predict,
                    in_shardings=(state_sh.params, place.batch_sh),
                    out_shardings=sharding.replicated(place.mesh))
  return Compiled(abstract_state, state_sh, train_step, predict)


def resume(ckpt: checkpoint_lib.Checkpointer, abstract_state, workdir: str):
  """The state at ``workdir``'s latest intact checkpoint, or None where it
  has none. As in pretraining (``Checkpointer.restore_latest``), a step
  that fails its manifest is moved to ``checkpoints_corrupt/`` and the
  next older one is restored; if none is left, the error says so."""
  restored = ckpt.restore_latest(abstract_state, None, _say)
  if restored is None:
    return None
  state, step = restored
  _say(f'resumed from the checkpoint at step {step} in {workdir}')
  return state


def restore_or_init(cfg, workdir: str, ckpt: checkpoint_lib.Checkpointer,
                    steps: Steps, compiled: Compiled,
                    pretrained: Pretrained) -> train_lib.TrainState:
  """The latest checkpoint in ``workdir``, else a fresh state (born
  sharded) with ``pretrained``'s encoder put in (``init_weights``
  pretrained) or left at random."""
  state = resume(ckpt, compiled.abstract_state, workdir)
  if state is not None:
    return state
  state = sharding.create_sharded(steps.init_state, compiled.state_sh)
  if cfg.init_weights == 'pretrained':
    state = state.replace(params=load_encoder(
        state.params, compiled.abstract_state.params, pretrained.params))
  return state


# ---------------------------------------------------------------------------
# Train loop.


class FinetuneLoop:
  """The train loop and its evaluation, over what they share: the compiled
  steps, the encoded task, the mesh, the metric writer."""

  def __init__(self, cfg, workdir: str, place: train_lib.Placement,
               data: TaskData, compiled: Compiled,
               ckpt: checkpoint_lib.Checkpointer, total_steps: int,
               state: train_lib.TrainState):
    self._cfg, self._place, self._data = cfg, place, data
    self._compiled, self._ckpt = compiled, ckpt
    self.total_steps = total_steps
    self.writer = metric_writers.MetricWriter(
        workdir, total_steps, int(jax.device_get(state.step)),
        enabled=jax.process_index() == 0)

  def to_global(self, data: dict, row_ids: np.ndarray, keys) -> dict:
    """The global batch of ``data``'s rows ``row_ids`` [batch_size] (this
    process reads its share of them)."""
    return sharding.make_global_batch(
        {k: data[k][row_ids[self._place.rows]] for k in keys},
        self._place.batch_sh, self._cfg.batch_size)

  def predict_all(self, params, data: dict) -> np.ndarray:
    """The head's logits on every row of ``data`` (the last batch padded
    with repeats of row 0, whose outputs are dropped)."""
    batch_size = self._cfg.batch_size
    n = len(data['input_ids'])
    outputs = []
    for start in range(0, n, batch_size):
      row_ids = np.arange(start, start + batch_size)
      row_ids = np.where(row_ids < n, row_ids, 0)
      outputs.append(np.asarray(jax.device_get(self._compiled.predict(
          params, self.to_global(data, row_ids, _INPUTS)))))
    return np.concatenate(outputs)[:n]

  def evaluate(self, params) -> dict[str, float]:
    """The task's metrics on the whole eval set."""
    return evaluate_task(self._data.task,
                         self.predict_all(params, self._data.eval),
                         self._data.eval, self._cfg)

  def held_out(self, params) -> dict:
    """What a run reports at its end: ``metrics`` (the eval set's), with a
    dev split ``dev_metrics`` and ``dev_examples``, and for the kinds with
    one prediction per example ``eval_predictions`` and ``eval_labels``
    (for intervals over held-out examples)."""
    data, task = self._data, self._data.task
    logits = self.predict_all(params, data.eval)
    scores = {'metrics': evaluate_task(task, logits, data.eval, self._cfg)}
    if data.dev_task is not None:
      scores['dev_metrics'] = evaluate_task(
          data.dev_task, self.predict_all(params, data.dev), data.dev,
          self._cfg)
      scores['dev_examples'] = len(data.dev_task.eval)
    if task.kind in PER_EXAMPLE:
      scores.update(per_example_predictions(task.kind, logits,
                                            data.eval['label']))
    return scores

  def run(self, state: train_lib.TrainState) -> train_lib.TrainState:
    """Trains from ``state``'s step to the last one, checkpointing when due
    and at the end; fails on a non-finite logged loss."""
    cfg, train = self._cfg, self._data.train
    step = int(jax.device_get(state.step))
    num_rows = len(train['input_ids'])
    t_last, logged = time.time(), step
    while step < self.total_steps:
      row_ids = batch_rows(cfg.seed, step, num_rows, cfg.batch_size)
      state, metrics = self._compiled.train_step(
          state, self.to_global(train, row_ids, self._data.features))
      step += 1
      self.writer.advance(step)
      last = step == self.total_steps
      evaluate = last or (cfg.eval_every_steps and
                          step % cfg.eval_every_steps == 0)
      if step % cfg.log_every_steps == 0 or evaluate:
        metrics = jax.device_get(metrics)
        if not np.isfinite(metrics['loss']):
          raise FloatingPointError(
              f'fine-tuning loss is {metrics["loss"]} at step {step}; lower '
              'optimizer.learning_rate.')
        entry = {k: float(v) for k, v in metrics.items()}
        now = time.time()
        entry['steps_per_second'] = (step - logged) / max(now - t_last, 1e-9)
        t_last, logged = now, step
        if evaluate:
          entry.update({f'eval_{k}': v for k, v in
                        self.evaluate(state.params).items()})
        self.writer.write(step, entry)
      self._ckpt.save(step, state, force=last)
    self._ckpt.wait()
    self._ckpt.close()
    return state


def per_example_predictions(kind: str, logits: np.ndarray,
                            labels: np.ndarray) -> dict:
  """``eval_predictions`` and ``eval_labels``: one per held-out example
  (classes, or regression values), as JSON lists."""
  predictions = logits.argmax(-1) if kind == 'classification' else logits[:, 0]
  return {'eval_predictions': predictions.tolist(),
          'eval_labels': np.asarray(labels).tolist()}


def load_encoder(params: dict, abstract: dict, encoder: dict) -> dict:
  """``params`` with the pretrained encoder's trees put in (and the head's
  pooler where the run has one); every pretrained tree must fit."""
  flat = flax.traverse_util.flatten_dict(params)
  shapes = flax.traverse_util.flatten_dict(abstract)
  for key, value in flax.traverse_util.flatten_dict(encoder).items():
    if key[0] in heads.HEAD and key not in flat:
      continue   # The pretrained pooler, under a head that has none.
    if key not in flat:
      raise FinetuneError(f'the model has no place for the pretrained '
                          f'{"/".join(key)}.')
    flat[key] = _place(value, shapes[key])
  return flax.traverse_util.unflatten_dict(flat)
