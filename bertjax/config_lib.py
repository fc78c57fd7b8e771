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

from bertjax import config_check
from bertjax import errors as errors_lib
from bertjax import objectives
from bertjax import optim
from bertjax import sharding as sharding_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import auxiliary
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
    ('act_intra', None),
    ('act_heads', 'tensor'),
    ('act_kv', None),
    ('act_mlp', 'tensor'),
    ('act_vocab', 'tensor'),
    ('act_predictions', None),
    ('vocab', 'tensor'),
    ('embed', 'fsdp'),
    ('factor', None),                 # ALBERT's embedding width E: small.
    ('intra', None),                  # MobileBERT's bottleneck I: small.
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

  c.model = model_config_lib.section()

  c.objective = ml_collections.ConfigDict()
  c.objective.name = 'bert'       # bertjax.objectives.names()
  c.objective.mlm_weight = 1.0
  c.objective.nsp_weight = 1.0    # 0 disables NSP (e.g. full_sentences).
  c.objective.sbo_weight = 0.0    # SpanBERT's span boundary objective.
  c.objective.sbo_count_offset = 1e-5  # SBO loss = sum / (targets +
                                  # this); spanbert.py: 1, SpanBERT's.

  # Each objective's own section (e.g. ``electra``, ``distillation``),
  # declared in its module (bertjax/objectives/).
  for name, objective in objectives.sections().items():
    c[name] = objective.defaults()

  # Self-supervised tasks beyond masking (data_pipelines/tasks/), each by
  # weight with its own knobs; and ERNIE 2.0's continual multi-task
  # schedule over streams of them (data_pipelines/continual.py).
  c.tasks = auxiliary.defaults()
  c.continual = auxiliary.continual_defaults()

  c.data = _data_section()
  c.masking = _masking_section()
  c.optimizer = _optimizer_section()
  c.sharding = _sharding_section()
  c.eval = ml_collections.ConfigDict()
  c.eval.num_batches = 20

  c.divergence = _divergence_section()
  c.log_every_steps = 100
  c.eval_every_steps = 10_000
  c.checkpoint_every_steps = 10_000
  c.keep_checkpoints = 3
  return c


def _data_section() -> ml_collections.ConfigDict:
  """The ``data`` section: corpus, tokenizer, layout and loader."""
  d = ml_collections.ConfigDict()
  d.corpus = corpus_config()
  # Several corpora (languages, domains) sampled with probabilities
  # proportional to (training tokens)^mixture_exponent: named components,
  # each a ``corpus_config()`` section, taken in sorted name order. Empty =
  # no mixture. When a mixture is set, ``data.corpus`` is ignored.
  d.mixture = ml_collections.ConfigDict()
  d.mixture_exponent = 0.7       # 1 natural shares, 0 uniform; 0.7 is
                                 # multilingual BERT's.
  d.tokenizer = ml_collections.ConfigDict()
  d.tokenizer.model_path = ''    # '' = train one on the corpus.
  d.tokenizer.vocab_size = 30522
  d.tokenizer.model_type = 'unigram'
  d.tokenizer.lowercase = False   # True: case-folded input (nmt_nfkc_cf),
                                  # as capitalization prediction needs.
  d.tokenizer.max_sentences = 2_000_000  # A seeded uniform sample of the
                                  # corpus's sentences (all, if fewer).
  d.tokenizer.sample_seed = 0     # Draws that sample.
  d.data_dir = default_data_dir()
  d.gazetteer_path = ''          # Entities/phrases for 'entity' masking.
  d.eval_fraction = 0.01
  d.split_seed = 0
  # Pre-tokenization (data_pipelines/shards.py): raw documents per shard
  # (the shard layout, and the cache key), and the processes that write
  # them (1 = the trainer's own; 0 = one per core). The bytes written do
  # not depend on the number of processes.
  d.docs_per_shard = 2000
  d.prepare_workers = 1
  d.layout = 'nsp'               # nsp | sop (ALBERT) | full_sentences |
                                 # doc_sentences (RoBERTa's) | ...
  d.max_seq_length = 128
  d.short_seq_prob = 0.1
  d.dupe_factor = 10             # Static masking: versions of the data.
  d.num_threads = 4
  d.num_workers = 0              # Grain worker processes (0 = none).
  d.prefetch_batches = 8
  return d


