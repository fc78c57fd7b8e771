"""What an objective is: the ``Objective`` it declares and the ``Task`` it
builds for the trainer.

The trainer (train.py) is the same for every member of the BERT family; what
differs is how the parameters are created and what the loss is. A ``Task``
holds both, as pure functions:

  init(key, batch[, inputs]) -> params
                                      boxed with logical axis names;
                                      ``inputs`` only for a task with
                                      ``init_inputs`` (a teacher)
  loss(params, batch, key, deterministic[, step]) -> (loss, metric sums)
                                      ``step`` only for a ``staged`` task
  trainable(params) -> bool pytree    False for frozen leaves (a teacher);
                                      called on boxed and plain params, so
                                      a box counts as one leaf

``key`` is the step's key (dropout, and for ELECTRA its masking and
sampling); evaluation passes a fixed key with ``deterministic=True``. The
metric sums add across batches and hosts (``losses.summarize`` turns them
into means).

An ``Objective`` is everything the rest of bertjax needs to know about one
family, declared in its own module (objectives/bert.py, electra.py,
distillation.py) and found by ``objective.name`` in the registry
(objectives/registry.py): its config section and checks, its task, and
what its encoder is when it is fine-tuned or exported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

from bertjax.models import bert as bert_lib


@dataclasses.dataclass(frozen=True)
class Task:
  init: Callable[[jax.Array, dict], Any]
  loss: Callable[[Any, dict, jax.Array, bool], tuple[jax.Array, dict]]
  trainable: Callable[[Any], Any] | None = None   # None: every leaf.
  # Training FLOPs per real token (bertjax/flops.py), for MFU and compare.
  flops_per_token: float = 0.0
  # Host arrays that ``init`` takes as its third argument (a distillation
  # teacher's parameters), in ``nn.Partitioned`` boxes: the trainer places
  # them on the mesh by their logical axes and passes them in, so no
  # compiled program holds them as constants. None: ``init(key, batch)``.
  init_inputs: Any = None
  # Whether ``loss`` takes the train step's number as ``step=`` (its loss
  # changes by stage: TinyBERT); evaluation passes ``step=None``. The
  # steps where a new stage starts, at which the divergence monitor's
  # running mean of the loss starts afresh (a new loss is no spike).
  staged: bool = False
  stage_starts: tuple[int, ...] = ()
  # ``(updates, step) -> updates`` zeroed where the step's stage leaves a
  # parameter unused (no weight decay either), as a reference optimizer
  # that skips parameters without a gradient does; None: every update.
  gate: Callable[[Any, jax.Array], Any] | None = None


def model_inputs(batch: dict) -> tuple:
  """The pretraining model's positional inputs, from a pipeline batch."""
  return (batch['input_ids'], batch['token_type_ids'],
          batch['attention_mask'], batch['masked_positions'],
          batch['masked_unit_start'])


def model_kwargs(batch: dict) -> dict:
  """The pretraining model's keyword inputs, from a pipeline batch:
  ``task_type_ids`` int [B, L] (ERNIE 2.0's task embedding) when the batch
  has them, a [B] task id per row spread over the row; else none (the
  model then takes task 0, if it has a task table)."""
  if 'task_type_ids' not in batch:
    return {}
  ids = batch['task_type_ids']
  if ids.ndim == 1:
    ids = jnp.broadcast_to(ids[:, None], batch['input_ids'].shape)
  return {'task_type_ids': ids}


def _no_checks(cfg, errors: list[str]) -> None:
  del cfg, errors


def _as_is(cfg):
  return cfg


def _all_params(params: dict) -> dict:
  return params


@dataclasses.dataclass(frozen=True)
class Objective:
  """One pretraining objective, as the rest of bertjax sees it.

  Attributes:
    name: its ``objective.name``.
    make_task: ``(cfg, vocab_size) -> Task``: its networks, heads, loss,
      metrics and FLOPs per token; ``vocab_size`` is the tokenizer's (the
      networks pad their tables: models/config.py ``encoder_config``).
    encoder_config: ``(cfg, vocab_size) -> BertConfig``: the encoder a run
      of it leaves for fine-tuning and export (ELECTRA's discriminator, a
      distilled student); ``vocab_size`` is the tokenizer's.
    export_family: ``cfg -> str``: the transformers family that encoder
      exports as (bertjax/interop/hf_convert.py's ``FAMILIES``).
    section: the name of its own config section (``cfg.<section>``); ''
      for none beyond ``cfg.objective``.
    defaults: ``() -> ConfigDict``: that section with its defaults.
    check: ``(cfg, errors)``: appends what is wrong with ``cfg`` for this
      objective, each message naming the field and what to use
      (config_lib.validate runs it before anything is read or compiled).
    prepare_config: ``cfg -> cfg``: what it derives before any data is
      read (distillation: the teacher's tokenizer).
    encoder_params: ``params -> params``: the encoder's part of a run's
      parameters (a distilled student's); the networks are still the
      objective's own, as ``make_task`` built them.
    run_identity: dotted config fields of its section that a resumed run
      must share with the run that wrote the checkpoint, beyond the
      trainer's (train.py ``_RUN_IDENTITY``): MobileBERT's stages are a
      function of the step and ``mobilebert.steps_per_layer``.
  """
  name: str
  make_task: Callable[[Any, int], Task]
  encoder_config: Callable[[Any, int], bert_lib.BertConfig]
  export_family: Callable[[Any], str]
  section: str = ''
  defaults: Callable[[], ml_collections.ConfigDict] | None = None
  check: Callable[[Any, list], None] = _no_checks
  prepare_config: Callable[[Any], Any] = _as_is
  encoder_params: Callable[[dict], dict] = _all_params
  run_identity: tuple[str, ...] = ()

  def __post_init__(self):
    if bool(self.section) != (self.defaults is not None):
      raise ValueError(f'objective {self.name!r}: a section needs its '
                       'defaults, and defaults need a section name.')
