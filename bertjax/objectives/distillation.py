"""DistilBERT: a student distilled from a bertjax teacher, as a ``Task``.

Sanh et al. 2019, "DistilBERT, a distilled version of BERT: smaller,
faster, cheaper and lighter", Sec. 2-3, as Hugging Face's
examples/research_projects/distillation (distiller.py, train.py,
scripts/extract_distilbert.py) does it:

- The teacher is the latest checkpoint of another bertjax run
  (``distillation.teacher_workdir``): its architecture from the run's
  ``run_meta.json``, its parameters restored with orbax. It is frozen and
  runs without dropout, under ``stop_gradient``.
- The student has the teacher's width (and vocabulary, positions, FFN and
  heads) and ``distillation.student_layers`` layers (0 = half the
  teacher's), no token-type embedding, no pooler and no NSP head. It starts
  as a copy of the teacher: word and position embeddings and their
  LayerNorm, evenly spaced teacher layers (``teacher_layers_for_student``)
  and the MLM head (transform, LayerNorm, output bias; the decoder is tied
  to the word embeddings).
- Loss = ``kl_weight`` x T^2 x KL(teacher || student) of the MLM
  distributions softened at temperature T, mean over the masked positions
  + ``mlm_weight`` x the student's MLM loss + ``cosine_weight`` x (1 -
  cos) between the student's and the teacher's last hidden states, mean
  over non-pad tokens (5.0, 2.0, 1.0 and T = 2 in Hugging Face's
  training command).

This run's ``model`` section gives the student's dropout rates and dtypes
(the compute dtype is the teacher's too); its architecture fields are not
used: the student's architecture is the teacher's.

How the teacher gets into the parameters. The task restores the teacher
when it is built, as host numpy arrays in their logical-axis boxes (before
anything compiles, which is also where a bad checkpoint fails): the task's
``init_inputs``. The trainer places them on the mesh, each process its own
shards (``train.init_inputs``), and passes them to the jitted ``init`` as
an argument; the student is a function of them. Both become ordinary
sharded leaves of the state (the teacher under ``params['teacher']``), so
the train step receives the teacher as an argument too, and checkpoints
hold it (a resumed run restores it from its own checkpoint). No compiled
program holds the teacher as a constant, so neither grows with it
(tests/bertjax/objectives/test_tinybert.py compares program sizes for two
teachers).

Departures from the reference: the soft-target KL is over the masked
positions (Hugging Face's ``--restrict_ce_to_mask``; its README's command
computes it over every non-pad token, which would need the vocabulary
projection at every position, against the sparse MLM head); tokens are
chosen for masking uniformly, not with the XLM-style frequency smoothing
(``mlm_smoothing`` 0.7) of Hugging Face's distiller.
"""

from __future__ import annotations

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from bertjax.runtime import checkpoint as checkpoint_lib
from bertjax.runtime import distributed
from bertjax import errors as errors_lib
from bertjax import flops
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import base
from bertjax.objectives import losses
from bertjax.objectives import registry
from bertjax import storage
from data_pipelines import tokenizer as tokenizer_lib

NAME = 'distillation'

# What bertjax.train writes in a workdir (not imported from it: train.py is
# also run as __main__, and importing it again would define its flags twice).
RUN_META = 'run_meta.json'
IMPORTED_CONFIG = 'config.json'
TOKENIZER_MODEL = 'tokenizer.model'
CHECKPOINTS = 'checkpoints'
# torch.nn.CosineEmbeddingLoss's guard against zero vectors.
_COSINE_EPS = 1e-12


class TeacherError(errors_lib.UserError, ValueError):
  """The teacher run cannot teach this run."""


def defaults() -> ml_collections.ConfigDict:
  """The ``distillation`` section; Sanh et al. 2019.

  The teacher is the latest checkpoint of another bertjax run; the student
  has its width and student_layers layers (0 = half), initialised from
  every other teacher layer.
  """
  t = ml_collections.ConfigDict()
  t.teacher_workdir = ''
  t.student_layers = 0
  t.temperature = 2.0
  t.kl_weight = 5.0
  t.mlm_weight = 2.0
  t.cosine_weight = 1.0
  return t


_WEIGHTS = ('kl_weight', 'mlm_weight', 'cosine_weight')


