"""MobileBERT's training: progressive knowledge transfer from an IB-BERT
teacher, then pretraining distillation (``objective.name='mobilebert'``).

Sun et al. 2020, "MobileBERT: a Compact Task-Agnostic BERT for
Resource-Limited Devices", as google-research/mobilebert's
run_pretraining.py (``--layer_wise_warmup``), distill_util.py and
lamb_optimizer.py do it:

- The teacher is IB-BERT: a finished bert-objective run with MobileBERT's
  options (``teacher_workdir``; experiments/configs/mobilebert.py:
  model=teacher), frozen, without dropout, restored as distillation.py
  restores DistilBERT's and passed to every step as an argument.
- The student is this run's ``model`` section (MobileBERT or
  MobileBERT-TINY): the teacher's width H (the feature maps are compared
  without a projection), embedding width, trigram, token types, positions
  and heads, and a depth that divides the teacher's (24 and 24: student
  layer l learns from teacher layer l). It starts random, with the
  teacher's embeddings, MLM head, pooler and NSP head copied in
  (``student_params_from_teacher``: the reference copies every variable
  outside the encoder layers whose name both have; not the embedding
  norm, NoNorm against the teacher's LayerNorm).
- One run whose stage is a function of the step: steps [0, L P) are the
  progressive transfer (P = ``steps_per_layer``), phase l = step // P
  training student layer l; steps [L P, total_steps) the pretraining
  distillation.
- Progressive transfer (``transfer_terms``): (1 / L) sum_l gate_l x
  (100 MSE(LN(H_S^l), LN(H_T^g(l))) + 1 KL(A_T^g(l) || A_S^l) + 5000 mean
  term + 5 variance term), gate the one-hot of the phase's layer; LN a
  LayerNorm without parameters, on both sides; the KL per head over the
  attention distributions; the mean and variance terms compare each
  token's mean and variance over H. The MLM and NSP losses are not used.
  Learning rates (``gate``, after the whole optimizer, so weight decay is
  gated too): the phase's layer at 3 x bg x lr, the layers below it at 0.3
  x bg x lr, those above it and the copied embeddings and heads at 0
  (frozen); bg warms up over the first 10% of each phase to 1 and decays
  to 0.9 at its end (``lr_multipliers``). The base lr is held at its peak
  (``optimizer.hold_steps`` = L P).
- Pretraining distillation (``distillation_loss``): 0.5 x MLM + 0.5 x
  CE(p_T, p_S) over the masked predictions (the reference's cross-entropy
  against the target 0.5 p_T + 0.5 onehot; CE is linear in its target),
  plus ``objective.nsp_weight`` x NSP on the hard labels. Every student
  parameter trains; the lr warms up and decays after the hold.

Params: ``{'student': ..., 'teacher': ...}``; export and fine-tuning read
the student (its family is the bert objective's: ``mobilebert`` for
MobileBERT's options).

Departures from the reference, on purpose:

- One run, where the reference runs the distillation as a second run:
  Adam's moments carry over into it (the reference starts it with fresh
  ones), and in the transfer they are not gated (the reference multiplies
  m and v by ``lr multiplier > 0``, which keeps the frozen embeddings' and
  heads' at 0 and zeroes every layer's at the one step of each phase whose
  multiplier is 0; here they accumulate).
- Phase l is steps [l P, (l + 1) P), the reference's (l P, (l + 1) P]:
  each phase's step at bg = 0 (no update) is its first, not its last.
- Masked keys take no attention; the TF code adds -6 to their logits, so
  they keep a weight of e^-6.
- The mean and variance terms compare the same layer; the reference's
  compare each student layer with every teacher layer (it reads
  ``teacher_hiddens`` for ``teacher_hidden``), which the paper does not
  describe.
- The attention loss is the KL, the reference's cross-entropy less the
  teacher's entropy: the same gradient.
- The lr decays to 0 (``bert_linear``), the reference's to 1e-4 of it; the
  distillation's temperature is 1 (the reference scales the teacher's
  hidden state, a no-op at 1); the pooler is BERT's dense + tanh, copied
  from the teacher and trained by NSP (google-research's MobileBERT pools
  the raw [CLS] state).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import base
from bertjax.objectives import bert as bert_objective
from bertjax.objectives import distillation
from bertjax.objectives import losses
from bertjax.objectives import registry
from bertjax.objectives import tinybert

NAME = 'mobilebert'
# The transfer's terms and their weights' fields.
_TRANSFER = {'hidden': 'hidden_weight', 'att': 'attention_weight',
             'mean': 'mean_weight', 'var': 'variance_weight'}
# model.<field> -> the BertConfig attribute the student must share with
# the teacher to take its embeddings and heads and compare its H-wide
# block outputs unprojected.
_SHARED = {'hidden_size': 'hidden_size', 'embedding_size': 'word_width',
           'trigram_input': 'trigram_input',
           'type_vocab_size': 'type_vocab_size',
           'max_position_embeddings': 'max_position_embeddings'}
# The epsilon of the reference's parameter-free LayerNorm (TF's).
_STANDARDIZE_EPSILON = 1e-12
# The checks ask the student's shape only, not its tables' size.
_ANY_VOCAB = 128


def defaults() -> ml_collections.ConfigDict:
  """The ``mobilebert`` section: the reference's recipe (README's
  distillation command)."""
  t = ml_collections.ConfigDict()
  t.teacher_workdir = ''
  t.steps_per_layer = 10_000     # P, each layer's phase of the transfer
                                 # (240k over 24 layers); 0 = none.
  t.hidden_weight = 100.0        # Feature maps (hidden_distill_factor).
  t.attention_weight = 1.0       # Attention maps (attention_distill_factor).
  t.mean_weight = 5000.0         # Per-token means (beta_distill_factor).
  t.variance_weight = 5.0        # Per-token variances (gamma_...factor).
  t.current_lr_scale = 3.0       # The phase's layer's lr multiplier,
  t.lower_lr_scale = 0.3         # the layers' below it.
  t.phase_warmup = True          # Each phase's multipliers warm up over
                                 # its first 10% (distill_util's bg).
  t.ground_truth_ratio = 0.5     # The distillation's hard-label share.
  return t


def check(cfg, errors: list[str]) -> None:
  """Appends what is wrong with the ``mobilebert`` section (and the
  student and optimizer it implies) to ``errors``; reads the teacher's
  saved config, if any."""
  t = cfg.mobilebert
  errors.extend(f'mobilebert.{name}={t[name]} must be >= 0.'
                for name in (*_TRANSFER.values(), 'lower_lr_scale',
                             'steps_per_layer') if t[name] < 0)
  if t.current_lr_scale <= 0:
    errors.append(f'mobilebert.current_lr_scale={t.current_lr_scale} must '
                  'be > 0: the phase\'s layer trains at it (MobileBERT: 3).')
  if not 0 <= t.ground_truth_ratio <= 1:
    errors.append(f'mobilebert.ground_truth_ratio={t.ground_truth_ratio} '
                  'must be in [0, 1] (the hard labels\' share of the '
                  'distillation target; MobileBERT: 0.5).')
  if cfg.model.num_layer_groups:
    errors.append('model.num_layer_groups: MobileBERT\'s student learns '
                  'layer by layer, so its layers are distinct; set 0.')
  student = student_config(cfg, _ANY_VOCAB)
  transfer = max(t.steps_per_layer, 0) * student.num_layers
  hold = cfg.optimizer.hold_steps
  if cfg.total_steps > transfer and hold != transfer:
    errors.append(
        f'optimizer.hold_steps={hold} must equal mobilebert.steps_per_layer'
        f' x model.num_layers = {transfer}: the lr is held at its peak '
        'through the progressive transfer, and the distillation after it '
        'warms up and decays (the reference\'s second run); set '
        f'optimizer.hold_steps={transfer} (experiments/configs/'
        'mobilebert.py ties them).')
  teacher = distillation.check_teacher(
      cfg, NAME, errors, 'the workdir of a finished IB-BERT run '
      '(experiments/configs/mobilebert.py:model=teacher)', mobilebert=True)
  if teacher:
    errors.extend(pair(student, teacher.model, t.attention_weight)[1])


def pair(student: bert_lib.BertConfig, teacher: bert_lib.BertConfig,
         attention_weight: float
         ) -> tuple[tuple[int, ...] | None, list[str]]:
  """(the layer map, or None; what keeps ``student`` from learning from
  ``teacher``, a message each): TinyBERT's uniform map and head count
  (``tinybert.pair``), and the fields the copy and the unprojected
  feature maps need equal."""
  mapping, problems = tinybert.pair(student, teacher, (), attention_weight,
                                    section=NAME)
  for field, attribute in _SHARED.items():
    mine, theirs = getattr(student, attribute), getattr(teacher, attribute)
    if mine != theirs:
      problems.append(
          f'the student has {attribute} {mine} (model.{field}) and the '
          f'teacher {theirs}: MobileBERT\'s student starts from the '
          'teacher\'s embeddings and heads and compares its block outputs '
          f'with the teacher\'s unprojected; set model.{field} as the '
          'teacher has it.')
  return mapping, problems


def student_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """This run's ``model`` section over the teacher's tokenizer, with the
  pooler and NSP head (copied from the teacher; NSP trains them in the
  distillation) and no SBO head."""
  return model_config_lib.encoder_config(cfg.model, vocab_size)


def student_params_from_teacher(student: dict, teacher: dict) -> dict:
  """``student`` (plain arrays) with each subtree outside its layers that
  the teacher has under the same name, structure and shapes replaced by
  the teacher's: the embeddings (not a NoNorm against a LayerNorm), the
  MLM head, the pooler and the NSP head, as the reference copies each
  variable whose name both have. Works on any array type (numpy, jax,
  tracers): it only selects leaves."""
  def same(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        x.shape == y.shape for x, y in zip(jax.tree.leaves(a),
                                           jax.tree.leaves(b)))

  def copy(mine, theirs):
    if same(mine, theirs):
      return theirs
    if isinstance(mine, dict) and isinstance(theirs, dict):
      return {k: copy(v, theirs[k]) if k in theirs else v
              for k, v in mine.items()}
    return mine

  return {k: v if k.startswith('layer_') or k not in teacher
          else copy(v, teacher[k]) for k, v in student.items()}


# ---- The transfer's losses, per layer.


def standardize(x: jax.Array) -> jax.Array:
  """``x`` [..., H] normalized over its last axis without parameters
  (mean 0, variance 1, epsilon 1e-12), in float32: the reference's
  ``layer_norm(..., trainable=False)``."""
  x = x.astype(jnp.float32)
  mean = jnp.mean(x, axis=-1, keepdims=True)
  variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(variance + _STANDARDIZE_EPSILON)


def feature_map_mse(student_state: jax.Array, teacher_state: jax.Array
                    ) -> jax.Array:
  """MSE of the standardized block outputs [B, L, H], mean over every
  element, padding included (as the reference)."""
  return tinybert.mse(standardize(student_state), standardize(teacher_state))


def _masked_logits(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """Recorded scores [B, heads, L, L] (0 at masked keys) with the masked
  keys at ``PADDING_LOGIT`` (finite: 0 x log p stays 0); ``mask`` [B, L] or
  [B, 1, L, L] (``bert.attention_mask_for``)."""
  keys = mask if mask.ndim == 4 else mask[:, None, None, :].astype(bool)
  return jnp.where(keys, scores.astype(jnp.float32), bert_lib.PADDING_LOGIT)


def attention_kl(student_scores: jax.Array, teacher_scores: jax.Array,
                 mask: jax.Array, teacher_mask: jax.Array | None = None
                 ) -> jax.Array:
  """KL(teacher || student) of the attention distributions, head i
  against head i, summed over keys, mean over batch, heads and queries
  (padded queries included, as the reference). Scores [B, heads, L, L]
  as recorded; ``mask`` (and the teacher's own, if it masks otherwise, as
  a teacher keeping packed documents apart) as ``_masked_logits``."""
  log_s = jax.nn.log_softmax(_masked_logits(student_scores, mask))
  log_t = jax.nn.log_softmax(_masked_logits(
      teacher_scores, mask if teacher_mask is None else teacher_mask))
  return jnp.mean(jnp.sum(jnp.exp(log_t) * (log_t - log_s), axis=-1))


def mean_var_terms(student_state: jax.Array, teacher_state: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """(mean of (mu_T - mu_S)^2, mean of |var_T - var_S|): each token's mean
  and variance over H of the raw block outputs [B, L, H], means over every
  token, padding included."""
  s = student_state.astype(jnp.float32)
  t = teacher_state.astype(jnp.float32)
  mean = jnp.mean(jnp.square(jnp.mean(t, -1) - jnp.mean(s, -1)))
  return mean, jnp.mean(jnp.abs(jnp.var(t, -1) - jnp.var(s, -1)))


def transfer_terms(student_states, student_scores, teacher_states,
                   teacher_scores, mapping, mask, teacher_mask=None) -> dict:
  """Each transfer term ([M], student layer l against teacher layer
  ``mapping[l]``): ``hidden``, ``att``, ``mean``, ``var``. States are the
  student's layers 1..M and the teacher's [embeddings, layer 1..N] (lists
  of [B, L, H]), scores each layer's (``tinybert.recorded``)."""
  rows = []
  for s, scores, g in zip(student_states, student_scores, mapping):
    mean, var = mean_var_terms(s, teacher_states[g])
    rows.append({'hidden': feature_map_mse(s, teacher_states[g]),
                 'att': attention_kl(scores, teacher_scores[g - 1], mask,
                                     teacher_mask),
                 'mean': mean, 'var': var})
  return {name: jnp.stack([r[name] for r in rows]) for name in _TRANSFER}


