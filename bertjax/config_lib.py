"""The experiment config: every field with its default, and its checks.

Experiment files in ``experiments/configs/`` start from ``base_config()`` and
set what their paper sets. ``validate`` checks every value that can be
checked before any data is read or anything is compiled, and names the field
and the allowed values in its message.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import os

import ml_collections

from bertjax.models import bert as bert_lib
from bertjax.models import electra as electra_lib
from bertjax import config_check
from bertjax import optim
from bertjax import sharding as sharding_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import instances as instances_lib
from data_pipelines import masking as masking_lib
from data_pipelines import tokenizer as tokenizer_lib

# Logical axis -> mesh axes. Weights: FSDP over ``embed``, tensor parallel
# over heads/mlp/vocab. Activations: batch over (replica, data, fsdp).
DEFAULT_RULES = (
    ('act_batch', ('replica', 'data', 'fsdp')),
    ('act_len', None),
    ('act_embed', None),
    ('act_heads', 'tensor'),
    ('act_kv', None),
    ('act_mlp', 'tensor'),
    ('act_vocab', 'tensor'),
    ('act_predictions', None),
    ('vocab', 'tensor'),
    ('embed', 'fsdp'),
    ('factor', None),                 # ALBERT's embedding width E: small.
    ('mlp', 'tensor'),
    ('heads', 'tensor'),
    ('kv', None),
    ('qkv', None),
    ('pos', None),
    ('types', None),
    ('classes', None),
    ('layers', None),                 # Scanned layers' stacking axis.
)


# jax.random implementations of the train step's key (config.step_rng).
STEP_RNGS = ('threefry', 'rbg')

# What a non-finite loss or gradient does (config.divergence.policy).
DIVERGENCE_POLICIES = ('skip', 'halt')

# Objective families (bertjax/pretraining.py).
OBJECTIVES = ('bert', 'electra', 'distillation')

# Seeds: JAX keeps a seed's low 32 bits (without jax_enable_x64), so seed and
# seed + 2**32 would draw the same numbers.
SEED_LIMIT = 2**32
# data.split_seed: the input pipeline hashes it as a 64-bit counter.
COUNTER_LIMIT = 2**63


def default_data_dir() -> str:
  return os.environ.get('BERTJAX_DATA_DIR',
                        os.path.join(os.path.expanduser('~'), '.cache',
                                     'bertjax'))


def corpus_config(**overrides) -> ml_collections.ConfigDict:
  """A corpus section (``data.corpus`` or a ``data.mixture`` component).

  Args:
    **overrides: field values to set, e.g. ``source='files', path=...``.

  Returns:
    The section with every field of ``corpus.CorpusSpec``.
  """
  c = ml_collections.ConfigDict()
  c.source = 'embedded'               # embedded | files | tfds
  c.path = ''
  c.text_format = 'sentence_per_line'
  c.tfds_name = ''
  c.tfds_split = 'train'
  c.tfds_data_dir = ''
  c.max_documents = 0
  for key, value in overrides.items():
    if key not in c:
      raise ValueError(f'corpus_config: unknown field {key!r}; use one of '
                       f'{sorted(c)}.')
    c[key] = value
  return c


def base_config() -> ml_collections.ConfigDict:
  """All fields, with BERT-base phase-1 defaults (google-research/bert)."""
  c = ml_collections.ConfigDict()
  c.seed = 0                      # Every random draw derives from this.
  c.step_rng = 'threefry'         # The train step's random bits (dropout;
                                  # ELECTRA's masking and sampling).
                                  # threefry: the same bits on any mesh;
                                  # rbg: XLA's RngBitGenerator, far cheaper
                                  # on GPU, bits fixed by seed and mesh.
  c.batch_size = 256              # Global, over all hosts.
  c.total_steps = 1_000_000       # Length T of the lr schedule.
  c.num_train_steps = 0           # Stop at this global step (0 = total).
  c.init_from = ''                # A workdir whose latest state starts a run
                                  # that has no checkpoint of its own.

  c.model = ml_collections.ConfigDict()
  c.model.size = 'base'           # bertjax.models.bert.SIZES
  c.model.hidden_size = 0         # 0 = from size.
  c.model.num_layers = 0
  c.model.num_heads = 0
  c.model.intermediate_size = 0
  c.model.embedding_size = 0      # ALBERT's E; 0 = hidden_size (no projection).
  c.model.num_layer_groups = 0    # ALBERT's sharing: 1 = all layers share
                                  # one set of weights; 0 = none shared.
  c.model.sbo_positions = 200     # SBO head's relative positions (SpanBERT);
                                  # the head exists when sbo_weight > 0.
  c.model.max_position_embeddings = 512
  c.model.type_vocab_size = 2
  c.model.hidden_dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.layer_norm_epsilon = 1e-12  # BERT's; fairseq's RoBERTa uses 1e-5.
  c.model.gelu = 'tanh'           # tanh (BERT's approximation) | exact (erf:
                                  # fairseq's RoBERTa; ELECTRA always).
  c.model.dtype = 'float32'       # Compute dtype: float32 | bfloat16.
  c.model.param_dtype = 'float32'
  c.model.remat = 'none'          # none | full | dots: recompute each layer's
                                  # activations in the backward pass.
  c.model.scan_layers = False     # One nn.scan over stacked layer weights
                                  # (compiles one layer); bert objective,
                                  # no layer sharing.
  c.model.attend_across_documents = True  # False: packed documents
                                  # (full_sentences) attend only to themselves.
  c.model.attention = 'xla'       # xla | cudnn | auto: the fused attention
                                  # kernel where no attention dropout is
                                  # active; auto is cuDNN on GPU in bfloat16,
                                  # else XLA (cuDNN is not yet measured).

  c.objective = ml_collections.ConfigDict()
  c.objective.name = 'bert'       # bert | electra | distillation
  c.objective.mlm_weight = 1.0
  c.objective.nsp_weight = 1.0    # 0 disables NSP (e.g. full_sentences).
  c.objective.sbo_weight = 0.0    # SpanBERT's span boundary objective.

  # ELECTRA (objective.name='electra'); Clark et al. 2020 and
  # google-research/electra. The generator has the discriminator's depth
  # times layers_fraction and its width times hidden_fraction, and shares
  # its token and position embeddings; masking and sampling happen inside
  # the step.
  c.electra = ml_collections.ConfigDict()
  c.electra.generator_hidden_fraction = 0.25
  c.electra.generator_layers_fraction = 1.0
  c.electra.mask_prob = 0.15          # N = int((mask_prob + 0.005) * L).
  c.electra.mask_token_prob = 0.85    # [MASK]; the rest kept, none random.
  c.electra.temperature = 1.0         # Gumbel-max sampling temperature.
  c.electra.generator_weight = 1.0
  c.electra.discriminator_weight = 50.0

  # DistilBERT (objective.name='distillation'); Sanh et al. 2019. The
  # teacher is the latest checkpoint of another bertjax run; the student has
  # its width and student_layers layers (0 = half), initialised from every
  # other teacher layer.
  c.distillation = ml_collections.ConfigDict()
  c.distillation.teacher_workdir = ''
  c.distillation.student_layers = 0
  c.distillation.temperature = 2.0
  c.distillation.kl_weight = 5.0
  c.distillation.mlm_weight = 2.0
  c.distillation.cosine_weight = 1.0

  c.data = ml_collections.ConfigDict()
  c.data.corpus = corpus_config()
  # Several corpora (languages, domains) sampled with probabilities
  # proportional to (training tokens)^mixture_exponent: named components,
  # each a ``corpus_config()`` section, taken in sorted name order. Empty =
  # no mixture. When a mixture is set, ``data.corpus`` is ignored.
  c.data.mixture = ml_collections.ConfigDict()
  c.data.mixture_exponent = 0.7       # 1 natural shares, 0 uniform; 0.7 is
                                      # multilingual BERT's.
  c.data.tokenizer = ml_collections.ConfigDict()
  c.data.tokenizer.model_path = ''    # '' = train one on the corpus.
  c.data.tokenizer.vocab_size = 30522
  c.data.tokenizer.model_type = 'unigram'
  c.data.tokenizer.max_sentences = 2_000_000
  c.data.data_dir = default_data_dir()
  c.data.gazetteer_path = ''          # Entities/phrases for 'entity' masking.
  c.data.eval_fraction = 0.01
  c.data.split_seed = 0
  c.data.layout = 'nsp'               # nsp | sop (ALBERT) | full_sentences
  c.data.max_seq_length = 128
  c.data.short_seq_prob = 0.1
  c.data.dupe_factor = 10             # Static masking: versions of the data.
  c.data.num_threads = 4
  c.data.num_workers = 0              # Grain worker processes (0 = none).
  c.data.prefetch_batches = 8

  c.masking = ml_collections.ConfigDict()
  c.masking.strategy = 'token'
  c.masking.rate = 0.15
  c.masking.max_predictions_per_seq = 20
  c.masking.mask_token_prob = 0.8
  c.masking.random_token_prob = 0.1
  c.masking.dynamic = False           # False: static, cycles dupe_factor.
  c.masking.corruption_unit = 'token'  # token | unit (once per word/span).
  c.masking.random_source = 'uniform'  # uniform | unigram (corpus counts).
  c.masking.max_ngram = 3             # ngram: n <= max_ngram, P(n) ~ 1/n.
  c.masking.span_geometric_p = 0.2    # span: length ~ Geometric(p) words,
  c.masking.span_lower = 1            #   clipped to [lower, upper].
  c.masking.span_upper = 10
  c.masking.entity_mixture = (1 / 3, 1 / 3, 1 / 3)  # entity: ERNIE levels
                                      # (word, phrase, entity) per row.
  c.masking.audit_tolerance = 0.0     # > 0: fail when a realized rate
                                      # drifts further from its setting.

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = 'bert_adamw'     # bert_adamw | adamw | lamb (ALBERT)
  c.optimizer.schedule = 'bert_linear'  # | warmup_linear | electra
  c.optimizer.learning_rate = 1e-4
  c.optimizer.warmup_steps = 10_000
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.grad_clip_norm = 1.0    # 0 = no clipping.

  c.sharding = ml_collections.ConfigDict()
  c.sharding.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor) within a slice
                                      # or node; -1 = the rest.
  c.sharding.replicas = 1             # Leading data-parallel axis across
                                      # TPU slices or GPU nodes (DCN).
  c.sharding.rules = DEFAULT_RULES

  c.eval = ml_collections.ConfigDict()
  c.eval.num_batches = 20

  # Non-finite loss or gradients are found inside the step (no host sync):
  # the update is skipped (parameters, optimizer state and schedule stay as
  # they were) and counted. skip: halt after halt_after consecutive skipped
  # steps; halt: halt at the first. The host reads the counters where it
  # already waits for the step (logged steps, checkpoints), so a halt comes
  # at most log_every_steps late, and no checkpoint holds a non-finite state.
  c.divergence = ml_collections.ConfigDict()
  c.divergence.policy = 'skip'          # skip | halt
  c.divergence.halt_after = 10
  # A finite loss above spike_factor x its running mean (an exponential
  # mean over about spike_window steps) is counted and logged; 0 = off.
  c.divergence.spike_factor = 3.0
  c.divergence.spike_window = 100

  c.log_every_steps = 100
  c.eval_every_steps = 10_000
  c.checkpoint_every_steps = 10_000
  c.keep_checkpoints = 3
  return c


def load_config_file(spec: str):
  """``path.py[:arg]`` -> the file's ``get_config(arg)`` (a config file in
  experiments/configs, loaded by path); ValueError if there is none."""
  path, _, arg = spec.partition(':')
  if not (path.endswith('.py') and os.path.isfile(path)):
    raise ValueError(f'{spec!r} is not a config file (path.py[:arg]).')
  module_spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def parse_arg(arg: str | None, **defaults) -> dict:
  """``'size=large,phase=2'`` -> dict, over ``defaults``; unknown keys fail."""
  values = dict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in values:
      raise ValueError(f'unknown config arg {key!r}; use '
                       f'{", ".join(f"{k}=" for k in values)}.')
    values[key] = value
  return values


def demo_config() -> ml_collections.ConfigDict:
  """A tiny BERT sized for a CPU (experiments/configs/demo.py says why)."""
  c = base_config()
  c.model.size = 'tiny'
  c.model.max_position_embeddings = 128
  c.data.tokenizer.vocab_size = 2000
  c.data.eval_fraction = 0.03
  c.data.max_seq_length = 128
  c.data.num_threads = 2
  c.masking.dynamic = True
  c.batch_size = 32
  c.total_steps = 1200
  c.optimizer.learning_rate = 1e-3
  c.optimizer.warmup_steps = 100
  c.log_every_steps = 50
  c.eval_every_steps = 300
  c.checkpoint_every_steps = 300
  c.eval.num_batches = 8
  return c


def bert_paper_config(size: str = 'base', phase: int = 1
                      ) -> ml_collections.ConfigDict:
  """google-research/bert's pretraining settings (see configs/bert.py)."""
  if phase not in (1, 2):
    raise ValueError(f'phase={phase}; use 1 (seq 128) or 2 (seq 512).')
  c = base_config()
  c.model.size = size
  c.batch_size = 256
  c.total_steps = 1_000_000
  c.optimizer.learning_rate = 1e-4
  c.optimizer.warmup_steps = 10_000
  if phase == 1:
    c.num_train_steps = 900_000
    c.data.max_seq_length = 128
    c.masking.max_predictions_per_seq = 20
  else:
    c.num_train_steps = 1_000_000
    c.data.max_seq_length = 512
    c.masking.max_predictions_per_seq = 80
  return c


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """A config an earlier run saved (``run_meta.json``), with the fields
  added since at their defaults."""
  merged = base_config().to_dict()

  def merge(into: dict, values: dict) -> None:
    for key, value in values.items():
      if isinstance(value, dict) and isinstance(into.get(key), dict):
        merge(into[key], value)
      else:
        into[key] = value

  merge(merged, saved)
  return ml_collections.ConfigDict(merged)


