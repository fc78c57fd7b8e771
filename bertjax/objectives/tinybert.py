"""TinyBERT: a narrower, shallower student distilled layer by layer.

Jiao et al. 2020, "TinyBERT: Distilling BERT for Natural Language
Understanding", Sec. 3.1-3.3, as huawei-noah/Pretrained-Language-Model's
TinyBERT/general_distill.py and task_distill.py do it:

- The teacher is the latest checkpoint of another bertjax run or of an
  import of a transformers BERT (``tinybert.teacher_workdir``), frozen,
  without dropout, restored as distillation.py restores DistilBERT's and
  passed to the step (and to ``init``) as an argument, never a constant.
- The student is this run's ``model`` section (TinyBERT-4: 4 layers, H 312,
  FFN 1200, 12 heads), randomly initialised, with the teacher's vocabulary
  (its tokenizer) and as many heads (the attention loss compares them head
  by head).
- Layer mapping: student layer m (1..M) learns from teacher layer
  g(m) = m N / M (the paper's uniform map; N a multiple of M, as the code
  asserts), or ``tinybert.layer_map`` (one teacher layer per student
  layer, increasing); the embeddings from the teacher's (g(0) = 0).
- Losses (Eq. 7-11), each a mean squared error as ``MSELoss``:
  embeddings ``MSE(E_S W_e, E_T)``; hidden states
  ``sum_m MSE(H_S^m W_h, H_T^g(m))``; attention
  ``sum_m MSE(A_S^m, A_T^g(m))`` on the unnormalised scores QK^T / sqrt(d)
  (the code zeroes masked keys' scores, ``where(att <= -1e2, 0, att)``; so
  does ``SelfAttention``'s record of them), each a mean over all of its
  elements; prediction layer ``CE(z_T / t, z_S / t)`` at temperature t over
  the MLM predictions (soft cross-entropy, mean over predictions).
  ``W_e`` and ``W_h`` map the student's width to the teacher's
  (``projection``); the code's one ``fit_dense`` serves both
  (``share_projection``, default) where the paper writes two.
- Stages (Sec. 3.3): the intermediate-layer losses for the first
  ``intermediate_steps`` steps, then the prediction-layer loss (plus an
  optional hard MLM loss, ``mlm_weight``). General distillation, as
  general_distill.py, is the intermediate stage alone (the preset sets
  ``intermediate_steps`` to ``total_steps``).

- Training as BertAdam (transformer/optimization.py) does: the preset
  clips each gradient tensor on its own (``optimizer.grad_clip``); a
  parameter no loss of the stage reads takes no step (``gate``: the pooler
  and NSP head never, the MLM head only in the prediction stage, the
  projections only in the intermediate one), as BertAdam skips one without
  a gradient; the [PAD] embedding takes no gradient, as the code's
  ``nn.Embedding(padding_idx=0)`` (``student_config``). experiments/
  fidelity.py checks the whole step against a transcription.

Params: ``{'student': ..., 'teacher': ..., 'projection': ...}``; only the
student is an encoder: fine-tuning and export read ``params['student']``
(a BERT with a pooler, exported as any BERT); the projections are dropped.

Departure: the prediction loss sums over the vocabulary and averages over
predictions (the code's task distillation averages over classes too, a
constant factor).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax import flops
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import base
from bertjax.objectives import distillation
from bertjax.objectives import losses
from bertjax.objectives import registry

NAME = 'tinybert'
# Student parameters no TinyBERT loss reads, and the MLM head's (which only
# the prediction stage reads).
_UNUSED = ('pooler', 'nsp')
_MLM_HEAD = ('mlm_transform', 'mlm_norm', 'mlm_output_bias')
# The checks ask the student's shape only, not its tables' size.
_ANY_VOCAB = 128
_INTERMEDIATE = ('embedding_weight', 'hidden_weight', 'attention_weight')
_PREDICTION = ('prediction_weight', 'mlm_weight')


def defaults() -> ml_collections.ConfigDict:
  """The ``tinybert`` section: general_distill.py's losses, weights 1."""
  t = ml_collections.ConfigDict()
  t.teacher_workdir = ''
  t.layer_map = ()             # Teacher layer (1..N) per student layer;
                               # () = uniform, m N / M.
  t.share_projection = True    # One W for embeddings and hidden states
                               # (the code's fit_dense); False: W_e, W_h.
  t.embedding_weight = 1.0
  t.hidden_weight = 1.0
  t.attention_weight = 1.0
  t.prediction_weight = 1.0
  t.mlm_weight = 0.0           # Hard MLM loss in the prediction stage.
  t.temperature = 1.0
  t.intermediate_steps = 0     # Steps of the intermediate-layer stage;
                               # the prediction-layer stage follows.
  return t