# ---- The schedule: stages, phases and learning-rate multipliers.


def layer_gates(step, steps_per_layer: int, num_layers: int) -> jax.Array:
  """[num_layers] float32: 1 for the layer whose phase ``step`` is in
  (step // steps_per_layer), all 0 after the transfer or without one."""
  if not steps_per_layer:
    return jnp.zeros((num_layers,), jnp.float32)
  return jax.nn.one_hot(jnp.asarray(step) // steps_per_layer, num_layers)


def lr_multipliers(step, t, num_layers: int) -> jax.Array:
  """[num_layers] float32: each layer's lr multiplier at ``step`` (``t``
  the ``mobilebert`` section): in the transfer bg x ``current_lr_scale``
  for the phase's layer, bg x ``lower_lr_scale`` below it, 0 above it,
  with bg = min(0.1 sqrt(1 - p) + 0.9, 10 p) at the fraction p of the
  phase done (distill_util.get_background_lr; 1 without
  ``phase_warmup``, or with one step per phase); 1 after the transfer."""
  per_layer = t.steps_per_layer
  if not per_layer:
    return jnp.ones((num_layers,), jnp.float32)
  step = jnp.asarray(step, jnp.int32)
  current = step // per_layer
  p = (step % per_layer).astype(jnp.float32) / per_layer
  background = (jnp.minimum(0.1 * jnp.sqrt(1.0 - p) + 0.9, 10.0 * p)
                if t.phase_warmup and per_layer > 1 else 1.0)
  layer = jnp.arange(num_layers)
  scale = jnp.where(layer == current, t.current_lr_scale,
                    jnp.where(layer < current, t.lower_lr_scale, 0.0))
  return jnp.where(current < num_layers, background * scale,
                   1.0).astype(jnp.float32)


# ---- The loss.


def distillation_loss(student_out: dict, teacher_out: dict, batch: dict,
                      ground_truth_ratio: float, nsp_weight: float):
  """ratio x MLM + (1 - ratio) x CE(p_T, p_S) over the masked predictions
  (+ ``nsp_weight`` x NSP): the cross-entropy against ratio x onehot +
  (1 - ratio) x p_T. Metric sums ``mlm_*``, ``pred_*``, ``teacher_mlm_*``
  and ``nsp_*``."""
  pred, mlm, metrics = tinybert.prediction_losses(student_out, teacher_out,
                                                  batch, 1.0)
  loss = ground_truth_ratio * mlm + (1.0 - ground_truth_ratio) * pred
  if nsp_weight:
    nsp, nsp_metrics = losses.next_sentence(student_out['nsp_logits'],
                                            batch['next_sentence_labels'])
    loss = loss + nsp_weight * nsp
    metrics.update(nsp_metrics)
  return loss, metrics


def objective(terms: dict, student_out: dict, teacher_out: dict,
              batch: dict, t, nsp_weight: float, step):
  """The loss at ``step`` (``t`` the ``mobilebert`` section; None, as in
  evaluation: every layer's transfer terms and the distillation added) and
  the metric sums: the transfer terms summed over the layers (``hidden_*``,
  ``att_*``, ``mean_*``, ``var_*``), the distillation's, and at a step
  ``progressive_layer`` (the phase's layer, -1 after the transfer) and
  ``current_lr_scale`` (its multiplier)."""
  layers = terms['hidden'].shape[0]
  per_layer = sum(t[weight] * terms[name] for name, weight in
                  _TRANSFER.items())
  distill, metrics = distillation_loss(student_out, teacher_out, batch,
                                       t.ground_truth_ratio, nsp_weight)
  sequences = jnp.asarray(batch['input_ids'].shape[0], jnp.float32)
  for name, value in terms.items():
    metrics.update(tinybert.sum_metrics(
        name, jnp.sum(value), sequences))
  if step is None:
    return jnp.sum(per_layer) / layers + distill, metrics
  in_transfer = step < t.steps_per_layer * layers
  current = jnp.where(in_transfer, step // max(t.steps_per_layer, 1), -1)
  one = jnp.ones((), jnp.float32)
  metrics.update(
      progressive_layer_sum=current.astype(jnp.float32),
      progressive_layer_count=one,
      current_lr_scale_sum=lr_multipliers(step, t, layers)[
          jnp.clip(current, 0, layers - 1)],
      current_lr_scale_count=one)
  transfer = jnp.sum(layer_gates(step, t.steps_per_layer, layers) *
                     per_layer) / layers
  return jnp.where(in_transfer, transfer, distill), metrics


# ---- The networks and the task.


@dataclasses.dataclass(frozen=True)
class Networks:
  """The student and the teacher of a MobileBERT run, lined up."""
  student: bert_lib.BertForPreTraining
  teacher: bert_lib.BertForPreTraining
  mapping: tuple[int, ...]

  def losses(self, params, inputs, deterministic: bool, key):
    """The transfer terms ([M] each) and both models' outputs."""
    (student_out, s_states, s_scores), (teacher_out, t_states, t_scores) = (
        tinybert.run_both(self.student, self.teacher, params, inputs,
                          deterministic, key))
    ids, _, attention_mask = inputs[:3]
    masks = [bert_lib.attention_mask_for(model.cfg, ids, attention_mask)
             for model in (self.student, self.teacher)]
    terms = transfer_terms(s_states[1:], s_scores, t_states, t_scores,
                           self.mapping, *masks)
    return terms, student_out, teacher_out


def networks(cfg, teacher: distillation.TeacherRun, vocab_size: int
             ) -> Networks:
  """The student and the teacher of ``cfg`` (checked).

  Raises:
    distillation.TeacherError: the student cannot learn from this teacher
      (depth, heads, widths, tables).
  """
  student_cfg = student_config(cfg, vocab_size)
  mapping, problems = pair(student_cfg, teacher.model,
                           cfg.mobilebert.attention_weight)
  tinybert.refuse(student_cfg, problems, 'MobileBERT')
  # The pooler and NSP head are restored too: the student copies them.
  teacher_cfg = dataclasses.replace(teacher.model, with_pooler_nsp=True,
                                    scan_layers=False)
  return Networks(bert_lib.BertForPreTraining(student_cfg),
                  bert_lib.BertForPreTraining(teacher_cfg), mapping)


def make_task(cfg, vocab_size: int) -> base.Task:
  """The student and its frozen teacher, the transfer's schedule in the
  loss (``staged``) and in the update (``gate``); restores the teacher
  now, as host arrays the trainer passes to ``init``.

  Raises:
    distillation.TeacherError: as ``distillation.read_teacher``; the
      tokenizer, vocabulary or sequence length differ from the teacher's;
      the student cannot learn from it (``pair``).
  """
  t = cfg.mobilebert
  teacher = distillation.read_teacher(cfg, NAME, mobilebert=True)

  tinybert._check_teacher_fits(cfg, teacher, vocab_size)
  nets = networks(cfg, teacher, vocab_size)
  teacher_boxes = distillation._abstract_params(nets.teacher)
  layers = nets.student.cfg.num_layers
  transfer_steps = t.steps_per_layer * layers
  nsp_weight = cfg.objective.nsp_weight

  def init(key, batch, teacher_params):
    del batch
    ids = jnp.zeros((1, 1), jnp.int32)
    student = nets.student.init(key, ids, ids, ids, ids)['params']
    from_teacher = student_params_from_teacher(nn.unbox(student),
                                               teacher_params)
    return {'teacher': distillation.boxed_like(teacher_boxes, teacher_params),
            'student': distillation.boxed_like(student, from_teacher)}

  def loss(params, batch, key, deterministic, step=None):
    terms, student_out, teacher_out = nets.losses(
        params, base.model_inputs(batch), deterministic, key)
    return objective(terms, student_out, teacher_out, batch, t, nsp_weight,
                     step)

  def trainable(params):
    flags = lambda tree, value: jax.tree.map(
        lambda _: value, tree, is_leaf=distillation._is_box)
    return {'student': flags(params['student'], True),
            'teacher': flags(params['teacher'], False)}

  def gate(updates, step):
    # The reference's lr_mult, on the whole update (its decay included):
    # each layer by its multiplier; the copied embeddings and heads frozen
    # until the distillation.
    multipliers = lr_multipliers(step, t, layers)
    after = (step >= transfer_steps).astype(jnp.float32)
    scale = lambda tree, k: jax.tree.map(lambda u: u * k.astype(u.dtype),
                                         tree)
    student = {
        k: scale(v, multipliers[int(k[len('layer_'):])]
                 if k.startswith('layer_') else after)
        for k, v in updates['student'].items()}
    return dict(updates, student=student)

  # Each phase and the distillation: a new layer's loss starts high, which
  # is no spike.
  stage_starts = (tuple(range(t.steps_per_layer, transfer_steps + 1,
                              t.steps_per_layer))
                  if transfer_steps else ())
  return base.Task(init, loss, trainable,
                   flops_per_token=tinybert.flops_per_token(
                       cfg, nets.student.cfg, nets.teacher.cfg),
                   init_inputs=distillation.restore_teacher_inputs(
                       teacher, teacher_boxes),
                   staged=True, stage_starts=stage_starts,
                   gate=gate if transfer_steps else None)


def encoder_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The student: this run's ``model`` section (no teacher needed)."""
  return student_config(cfg, vocab_size)


OBJECTIVE = registry.register(base.Objective(
    name=NAME, make_task=make_task, encoder_config=encoder_config,
    export_family=bert_objective.export_family, section=NAME,
    defaults=defaults, check=check,
    prepare_config=lambda cfg: distillation.prepare_config(
        cfg, NAME, mobilebert=True),
    encoder_params=lambda params: params['student'],
    run_identity=('mobilebert.steps_per_layer',)))
