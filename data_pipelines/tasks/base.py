"""What a self-supervised task declares, and the registry of them
(see the package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

HEADS = ('token', 'sentence', 'pointer')


def _no_checks(params: dict, data_cfg, errors: list[str]) -> None:
  del params, data_cfg, errors


def _no_knobs() -> dict:
  return {}


@dataclasses.dataclass(frozen=True)
class HostTask:
  """One self-supervised task, as the input pipeline and the heads see it.

  Attributes:
    name: its section ``cfg.tasks.<name>``.
    head: one of ``HEADS``.
    num_classes: ``(params, max_seq_length) -> int``; for a ``pointer``
      head, the positions (``max_seq_length``).
    label_field: the batch field of its labels: int32 [B, L] for a token
      head, int32 [B] otherwise.
    weight_field: float32, the labels' weights ([B, L] for a token head,
      [B] otherwise; 0 = not a label), or '' for every row.
    apply: ``(batch, params, seed) -> batch`` with the task's fields (and
      for a corrupting task, new ``input_ids`` and whatever else the
      corruption moves: ``token_type_ids``, ``attention_mask``,
      ``word_starts``, ``unit_labels``, ``sentence_ids``); None when the
      instance builder makes the fields.
    fields: ``(params, max_seq_length) -> {name: (shape after the batch
      axis, dtype)}``: what the task adds to a batch.
    corrupts: whether ``apply`` rewrites the input.
    new_tokens: a corrupting task that leaves tokens where the builder's
      facts about them are not theirs (inserted, replaced or shuffled
      tokens: ``capitalized`` and ``token_document_labels`` there are the
      position's original token's, or made up).
    shown_token_labels: its labels say what became of the token each
      position shows (inserted, replaced, moved), so where MLM then puts
      [MASK] or a random token the label no longer fits the input: the
      pipeline gives those positions weight 0.
    token_facts: its labels are those builder's facts, true only of the
      tokens the corpus has at each position: it shares no stream with a
      ``new_tokens`` task.
    across_documents: its labels relate the row's content across its
      [SEP]s (the order of sentences or documents), which the encoder must
      see whole: it needs ``model.attend_across_documents=True``.
    defaults: ``() -> dict`` of its knobs beyond ``weight``.
    check: ``(params, data_cfg, errors)`` appends what is wrong, each
      message naming the field and what to use.
    layout: the ``data.layout`` it needs ('' = any).
    instance_flags: ``InstanceConfig`` fields it turns on (fields the
      builder computes from whole documents), e.g. ``('token_document',)``.
    check_data: ``(batches) -> Any``, run on a stream's eval batches
      before anything is compiled; raises ``pretokenize.DataError`` when
      the data cannot teach the task (a lower-cased corpus for
      capitalization); None for no check.
    description: one line for docs and tables.
  """
  name: str
  head: str
  num_classes: Callable[[dict, int], int]
  label_field: str
  weight_field: str
  fields: Callable[[dict, int], dict]
  apply: Callable[[dict, dict, int], dict] | None = None
  corrupts: bool = False
  new_tokens: bool = False
  shown_token_labels: bool = False
  token_facts: bool = False
  across_documents: bool = False
  defaults: Callable[[], dict] = _no_knobs
  check: Callable[[dict, Any, list], None] = _no_checks
  layout: str = ''
  instance_flags: tuple[str, ...] = ()
  check_data: Callable[[list], Any] | None = None
  description: str = ''

  def __post_init__(self):
    if self.head not in HEADS:
      raise ValueError(f'task {self.name!r}: head={self.head!r}; use one of '
                       f'{HEADS}.')


def _two_classes(params: dict, max_seq_length: int) -> int:
  del params, max_seq_length
  return 2


def token_task(name: str, apply, num_classes=_two_classes,
               **kwargs) -> HostTask:
  """A task that labels positions: a ``token`` head over ``num_classes``
  (default 2: a detection), its labels ``<name>_labels`` int32 [B, L] and
  their weights ``<name>_weights`` float32 [B, L], made by ``apply``.
  ``kwargs``: the other ``HostTask`` fields."""
  labels, weights = f'{name}_labels', f'{name}_weights'

  def fields(params: dict, max_seq_length: int) -> dict:
    del params
    return {labels: ((max_seq_length,), np.int32),
            weights: ((max_seq_length,), np.float32)}

  return HostTask(name=name, head='token', num_classes=num_classes,
                  label_field=labels, weight_field=weights, fields=fields,
                  apply=apply, **kwargs)


_TASKS: dict[str, HostTask] = {}


def register(task: HostTask) -> HostTask:
  """Adds ``task`` under its name; a name is registered once."""
  if task.name in _TASKS and _TASKS[task.name] is not task:
    raise ValueError(f'task {task.name!r} is already registered.')
  _TASKS[task.name] = task
  return task


def names() -> tuple[str, ...]:
  """The registered task names, sorted."""
  return tuple(sorted(_TASKS))


def get(name: str) -> HostTask:
  if name not in _TASKS:
    raise ValueError(f'task {name!r}; use one of {names()}.')
  return _TASKS[name]


def params_of(section) -> dict:
  """A task's config section as a plain dict (picklable for workers)."""
  return dict(section.to_dict() if hasattr(section, 'to_dict') else section)


def run_params(cfg, name: str, vocab_size: int = 0) -> dict:
  """Task ``name``'s knobs as ``apply`` gets them: its section
  ``cfg.tasks.<name>``, with the tokenizer's ``vocab_size`` and
  ``data.max_seq_length``."""
  out = params_of(cfg.tasks[name])
  out.update(vocab_size=vocab_size, max_seq_length=cfg.data.max_seq_length)
  return out


def present_field(name: str) -> str:
  """float32 [B]: 1 on the rows whose stream builds task ``name``."""
  return f'{name}_present'


def batch_fields(cfg, names) -> dict:
  """Task name -> {feature: (shape after the batch axis, dtype)} that
  tasks ``names`` add to a batch, each with its ``<task>_present``."""
  out = {}
  for name in names:
    task = get(name)
    fields = dict(task.fields(run_params(cfg, name), cfg.data.max_seq_length))
    fields[present_field(name)] = ((), np.float32)
    out[name] = fields
  return out


def token_weights(batch: dict) -> np.ndarray:
  """float32 [B, L]: 1 on the real tokens that are not [CLS] or [SEP]
  (``sentence_ids`` >= 0), the positions a token task labels."""
  return (np.asarray(batch['sentence_ids']) >= 0).astype(np.float32)

