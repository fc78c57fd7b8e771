"""bertjax <-> transformers: weights round trip exactly, logits agree."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax.interop import hf_convert
from bertjax import runs as runs_lib
from bertjax import storage
from bertjax.models import bert as bert_lib
from bertjax.models import electra as electra_models
from bertjax.objectives import distillation
from bertjax.objectives import electra as electra_objective
from bertjax.objectives import tinybert

VOCAB = 500          # Not a multiple of 128: bertjax pads its tables.
LENGTH = 16
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=40, pad_token_id=0)
# family -> (class, config class, config) of a small random model.
MODELS = {
    'bert': (transformers.BertForPreTraining, transformers.BertConfig,
             dict(_COMMON, hidden_act='gelu_new')),
    'roberta': (transformers.RobertaForMaskedLM, transformers.RobertaConfig,
                dict(_COMMON, layer_norm_eps=1e-5, type_vocab_size=1,
                     max_position_embeddings=41)),
    'albert': (transformers.AlbertForPreTraining, transformers.AlbertConfig,
               dict(_COMMON, embedding_size=16, num_hidden_groups=1,
                    hidden_act='gelu_new')),
    'distilbert': (transformers.DistilBertForMaskedLM,
                   transformers.DistilBertConfig,
                   dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2,
                        hidden_dim=64, max_position_embeddings=40,
                        activation='gelu', pad_token_id=0)),
    'electra': (transformers.ElectraForPreTraining,
                transformers.ElectraConfig,
                dict(_COMMON, embedding_size=16, hidden_act='gelu')),
    'electra_generator': (transformers.ElectraForMaskedLM,
                          transformers.ElectraConfig,
                          dict(_COMMON, embedding_size=16, hidden_size=8,
                               num_attention_heads=1, intermediate_size=32,
                               hidden_act='gelu')),
}


def _save_random(name, directory):
  model_class, config_class, config = MODELS[name]
  torch.manual_seed(len(name))
  model = model_class(config_class(**config)).eval()
  model.save_pretrained(directory)
  return model


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """Each random model saved once: name -> (model, directory)."""
  out = {}
  for name in MODELS:
    directory = str(tmp_path_factory.mktemp(name))
    out[name] = (_save_random(name, directory), directory)
  # ELECTRA's networks share one embedding table, as ELECTRA trains them.
  discriminator, generator = out['electra'][0], out['electra_generator'][0]
  generator.electra.embeddings.load_state_dict(
      discriminator.electra.embeddings.state_dict())
  generator.save_pretrained(out['electra_generator'][1])
  return out


def _batch(seed=0):
  """[2, LENGTH] ids, token types and a mask with padding in row 1."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (2, LENGTH))
  ids[:, 0], ids[:, -1], ids[1, 12:] = 2, 3, 0
  types = np.zeros((2, LENGTH), np.int64)
  types[0, 8:] = 1
  mask = (ids != 0).astype(np.int64)
  return ids, types, mask


def _import(saved, family):
  if family == 'electra':
    return hf_convert.import_model(saved['electra'][1],
                                   saved['electra_generator'][1])
  return hf_convert.import_model(saved[family][1])


@pytest.mark.parametrize('family', ['bert', 'roberta', 'albert',
                                    'distilbert', 'electra'])
def test_import_then_export_reproduces_the_checkpoint(saved, family):
  imported = _import(saved, family)
  assert imported.family == family and imported.vocab_size == VOCAB
  parts = ({'discriminator': 'electra', 'generator': 'electra_generator'}
           if family == 'electra' else {None: family})
  for part, name in parts.items():
    original = hf_convert.read_state_dict(saved[name][1])
    exported = hf_convert.hf_state_dict(imported.params, imported.config,
                                        family, imported.vocab_size, part)
    # The file holds every tensor once; tied decoders may be left out of it.
    tied = set(hf_convert.TIED.get((family, part),
                                   hf_convert.TIED.get(family, ())))
    assert set(original) - tied == set(exported) - tied
    for key, value in original.items():
      if family == 'roberta' and key.endswith('position_embeddings.weight'):
        # Rows below RoBERTa's offset (pad_token_id + 1) are never read;
        # bertjax keeps the rest and writes the unused row as zeros, which
        # is what transformers initialises it to (padding_idx).
        assert np.array_equal(exported[key][1:], value[1:]), key
        assert not exported[key][0].any()
        continue
      assert exported[key].dtype == value.dtype, key
      assert np.array_equal(exported[key], value), key


