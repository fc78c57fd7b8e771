"""The heads and losses of the self-supervised tasks beyond masking.

The tasks themselves (what each builds on the host: corruptions, labels)
are declared in data_pipelines/tasks/, one module each; this module turns
their declarations into what the encoder trains:

- the config section ``tasks``: one subsection per task, ``weight`` (0 =
  off) and the task's own knobs, and the checks across it;
- one head per enabled task on the encoder's output (``TaskHeads``):
  ``token`` a linear layer to the task's classes at every position,
  ``sentence`` one on the [CLS] state, ``pointer`` a score per position
  normalised over the row's real positions;
- the loss: ``sum_t weight_t * loss_t`` added to the objective's own, each
  ``loss_t`` the cross-entropy averaged over the task's labels in the batch
  (``sum(w * nll) / (sum(w) + 1e-5)``, MLM's form), and the metrics
  ``<task>_loss`` and ``<task>_accuracy``;
- FLOPs per token of the heads.

A batch from a stream that does not build a task (ERNIE 2.0's continual
multi-task pretraining, data_pipelines/continual.py) carries the task's
fields as zeros and ``<task>_present`` = 0 on its rows, so the task adds
nothing there.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax.models import bert as bert_lib
from data_pipelines import continual as continual_lib
from data_pipelines import instances as instances_lib
from data_pipelines import tasks as tasks_lib

SECTION = 'tasks'
# The parameter tree of the heads, next to the encoder's.
PARAMS = 'task_heads'
COUNT_OFFSET = 1e-5
# The batch field of NSP's labels, which a pair task's classes replace.
NSP_LABELS = 'next_sentence_labels'


def defaults() -> ml_collections.ConfigDict:
  """``tasks.<name>``: ``weight`` (0 = off) and the task's own knobs."""
  c = ml_collections.ConfigDict()
  for name in tasks_lib.names():
    section = ml_collections.ConfigDict()
    section.weight = 0.0
    for key, value in tasks_lib.get(name).defaults().items():
      section[key] = value
    c[name] = section
  return c


def enabled(cfg) -> list[tasks_lib.HostTask]:
  """The tasks the run trains, in name order: those with weight > 0, or
  in a continual run those its streams build."""
  return [tasks_lib.get(n) for n in continual_lib.run_tasks(cfg)]


def num_classes(cfg, task: tasks_lib.HostTask) -> int:
  return task.num_classes(tasks_lib.run_params(cfg, task.name),
                          cfg.data.max_seq_length)


def check(cfg, errors: list[str]) -> None:
  """Each enabled task's own checks, and what they need of the run."""
  section = cfg.get(SECTION)
  if section is None:
    return
  for name in section:
    if name not in tasks_lib.names():
      errors.append(f'tasks.{name}: no such task; use one of '
                    f'{tasks_lib.names()}.')
    elif section[name].weight < 0:
      errors.append(f'tasks.{name}.weight={section[name].weight} must be '
                    '>= 0 (0 = off).')
  if cfg.continual.stage_steps or cfg.continual.streams:
    check_continual(cfg, errors)
  on = enabled(cfg)
  if not cfg.continual.stage_steps:
    check_stream([t.name for t in on], cfg.data.layout, cfg.objective,
                 'data.layout', errors)
  if not on:
    return
  if cfg.objective.name != 'bert':
    errors.append(f'tasks {[t.name for t in on]} are on (weight > 0) with '
                  f'objective.name={cfg.objective.name!r}; the tasks train '
                  "on the BERT family's encoder: use objective.name=bert, "
                  'or set their tasks.<name>.weight=0.')
  for task in on:
    task.check(tasks_lib.run_params(cfg, task.name), cfg.data, errors)
  whole = [t.name for t in on if t.across_documents]
  if whole and not cfg.model.attend_across_documents:
    errors.append(f'tasks {whole} label the order of the row\'s sentences '
                  'or documents, which model.attend_across_documents=False '
                  'hides from each other: use True, or set their '
                  'tasks.<name>.weight=0.')