def check(cfg, errors: list[str]) -> None:
  """Appends what is wrong with the ``distillation`` section to ``errors``
  (``prepare_config`` reads the teacher's run itself)."""
  t = cfg.distillation
  if t.temperature <= 0:
    errors.append(f'distillation.temperature={t.temperature} must be > 0.')
  errors.extend(f'distillation.{name}={t[name]} must be >= 0.'
                for name in _WEIGHTS if t[name] < 0)
  if not any(t[name] for name in _WEIGHTS):
    errors.append('distillation.kl_weight, distillation.mlm_weight and '
                  'distillation.cosine_weight are all 0: the loss is 0; use '
                  'weights > 0 (DistilBERT uses 5, 2 and 1).')
  if t.student_layers < 0:
    errors.append(f'distillation.student_layers={t.student_layers} must be '
                  '>= 0 (0 = half the teacher\'s).')
  if not (t.teacher_workdir and storage.isdir(t.teacher_workdir)):
    errors.append(f'distillation.teacher_workdir={t.teacher_workdir!r} is '
                  'not a directory; use the workdir of a finished bertjax '
                  'run (objective.name=bert), e.g. $WORK/bert-base.')


@dataclasses.dataclass(frozen=True)
class TeacherRun:
  """What a teacher workdir holds, read without restoring any parameter."""
  workdir: str
  step: int                           # Its latest checkpoint.
  model: bert_lib.BertConfig          # Only what distillation runs.
  tokenizer_sha256: str
  vocab_size: int                     # The tokenizer's (tables are padded).


def is_teacher_run(workdir: str) -> bool:
  """Whether ``workdir`` holds a run's metadata or an import's config (what
  ``read_teacher`` reads first)."""
  return (storage.isfile(os.path.join(workdir, RUN_META)) or
          checkpoint_lib.is_params_only(workdir))


def read_teacher(cfg, section: str = NAME, mobilebert: bool = False
                 ) -> TeacherRun:
  """Checks ``cfg.<section>.teacher_workdir`` and reads its run (a
  bertjax run, or an import of a transformers BERT). A run with MobileBERT's
  options teaches only with ``mobilebert`` (MobileBERT's student learns
  from an IB-BERT: objectives/mobilebert.py).

  Raises:
    TeacherError: the workdir is unset or missing, or has no run metadata
      or checkpoint, or its run is not a BERT-family MLM model this task
      can distill.
  """
  workdir = cfg[section].teacher_workdir
  field = f'{section}.teacher_workdir'
  if not workdir:
    raise TeacherError(
        f'{field} is empty: set it to the workdir of a '
        'finished bertjax run (objective.name="bert"), e.g. '
        f'--config.{field}=$WORK/bert-base.')
  if not storage.isdir(workdir):
    raise TeacherError(f'{field}={workdir!r} is not a '
                       'directory.')
  # A run's workdir, or an import of a transformers checkpoint
  # (experiments/import_hf.py: its config.json and step-0 parameters).
  imported = checkpoint_lib.is_params_only(workdir)
  meta_path = os.path.join(workdir, IMPORTED_CONFIG if imported else RUN_META)
  if not storage.isfile(meta_path):
    raise TeacherError(f'{field}={workdir!r} has no '
                       f'{RUN_META}: it is not the workdir of a bertjax run '
                       '(nor an import: experiments/import_hf.py).')
  step = checkpoint_lib.latest_step(os.path.join(workdir, CHECKPOINTS))
  if step is None:
    raise TeacherError(f'{field}={workdir!r} has no '
                       'checkpoint to restore the teacher from.')
  meta = json.loads(storage.read_text(meta_path))
  if imported:
    tokenizer_path = os.path.join(workdir, TOKENIZER_MODEL)
    meta = {'config': meta, 'tokenizer_sha256': storage.sha256(tokenizer_path),
            'vocab_size': tokenizer_lib.Tokenizer.load(
                tokenizer_path).vocab_size}
  saved = meta['config']
  teacher_objective = saved.get('objective', {}).get('name', 'bert')
  if teacher_objective != 'bert':
    raise TeacherError(
        f'{field}={workdir!r} holds an '
        f'objective.name={teacher_objective!r} run; the teacher '
        'must be a BERT-family MLM model (objective.name="bert").')
  teacher_model = model_config_lib.from_saved(saved.get('model', {}))
  if teacher_model.num_layer_groups:
    raise TeacherError(
        f'{field}={workdir!r} shares layers across '
        f'depth (model.num_layer_groups={teacher_model.num_layer_groups}'
        '); the student copies distinct teacher layers, so the teacher '
        'must have none shared.')
  options = model_config_lib.mobilebert_options(teacher_model)
  if options and not mobilebert:
    raise TeacherError(
        f'{field}={workdir!r} is a MobileBERT-style run '
        f'({", ".join(options)}); DistilBERT and TinyBERT students are '
        "built from BERT's layers: use a BERT run as the teacher.")
  if teacher_model.scan_layers:
    raise TeacherError(
        f'{field}={workdir!r} stacks its layers in one scan '
        '(model.scan_layers=True); a student learns from distinct teacher '
        'layers: export the teacher and import it back (experiments/'
        'export.py, experiments/import_hf.py), which unstacks them.')
  vocab_size = meta['vocab_size']
  # The compute dtype and attention kernel are this run's; the SBO, pooler
  # and NSP heads are neither run nor restored.
  teacher_model.dtype = cfg.model.dtype
  teacher_model.attention = cfg.model.attention
  model = dataclasses.replace(
      model_config_lib.encoder_config(teacher_model, vocab_size),
      with_pooler_nsp=False)
  return TeacherRun(workdir, step, model, meta['tokenizer_sha256'],
                    vocab_size)