def _masking_section() -> ml_collections.ConfigDict:
  """The ``masking`` section (data_pipelines/masking/ says what each does)."""
  k = ml_collections.ConfigDict()
  k.strategy = 'token'
  k.rate = 0.15
  k.max_predictions_per_seq = 20
  k.mask_token_prob = 0.8
  k.random_token_prob = 0.1
  k.dynamic = False           # False: static, cycles dupe_factor.
  k.corruption_unit = 'token'  # token | unit (once per word/span).
  k.random_source = 'uniform'  # uniform | unigram (corpus counts).
  k.max_ngram = 3             # ngram: n <= max_ngram, P(n) ~ 1/n.
  k.span_geometric_p = 0.2    # span: length ~ Geometric(p) words,
  k.span_lower = 1            #   clipped to [lower, upper].
  k.span_upper = 10
  k.entity_mixture = (1 / 3, 1 / 3, 1 / 3)  # entity: ERNIE levels
                                            # (word, phrase, entity) per row.
  k.split_punctuation = False  # Word units: each punctuation piece a word
                              # of its own (BERT's basic tokenizer; off:
                              # it belongs to the word it is written on).
  k.audit_tolerance = 0.0     # > 0: fail when a realized rate
                              # drifts further from its setting.
  return k


def _optimizer_section() -> ml_collections.ConfigDict:
  """The ``optimizer`` section: google-research/bert's AdamWeightDecay."""
  o = ml_collections.ConfigDict()
  o.name = 'bert_adamw'     # bert_adamw | adamw | fairseq_adam | lamb
                            # (bertjax/optim.py says whose each is)
  o.schedule = 'bert_linear'  # | warmup_linear | electra | spanbert
  o.learning_rate = 1e-4
  o.warmup_steps = 10_000
  o.hold_steps = 0          # Updates at the peak lr before the schedule
                            # (its warmup, then decay) runs over the rest
                            # (MobileBERT's progressive transfer).
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-6
  o.weight_decay = 0.01
  o.decay_mask = 'bert'     # Which leaves decay: bert (kernels and
                            # embeddings, not biases or LayerNorm) | all
                            # (fairseq's Adam).
  o.grad_clip_norm = 1.0    # 0 = no clipping.
  o.grad_clip = 'global'    # global (one norm over every gradient) |
                            # per_tensor (BertAdam's, TinyBERT's).
  return o


def _sharding_section() -> ml_collections.ConfigDict:
  """The ``sharding`` section: the mesh and the logical-axis rules."""
  sh = ml_collections.ConfigDict()
  sh.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor) within a slice
                              # or node; -1 = the rest.
  sh.replicas = 1             # Leading data-parallel axis across
                              # TPU slices or GPU nodes (DCN).
  sh.rules = DEFAULT_RULES
  return sh


def _divergence_section() -> ml_collections.ConfigDict:
  """The ``divergence`` section: what a non-finite or spiking step does."""
  # Non-finite loss or gradients are found inside the step (no host sync):
  # the update is skipped (parameters, optimizer state and schedule stay as
  # they were) and counted. skip: halt after halt_after consecutive skipped
  # steps; halt: halt at the first. The host reads the counters where it
  # already waits for the step (logged steps, checkpoints), so a halt comes
  # at most log_every_steps late, and no checkpoint holds a non-finite state.
  dv = ml_collections.ConfigDict()
  dv.policy = 'skip'          # skip | halt
  dv.halt_after = 10
  # A finite loss above spike_factor x its running mean (an exponential
  # mean over about spike_window steps) is counted and logged; 0 = off.
  dv.spike_factor = 3.0
  dv.spike_window = 100
  return dv


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
  """``'size=large,phase=2'`` -> dict, over ``defaults``; unknown keys fail
  (any key, where a config takes no arg: no ``defaults``)."""
  values = dict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in values:
      takes = (f'use {", ".join(f"{k}=" for k in values)}' if values else
               'this config takes none: drop the ":..." after its path')
      raise ValueError(f'unknown config arg {key!r}; {takes}.')
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
  # A field of another source is not read: a path given without
  # source="files" would train on the embedded corpus without a word.
  for field, source in (('path', 'files'), ('tfds_name', 'tfds')):
    _check(corpus.source == source or not corpus[field],
           f'{prefix}.{field}={corpus[field]!r} is read only with '
           f'{prefix}.source="{source}", not {corpus.source!r}: set '
           f'{prefix}.source={source} (or leave {field} empty).', errors)
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
    elif name == 'continual.streams':   # Named stream sections.
      for stream in value:
        if isinstance(value[stream], ml_collections.ConfigDict):
          _check_types(value[stream], auxiliary.stream_defaults(),
                       f'{name}.{stream}.', errors)
        else:
          errors.append(f'{name}.{stream}={value[stream]!r}; use a section '
                        'built by objectives.auxiliary.stream_defaults().')
    elif isinstance(want, ml_collections.ConfigDict):
      _check_types(value, want, f'{name}.', errors, known_only)
    elif isinstance(want, tuple):
      _check_elements(name, value, want, errors)
  if not known_only:
    for key in cfg:
      _check(key in default, f'{prefix}{key} is not a field; use one of '
             f'{sorted(default)}.', errors)