def check(cfg, errors: list[str]) -> None:
  """Appends what is wrong with the ``tinybert`` section (and the student
  it implies) to ``errors``; reads the teacher's saved config, if any."""
  t = cfg.tinybert
  if t.temperature <= 0:
    errors.append(f'tinybert.temperature={t.temperature} must be > 0 (the '
                  'soft targets are softmax(z / t); TinyBERT uses 1).')
  names = _INTERMEDIATE + _PREDICTION
  errors.extend(f'tinybert.{name}={t[name]} must be >= 0.'
                for name in names if t[name] < 0)
  if not any(t[name] for name in names):
    errors.append(', '.join(f'tinybert.{name}' for name in names) +
                  ' are all 0: every loss weight is 0, so the loss is 0; '
                  'set them > 0 (TinyBERT weighs each of its losses 1).')
  if t.intermediate_steps < 0:
    errors.append(f'tinybert.intermediate_steps={t.intermediate_steps} '
                  'must be >= 0.')
  if cfg.model.scan_layers or cfg.model.num_layer_groups:
    errors.append('model.scan_layers / model.num_layer_groups: a TinyBERT '
                  'student matches each of its layers to a teacher layer, '
                  'so its layers are distinct and unscanned; set both off.')
  student = student_config(cfg, _ANY_VOCAB)
  if t.layer_map:
    # The teacher's depth bounds it too (below, or when the task is made).
    explicit = tuple(t.layer_map)
    if (len(explicit) != student.num_layers or min(explicit) < 1 or
        any(b <= a for a, b in zip(explicit, explicit[1:]))):
      errors.append(f'tinybert.layer_map={explicit} must name one teacher '
                    f'layer (from 1, increasing) for each of the student\'s '
                    f'{student.num_layers} layers; use () for the uniform '
                    'map m N / M.')
  teacher = distillation.check_teacher(
      cfg, NAME, errors, 'the workdir of a finished bertjax BERT run or of '
      'an import (experiments/import_hf.py)')
  if teacher:
    errors.extend(pair(student, teacher.model, t.layer_map,
                       t.attention_weight)[1])


def refuse(student_cfg: bert_lib.BertConfig, problems: list[str],
           family: str) -> None:
  """Raises what keeps a ``family`` student from learning layer by layer
  (``problems``, from a ``pair``), or a student whose layers are scanned or
  shared, as ``distillation.TeacherError``."""
  if problems:
    raise distillation.TeacherError(' '.join(problems))
  if student_cfg.scan_layers or student_cfg.num_layer_groups:
    raise distillation.TeacherError(f'a {family} student has distinct, '
                                    'unscanned layers.')