def check_teacher(cfg, section: str, errors: list[str], use: str,
                  mobilebert: bool = False) -> TeacherRun | None:
  """The teacher run of ``cfg.<section>.teacher_workdir`` for a section's
  ``check``, or None with what is wrong appended to ``errors``: not a
  directory (``use`` says which run to give instead), or a run that cannot
  teach (``read_teacher``'s message). A directory that is not a run at all
  is left to ``prepare_config``, which says what it lacks."""
  workdir = cfg[section].teacher_workdir
  if not (workdir and storage.isdir(workdir)):
    errors.append(f'{section}.teacher_workdir={workdir!r} is not a '
                  f'directory; use {use}.')
    return None
  if not is_teacher_run(workdir):
    return None
  try:
    return read_teacher(cfg, section, mobilebert=mobilebert)
  except TeacherError as e:
    errors.append(str(e))
    return None


def check_teacher_tokenizer(model_path: str, teacher: TeacherRun) -> None:
  if (not storage.isfile(model_path) or
      storage.sha256(model_path) != teacher.tokenizer_sha256):
    raise TeacherError(
        f'data.tokenizer.model_path={model_path!r} is not the tokenizer the '
        f'teacher in {teacher.workdir!r} was trained with (sha256 '
        f'{teacher.tokenizer_sha256[:12]}); the student must read the '
        'teacher\'s tokens: set it to '
        f'{os.path.join(teacher.workdir, TOKENIZER_MODEL)!r}.')


def prepare_config(cfg, section: str = NAME, mobilebert: bool = False
                   ) -> ml_collections.ConfigDict:
  """``cfg`` set up to learn from its teacher; checks the teacher first.

  The student must read the teacher's tokens: an empty
  ``data.tokenizer.model_path`` becomes the teacher's saved tokenizer, and
  a set one must be the same model (sha256). The trainer loads the
  tokenizer before it builds the task, so the path only takes effect when
  this runs before that; the task itself only checks.

  Args:
    cfg: an experiment config with ``objective.name='distillation'`` (or
      the objective that owns ``section``).
    section: that objective's config section.
    mobilebert: whether a MobileBERT-style teacher may teach (as
      ``read_teacher``).

  Returns:
    A copy of ``cfg`` (references resolved) with the tokenizer path set.

  Raises:
    TeacherError: as ``read_teacher``, or when the tokenizer differs.
  """
  teacher = read_teacher(cfg, section, mobilebert)
  cfg = cfg.copy_and_resolve_references()
  tok = cfg.data.tokenizer
  if tok.model_path:
    check_teacher_tokenizer(tok.model_path, teacher)
  else:
    tok.model_path = os.path.join(teacher.workdir, TOKENIZER_MODEL)
  return cfg