def validate(cfg) -> None:
  """Raises ``errors.ConfigError`` listing every problem found in ``cfg``.

  Each section is checked on its own (the ``model`` section by
  bertjax/models/config.py, an objective's by its module), then the fields
  that constrain each other across sections, then the trap checks
  (config_check.py) once every field is valid.
  """
  errors: list[str] = []
  # Types first: the checks below compare values.
  _check_types(cfg, base_config(), '', errors)
  if errors:
    raise errors_lib.ConfigError('invalid config:\n  ' + '\n  '.join(errors))
  _check_run(cfg, errors)
  model_config_lib.check(cfg.model, errors)
  _check_data(cfg.data, errors)
  _check_masking(cfg.masking, errors)
  _check_objective(cfg, errors)
  auxiliary.check(cfg, errors)
  _check_optimizer(cfg.optimizer, cfg.total_steps, errors)
  _check_divergence(cfg.divergence, errors)
  _check_sharding(cfg.sharding, errors)
  _check_across_sections(cfg, errors)
  if not errors:   # Mixes of fields, once each field is valid on its own.
    errors.extend(config_check.errors_for(cfg))
  if errors:
    raise errors_lib.ConfigError('invalid config:\n  ' + '\n  '.join(errors))


def _check_run(cfg, errors: list[str]) -> None:
  """The top-level fields: seed, step count, batch, logging, init_from."""
  _check(0 <= cfg.seed < SEED_LIMIT, f'seed={cfg.seed} must be in [0, '
         '2**32): JAX keeps its low 32 bits, so seed and seed + 2**32 draw '
         'the same numbers.', errors)
  _check(cfg.step_rng in STEP_RNGS,
         f'step_rng={cfg.step_rng!r}; use one of {STEP_RNGS}.', errors)
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
  _check(cfg.eval.num_batches >= 1, f'eval.num_batches={cfg.eval.num_batches}'
         ' must be >= 1.', errors)
  _check(cfg.init_from == '' or os.path.isdir(cfg.init_from),
         f'init_from={cfg.init_from!r} is not a directory; use the workdir '
         "of an earlier run, or '' for none.", errors)


def _check_data(d, errors: list[str]) -> None:
  """The ``data`` section: layout, lengths, loader, tokenizer, corpora."""
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
  _check(d.docs_per_shard >= 1, f'data.docs_per_shard={d.docs_per_shard} '
         'must be >= 1 (documents per pre-tokenized shard).', errors)
  _check(d.prepare_workers >= 0, 'data.prepare_workers='
         f'{d.prepare_workers} must be >= 0 (0 = one per core).', errors)
  _check(d.num_workers >= 0, f'data.num_workers={d.num_workers} must be '
         '>= 0 (0 = no worker processes).', errors)
  _check(d.num_threads >= 1, f'data.num_threads={d.num_threads} must be '
         '>= 1.', errors)
  _check(d.prefetch_batches >= 0, 'data.prefetch_batches='
         f'{d.prefetch_batches} must be >= 0 (0 = no prefetching).', errors)
  _check(0 <= d.split_seed < COUNTER_LIMIT, f'data.split_seed={d.split_seed}'
         ' must be in [0, 2**63) (the pipeline hashes it as a 64-bit '
         'counter).', errors)
  _check(bool(d.data_dir), "data.data_dir='' must be set: use a directory "
         'for the tokenizer and tokenized data.', errors)
  _check_tokenizer(d.tokenizer, errors)
  _check(not d.gazetteer_path or os.path.isfile(d.gazetteer_path),
         f'data.gazetteer_path={d.gazetteer_path!r} does not exist; use a '
         "gazetteer file (one entity or phrase per line), or ''.", errors)
  _check_corpora(d, errors)