def _apply(model, params, *args, method=None):
  """``model.apply`` as one compiled program (run op by op, it would
  compile a program per operation and shape)."""
  return jax.jit(lambda p, *a: model.apply({'params': p}, *a, method=method)
                 )(params, *args)


def _bertjax_logits(imported, ids, types, mask, part=None):
  """The imported model's own forward: float32 logits, vocabulary trimmed."""
  cfg, vocab = imported.config, imported.vocab_size
  model_cfg = hf_convert.encoder_config(cfg, vocab)
  args = (jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
  positions = jnp.tile(jnp.arange(LENGTH)[None], (ids.shape[0], 1))
  if imported.family == 'electra':
    disc, gen = electra_objective.model_configs(cfg, model_cfg.vocab_size)
    model = electra_models.Electra(disc, gen)
    if part == 'generator':
      out = _apply(model, imported.params, *args, positions,
                   method=electra_models.Electra.generate)
      return {'logits': np.asarray(out)[..., :vocab]}
    return {'logits': np.asarray(_apply(
        model, imported.params, *args,
        method=electra_models.Electra.discriminate))}
  params = imported.params
  if imported.family == 'distilbert':
    params = params['student']
  if imported.family == 'roberta':   # RobertaForMaskedLM has neither.
    model_cfg = dataclasses.replace(model_cfg, with_pooler_nsp=False)
  # SpanBERT's SBO head (not exported) needs span starts; any will do.
  out = _apply(bert_lib.BertForPreTraining(model_cfg), params, *args,
               positions, positions)
  logits = {'logits': np.asarray(out['mlm_logits'])[..., :vocab]}
  if 'nsp_logits' in out and imported.family in ('bert', 'albert'):
    logits['nsp'] = np.asarray(out['nsp_logits'])
  return logits


def _hf_logits(model, family, ids, types, mask, hidden=False):
  """The heads' logits by name, or (``hidden``) the last hidden states."""
  inputs = {'input_ids': torch.tensor(ids),
            'attention_mask': torch.tensor(mask)}
  if family != 'distilbert':
    inputs['token_type_ids'] = torch.tensor(
        types if family != 'roberta' else np.zeros_like(types))
  with torch.no_grad():
    out = model(**inputs, output_hidden_states=hidden)
  if hidden:
    return out.hidden_states[-1].numpy()
  if family in ('bert', 'albert'):
    return {'logits': out.prediction_logits.numpy(),
            'nsp': (out.seq_relationship_logits if family == 'bert'
                    else out.sop_logits).numpy()}
  return {'logits': out.logits.numpy()}


@pytest.mark.parametrize('name', ['bert', 'roberta', 'albert', 'distilbert',
                                  'electra', 'electra_generator'])
def test_imported_forward_matches_transformers(saved, name):
  family = 'electra' if name.startswith('electra') else name
  part = {'electra': 'discriminator',
          'electra_generator': 'generator'}.get(name)
  imported = _import(saved, family)
  ids, types, mask = _batch()
  if family == 'roberta':
    types = np.zeros_like(types)   # type_vocab_size=1.
  ours = _bertjax_logits(imported, ids, types, mask, part)
  theirs = _hf_logits(saved[name][0], family, ids, types, mask)
  real = mask.astype(bool)
  for key in theirs:
    a, b = ours[key], theirs[key]
    if a.ndim >= 2 and a.shape[1] == LENGTH:
      a, b = a[real], b[real]    # Padded positions' outputs are unused.
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4, err_msg=key)