def teacher_layers_for_student(teacher_layers: int, student_layers: int
                               ) -> tuple[int, ...]:
  """The teacher layer that initialises each student layer.

  Evenly spaced from the teacher's first layer to its last, halves rounded
  up. For 12 -> 6 these are layers 0, 2, 4, 7, 9, 11, the ones Hugging
  Face's ``scripts/extract_distilbert.py`` copies into DistilBERT: the
  paper's "one layer out of two", with the teacher's last layer kept (the
  cosine loss aligns the student's last hidden states with its output). A
  one-layer student starts from the first layer.
  """
  if not 1 <= student_layers <= teacher_layers:
    raise ValueError(f'a student of {student_layers} layers cannot be taken '
                     f'from a teacher of {teacher_layers}.')
  if student_layers == 1:
    return (0,)
  gaps = student_layers - 1
  # round(i * (T - 1) / (S - 1)) with halves up, in integers.
  return tuple((2 * i * (teacher_layers - 1) + gaps) // (2 * gaps)
               for i in range(student_layers))


def student_params_from_teacher(teacher: dict, layers: tuple[int, ...]
                                ) -> dict:
  """The student's parameters, copied from the teacher's (plain arrays).

  Student layer i is teacher layer ``layers[i]``; the embeddings lose their
  token-type table; the MLM head is the teacher's. Works on any array type
  (numpy, jax, tracers): it only selects leaves.
  """
  student = {'embeddings': {k: v for k, v in teacher['embeddings'].items()
                            if k != 'token_type'}}
  for i, source in enumerate(layers):
    student[f'layer_{i}'] = teacher[f'layer_{source}']
  for name in ('mlm_transform', 'mlm_norm', 'mlm_output_bias'):
    student[name] = teacher[name]
  return student


def student_config(cfg, teacher: bert_lib.BertConfig) -> bert_lib.BertConfig:
  """The teacher's architecture at the student's depth, with no token-type
  table, pooler, NSP or SBO head; dropout and dtypes from ``cfg.model``."""
  layers = cfg.distillation.student_layers or teacher.num_layers // 2
  m = cfg.model
  return dataclasses.replace(
      teacher, num_layers=layers, type_vocab_size=0, with_pooler_nsp=False,
      sbo_positions=0, hidden_dropout_rate=m.hidden_dropout_rate,
      attention_dropout_rate=m.attention_dropout_rate,
      dtype=jnp.dtype(m.dtype), param_dtype=jnp.dtype(m.param_dtype))


def _abstract_params(model: bert_lib.BertForPreTraining):
  """The model's boxed parameters as shapes (they depend on no input)."""
  ids = jnp.zeros((1, 1), jnp.int32)
  return jax.eval_shape(
      lambda: model.init(jax.random.key(0), ids, ids, ids, ids)['params'])


def restore_teacher_params(teacher: TeacherRun, abstract_params) -> dict:
  """The teacher's parameters at its latest step (process 0's, checked
  against its manifest), as host numpy arrays.

  Only the leaves of ``abstract_params`` (unboxed shapes and dtypes) are
  read: not the optimizer state, nor heads distillation does not run.
  """
  restore_args = jax.tree.map(
      lambda x: ocp.RestoreArgs(restore_type=np.ndarray, dtype=x.dtype),
      abstract_params)
  # The step process 0 read: a teacher still training commits new steps.
  step = distributed.process_zero_choice(teacher.step)
  directory = storage.absolute(os.path.join(teacher.workdir, CHECKPOINTS))
  try:
    checkpoint_lib.verify_on_every_process(os.path.join(directory, str(step)))
  except checkpoint_lib.CorruptCheckpointError as e:
    raise TeacherError(f'the teacher {teacher.workdir!r} cannot be read: '
                       f'{e}') from e
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.PyTreeCheckpointHandler()}) as manager:
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            item={'params': abstract_params},
            restore_args={'params': restore_args}, partial_restore=True)))
  params = restored['state']['params']
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
  if shapes(params) != shapes(abstract_params):
    raise TeacherError(f'the checkpoint at step {step} in '
                       f'{teacher.workdir!r} does not hold the model its '
                       f'{RUN_META} describes.')
  return params


def soft_target_kl(student_logits: jax.Array, teacher_logits: jax.Array,
                   weights: jax.Array, temperature: float):
  """T^2 x KL(teacher || student) at temperature T, mean over predictions.

  As Hugging Face's distiller: ``KLDivLoss(reduction='batchmean')`` of
  ``log_softmax(s / T)`` against ``softmax(t / T)`` over the selected
  positions, times T^2 (which keeps its gradients on the scale of the hard
  loss's, Hinton et al. 2015).

  Args:
    student_logits: float [B, P, V].
    teacher_logits: float [B, P, V].
    weights: float32 [B, P], 1 for real prediction slots, 0 for padding.
    temperature: T > 0.
  """
  log_p_teacher = jax.nn.log_softmax(
      teacher_logits.astype(jnp.float32) / temperature)
  log_p_student = jax.nn.log_softmax(
      student_logits.astype(jnp.float32) / temperature)
  kl = jnp.sum(jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student),
               axis=-1) * temperature**2
  total, count = jnp.sum(weights * kl), jnp.sum(weights)
  return total / jnp.maximum(count, 1.0), {'kl_loss_sum': total,
                                           'kl_count': count}