def _check_tokenizer(tok, errors: list[str]) -> None:
  """``data.tokenizer``: a model file, or what to train one with."""
  if tok.model_path:
    _check(os.path.isfile(tok.model_path), 'data.tokenizer.model_path='
           f'{tok.model_path!r} does not exist; use a SentencePiece model '
           "file, or '' to train one on the corpus.", errors)
    return
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
  _check(0 <= tok.sample_seed < 2**32, 'data.tokenizer.sample_seed='
         f'{tok.sample_seed} must be in [0, 2**32).', errors)


def _corpora(d) -> list:
  """The corpus sections a run reads: the mixture's, or ``data.corpus``."""
  mixture = d.get('mixture') or {}
  return list(mixture.values()) if mixture else [d.corpus]


def _check_corpora(d, errors: list[str]) -> None:
  """``data.corpus``, or the mixture's components and exponent."""
  mixture = d.get('mixture') or {}
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


def _check_masking(k, errors: list[str]) -> None:
  """The ``masking`` section (its rules live with the masking code)."""
  try:
    masking_lib.MaskingConfig.from_config(k).validate()
  except ValueError as e:
    errors.append(str(e))
  _check(k.audit_tolerance >= 0, f'masking.audit_tolerance='
         f'{k.audit_tolerance} must be >= 0 (0 = no audit).', errors)


def _check_objective(cfg, errors: list[str]) -> None:
  """``objective.*`` and the chosen objective's own section and checks."""
  o = cfg.objective
  if o.name in objectives.names():
    objectives.get(o.name).check(cfg, errors)
  else:
    errors.append(f'objective.name={o.name!r}; use one of '
                  f'{objectives.names()}.')
  for name in ('mlm_weight', 'nsp_weight', 'sbo_weight', 'sbo_count_offset'):
    _check(o[name] >= 0, f'objective.{name}={o[name]} must be >= 0.', errors)


def _check_optimizer(o, total_steps: int, errors: list[str]) -> None:
  """The ``optimizer`` section; warmup within the ``total_steps``."""
  _check(o.name in optim.OPTIMIZERS,
         f'optimizer.name={o.name!r}; use one of {optim.OPTIMIZERS}.', errors)
  _check(o.schedule in optim.SCHEDULES,
         f'optimizer.schedule={o.schedule!r}; use one of {optim.SCHEDULES}.',
         errors)
  _check(o.learning_rate > 0, f'optimizer.learning_rate={o.learning_rate} '
         'must be > 0.', errors)
  _check(o.schedule != 'constant' or not o.warmup_steps,
         f'optimizer.warmup_steps={o.warmup_steps} with optimizer.schedule='
         "'constant': a constant rate has no warmup; set warmup_steps=0.",
         errors)
  _check(0 <= o.warmup_steps <= total_steps,
         f'optimizer.warmup_steps={o.warmup_steps} must be in [0, '
         f'total_steps={total_steps}].', errors)
  if not 0 <= o.hold_steps <= total_steps:
    errors.append(f'optimizer.hold_steps={o.hold_steps} must be in [0, '
                  f'total_steps={total_steps}].')
  else:
    _check(o.warmup_steps <= total_steps - o.hold_steps,
           f'optimizer.warmup_steps={o.warmup_steps} with '
           f'optimizer.hold_steps={o.hold_steps}: the warmup runs after the '
           f'hold, so it must be at most total_steps - hold_steps = '
           f'{total_steps - o.hold_steps}.', errors)
  for name in ('b1', 'b2'):
    _check(0 <= getattr(o, name) < 1,
           f'optimizer.{name}={getattr(o, name)} must be in [0, 1).', errors)
  _check(o.eps > 0, f'optimizer.eps={o.eps} must be > 0.', errors)
  _check(o.weight_decay >= 0, f'optimizer.weight_decay={o.weight_decay} '
         'must be >= 0.', errors)
  _check(o.decay_mask in optim.DECAY_MASKS,
         f'optimizer.decay_mask={o.decay_mask!r}; use one of '
         f'{optim.DECAY_MASKS}.', errors)
  _check(o.grad_clip_norm >= 0, 'optimizer.grad_clip_norm='
         f'{o.grad_clip_norm} must be >= 0 (0 = no clipping).', errors)
  _check(o.grad_clip in optim.GRAD_CLIPS, f'optimizer.grad_clip='
         f'{o.grad_clip!r}; use one of {optim.GRAD_CLIPS}.', errors)