def pair(student: bert_lib.BertConfig, teacher: bert_lib.BertConfig,
         explicit_map, attention_weight: float, section: str = NAME
         ) -> tuple[tuple[int, ...] | None, list[str]]:
  """(the layer map g(1..M), or None; what keeps ``student`` from learning
  layer by layer from ``teacher``, a message each): the map must fit
  (``layer_map``), and the attention loss (``attention_weight`` > 0, the
  ``section``'s) compares the two head by head. For general and task
  distillation alike."""
  problems = []
  mapping = None
  try:
    mapping = layer_map(explicit_map, student.num_layers, teacher.num_layers,
                        section)
  except ValueError as e:
    problems.append(str(e))
  if attention_weight and student.num_heads != teacher.num_heads:
    problems.append(
        f'the student has {student.num_heads} attention heads and the '
        f'teacher {teacher.num_heads}: the attention loss compares them head '
        f'by head. Use a student of {teacher.num_heads} heads '
        f'(model.num_heads; TinyBERT keeps 12), or set '
        f'{section}.attention_weight=0.')
  return mapping, problems


def layer_map(explicit, student_layers: int, teacher_layers: int,
              section: str = NAME) -> tuple[int, ...]:
  """g(1..M): the teacher layer (1-based) each student layer learns from.

  ``explicit`` () gives the paper's uniform map m N / M: 3, 6, 9, 12 for 4
  of 12 layers. Otherwise one increasing teacher layer per student layer
  (``<section>.layer_map``; MobileBERT's section has none: its student
  takes the uniform map).

  Raises:
    ValueError: the map has the wrong length, points outside the
      teacher's layers or goes backwards; no map, and N is not a multiple
      of M.
  """
  if not 1 <= student_layers <= teacher_layers:
    raise ValueError(f'a student of {student_layers} layers cannot learn '
                     f'layer by layer from a teacher of {teacher_layers}: '
                     f'use 1 to {teacher_layers} layers (model.num_layers).')
  if not explicit:
    if teacher_layers % student_layers:
      fix = ('use a student whose model.num_layers divides the teacher\'s'
             if section == 'mobilebert' else
             f'give {section}.layer_map, one teacher layer per student layer')
      raise ValueError(
          f'the uniform layer map m N / M needs the teacher\'s {teacher_layers}'
          f' layers to be a multiple of the student\'s {student_layers} (as '
          f'general_distill.py asserts); {fix}.')
    return tuple(m * teacher_layers // student_layers
                 for m in range(1, student_layers + 1))
  explicit = tuple(int(g) for g in explicit)
  if len(explicit) != student_layers:
    raise ValueError(f'{section}.layer_map={explicit} names '
                     f'{len(explicit)} teacher layers for a student of '
                     f'{student_layers}; give one per student layer, or () '
                     'for the uniform map.')
  if not all(1 <= g <= teacher_layers for g in explicit):
    raise ValueError(f'{section}.layer_map={explicit} points past the '
                     f'teacher\'s {teacher_layers} layers; use layers 1 to '
                     f'{teacher_layers}.')
  if any(b <= a for a, b in zip(explicit, explicit[1:])):
    raise ValueError(f'{section}.layer_map={explicit} must increase: a '
                     'deeper student layer learns from a deeper teacher '
                     'layer.')
  return explicit


def student_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """This run's ``model`` section over the teacher's tokenizer, with a
  pooler and NSP head (an exported BERT has both; neither trains here),
  no SBO head, and a [PAD] embedding that takes no gradient (the code's
  ``nn.Embedding(padding_idx=0)``: the MSE losses read padded positions)."""
  return dataclasses.replace(
      model_config_lib.encoder_config(cfg.model, vocab_size),
      with_pooler_nsp=True, sbo_positions=0, pad_row_trains=False)


# ---- The losses.


def mse(x: jax.Array, y: jax.Array) -> jax.Array:
  """``MSELoss``: the mean of (x - y)^2 over every element, in float32."""
  return jnp.mean(jnp.square(x.astype(jnp.float32) - y.astype(jnp.float32)))


def attention_loss(student_scores, teacher_scores, mapping) -> jax.Array:
  """sum_m MSE(A_S^m, A_T^g(m)): lists of [B, H, L, L] scores (masked keys
  0), student layer m (1-based) against teacher layer ``mapping[m-1]``."""
  return sum(mse(s, teacher_scores[g - 1])
             for s, g in zip(student_scores, mapping))