def model_config(cfg, vocab_size: int) -> bert_lib.BertConfig:
  """The encoder's hyperparameters; ``vocab_size`` is already padded."""
  m = cfg.model
  overrides = {k: getattr(m, k) for k in ('hidden_size', 'num_layers',
                                          'num_heads', 'intermediate_size')
               if getattr(m, k)}
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return bert_lib.BertConfig.from_size(
      m.size, vocab_size=vocab_size,
      max_position_embeddings=m.max_position_embeddings,
      type_vocab_size=m.type_vocab_size,
      embedding_size=m.embedding_size, num_layer_groups=m.num_layer_groups,
      sbo_positions=m.sbo_positions if cfg.objective.sbo_weight else 0,
      hidden_dropout_rate=m.hidden_dropout_rate,
      attention_dropout_rate=m.attention_dropout_rate,
      dtype=jnp.dtype(m.dtype), param_dtype=jnp.dtype(m.param_dtype),
      remat=m.remat, attend_across_documents=m.attend_across_documents,
      gelu_approximate=m.gelu == 'tanh',
      layer_norm_epsilon=m.layer_norm_epsilon,
      scan_layers=m.scan_layers, attention_impl=attention_impl(cfg),
      **overrides)


def attention_impl(cfg) -> str:
  """``model.attention`` resolved for this backend: 'auto' is cuDNN's
  fused attention on GPU in bfloat16 where the head size allows it."""
  m = cfg.model
  if m.attention != 'auto':
    return m.attention
  import jax  # pylint: disable=g-import-not-at-top
  _, hidden, heads = bert_lib.SIZES[m.size]
  head_dim = (m.hidden_size or hidden) // (m.num_heads or heads)
  usable = (jax.default_backend() == 'gpu' and m.dtype == 'bfloat16'
            and head_dim % 8 == 0 and head_dim <= 128)
  return 'cudnn' if usable else 'xla'