def test_missing_tensors_are_named(saved, tmp_path):
  state = hf_convert.read_state_dict(saved['bert'][1])
  del state['bert.encoder.layer.1.output.dense.weight']
  config = os.path.join(saved['bert'][1], 'config.json')
  directory = tmp_path / 'broken'
  directory.mkdir()
  (directory / 'config.json').write_text(open(config).read())
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  st_numpy.save_file(state, str(directory / 'model.safetensors'))
  with pytest.raises(hf_convert.ConversionError,
                     match='layer.1.output.dense.weight'):
    hf_convert.import_model(str(directory))


def test_an_untied_decoder_is_refused(tmp_path):
  """bertjax's MLM decoder is the word table: a checkpoint with its own
  would lose it on import."""
  model_class, config_class, config = MODELS['bert']
  torch.manual_seed(0)
  model_class(config_class(**config, tie_word_embeddings=False)
              ).save_pretrained(str(tmp_path))
  with pytest.raises(hf_convert.ConversionError, match='is not tied'):
    hf_convert.import_model(str(tmp_path))


def test_unknown_architecture_is_refused(tmp_path):
  (tmp_path / 'config.json').write_text(
      '{"architectures": ["GPT2LMHeadModel"]}')
  with pytest.raises(hf_convert.ConversionError, match='GPT2LMHeadModel'):
    hf_convert.import_model(str(tmp_path))


# ---------------------------------------------------------------------------
# Runs: bertjax -> transformers -> bertjax, then pretraining goes on.


def _train_tiny(workdir, data_dir, preset=None, arg=None, **fields):
  """A 2-step run of ``preset`` (default: the demo) at the tiny size: 2
  layers unless ``fields`` say otherwise (a layer more or less maps the same
  way; twelve would only cost compile time)."""
  import preset_helpers  # pylint: disable=g-import-not-at-top
  from bertjax import config_lib  # pylint: disable=g-import-not-at-top
  from bertjax import train  # pylint: disable=g-import-not-at-top
  cfg = (preset_helpers.load_preset(preset, arg) if preset
         else config_lib.demo_config())
  cfg.data.corpus = config_lib.demo_config().data.corpus
  preset_helpers.set_fields(cfg, {
      **preset_helpers.TINY, 'model.num_layers': 2,
      'data.data_dir': str(data_dir), 'total_steps': 2, 'num_train_steps': 0,
      'log_every_steps': 2, 'eval_every_steps': 2, 'checkpoint_every_steps': 2,
      'optimizer.warmup_steps': 1, **fields})
  train.train_and_evaluate(cfg, str(workdir))
  return str(workdir)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('data')