def hidden_loss(projected_states, teacher_states, mapping) -> jax.Array:
  """sum_m MSE(H_S^m W_h, H_T^g(m)): ``projected_states`` the student's
  layers 1..M already through W_h, ``teacher_states`` [embeddings, layer
  1..N] (lists of [B, L, D])."""
  return sum(mse(h, teacher_states[g])
             for h, g in zip(projected_states, mapping))


def soft_cross_entropy(student_logits, teacher_logits, weights,
                       temperature: float):
  """CE(softmax(z_T / t), z_S / t): sum over classes, mean over the
  weighted predictions (``weights`` [..., P] 1 for real ones)."""
  targets = jax.nn.softmax(teacher_logits.astype(jnp.float32) / temperature)
  log_p = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  ce = -jnp.sum(targets * log_p, axis=-1)
  total, count = jnp.sum(weights * ce), jnp.sum(weights)
  return total / jnp.maximum(count, 1.0), {'pred_loss_sum': total,
                                           'pred_count': count}


class Projections(nn.Module):
  """W_e and W_h (student width -> teacher width, with bias); one shared
  Dense when ``shared``, as the code's ``fit_dense``."""
  student: bert_lib.BertConfig
  teacher_width: int
  shared: bool

  @nn.compact
  def __call__(self, embeddings, hidden_states):
    """(``embeddings`` W_e, [h W_h for h in ``hidden_states``])."""
    dense = lambda name: nn.Dense(
        self.teacher_width, dtype=self.student.dtype,
        param_dtype=self.student.param_dtype,
        kernel_init=bert_lib.param_init(self.student, ('embed', None)),
        bias_init=bert_lib.zeros_init((None,)), name=name)
    hidden = dense('hidden')
    embedding = hidden if self.shared else dense('embedding')
    return embedding(embeddings), [hidden(h) for h in hidden_states]


def recorded(intermediates: dict, num_layers: int):
  """(hidden states [embeddings, layer 1..N], attention scores [layer
  1..N]) recorded by an apply with ``mutable=['intermediates']``: lists of
  [B, L, H] and of [B, heads, L, L] (masked keys 0). MobileBERT's layers
  record the same: the H-wide block outputs, their attention's scores."""
  states = list(intermediates['hidden_states'])
  scores = [intermediates[f'layer_{i}']['attention']['attention_scores'][0]
            for i in range(num_layers)]
  return states, scores


def sum_metrics(name: str, value, count) -> dict:
  """A loss's metric sums: value x count and count (summarize: the mean)."""
  return {f'{name}_loss_sum': value * count, f'{name}_count': count}


def run_both(student, teacher, params, inputs, deterministic: bool, key):
  """``(outputs, states, scores)`` of the student and of the teacher
  (always deterministic, its parameters stopped) on ``inputs``, each
  model's hidden states and attention scores as ``recorded`` reads them."""
  teacher_out, teacher_rec = teacher.apply(
      {'params': jax.lax.stop_gradient(params['teacher'])}, *inputs,
      deterministic=True, mutable=['intermediates'])
  student_out, student_rec = student.apply(
      {'params': params['student']}, *inputs, deterministic=deterministic,
      rngs=None if deterministic else {'dropout': key},
      mutable=['intermediates'])
  return ((student_out, *recorded(student_rec['intermediates'],
                                  student.cfg.num_layers)),
          (teacher_out, *recorded(teacher_rec['intermediates'],
                                  teacher.cfg.num_layers)))


@dataclasses.dataclass(frozen=True)
class Networks:
  """The three networks of a TinyBERT run and how they line up."""
  student: bert_lib.BertForPreTraining
  teacher: bert_lib.BertForPreTraining
  projections: Projections
  mapping: tuple[int, ...]

  def losses(self, params, inputs, deterministic: bool, key):
    """Every loss term (scalars) and the two models' outputs."""
    (student_out, s_states, s_scores), (teacher_out, t_states, t_scores) = (
        run_both(self.student, self.teacher, params, inputs, deterministic,
                 key))
    embedded, projected = self.projections.apply(
        {'params': params['projection']}, s_states[0], s_states[1:])
    terms = {'emb': mse(embedded, t_states[0]),
             'hidden': hidden_loss(projected, t_states, self.mapping),
             'att': attention_loss(s_scores, t_scores, self.mapping)}
    return terms, student_out, teacher_out