def check_stream(names, layout: str, objective, where: str,
                 errors: list[str]) -> None:
  """What one batch stream's tasks need: their layout, at most one
  corruption, no labels of the tokens next to a corruption that changes
  them, and no NSP head reading another task's pair labels."""
  tasks = [tasks_lib.get(n) for n in names]
  corrupting = [t.name for t in tasks if t.corrupts]
  if len(corrupting) > 1:
    errors.append(f'tasks {corrupting} each rewrite the input; a batch '
                  'takes one (each labels positions of the sequence it '
                  'builds): turn all but one off (weight 0), or give them '
                  'separate streams (continual.streams).')
  new = [f'tasks.{t.name}.weight' for t in tasks if t.new_tokens]
  facts = [f'tasks.{t.name}.weight' for t in tasks if t.token_facts]
  if new and facts:
    errors.append(f'{", ".join(new)} > 0 next to {", ".join(facts)} > 0 '
                  'in one batch: an inserted, replaced or shuffled token '
                  'stands where the facts those tasks predict '
                  '(capitalization, document relation) are another '
                  'token\'s or unknown: set one side\'s weights to 0, or '
                  'give them separate streams (continual.streams).')
  for task in tasks:
    # A task on packed rows takes either packing (a doc_sentences row is
    # full_sentences' within one document).
    packed = (task.layout in instances_lib.PACKED_LAYOUTS
              and layout in instances_lib.PACKED_LAYOUTS)
    if task.layout and task.layout != layout and not packed:
      needs = (' or '.join(repr(x) for x in instances_lib.PACKED_LAYOUTS)
               if task.layout in instances_lib.PACKED_LAYOUTS
               else repr(task.layout))
      errors.append(f'tasks.{task.name} needs {where}={needs}; got '
                    f'{layout!r}: set it, or tasks.{task.name}.weight=0.')
  # A layout whose pair label is a task's classes, not NSP's 2 (the NSP
  # head would read labels outside its classes: a NaN loss).
  pair_tasks = sorted(
      {t.name for t in tasks if t.label_field == NSP_LABELS}
      | {n for n in tasks_lib.names() if tasks_lib.get(n).layout == layout
         and tasks_lib.get(n).label_field == NSP_LABELS})
  if pair_tasks and objective.nsp_weight:
    errors.append(f'{where}={layout!r} with objective.nsp_weight='
                  f'{objective.nsp_weight}: the pairs carry the classes of '
                  f'tasks {pair_tasks} in place of NSP\'s, which the NSP '
                  'head cannot read: use objective.nsp_weight=0.')


def continual_defaults() -> ml_collections.ConfigDict:
  """``continual``: ERNIE 2.0's schedule (data_pipelines/continual.py).

  ``stage_steps``: steps of each stage, summing to ``total_steps`` (empty:
  no schedule, one stream). ``streams``: named sections, each
  ``stream_defaults()``; a stream's task id is its place in the order of
  ``first_stage``, then name (``continual.stream_order``).
  """
  c = ml_collections.ConfigDict()
  c.stage_steps = ()
  c.streams = ml_collections.ConfigDict()
  return c


def stream_defaults() -> ml_collections.ConfigDict:
  """One stream of a continual run: its instance ``layout`` ('' =
  ``data.layout``), the ``tasks`` it builds (their weights and knobs are
  ``tasks.<name>``'s), whether it is masked for ``mlm``, its sampling
  ``weight`` in a stage and the stage that introduces it."""
  s = ml_collections.ConfigDict()
  s.layout = ''
  s.tasks = ()
  s.mlm = True
  s.weight = 1.0
  s.first_stage = 0
  return s


def check_continual(cfg, errors: list[str]) -> None:
  """The schedule covers the run; every stream is buildable and used."""
  c = cfg.continual
  stages = tuple(c.stage_steps)
  if not stages or not c.streams:
    errors.append('continual.stage_steps and continual.streams go together '
                  f'(got {len(stages)} stages and {len(c.streams)} '
                  'streams): set both, or neither for one stream.')
    return
  if any(n <= 0 for n in stages) or sum(stages) != cfg.total_steps:
    errors.append(f'continual.stage_steps={stages} must be positive and '
                  f'sum to total_steps={cfg.total_steps} (they sum to '
                  f'{sum(stages)}): the stages must cover the run.')
  if cfg.model.task_type_vocab_size < len(c.streams):
    errors.append(f'model.task_type_vocab_size='
                  f'{cfg.model.task_type_vocab_size} is less than the '
                  f'{len(c.streams)} streams: each stream has a task id; '
                  f'use >= {len(c.streams)}.')
  firsts = []
  for name in sorted(c.streams):
    firsts.append(_check_one_stream(cfg, name, len(stages), errors))
  built = {t for name in c.streams for t in c.streams[name].tasks}
  errors.extend(
      f'tasks.{name}.weight={cfg.tasks[name].weight} but no '
      'continual.streams.<name>.tasks builds it: a continual run trains '
      'its streams\' tasks only; add it to a stream, or set the weight to 0.'
      for name in sorted(cfg.tasks)
      if name in tasks_lib.names() and cfg.tasks[name].weight > 0
      and name not in built)
  if 0 not in firsts:
    errors.append('no stream has continual.streams.<name>.first_stage=0: '
                  'the first stage would have nothing to train on.')