def _check(condition: bool, message: str, errors: list[str]) -> None:
  if not condition:
    errors.append(message)


def _check_corpus(prefix: str, corpus, errors: list[str]) -> None:
  """The checks of one corpus section that need no file or dataset."""
  fields = sorted(corpus_config())
  if not isinstance(corpus, ml_collections.ConfigDict):
    errors.append(f'{prefix} is a {type(corpus).__name__}; it must be a '
                  'corpus section: build it with config_lib.corpus_config().')
    return
  if sorted(corpus) != fields:
    errors.append(f'{prefix} has the fields {sorted(corpus)}; a corpus '
                  f'section has {fields}: use config_lib.corpus_config() '
                  'to build it.')
    return
  _check(corpus.source in corpus_lib.SOURCES,
         f'{prefix}.source={corpus.source!r}; use one of '
         f'{corpus_lib.SOURCES}.', errors)
  _check(corpus.max_documents >= 0, f'{prefix}.max_documents='
         f'{corpus.max_documents} must be >= 0 (0 = all).', errors)
  if corpus.source == 'files':
    _check(corpus.text_format in corpus_lib.TEXT_FORMATS,
           f'{prefix}.text_format={corpus.text_format!r}; use one of '
           f'{corpus_lib.TEXT_FORMATS}.', errors)
    _check(bool(corpus.path), f'{prefix}.source="files" needs {prefix}.path:'
           ' use a directory, a file or a glob of text files.', errors)
  if corpus.source == 'tfds':
    # corpus.read_tfds's form; whether the dataset exists is TFDS's to say.
    name, colon, feature = corpus.tfds_name.rpartition(':')
    _check(bool(colon and name and feature),
           f'{prefix}.tfds_name={corpus.tfds_name!r} must look like '
           '"name[/config][:version]:feature"; use e.g. '
           '"wikipedia/20230601.en:text".', errors)
    _check(bool(corpus.tfds_split), f'{prefix}.tfds_split=\'\' names no '
           "split; use one, e.g. 'train'.", errors)