def prediction_losses(student_out: dict, teacher_out: dict, batch: dict,
                      temperature: float):
  """(the soft cross-entropy of the student's MLM logits against the
  teacher's at ``temperature``, the student's hard MLM loss, the metric
  sums ``pred_*``, ``mlm_*`` and the teacher's ``teacher_mlm_*``)."""
  weights = batch['masked_weights']
  pred, metrics = soft_cross_entropy(student_out['mlm_logits'],
                                     teacher_out['mlm_logits'], weights,
                                     temperature)
  mlm, mlm_metrics = losses.masked_lm(student_out['mlm_logits'],
                                      batch['masked_ids'], weights)
  _, teacher_metrics = losses.masked_lm(teacher_out['mlm_logits'],
                                        batch['masked_ids'], weights)
  metrics.update(mlm_metrics)
  metrics.update({f'teacher_{k}': v for k, v in teacher_metrics.items()})
  return pred, mlm, metrics


def objective(terms: dict, student_out: dict, teacher_out: dict,
              batch: dict, t, step):
  """The loss of ``t``'s (the ``tinybert`` section's) stage at ``step``
  (None, as in evaluation: both stages' terms added) and the metric sums:
  ``emb_*``, ``hidden_*``, ``att_*``, ``pred_*``, the student's ``mlm_*``
  and the teacher's ``teacher_mlm_*``."""
  pred, mlm, metrics = prediction_losses(student_out, teacher_out, batch,
                                         t.temperature)
  sequences = jnp.asarray(batch['input_ids'].shape[0], jnp.float32)
  for name, value in terms.items():
    metrics.update(sum_metrics(name, value, sequences))
  intermediate = (t.embedding_weight * terms['emb'] +
                  t.hidden_weight * terms['hidden'] +
                  t.attention_weight * terms['att'])
  prediction = t.prediction_weight * pred + t.mlm_weight * mlm
  if step is None:
    return intermediate + prediction, metrics
  return jnp.where(step < t.intermediate_steps, intermediate,
                   prediction), metrics


def flops_per_token(cfg, student: bert_lib.BertConfig,
                    teacher: bert_lib.BertConfig) -> float:
  """The student trained (MLM head on the masked fraction) and the
  teacher's forward pass; the projections are a rounding error."""
  s = cfg.data.max_seq_length
  p = flops.masked_fraction(cfg.masking, s)
  return 3 * flops.mlm_forward(student, s, p) + flops.mlm_forward(
      teacher, s, p)


def networks(cfg, teacher: distillation.TeacherRun, vocab_size: int
             ) -> Networks:
  """The student, teacher and projections of ``cfg`` (checked).

  Raises:
    distillation.TeacherError: the student cannot learn from this teacher
      (depth, heads, map, sequence length).
  """
  student_cfg = student_config(cfg, vocab_size)
  mapping, problems = pair(student_cfg, teacher.model, cfg.tinybert.layer_map,
                           cfg.tinybert.attention_weight)
  refuse(student_cfg, problems, 'TinyBERT')
  teacher_cfg = dataclasses.replace(teacher.model, scan_layers=False)
  return Networks(bert_lib.BertForPreTraining(student_cfg),
                  bert_lib.BertForPreTraining(teacher_cfg),
                  Projections(student_cfg, teacher_cfg.hidden_size,
                              cfg.tinybert.share_projection), mapping)