def hidden_cosine(student_hidden: jax.Array, teacher_hidden: jax.Array,
                  attention_mask: jax.Array):
  """Mean of 1 - cos(student, teacher) over non-pad tokens.

  As ``torch.nn.CosineEmbeddingLoss`` with target 1 on the last hidden
  states of the tokens the attention mask keeps.

  Args:
    student_hidden: float [B, L, D].
    teacher_hidden: float [B, L, D].
    attention_mask: int [B, L], 1 for real tokens.
  """
  s = student_hidden.astype(jnp.float32)
  t = teacher_hidden.astype(jnp.float32)
  cos = jnp.sum(s * t, axis=-1) / jnp.sqrt(
      (jnp.sum(s * s, axis=-1) + _COSINE_EPS) *
      (jnp.sum(t * t, axis=-1) + _COSINE_EPS))
  weights = attention_mask.astype(jnp.float32)
  total, count = jnp.sum(weights * (1.0 - cos)), jnp.sum(weights)
  return total / jnp.maximum(count, 1.0), {'cos_loss_sum': total,
                                           'cos_count': count}


def distillation_objective(student: dict, teacher: dict, batch: dict,
                           temperature: float, kl_weight: float,
                           mlm_weight: float, cosine_weight: float):
  """DistilBERT's loss from both models' outputs (``mlm_logits`` [B, P, V],
  ``sequence_output`` [B, L, D]) and the batch.

  Metric sums: ``kl_*``, ``cos_*``, the student's ``mlm_*`` and the
  teacher's ``teacher_mlm_*`` (its accuracy on the same predictions).
  """
  weights = batch['masked_weights']
  kl, metrics = soft_target_kl(student['mlm_logits'], teacher['mlm_logits'],
                               weights, temperature)
  mlm, mlm_metrics = losses.masked_lm(student['mlm_logits'],
                                      batch['masked_ids'], weights)
  cos, cos_metrics = hidden_cosine(student['sequence_output'],
                                   teacher['sequence_output'],
                                   batch['attention_mask'])
  _, teacher_metrics = losses.masked_lm(teacher['mlm_logits'],
                                        batch['masked_ids'], weights)
  metrics.update(mlm_metrics)
  metrics.update(cos_metrics)
  metrics.update({f'teacher_{k}': v for k, v in teacher_metrics.items()})
  return kl_weight * kl + mlm_weight * mlm + cosine_weight * cos, metrics


def _is_box(x) -> bool:
  return isinstance(x, nn.Partitioned)


def boxed_like(abstract, values, xp=jnp):
  """``values`` (plain arrays) in the boxes (logical names) of
  ``abstract``, cast to its dtypes (``xp``: jnp in a traced function, np
  for host arrays)."""
  return jax.tree.map(
      lambda box, value: box.replace_boxed(
          xp.asarray(value, box.value.dtype)),
      abstract, values, is_leaf=_is_box)


def restore_teacher_inputs(teacher: TeacherRun, teacher_boxes) -> dict:
  """The teacher's parameters as host arrays in ``teacher_boxes``' boxes:
  a task's ``init_inputs``."""
  values = restore_teacher_params(teacher, nn.unbox(teacher_boxes))
  return boxed_like(teacher_boxes, values, np)


def flops_per_token(cfg, student: bert_lib.BertConfig,
                    teacher: bert_lib.BertConfig) -> float:
  """Training FLOPs per real token: the student trained (MLM head on the
  masked fraction), plus the teacher's forward pass (encoder and MLM head),
  which has no backward."""
  s = cfg.data.max_seq_length
  p = flops.masked_fraction(cfg.masking, s)
  return 3 * flops.mlm_forward(student, s, p) + flops.mlm_forward(
      teacher, s, p)