def _wanted(default) -> str:
  """What a field whose default is ``default`` must hold, in words."""
  if isinstance(default, bool):
    return 'True or False'
  if isinstance(default, int):
    return 'an integer'
  if isinstance(default, float):
    return 'a finite number'
  if isinstance(default, str):
    return 'a string'
  if isinstance(default, tuple):
    return 'a tuple'
  return 'a section (an ml_collections.ConfigDict)'


def _has_type(value, default) -> bool:
  """Whether ``value`` can stand for ``default``: the same kind of value,
  an int where a float is (never a bool where a number is), a list where a
  tuple is (JSON has no tuples), and floats finite."""
  if isinstance(default, bool):
    return isinstance(value, bool)
  if isinstance(value, bool):
    return False
  if isinstance(default, int):
    return isinstance(value, numbers.Integral)
  if isinstance(default, float):
    return isinstance(value, numbers.Real) and math.isfinite(value)
  if isinstance(default, str):
    return isinstance(value, str)
  if isinstance(default, tuple):
    return isinstance(value, (tuple, list))
  return isinstance(value, ml_collections.ConfigDict)


def _type_message(name: str, value, default) -> str:
  if isinstance(value, float) and isinstance(default, float):
    return f'{name}={value!r} is not finite; use a finite number.'
  return (f'{name}={value!r} has type {type(value).__name__}; use '
          f'{_wanted(default)}.')


def _check_elements(name: str, value, default: tuple,
                    errors: list[str]) -> None:
  """The elements of a tuple field: sharding.rules' pairs, or each element
  of the kind of the default's (mesh sizes, mixture weights)."""
  if name == 'sharding.rules':
    for rule in value:
      pair = isinstance(rule, (tuple, list)) and len(rule) == 2
      axes = rule[1] if pair else None
      _check(pair and isinstance(rule[0], str)
             and (axes is None or isinstance(axes, str)
                  or (isinstance(axes, (tuple, list))
                      and all(isinstance(a, str) for a in axes))),
             f'sharding.rules holds {rule!r}; use (logical axis, mesh axes) '
             'pairs, the mesh axes a name, a tuple of names or None, as in '
             'config_lib.DEFAULT_RULES.', errors)
    return
  if len({type(v) for v in default}) != 1:
    return
  for i, element in enumerate(value):
    if not _has_type(element, default[0]):
      errors.append(_type_message(f'{name}[{i}]', element, default[0]))