def _check_teacher_fits(cfg, teacher: distillation.TeacherRun,
                        vocab_size: int) -> None:
  model_path = cfg.data.tokenizer.model_path
  if not model_path:
    raise distillation.TeacherError(
        'data.tokenizer.model_path is "": the student must read the '
        'teacher\'s tokens; experiments/configs/tinybert.py sets it from '
        'tinybert.teacher_workdir.')
  distillation.check_teacher_tokenizer(model_path, teacher)
  if teacher.vocab_size != vocab_size:
    raise distillation.TeacherError(
        f'the teacher in {teacher.workdir!r} has {teacher.vocab_size} '
        f'vocabulary ids; this run has {vocab_size}.')
  if cfg.data.max_seq_length > teacher.model.max_position_embeddings:
    raise distillation.TeacherError(
        f'data.max_seq_length={cfg.data.max_seq_length} exceeds the '
        f'teacher\'s max_position_embeddings='
        f'{teacher.model.max_position_embeddings}.')


def make_task(cfg, vocab_size: int) -> base.Task:
  """The student, its frozen teacher and the projections between them;
  restores the teacher now, as host arrays the trainer passes to ``init``.

  Raises:
    distillation.TeacherError: as ``distillation.read_teacher``; the
      tokenizer, vocabulary or sequence length differ from the teacher's;
      the student cannot be mapped onto it.
  """
  t = cfg.tinybert
  teacher = distillation.read_teacher(cfg, NAME)
  _check_teacher_fits(cfg, teacher, vocab_size)
  nets = networks(cfg, teacher, vocab_size)

  teacher_boxes = distillation._abstract_params(nets.teacher)
  width = nets.student.cfg.hidden_size

  def init(key, batch, teacher_params):
    del batch
    student_key, projection_key = jax.random.split(key)
    ids = jnp.zeros((1, 1), jnp.int32)
    x = jnp.zeros((1, 1, width), nets.student.cfg.dtype)
    return {'teacher': distillation.boxed_like(teacher_boxes, teacher_params),
            'student': nets.student.init(student_key, ids, ids, ids,
                                         ids)['params'],
            'projection': nets.projections.init(projection_key, x,
                                                [x])['params']}

  def loss(params, batch, key, deterministic, step=None):
    terms, student_out, teacher_out = nets.losses(
        params, base.model_inputs(batch), deterministic, key)
    return objective(terms, student_out, teacher_out, batch, t, step)

  def trainable(params):
    flags = lambda tree, value: jax.tree.map(
        lambda _: value, tree, is_leaf=distillation._is_box)
    # No loss reads the pooler or the NSP head: they keep their init (and
    # export as it), as BertAdam skips a parameter without a gradient.
    student = {k: flags(v, k not in _UNUSED)
               for k, v in params['student'].items()}
    return {'student': student,
            'projection': flags(params['projection'], True),
            'teacher': flags(params['teacher'], False)}

  def gate(updates, step):
    # The MLM head learns in the prediction stage only, the projections in
    # the intermediate stage only; elsewhere they take no step (nor decay).
    first = (step < t.intermediate_steps).astype(jnp.float32)
    scale = lambda tree, on: jax.tree.map(
        lambda u: u * on.astype(u.dtype), tree)
    student = {k: scale(v, 1.0 - first) if k in _MLM_HEAD else v
               for k, v in updates['student'].items()}
    return dict(updates, student=student,
                projection=scale(updates['projection'], first))

  return base.Task(init, loss, trainable,
                   flops_per_token=flops_per_token(cfg, nets.student.cfg,
                                                   nets.teacher.cfg),
                   init_inputs=distillation.restore_teacher_inputs(
                       teacher, teacher_boxes),
                   staged=True, stage_starts=(t.intermediate_steps,),
                   gate=gate)


def encoder_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The student: this run's ``model`` section (no teacher needed)."""
  return student_config(cfg, vocab_size)


OBJECTIVE = registry.register(base.Objective(
    name=NAME, make_task=make_task, encoder_config=encoder_config,
    export_family=lambda cfg: 'bert', section=NAME, defaults=defaults,
    check=check,
    prepare_config=lambda cfg: distillation.prepare_config(cfg, NAME),
    encoder_params=lambda params: params['student']))