@pytest.mark.e2e
def test_imported_checkpoint_continues_pretraining(runs, data_dir, tmp_path):
  """A run exported to transformers and imported back starts a new run
  from exactly its parameters (a step at lr 1e-30 changes nothing)."""
  import preset_helpers  # pylint: disable=g-import-not-at-top
  from bertjax import train  # pylint: disable=g-import-not-at-top
  from data_pipelines import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  run = runs_lib.load_run(runs['demo'])
  exported = str(tmp_path / 'exported')
  hf_convert.write_model(
      exported, hf_convert.hf_state_dict(run.params, run.config, 'bert',
                                         run.vocab_size),
      hf_convert.hf_config(run.config, 'bert', run.vocab_size))
  config_path = hf_convert.write_import(
      hf_convert.import_model(exported),
      tokenizer_lib.Tokenizer.load(run.tokenizer_path),
      str(tmp_path / 'imported'), source=exported)
  cfg = preset_helpers.load_preset('imported', config_path)
  assert cfg.init_from == str(tmp_path / 'imported')
  preset_helpers.set_fields(cfg, {
      **preset_helpers.TINY_DATA, 'data.data_dir': str(data_dir),
      'total_steps': 1, 'log_every_steps': 1, 'eval_every_steps': 1,
      'checkpoint_every_steps': 1, 'optimizer.learning_rate': 1e-30,
      'optimizer.warmup_steps': 0})
  train.train_and_evaluate(cfg, str(tmp_path / 'continued'))
  continued = runs_lib.load_run(str(tmp_path / 'continued'))
  assert continued.step == 1
  vocab = run.vocab_size
  for (path, a), b in zip(
      jax.tree_util.tree_flatten_with_path(continued.params)[0],
      jax.tree.leaves(run.params)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape[:1] == (tokenizer_lib.padded_vocab_size(vocab),):
      # Rows past the tokenizer's vocabulary are unreachable: the import
      # zeroes them.
      a, b = a[:vocab], b[:vocab]
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  # The import teaches a TinyBERT student as the run itself would: its
  # config, tokenizer and parameters restored from the import.
  student = preset_helpers.set_fields(
      preset_helpers.load_preset('tinybert', 'size=demo'), {
          **preset_helpers.TINY_DATA, 'model.num_layers': 1,
          'model.hidden_size': 16, 'model.intermediate_size': 32,
          'tinybert.teacher_workdir': str(tmp_path / 'imported')})
  student = distillation.prepare_config(student, tinybert.NAME)
  teacher = tinybert.make_task(student, vocab).init_inputs
  kernel = ('layer_1', 'ffn', 'wi', 'kernel')
  np.testing.assert_array_equal(
      _get_path(teacher, kernel).value, _get_path(run.params, kernel))


def _get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_import_into_an_existing_directory_is_refused(saved, tmp_path):
  imported = hf_convert.import_model(saved['bert'][1])
  (tmp_path / 'taken').mkdir()
  (tmp_path / 'taken' / 'keep.txt').write_text('mine')
  with pytest.raises(hf_convert.ConversionError, match='exists'):
    hf_convert.write_import(imported, None, str(tmp_path / 'taken'),
                            source='x')
  assert (tmp_path / 'taken' / 'keep.txt').read_text() == 'mine'


# family -> (preset, arg, fields) of the tiny runs exported below.
RUNS = {
    'bert': ('spanbert', None, {}),   # Its SBO head is left out.
    'roberta': ('roberta', 'size=base', {'data.max_seq_length': 32,
                                         'masking.max_predictions_per_seq': 5,
                                         'model.max_position_embeddings': 32,
                                         'batch_size': 8}),
    'albert': ('albert', 'size=base', {'model.embedding_size': 16,
                                       'model.num_layers': 3}),
    'electra': ('electra', 'size=small', {}),
}


@pytest.fixture(scope='module')
def runs(tmp_path_factory, data_dir):
  """Tiny trained runs, by family, and the demo's (``demo``), which is also
  the distillation student's teacher."""
  root = tmp_path_factory.mktemp('runs')
  out = {name: _train_tiny(root / name, data_dir, preset, arg, **fields)
         for name, (preset, arg, fields) in RUNS.items()}
  out['demo'] = _train_tiny(root / 'demo', data_dir)
  out['distilbert'] = _train_tiny(
      root / 'distilbert', data_dir, 'distilbert', None,
      **{'distillation.teacher_workdir': out['demo'],
         'distillation.student_layers': 1})
  # A narrower, shallower student; its first step intermediate-layer, its
  # second prediction-layer distillation.
  out['tinybert'] = _train_tiny(
      root / 'tinybert', data_dir, 'tinybert', 'size=demo',
      **{'tinybert.teacher_workdir': out['demo'], 'model.num_layers': 1,
         'model.hidden_size': 16, 'model.intermediate_size': 32,
         'tinybert.intermediate_steps': 1})
  return out


SENTENCES = ['The module provides a way of using operating system dependent '
             'functionality.', 'Return the number of items in a container.',
             '  Leading spaces,  doubled  spaces and digits 12345.']


# Runs exported as another family than their name: a TinyBERT student is a
# BERT (its teacher and projections are left out).
EXPORTED_AS = {'tinybert': 'bert'}


@pytest.mark.e2e
@pytest.mark.parametrize('name', ['bert', 'roberta', 'albert', 'electra',
                                  'distilbert', 'tinybert'])
def test_exported_run_loads_in_transformers_with_equal_logits(
    runs, name, tmp_path):
  from data_pipelines import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  family = EXPORTED_AS.get(name, name)
  run = runs_lib.load_run(runs[name])
  assert hf_convert.family_of(run.config) == family
  if name in EXPORTED_AS:
    run = dataclasses.replace(run, params=run.params['student'])
  out = str(tmp_path / 'exported')
  written = hf_convert.export_run(runs[name], out)
  parts = (('discriminator', 'generator') if family == 'electra'
           else (None,))
  assert written == [os.path.join(out, p) if p else out for p in parts]
  ours_tokenizer = tokenizer_lib.Tokenizer.load(run.tokenizer_path)
  imported = hf_convert.Imported(family, run.config, run.params,
                                 run.vocab_size)
  ids, types, mask = _batch()
  ids = np.where(ids < run.vocab_size, ids, 7)
  if family == 'roberta':
    types = np.zeros_like(types)
  for part, directory in zip(parts, written):
    architecture = hf_convert.ARCHITECTURES[(family, part)]
    model, info = getattr(transformers, architecture).from_pretrained(
        directory, output_loading_info=True)
    assert not info['missing_keys'] and not info['unexpected_keys'], info
    model.eval()
    ours = _bertjax_logits(imported, ids, types, mask, part)
    theirs = _hf_logits(model, family, ids, types, mask)
    real = mask.astype(bool)
    for key in theirs:
      a, b = ours[key], theirs[key]
      if a.ndim >= 2 and a.shape[1] == LENGTH:
        a, b = a[real], b[real]
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-4, err_msg=key)
    if part != 'generator':   # The encoder fine-tuning starts from.
      np.testing.assert_allclose(
          _finetune_encoder_output(runs[name], ids, types, mask)[real],
          _hf_logits(model, family, ids, types, mask, hidden=True)[real],
          rtol=0, atol=1e-4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    for a_text, b_text in zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1]):
      a_ids, b_ids = (list(x) for x in ours_tokenizer.encode([a_text,
                                                               b_text]))
      assert tokenizer(a_text)['input_ids'] == [2] + a_ids + [3]
      assert tokenizer(a_text, b_text)['input_ids'] == (
          [2] + a_ids + [3] + b_ids + [3])
    readme = open(os.path.join(directory, 'README.md')).read()
    assert ('span boundary' in readme) == (name == 'bert')
    assert ('projections' in readme) == (name == 'tinybert')