def _check_types(cfg, default, prefix: str, errors: list[str],
                 known_only: bool = False) -> None:
  """Each field of the section ``cfg`` has the type of its ``default`` (the
  same section of ``base_config()``); unless ``known_only``, every field is
  there and no other is (a misspelt field in a config file would otherwise
  be ignored)."""
  for key in default:
    name = f'{prefix}{key}'
    if key not in cfg:
      if not known_only:
        errors.append(f'{name} is missing; use a config built from '
                      'config_lib.base_config().')
      continue
    value, want = cfg[key], default[key]
    if not _has_type(value, want):
      errors.append(_type_message(name, value, want))
    elif name == 'data.mixture':   # Named corpus sections.
      for component in value:
        if isinstance(value[component], ml_collections.ConfigDict):
          # Missing or extra fields are _check_corpus's to report.
          _check_types(value[component], corpus_config(),
                       f'{name}.{component}.', errors, known_only=True)
    elif isinstance(want, ml_collections.ConfigDict):
      _check_types(value, want, f'{name}.', errors, known_only)
    elif isinstance(want, tuple):
      _check_elements(name, value, want, errors)
  if not known_only:
    for key in cfg:
      _check(key in default, f'{prefix}{key} is not a field; use one of '
             f'{sorted(default)}.', errors)