def _check_divergence(dv, errors: list[str]) -> None:
  """The ``divergence`` section: what a non-finite step or a spike does."""
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


def _check_sharding(sh, errors: list[str]) -> None:
  """The ``sharding`` section: mesh sizes, replicas, logical-axis rules."""
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


def _check_across_sections(cfg, errors: list[str]) -> None:
  """Fields that constrain each other across sections."""
  m, d, k, o = cfg.model, cfg.data, cfg.masking, cfg.objective
  _check(m.attend_across_documents or (
      d.layout == 'full_sentences' and o.name == 'bert'),
         'model.attend_across_documents=False separates the documents '
         'packed in a row, which only data.layout=full_sentences has ('
         + ('a doc_sentences row holds one document, so it would do '
            'nothing' if d.layout == 'doc_sentences' else
            f'in {d.layout!r} a [SEP] separates segments A and B, which '
            'must attend to each other') + '), and only for '
         'objective.name=bert; use True otherwise.', errors)
  _check(not m.scan_layers or (o.name == 'bert' and not m.num_layer_groups),
         'model.scan_layers=True needs objective.name=bert and no layer '
         'sharing (model.num_layer_groups=0): ELECTRA, distillation and '
         "ALBERT's shared layers address layers by name; use False "
         'otherwise.', errors)
  _check(o.name == 'bert' or not (m.layerdrop or m.pruned_heads),
         f'model.layerdrop={m.layerdrop} and model.pruned_heads='
         f'{tuple(m.pruned_heads)} with objective.name={o.name!r}: LayerDrop '
         "and pruned heads are the bert objective's encoder's (ELECTRA and "
         'distillation build their networks otherwise); use 0 and ().',
         errors)
  mobilebert = model_config_lib.mobilebert_options(m)
  _check(o.name in ('bert', 'mobilebert') or not mobilebert,
         f'{", ".join(mobilebert)} with objective.name={o.name!r}: '
         "MobileBERT's options are built for the bert objective's encoder "
         "and MobileBERT's student (ELECTRA and distillation build their "
         'networks otherwise); use their defaults, or objective.name=bert '
         'or mobilebert.', errors)
  _check(o.name == 'bert' or m.quantize == 'none',
         f'model.quantize={m.quantize!r} with objective.name={o.name!r}: '
         "8-bit training quantizes the bert objective's encoder and heads "
         '(ELECTRA and distillation build their networks otherwise); use '
         "'none'.", errors)
  _check(d.max_seq_length <= m.max_position_embeddings,
         f'data.max_seq_length={d.max_seq_length} exceeds '
         f'model.max_position_embeddings={m.max_position_embeddings}: the '
         'model has no position embedding beyond that. Lower '
         'data.max_seq_length or raise model.max_position_embeddings: '
         'data.max_seq_length must be <= model.max_position_embeddings.',
         errors)
  _check(not o.sbo_weight or m.sbo_positions >= 1,
         f'model.sbo_positions={m.sbo_positions}: the span boundary head '
         '(objective.sbo_weight > 0) needs at least one relative position; '
         'use >= 1 (SpanBERT uses 15).', errors)
  _check(d.layout not in instances_lib.PACKED_LAYOUTS or not o.nsp_weight,
         f'data.layout="{d.layout}" has no sentence pairs: use '
         'objective.nsp_weight=0.', errors)
  annotated = any(isinstance(c, ml_collections.ConfigDict)
                  and c.get('source') == 'files'
                  and c.get('text_format') == 'jsonl' for c in _corpora(d))
  _check(not k.split_punctuation or k.strategy != 'token',
         'masking.split_punctuation=True with masking.strategy="token": '
         'token masking has no word units to split; use a word strategy '
         '(whole_word, ngram, span, entity) or False.', errors)
  _check(k.strategy != 'entity' or bool(d.gazetteer_path) or annotated,
         'masking.strategy="entity" needs entity/phrase units: set '
         'data.gazetteer_path to a gazetteer file (one entity or phrase per '
         'line), or use a JSON Lines corpus with "spans" '
         '(data.corpus.text_format="jsonl").', errors)
  _check(k.max_predictions_per_seq <= d.max_seq_length,
         f'masking.max_predictions_per_seq={k.max_predictions_per_seq} '
         f'exceeds data.max_seq_length={d.max_seq_length}; it must be at '
         'most that.', errors)