def _finetune_encoder_output(workdir, ids, types, mask):
  """The last hidden states [B, L, D] of the encoder that fine-tuning
  loads from ``workdir`` (bertjax.finetune.load_pretrained)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from bertjax import finetune  # pylint: disable=g-import-not-at-top
  from bertjax.models import heads  # pylint: disable=g-import-not-at-top
  pretrained = finetune.load_pretrained(workdir)
  model = heads.DownstreamModel(pretrained.model, 'token', 2)
  ids, types, mask = (jnp.asarray(x) for x in (ids, types, mask))
  params = dict(nn.unbox(jax.jit(model.init)(jax.random.key(0), ids, types,
                                              mask))['params'])
  params.update(pretrained.params)
  return np.asarray(_apply(
      model, params, ids, types, mask,
      method=lambda m, a, b, c: bert_lib.run_layers(
          m.cfg, m.layers, m.embeddings(a, b, True), a, c, True)))


def test_export_never_overwrites(runs, tmp_path):
  (tmp_path / 'out').mkdir()
  with pytest.raises(hf_convert.ConversionError, match='exists'):
    hf_convert.export_run(runs['bert'], str(tmp_path / 'out'))


def test_a_pair_run_is_not_exported_as_roberta(runs):
  """NSP pairs' second segments are type 1, which RoBERTa never gives
  (the demo is BERT's MLM and NSP)."""
  cfg = runs_lib.load_run(runs['demo']).config
  cfg.model.gelu = 'exact'
  with pytest.raises(hf_convert.ConversionError, match='sentence pairs'):
    hf_convert.check_family(cfg, 'roberta')


@pytest.mark.parametrize('field, value, message', [
    ('layer_norm_epsilon', 1e-5, 'epsilon 1e-12'),
    ('num_layer_groups', 1, 'no shared layers')])
def test_a_distilbert_student_transformers_cannot_hold_is_refused(
    runs, tmp_path, monkeypatch, field, value, message):
  """transformers' DistilBERT fixes epsilon at 1e-12 (a RoBERTa-preset
  teacher's 1e-5 gave logits 9e-4 apart) and has BERT's layers."""
  encoder = hf_convert.encoder_config
  monkeypatch.setattr(hf_convert, 'encoder_config', lambda *a: (
      dataclasses.replace(encoder(*a), **{field: value})))
  with pytest.raises(hf_convert.ConversionError, match=message):
    hf_convert.export_run(runs['distilbert'], str(tmp_path / 'out'))
  assert not os.listdir(tmp_path)


def test_tanh_gelu_run_is_not_exported_as_roberta(runs, tmp_path):
  cfg = runs_lib.load_run(runs['roberta']).config
  cfg.model.gelu = 'tanh'
  with pytest.raises(hf_convert.ConversionError, match="family 'bert'"):
    hf_convert.check_family(cfg, 'roberta')
  hf_convert.check_family(cfg, 'bert')


def test_a_failed_upload_to_a_bucket_leaves_no_export(runs, gcs_bucket,
                                                      monkeypatch):
  out = f'{gcs_bucket}/export-{os.getpid()}'
  upload, uploaded = storage.upload, []

  def fail_on_the_third(path, target):
    if len(uploaded) == 2:
      raise OSError('the network went away')
    upload(path, target)
    uploaded.append(os.path.basename(target))
  monkeypatch.setattr(storage, 'upload', fail_on_the_third)
  with pytest.raises(OSError, match='went away'):
    hf_convert.export_run(runs['bert'], out)
  assert 'config.json' not in uploaded   # A loader's entry point comes last.
  assert storage.find(out) == {}
  monkeypatch.setattr(storage, 'upload', upload)
  hf_convert.export_run(runs['bert'], out)   # The retry is not refused.
  assert storage.exists(f'{out}/config.json')
  storage.rmtree(out)


def test_albert_sharing_without_factorization_exports_an_identity_projection():
  # transformers' ALBERT always has embedding_hidden_mapping_in; a bertjax
  # model of hidden-wide embeddings has none, and exports it as identity.
  import preset_helpers  # pylint: disable=g-import-not-at-top
  cfg = preset_helpers.load_preset('albert', 'size=base')
  preset_helpers.set_fields(cfg, {**preset_helpers.TINY,
                                  'model.num_layers': 3,
                                  'model.embedding_size': 0})
  params = preset_helpers.random_bert_params(cfg, VOCAB, 0.05)
  state = hf_convert.hf_state_dict(params, cfg, 'albert', VOCAB)
  model = transformers.AlbertForPreTraining(transformers.AlbertConfig(
      **hf_convert.hf_config(cfg, 'albert', VOCAB)))
  info = model.load_state_dict({k: torch.tensor(v) for k, v in state.items()},
                               strict=False)
  assert not info.unexpected_keys
  # The decoder's bias is predictions.bias itself (tied).
  assert not [k for k in info.missing_keys if 'position_ids' not in k
              and k != 'predictions.decoder.bias']
  model.eval()
  ids, types, mask = _batch()
  ours = _bertjax_logits(hf_convert.Imported('albert', cfg, params, VOCAB),
                         ids, types, mask)
  theirs = _hf_logits(model, 'albert', ids, types, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours['logits'][real], theirs['logits'][real],
                             rtol=0, atol=1e-4)
  np.testing.assert_allclose(ours['nsp'], theirs['nsp'], rtol=0, atol=1e-4)


def test_albert_groups_transformers_would_share_otherwise_are_refused():
  for layers, groups in ((12, 1), (12, 4), (24, 6), (3, 3)):
    hf_convert.albert_groups_check(layers, groups)
  # int(9 / (18 / 14)) is 6 in floating point; floor(9 * 14 / 18) is 7.
  with pytest.raises(hf_convert.ConversionError,
                     match=r'layer\(s\) \[9\] in group\(s\) \[6\], bertjax '
                     r'in \[7\]'):
    hf_convert.albert_groups_check(18, 14)