def validate(cfg) -> None:
  """Raises ValueError listing every problem found in ``cfg``."""
  errors: list[str] = []
  # Types first: the checks below compare values.
  _check_types(cfg, base_config(), '', errors)
  if errors:
    raise ValueError('invalid config:\n  ' + '\n  '.join(errors))
  m, d, k, o = cfg.model, cfg.data, cfg.masking, cfg.optimizer
  _check(0 <= cfg.seed < SEED_LIMIT, f'seed={cfg.seed} must be in [0, '
         '2**32): JAX keeps its low 32 bits, so seed and seed + 2**32 draw '
         'the same numbers.', errors)
  _check(m.size in bert_lib.SIZES,
         f'model.size={m.size!r}; use one of {sorted(bert_lib.SIZES)}.',
         errors)
  dims = ('hidden_size', 'num_layers', 'num_heads', 'intermediate_size')
  for name in dims:
    _check(m[name] >= 0, f'model.{name}={m[name]} must be >= 0 (0 = '
           'model.size\'s).', errors)
  if m.size in bert_lib.SIZES and min(m[name] for name in dims) >= 0:
    layers, hidden, heads = bert_lib.SIZES[m.size]
    layers = m.num_layers or layers
    hidden, heads = m.hidden_size or hidden, m.num_heads or heads
    _check(hidden % heads == 0, f'model.hidden_size={hidden} must be '
           f'divisible by model.num_heads={heads}.', errors)
    _check(0 <= m.num_layer_groups <= layers,
           f'model.num_layer_groups={m.num_layer_groups} must be in [0, '
           f'{layers}] (the number of layers): 0 shares nothing, 1 shares '
           'one set of weights across all layers.', errors)
  _check(m.embedding_size >= 0,
         f'model.embedding_size={m.embedding_size} must be >= 0 (0 = the '
         'hidden size, no factorization).', errors)
  _check(m.sbo_positions >= 0, f'model.sbo_positions={m.sbo_positions} '
         'must be >= 0 (SpanBERT uses 200).', errors)
  _check(m.max_position_embeddings >= 1, 'model.max_position_embeddings='
         f'{m.max_position_embeddings} must be >= 1.', errors)
  _check(m.type_vocab_size >= 0, 'model.type_vocab_size='
         f'{m.type_vocab_size} must be >= 0 (0 = no token-type embedding; '
         'BERT uses 2).', errors)
  _check(m.layer_norm_epsilon > 0, 'model.layer_norm_epsilon='
         f'{m.layer_norm_epsilon} must be > 0 (BERT uses 1e-12, RoBERTa '
         '1e-5).', errors)
  _check(m.gelu in ('tanh', 'exact'),
         f"model.gelu={m.gelu!r}; use 'tanh' (BERT) or 'exact' (RoBERTa).",
         errors)
  _check(m.dtype in ('float32', 'bfloat16'),
         f'model.dtype={m.dtype!r}; use float32 or bfloat16.', errors)
  _check(m.attend_across_documents or (
      d.layout == 'full_sentences' and cfg.objective.name == 'bert'),
         'model.attend_across_documents=False separates the documents '
         'packed in a row, which only data.layout=full_sentences has (in '
         f'{d.layout!r} a [SEP] separates segments A and B, which must '
         'attend to each other), and only for objective.name=bert; use '
         'True otherwise.', errors)
  _check(not m.scan_layers or (cfg.objective.name == 'bert'
                                and not m.num_layer_groups),
         'model.scan_layers=True needs objective.name=bert and no layer '
         'sharing (model.num_layer_groups=0): ELECTRA, distillation and '
         "ALBERT's shared layers address layers by name; use False "
         'otherwise.', errors)
  _check(cfg.step_rng in STEP_RNGS,
         f'step_rng={cfg.step_rng!r}; use one of {STEP_RNGS}.', errors)
  _check(m.attention in ('auto',) + bert_lib.ATTENTION_IMPLS,
         f'model.attention={m.attention!r}; use auto or one of '
         f'{bert_lib.ATTENTION_IMPLS}.', errors)
  if m.attention == 'cudnn':
    import jax  # pylint: disable=g-import-not-at-top
    _check(jax.default_backend() == 'gpu' and m.dtype == 'bfloat16',
           "model.attention='cudnn' needs a GPU and model.dtype='bfloat16' "
           f'(here: {jax.default_backend()}, {m.dtype}); use auto or xla.',
           errors)
  _check(m.remat in bert_lib.REMAT,
         f'model.remat={m.remat!r}; use one of {bert_lib.REMAT}.', errors)
  _check(m.param_dtype in ('float32', 'bfloat16'),
         f'model.param_dtype={m.param_dtype!r}; use float32 or bfloat16.',
         errors)
  for name in ('hidden_dropout_rate', 'attention_dropout_rate'):
    value = getattr(m, name)
    _check(0 <= value < 1, f'model.{name}={value} must be in [0, 1).',
           errors)
  _check(d.max_seq_length <= m.max_position_embeddings,
         f'data.max_seq_length={d.max_seq_length} exceeds '
         f'model.max_position_embeddings={m.max_position_embeddings}: the '
         'model has no position embedding beyond that. Lower '
         'data.max_seq_length or raise model.max_position_embeddings: '
         'data.max_seq_length must be <= model.max_position_embeddings.',
         errors)
  _check(d.max_seq_length >= 8, f'data.max_seq_length={d.max_seq_length} '
         'must be at least 8.', errors)
  _check(d.layout in instances_lib.LAYOUTS,
         f'data.layout={d.layout!r}; use one of {instances_lib.LAYOUTS}.',
         errors)
  _check(0 <= d.short_seq_prob <= 1,
         f'data.short_seq_prob={d.short_seq_prob} must be in [0, 1].', errors)
  _check(0 < d.eval_fraction < 1,
         f'data.eval_fraction={d.eval_fraction} must be in (0, 1).', errors)
  _check(d.dupe_factor >= 1, f'data.dupe_factor={d.dupe_factor} must be '
         '>= 1.', errors)
  _check(d.num_workers >= 0, f'data.num_workers={d.num_workers} must be '
         '>= 0 (0 = no worker processes).', errors)
  _check(d.num_threads >= 1, f'data.num_threads={d.num_threads} must be '
         '>= 1.', errors)
  _check(d.prefetch_batches >= 0, 'data.prefetch_batches='
         f'{d.prefetch_batches} must be >= 0 (0 = no prefetching).', errors)
  _check(0 <= d.split_seed < COUNTER_LIMIT, f'data.split_seed={d.split_seed}'
         ' must be in [0, 2**63) (the pipeline hashes it as a 64-bit '
         'counter).', errors)
  _check(cfg.objective.name in OBJECTIVES,
         f'objective.name={cfg.objective.name!r}; use one of {OBJECTIVES}.',
         errors)
  if cfg.objective.name == 'electra':
    e = cfg.electra
    _check(0 < e.mask_prob < 1,
           f'electra.mask_prob={e.mask_prob} must be in (0, 1).', errors)
    _check(electra_lib.num_slots(e.mask_prob, d.max_seq_length) >= 1,
           f'electra.mask_prob={e.mask_prob} with data.max_seq_length='
           f'{d.max_seq_length} gives no prediction slots '
           '(int((mask_prob + 0.005) * L) = 0); use a mask_prob that gives '
           'one (ELECTRA uses 0.15).', errors)
    _check(0 <= e.mask_token_prob <= 1,
           f'electra.mask_token_prob={e.mask_token_prob} must be in [0, 1].',
           errors)
    _check(e.temperature > 0,
           f'electra.temperature={e.temperature} must be > 0.', errors)
    for name in ('generator_weight', 'discriminator_weight'):
      _check(e[name] >= 0, f'electra.{name}={e[name]} must be >= 0.', errors)
    _check(bool(e.generator_weight or e.discriminator_weight),
           f'electra.generator_weight={e.generator_weight} and '
           f'electra.discriminator_weight={e.discriminator_weight}: the loss '
           'is 0; use weights > 0 (ELECTRA uses 1 and 50).', errors)
    fractions = ('generator_hidden_fraction', 'generator_layers_fraction')
    for name in fractions:
      _check(0 < e[name] <= 1, f'electra.{name}={e[name]} must be in (0, 1]'
             ': the generator is at most as wide and deep as the '
             'discriminator.', errors)
    if (m.size in bert_lib.SIZES and min(m[name] for name in dims) >= 0
        and all(0 < e[name] <= 1 for name in fractions)):
      layers, hidden, heads = bert_lib.SIZES[m.size]
      discriminator = bert_lib.BertConfig(
          vocab_size=1, hidden_size=m.hidden_size or hidden,
          num_layers=m.num_layers or layers, num_heads=m.num_heads or heads)
      try:   # Its rules: a layer, a unit, a width its heads divide.
        electra_lib.generator_config(discriminator,
                                     e.generator_hidden_fraction,
                                     e.generator_layers_fraction)
      except ValueError as error:
        errors.append(f'{error} Use fractions whose generator has a layer '
                      'and a width that its heads (width // 64) divide.')
  if cfg.objective.name == 'distillation':
    t = cfg.distillation
    _check(t.temperature > 0,
           f'distillation.temperature={t.temperature} must be > 0.', errors)
    weights = ('kl_weight', 'mlm_weight', 'cosine_weight')
    for name in weights:
      _check(t[name] >= 0, f'distillation.{name}={t[name]} must be >= 0.',
             errors)
    _check(any(t[name] for name in weights),
           'distillation.kl_weight, distillation.mlm_weight and '
           'distillation.cosine_weight are all 0: the loss is 0; use '
           'weights > 0 (DistilBERT uses 5, 2 and 1).', errors)
    _check(t.student_layers >= 0, 'distillation.student_layers='
           f'{t.student_layers} must be >= 0 (0 = half the teacher\'s).',
           errors)
    # pretraining.prepare_config reads the teacher's run itself.
    _check(bool(t.teacher_workdir) and os.path.isdir(t.teacher_workdir),
           f'distillation.teacher_workdir={t.teacher_workdir!r} is not a '
           'directory; use the workdir of a finished bertjax run '
           '(objective.name=bert), e.g. $WORK/bert-base.', errors)
  for name in ('mlm_weight', 'nsp_weight', 'sbo_weight'):
    value = cfg.objective[name]
    _check(value >= 0, f'objective.{name}={value} must be >= 0.', errors)
  _check(not cfg.objective.sbo_weight or m.sbo_positions >= 1,
         f'model.sbo_positions={m.sbo_positions}: the span boundary head '
         '(objective.sbo_weight > 0) needs at least one relative position; '
         'use >= 1 (SpanBERT uses 200).', errors)
  _check(d.layout != 'full_sentences' or not cfg.objective.nsp_weight,
         'data.layout="full_sentences" has no sentence pairs: use '
         'objective.nsp_weight=0.', errors)
  _check(bool(d.data_dir), "data.data_dir='' must be set: use a directory "
         'for the tokenizer and tokenized data.', errors)
  tok = d.tokenizer
  if not tok.model_path:
    _check(tok.model_type in tokenizer_lib.MODEL_TYPES,
           f'data.tokenizer.model_type={tok.model_type!r}; use one of '
           f'{tokenizer_lib.MODEL_TYPES}.', errors)
    _check(tok.vocab_size > tokenizer_lib.NUM_SPECIAL + 1,
           f'data.tokenizer.vocab_size={tok.vocab_size} is too small: it '
           f'must be > {tokenizer_lib.NUM_SPECIAL + 1} (the special pieces '
           'and one more).', errors)
    _check(tok.max_sentences >= 1, 'data.tokenizer.max_sentences='
           f'{tok.max_sentences} must be >= 1 (sentences to train the '
           'tokenizer on).', errors)
  else:
    _check(os.path.isfile(tok.model_path), 'data.tokenizer.model_path='
           f'{tok.model_path!r} does not exist; use a SentencePiece model '
           "file, or '' to train one on the corpus.", errors)
  _check(not d.gazetteer_path or os.path.isfile(d.gazetteer_path),
         f'data.gazetteer_path={d.gazetteer_path!r} does not exist; use a '
         "gazetteer file (one entity or phrase per line), or ''.", errors)
  mixture = d.get('mixture') or {}
  corpora = list(mixture.values()) if mixture else [d.corpus]
  annotated = any(isinstance(c, ml_collections.ConfigDict)
                  and c.get('source') == 'files'
                  and c.get('text_format') == 'jsonl' for c in corpora)
  _check(k.strategy != 'entity' or bool(d.gazetteer_path) or annotated,
         'masking.strategy="entity" needs entity/phrase units: set '
         'data.gazetteer_path to a gazetteer file (one entity or phrase per '
         'line), or use a JSON Lines corpus with "spans" '
         '(data.corpus.text_format="jsonl").', errors)
  if mixture:
    _check(len(mixture) >= 2, f'data.mixture has one component '
           f'({", ".join(mixture)}); a mixture needs at least 2. Add '
           'another, or leave data.mixture empty and set data.corpus.',
           errors)
    for name in sorted(mixture):
      _check_corpus(f'data.mixture.{name}', mixture[name], errors)
  else:
    _check_corpus('data.corpus', d.corpus, errors)
  exponent = d.get('mixture_exponent', 1.0)
  _check(0 <= exponent <= 1, f'data.mixture_exponent={exponent} must be in '
         '[0, 1] (1 = natural shares, 0 = uniform).', errors)
  try:
    masking_lib.MaskingConfig.from_config(cfg.masking).validate()
  except ValueError as e:
    errors.append(str(e))
  _check(k.audit_tolerance >= 0, f'masking.audit_tolerance='
         f'{k.audit_tolerance} must be >= 0 (0 = no audit).', errors)
  _check(k.max_predictions_per_seq <= d.max_seq_length,
         f'masking.max_predictions_per_seq={k.max_predictions_per_seq} '
         f'exceeds data.max_seq_length={d.max_seq_length}; it must be at '
         'most that.', errors)
  _check(o.name in optim.OPTIMIZERS,
         f'optimizer.name={o.name!r}; use one of {optim.OPTIMIZERS}.', errors)
  _check(o.schedule in optim.SCHEDULES,
         f'optimizer.schedule={o.schedule!r}; use one of {optim.SCHEDULES}.',
         errors)
  _check(o.learning_rate > 0, f'optimizer.learning_rate={o.learning_rate} '
         'must be > 0.', errors)
  _check(0 <= o.warmup_steps <= cfg.total_steps,
         f'optimizer.warmup_steps={o.warmup_steps} must be in [0, '
         f'total_steps={cfg.total_steps}].', errors)
  for name in ('b1', 'b2'):
    _check(0 <= getattr(o, name) < 1,
           f'optimizer.{name}={getattr(o, name)} must be in [0, 1).', errors)
  _check(o.eps > 0, f'optimizer.eps={o.eps} must be > 0.', errors)
  _check(o.weight_decay >= 0, f'optimizer.weight_decay={o.weight_decay} '
         'must be >= 0.', errors)
  _check(o.grad_clip_norm >= 0, 'optimizer.grad_clip_norm='
         f'{o.grad_clip_norm} must be >= 0 (0 = no clipping).', errors)
  _check(cfg.total_steps >= 1, f'total_steps={cfg.total_steps} must be '
         '>= 1.', errors)
  _check(0 <= cfg.num_train_steps <= cfg.total_steps,
         f'num_train_steps={cfg.num_train_steps} must be in [0, '
         f'total_steps={cfg.total_steps}] (0 = total_steps).', errors)
  _check(cfg.batch_size >= 1, f'batch_size={cfg.batch_size} must be >= 1.',
         errors)
  for name in ('log_every_steps', 'eval_every_steps',
               'checkpoint_every_steps', 'keep_checkpoints'):
    _check(getattr(cfg, name) >= 1, f'{name}={getattr(cfg, name)} must be '
           '>= 1.', errors)
  dv = cfg.divergence
  _check(dv.policy in DIVERGENCE_POLICIES,
         f'divergence.policy={dv.policy!r}; use one of '
         f'{DIVERGENCE_POLICIES}.', errors)
  _check(dv.halt_after >= 1, f'divergence.halt_after={dv.halt_after} must '
         'be >= 1 (consecutive non-finite steps before the run halts).',
         errors)
  _check(dv.spike_factor == 0 or dv.spike_factor > 1,
         f'divergence.spike_factor={dv.spike_factor} must be > 1 (a loss '
         'that many times its running mean is a spike) or 0 (off).', errors)
  _check(dv.spike_window >= 1, f'divergence.spike_window='
         f'{dv.spike_window} must be >= 1 (steps).', errors)
  _check(cfg.eval.num_batches >= 1, f'eval.num_batches={cfg.eval.num_batches}'
         ' must be >= 1.', errors)
  sh = cfg.sharding
  _check(len(sh.mesh_shape) == 3 and all(
      isinstance(v, int) and (v >= 1 or v == -1) for v in sh.mesh_shape)
         and list(sh.mesh_shape).count(-1) <= 1,
         f'sharding.mesh_shape={tuple(sh.mesh_shape)} must be three sizes '
         '(data, fsdp, tensor), each >= 1 or one -1 ("the rest").', errors)
  _check(isinstance(sh.replicas, int) and sh.replicas >= 1,
         f'sharding.replicas={sh.replicas} must be an integer >= 1.', errors)
  for logical, axes in sh.rules:
    named = (axes,) if isinstance(axes, str) else tuple(axes or ())
    _check(all(a in sharding_lib.MESH_AXES for a in named),
           f'sharding.rules maps {logical!r} to {axes!r}; use mesh axes '
           f'from {sharding_lib.MESH_AXES}, or None.', errors)
  _check(cfg.init_from == '' or os.path.isdir(cfg.init_from),
         f'init_from={cfg.init_from!r} is not a directory; use the workdir '
         "of an earlier run, or '' for none.", errors)
  if not errors:   # Mixes of fields, once each field is valid on its own.
    errors.extend(config_check.errors_for(cfg))
  if errors:
    raise ValueError('invalid config:\n  ' + '\n  '.join(errors))