def _check_one_stream(cfg, name: str, num_stages: int,
                      errors: list[str]) -> int:
  """One stream's fields; returns its first stage."""
  s, where = cfg.continual.streams[name], f'continual.streams.{name}'
  unknown = [t for t in s.tasks if t not in tasks_lib.names()]
  if unknown:
    errors.append(f'{where}.tasks={tuple(s.tasks)}: no tasks {unknown}; '
                  f'use some of {tasks_lib.names()}.')
    return s.first_stage
  off = [t for t in s.tasks if cfg.tasks[t].weight <= 0]
  if off:
    errors.append(f'{where} builds tasks {off} whose loss weight is 0: set '
                  f'tasks.<name>.weight > 0 for them.')
  if not s.tasks and not s.mlm:
    errors.append(f'{where} has no tasks and mlm=False: it would train '
                  'nothing.')
  if s.mlm and not cfg.objective.mlm_weight:
    errors.append(f'{where}.mlm=True with objective.mlm_weight=0.')
  if not 0 <= s.first_stage < num_stages:
    errors.append(f'{where}.first_stage={s.first_stage} must be in [0, '
                  f'{num_stages}).')
  if s.weight <= 0:
    errors.append(f'{where}.weight={s.weight} must be > 0.')
  layout = s.layout or cfg.data.layout
  if layout not in instances_lib.LAYOUTS:
    errors.append(f'{where}.layout={layout!r}; use one of '
                  f'{instances_lib.LAYOUTS}.')
  if layout in instances_lib.PACKED_LAYOUTS and cfg.objective.nsp_weight:
    errors.append(f'{where}.layout={layout!r} has no sentence '
                  f'pairs, and NSP (objective.nsp_weight='
                  f'{cfg.objective.nsp_weight}) reads every stream\'s '
                  'batches: use objective.nsp_weight=0, or a pair layout '
                  'for each stream.')
  check_stream(list(s.tasks), layout, cfg.objective, f'{where}.layout',
               errors)
  return s.first_stage


def flops_per_token(cfg, model: bert_lib.BertConfig) -> float:
  """Training FLOPs per token of the token and pointer heads (a
  per-sequence head is not counted, as NSP is not: bertjax/flops.py)."""
  total = 0.0
  for task in enabled(cfg):
    if task.head == 'token':
      total += 2 * model.hidden_size * num_classes(cfg, task)
    elif task.head == 'pointer':
      total += 2 * model.hidden_size
  return 3 * total


class TaskHeads(nn.Module):
  """One linear head per task: ``{name: logits}`` (float32), [B, L, C] for
  a token head, [B, C] for a sentence head (on the [CLS] state), [B, L]
  for a pointer head (positions outside ``attention_mask`` at -1e9)."""
  model: bert_lib.BertConfig
  heads: tuple[tuple[str, str, int], ...]   # (name, head, classes)

  @nn.compact
  def __call__(self, sequence_output, attention_mask):
    out = {}
    for name, head, classes in self.heads:
      dense = nn.Dense(
          1 if head == 'pointer' else classes, name=name,
          dtype=self.model.dtype, param_dtype=self.model.param_dtype,
          kernel_init=nn.with_logical_partitioning(
              nn.initializers.truncated_normal(self.model.initializer_range),
              ('embed', 'classes')),
          bias_init=nn.with_logical_partitioning(
              nn.initializers.zeros_init(), ('classes',)))
      if head == 'sentence':
        out[name] = dense(sequence_output[:, 0]).astype(jnp.float32)
      elif head == 'token':
        out[name] = dense(sequence_output).astype(jnp.float32)
      else:
        scores = dense(sequence_output)[..., 0].astype(jnp.float32)
        out[name] = jnp.where(attention_mask > 0, scores, -1e9)
    return out


def make_heads(cfg, model: bert_lib.BertConfig) -> TaskHeads | None:
  """The heads of ``cfg``'s enabled tasks; None when none is on."""
  on = enabled(cfg)
  if not on:
    return None
  return TaskHeads(model, tuple((t.name, t.head, num_classes(cfg, t))
                                for t in on))


def label_weights(task: tasks_lib.HostTask, batch: dict) -> jax.Array:
  """The weight of each label: [B, L] (token) or [B], times the row's
  ``<task>_present``."""
  present = batch[tasks_lib.present_field(task.name)].astype(jnp.float32)
  if task.head == 'token':
    return batch[task.weight_field].astype(jnp.float32) * present[:, None]
  if task.weight_field:
    return batch[task.weight_field].astype(jnp.float32) * present
  return present


def task_loss(task: tasks_lib.HostTask, logits: jax.Array, batch: dict):
  """(mean cross-entropy over the task's labels, metric sums)."""
  weights = label_weights(task, batch)
  # A label of weight 0 may be another task's (two streams share
  # ``next_sentence_labels``), outside this head's classes: out-of-range
  # gathers give NaN, and 0 x NaN is NaN.
  labels = jnp.where(weights > 0, batch[task.label_field].astype(jnp.int32),
                     0)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  count = jnp.sum(weights)
  loss = jnp.sum(weights * nll) / (count + COUNT_OFFSET)
  return loss, {f'{task.name}_loss_sum': jnp.sum(weights * nll),
                f'{task.name}_correct': jnp.sum(weights * correct),
                f'{task.name}_count': count}


def losses(cfg, logits: dict, batch: dict):
  """``sum_t weight_t * loss_t`` over the enabled tasks, and the metrics."""
  total, metrics = jnp.zeros((), jnp.float32), {}
  for task in enabled(cfg):
    loss, sums = task_loss(task, logits[task.name], batch)
    total = total + cfg[SECTION][task.name].weight * loss
    metrics.update(sums)
  return total, metrics


def drop_heads(params_tree: dict) -> dict:
  """The run's parameters without the task heads (the encoder's)."""
  return {k: v for k, v in params_tree.items() if k != PARAMS}