def make_task(cfg, vocab_size: int) -> base.Task:
  """The student and its frozen teacher: ``params = {'student': ...,
  'teacher': ...}``; ``vocab_size`` is this run's tokenizer's.

  Restores the teacher now (see the module docstring for why).

  Raises:
    TeacherError: as ``prepare_config``; when this run's tokenizer was not
      set to the teacher's; when the teacher cannot serve this run's
      sequence length.
  """
  d = cfg.distillation   # Its values are checked by ``check``.
  teacher = read_teacher(cfg)
  model_path = cfg.data.tokenizer.model_path
  if not model_path:
    # The trainer has already loaded a tokenizer trained on the corpus.
    raise TeacherError(
        'data.tokenizer.model_path is "": this run tokenizes with a model '
        'trained on its corpus, but the student must read the teacher\'s '
        'tokens. Set --config.data.tokenizer.model_path='
        f'{os.path.join(teacher.workdir, TOKENIZER_MODEL)} '
        '(experiments/configs/distilbert.py sets it from '
        'distillation.teacher_workdir).')
  check_teacher_tokenizer(model_path, teacher)
  if teacher.vocab_size != vocab_size:
    raise TeacherError(f'the teacher in {teacher.workdir!r} has '
                       f'{teacher.vocab_size} vocabulary ids; this run '
                       f'has {vocab_size}.')
  if cfg.data.max_seq_length > teacher.model.max_position_embeddings:
    raise TeacherError(
        f'data.max_seq_length={cfg.data.max_seq_length} exceeds the '
        f'teacher\'s max_position_embeddings='
        f'{teacher.model.max_position_embeddings}.')
  student_cfg = student_config(cfg, teacher.model)
  if not 1 <= student_cfg.num_layers <= teacher.model.num_layers:
    raise TeacherError(
        f'distillation.student_layers={d.student_layers}: the student '
        f'copies its layers from the teacher\'s {teacher.model.num_layers}, '
        f'so it needs 1 to {teacher.model.num_layers} (0 = half).')
  layers = teacher_layers_for_student(teacher.model.num_layers,
                                      student_cfg.num_layers)
  teacher_model = bert_lib.BertForPreTraining(teacher.model)
  student_model = bert_lib.BertForPreTraining(student_cfg)
  teacher_boxes = _abstract_params(teacher_model)
  student_boxes = _abstract_params(student_model)

  def init(key, batch, teacher_params):
    del key, batch   # The student is a function of the teacher alone.
    return {'teacher': boxed_like(teacher_boxes, teacher_params),
            'student': boxed_like(student_boxes, student_params_from_teacher(
                teacher_params, layers))}

  def loss(params, batch, key, deterministic):
    inputs = base.model_inputs(batch)
    teacher_out = teacher_model.apply(
        {'params': jax.lax.stop_gradient(params['teacher'])}, *inputs,
        deterministic=True)
    student_out = student_model.apply(
        {'params': params['student']}, *inputs, deterministic=deterministic,
        rngs=None if deterministic else {'dropout': key})
    return distillation_objective(student_out, teacher_out, batch,
                                  d.temperature, d.kl_weight, d.mlm_weight,
                                  d.cosine_weight)

  def trainable(params):
    # One flag per parameter, a boxed one included: the trainer also asks
    # about the boxed parameters, and its optimizer state must have the
    # same leaves either way.
    flags = lambda tree, value: jax.tree.map(lambda _: value, tree,
                                             is_leaf=_is_box)
    return {'student': flags(params['student'], True),
            'teacher': flags(params['teacher'], False)}

  return base.Task(init, loss, trainable,
                   flops_per_token=flops_per_token(cfg, student_cfg,
                                                   teacher.model),
                   init_inputs=restore_teacher_inputs(teacher,
                                                      teacher_boxes))


def encoder_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The student: its teacher's architecture with ``student_layers``
  layers, read from the teacher's run (an imported student, with no
  teacher, carries it in the ``model`` section); ``vocab_size`` is the
  tokenizer's.

  Raises:
    TeacherError: as ``read_teacher``.
  """
  if not cfg.distillation.teacher_workdir:
    return student_config(cfg, model_config_lib.encoder_config(
        cfg.model, vocab_size))
  return student_config(cfg, read_teacher(cfg).model)


OBJECTIVE = registry.register(base.Objective(
    name=NAME, make_task=make_task, encoder_config=encoder_config,
    export_family=lambda cfg: 'distilbert', section='distillation',
    defaults=defaults, check=check, prepare_config=prepare_config,
    encoder_params=lambda params: params['student']))
