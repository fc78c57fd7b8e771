"""End-to-end runs of the real entry point on a tiny model and corpus."""

import json
import math
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from bertjax.runtime import checkpoint as checkpoint_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import tokenizer as tokenizer_lib
import preset_helpers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DEMO = os.path.join(REPO, 'experiments', 'configs', 'demo.py')
# A tiny variant of the demo: 60 embedded documents, a 2-layer 32-wide model.
TINY = preset_helpers.TINY
TIMING_FIELDS = preset_helpers.TIMING_FIELDS


def _config(data_dir, **overrides):
  sys.path.insert(0, os.path.dirname(DEMO))
  try:
    import demo  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  cfg = demo.get_config()
  for key, value in {**TINY, 'data.data_dir': str(data_dir),
                     **overrides}.items():
    section = cfg
    *parents, leaf = key.split('.')
    for p in parents:
      section = section[p]
    section[leaf] = value
  return cfg


_read_jsonl = preset_helpers.read_jsonl


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('data')


# The demo's tiny run: 6 steps, logged every 2, checkpointed every 3.
SIX_STEPS = dict(total_steps=6, log_every_steps=2, eval_every_steps=6,
                 checkpoint_every_steps=3)


@pytest.fixture(scope='module')
def six_steps(data_dir, tmp_path_factory):
  """(config, workdir, final metrics) of the tiny run of ``SIX_STEPS``."""
  workdir = str(tmp_path_factory.mktemp('six_steps') / 'run')
  cfg = _config(data_dir, **SIX_STEPS)
  return cfg, workdir, train.train_and_evaluate(cfg, workdir)


@pytest.mark.e2e
def test_main_trains_logs_and_checkpoints(six_steps):
  cfg, workdir, final = six_steps
  records = _read_jsonl(workdir)
  assert [r['step'] for r in records] == [2, 4, 6]
  for key in ('loss', 'mlm_loss', 'mlm_accuracy', 'nsp_accuracy',
              'learning_rate', 'grad_norm', 'skipped_steps', 'loss_spikes',
              'masking_rate', 'masking_mask_fraction',
              'masking_random_fraction', 'masking_kept_fraction',
              'masking_unit_length_mean', 'masking_unit_len_1'):
    assert key in records[-1], key
  assert 'eval_mlm_accuracy' in records[-1]
  assert records[-1]['skipped_steps'] == 0
  # Timings go to their own file: metrics.jsonl is reproducible.
  assert not set(TIMING_FIELDS) & set(records[-1])
  timings = _read_jsonl(workdir, 'throughput.jsonl')
  assert [r['step'] for r in timings] == [2, 4, 6]
  # Achieved FLOP/s is tokens/s times the analytic FLOPs of this model.
  vocab = tokenizer_lib.padded_vocab_size(cfg.data.tokenizer.vocab_size)
  per_token = objectives.bert.flops_per_token(
      cfg, objectives.bert.encoder_config(cfg, vocab))
  assert timings[-1]['tflops_per_second'] == pytest.approx(
      timings[-1]['tokens_per_second'] * per_token / 1e12, rel=1e-6)
  assert 'mfu' not in timings[-1]   # No peak is known for a CPU.
  assert 0 <= final['eval_mlm_accuracy'] <= 1
  assert 0 < final['baseline_mlm_accuracy'] < 1
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints')))[-1] == '6'
  assert any(f.startswith('events.out.tfevents')
             for f in os.listdir(os.path.join(workdir, 'tensorboard')))
  # Rerunning the finished run resumes at its end and trains nothing more.
  train.train_and_evaluate(cfg, workdir)
  assert _read_jsonl(workdir) == records


# ---- Bad input fails fast and writes nothing.


@pytest.mark.e2e
@pytest.mark.parametrize('make_corpus, message', [
    (lambda d: str(d / 'missing'), 'matches no files'),
    (lambda d: (d / 'empty').mkdir() or str(d / 'empty'), 'matches no files'),
    (lambda d: (d / 'blank.txt').write_text('\n \n') and str(d / 'blank.txt'),
     'hold no text'),
])
def test_bad_corpus_fails_before_writing(tmp_path, make_corpus, message):
  workdir = tmp_path / 'run'
  data = tmp_path / 'data'
  cfg = _config(data, **{'data.corpus.source': 'files',
                         'data.corpus.path': make_corpus(tmp_path)})
  with pytest.raises(corpus_lib.CorpusError, match=message):
    train.train_and_evaluate(cfg, str(workdir))
  assert not workdir.exists() and not data.exists()


@pytest.mark.e2e
def test_seq_length_beyond_positions_fails_before_writing(tmp_path):
  cfg = _config(tmp_path / 'data', **{'data.max_seq_length': 64})
  with pytest.raises(ValueError, match='max_position_embeddings'):
    train.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert not os.listdir(tmp_path)


@pytest.mark.e2e
@pytest.mark.parametrize('config', [
    DEMO,
    # compare_small.py imports bertjax.finetune, which imports bertjax.train
    # under its name while ``python -m`` runs it as __main__: the flags are
    # defined once (bertjax/train_flags.py), so the config loads too.
    os.path.join(REPO, 'experiments', 'configs',
                 'compare_small.py:objective=bert')])
def test_config_typo_is_an_error(tmp_path, config):
  result = subprocess.run(
      [sys.executable, '-m', 'bertjax.train', f'--config={config}',
       f'--workdir={tmp_path / "run"}', '--config.modle.size=base'],
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
      cwd=REPO)
  assert result.returncode == 1
  assert 'defined twice' not in result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  assert result.stderr.startswith(
      'train: a --config.* override names a field the config does not '
      "have: 'modle'"), result.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.e2e
def test_help_lists_the_flags_and_a_missing_workdir_is_refused(tmp_path):
  """The flags live in bertjax/train_flags.py: --help lists them all the
  same, and a command (here fine-tuning's) started without --workdir
  stops with the usage error, writing nothing."""
  env = dict(os.environ, PYTHONPATH=REPO)
  # python -m bertjax.train, and setup.py's console script bertjax-train
  # (its own file as sys.argv[0]). absl's --help exits with status 1.
  for command in (['-m', 'bertjax.train'], [
      '-c', 'import sys; from bertjax import train; '
      'sys.argv[0] = "bertjax-train"; train.run()']):
    shown = subprocess.run([sys.executable, *command, '--help'], env=env,
                           capture_output=True, text=True, cwd=REPO).stdout
    for flag in ('config', 'workdir', 'multihost', 'coordinator_address'):
      assert f'\n  --{flag}:' in shown, (command, flag)
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'finetune.py'),
       '--config=' + os.path.join(REPO, 'experiments', 'configs',
                                  'finetune.py')],
      env=env, capture_output=True, text=True, cwd=tmp_path)
  assert result.returncode != 0
  assert '--config and --workdir are required' in result.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.e2e
def test_resume_with_other_tokenizer_fails_and_keeps_checkpoints(
    data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  cfg = _config(data_dir, total_steps=2, log_every_steps=1,
                eval_every_steps=2, checkpoint_every_steps=2)
  train.train_and_evaluate(cfg, workdir)
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  other = _config(data_dir, total_steps=4, **{'data.tokenizer.vocab_size': 300})
  with pytest.raises(train.ResumeError, match='data.tokenizer'):
    train.train_and_evaluate(other, workdir)
  # What the data stream is, and the optimizer's state tree: the saved
  # position counts batches (one state per Grain worker).
  for field, value, name in (
      ('batch_size', 2 * cfg.batch_size, 'batch_size'),
      ('data.layout', 'sop', 'data.layout'),
      ('data.num_workers', cfg.data.num_workers + 1, 'data.num_workers'),
      ('masking.rate', 0.2, 'masking'),
      ('optimizer.name', 'lamb', 'optimizer.name')):
    with pytest.raises(train.ResumeError, match=f'whose {name} differ'):
      train.train_and_evaluate(_config(data_dir, total_steps=4,
                                       **{field: value}), workdir)
  # Same settings, but the tokenizer file itself was replaced.
  meta_path = os.path.join(workdir, 'run_meta.json')
  with open(meta_path) as f:
    meta = json.load(f)
  meta['tokenizer_sha256'] = '0' * 64
  with open(meta_path, 'w') as f:
    json.dump(meta, f)
  with pytest.raises(train.ResumeError, match='not the one the checkpoints'):
    train.train_and_evaluate(_config(data_dir, total_steps=4), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before


def test_most_frequent_token_skips_specials():
  import numpy as np  # pylint: disable=g-import-not-at-top
  counts = np.array([100, 50, 90, 90, 10, 3, 7, 2])
  assert train.most_frequent_token(counts) == 6


def test_identity_changes_fill_fields_added_since_and_name_the_rest():
  defaults = {'seed': 0, 'model': {'layers': 2, 'new': 'off'}}
  mine = {'seed': 0, 'model': {'layers': 2, 'new': 'off'}, 'task': 't'}
  # A saved section without a field added since counts at its default.
  saved = {'seed': 0, 'model': {'layers': 2}, 'task': 't'}
  assert train.identity_changes(saved, mine, defaults) == {}
  saved['model']['new'] = 'on'
  assert train.identity_changes(saved, mine, defaults) == {
      'model': ({'layers': 2, 'new': 'on'}, {'layers': 2, 'new': 'off'})}
  # A name on one side only is a change, but for one the code added to the
  # identity since the run (in defaults); tuples compare as saved.
  assert train.identity_changes({'seed': 0, 'ids': [1], 'task': 't'},
                                {'seed': 0, 'ids': (1,)},
                                defaults) == {'task': ('t', None)}
  assert train.identity_changes({'seed': 0}, {'seed': 0, 'task': 't'},
                                defaults) == {'task': (None, 't')}
  assert train.identity_changes({'seed': 0}, {'seed': 0, 'model': {}},
                                defaults) == {}


def test_base_config_is_valid():
  config_lib.validate(config_lib.base_config())


@pytest.mark.e2e
def test_init_from_continues_another_runs_state(data_dir, tmp_path):
  first = str(tmp_path / 'phase1')
  train.train_and_evaluate(
      _config(data_dir, total_steps=6, num_train_steps=4, log_every_steps=1,
              eval_every_steps=4, checkpoint_every_steps=4), first)
  second = str(tmp_path / 'phase2')
  cfg = _config(data_dir, total_steps=6, log_every_steps=1,
                eval_every_steps=6, checkpoint_every_steps=6,
                init_from=first, **{'masking.max_predictions_per_seq': 8})
  train.train_and_evaluate(cfg, second)
  records = _read_jsonl(second)
  assert [r['step'] for r in records] == [5, 6]
  # The schedule continues: lr(4) = peak * (1 - 4 / 6).
  assert records[0]['learning_rate'] == pytest.approx(1e-3 * (1 - 4 / 6),
                                                      rel=1e-5)
  # Another model size, or another tokenizer of the same size, is refused
  # by name before anything is compiled or written.
  wider = _config(data_dir, init_from=first, **{'model.intermediate_size':
                                                96})
  with pytest.raises(train.ResumeError, match=(
      r"6 parameter\(s\) differ .*\['wi'\]\['kernel'\]: \(32, 64\) "
      r'there, \(32, 96\) here')):
    train.train_and_evaluate(wider, str(tmp_path / 'wider'))
  retokenized = _config(data_dir, init_from=first,
                        **{'data.tokenizer.model_type': 'bpe'})
  with pytest.raises(train.ResumeError, match='not the one init_from='):
    train.train_and_evaluate(retokenized, str(tmp_path / 'retokenized'))
  for refused in ('wider', 'retokenized'):
    assert not (tmp_path / refused).exists(), refused


def test_a_start_that_left_no_checkpoint_binds_no_settings(tmp_path):
  # E.g. one that failed to compile: its run_meta.json holds no run back.
  cfg = config_lib.demo_config()
  train.write_json_atomic(str(tmp_path / train.RUN_META),
                          {'identity': train.run_identity(cfg)})
  layers = cfg.model.num_layers
  cfg.model.num_layers += 1
  assert train.check_resume_compatible(str(tmp_path), cfg) is None
  (tmp_path / 'checkpoints' / '5').mkdir(parents=True)
  with pytest.raises(train.ResumeError) as refused:
    train.check_resume_compatible(str(tmp_path), cfg)
  # The one field that changed, not the whole section.
  assert ('whose model differ from this config (model.num_layers: '
          f'{layers} saved, {layers + 1} now)') in str(refused.value)


@pytest.mark.e2e
def test_init_from_without_checkpoint_fails_before_writing(tmp_path):
  (tmp_path / 'empty').mkdir()
  cfg = _config(tmp_path / 'data', init_from=str(tmp_path / 'empty'))
  with pytest.raises(train.ResumeError, match='has no checkpoint'):
    train.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert sorted(os.listdir(tmp_path)) == ['empty']


@pytest.mark.e2e
def test_masking_audit_fails_before_training(data_dir, tmp_path):
  # 2 prediction slots for 32-token rows cap the rate near 0.06, not 0.15.
  cfg = _config(data_dir, **{'masking.max_predictions_per_seq': 2,
                             'masking.audit_tolerance': 0.02})
  with pytest.raises(ValueError, match='masking audit failed on the eval'):
    train.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def _tiny_preset(name, arg, data_dir, **overrides):
  """A preset from experiments/configs at the tiny size, on the embedded
  corpus, for 4 steps."""
  cfg = preset_helpers.load_preset(name, arg)
  cfg.data.corpus = _config(data_dir).data.corpus
  return preset_helpers.set_fields(cfg, {
      **TINY, 'data.data_dir': str(data_dir), 'total_steps': 4,
      'num_train_steps': 0, 'log_every_steps': 2, 'eval_every_steps': 4,
      'checkpoint_every_steps': 4, 'optimizer.learning_rate': 1e-3,
      **overrides})


@pytest.mark.e2e
def test_albert_preset_trains_with_its_own_pieces(data_dir, tmp_path):
  """ALBERT's preset at a tiny size: SOP pairs, n-gram masking, factorized
  embedding, one shared layer and LAMB train end to end."""
  cfg = _tiny_preset('albert', 'size=base', data_dir,
                     **{'model.num_layers': 3, 'model.embedding_size': 16})
  workdir = str(tmp_path / 'albert')
  final = train.train_and_evaluate(cfg, workdir)
  records = _read_jsonl(workdir)
  assert [r['step'] for r in records] == [2, 4]
  assert all(math.isfinite(r['loss']) and 'nsp_accuracy' in r
             for r in records)
  assert records[-1]['masking_unit_length_mean'] > 1   # n-grams, not tokens.
  assert 0 <= final['eval_mlm_accuracy'] <= 1
  with open(os.path.join(workdir, train.RUN_META)) as f:
    saved = json.load(f)['config']
  assert (saved['optimizer']['name'], saved['data']['layout'],
          saved['model']['num_layer_groups']) == ('lamb', 'sop', 1)


@pytest.mark.e2e
def test_spanbert_preset_trains_mlm_and_sbo(data_dir, tmp_path):
  cfg = _tiny_preset('spanbert', 'size=base', data_dir,
                     **{'model.num_layers': 2, 'data.max_seq_length': 32,
                        'masking.max_predictions_per_seq': 5})
  workdir = str(tmp_path / 'spanbert')
  final = train.train_and_evaluate(cfg, workdir)
  records = _read_jsonl(workdir)
  slots = cfg.batch_size * cfg.masking.max_predictions_per_seq
  for r in records:
    assert math.isfinite(r['sbo_loss']) and 'nsp_loss' not in r
    # The total is the MLM mean + 1.0 x the SBO sum / (its n targets + 1),
    # SpanBERT's NoNSPPairLoss; the logged sbo_loss is the sum / n (all of
    # the same batch). So (loss - mlm) / sbo = n / (n + 1) for a whole n.
    ratio = (r['loss'] - r['mlm_loss']) / r['sbo_loss']
    n = ratio / (1 - ratio)
    assert abs(n - round(n)) < 0.05 and 1 <= round(n) <= slots, n
  assert 0 <= final['eval_sbo_accuracy'] <= 1


@pytest.mark.e2e
def test_roberta_preset_trains_without_nsp(data_dir, tmp_path):
  cfg = _tiny_preset('roberta', 'size=base', data_dir,
                     **{'model.num_layers': 2, 'data.max_seq_length': 32,
                        'masking.max_predictions_per_seq': 5})
  workdir = str(tmp_path / 'roberta')
  final = train.train_and_evaluate(cfg, workdir)
  records = _read_jsonl(workdir)
  assert [r['step'] for r in records] == [2, 4]
  for r in records:
    assert 'nsp_loss' not in r
    assert r['loss'] == pytest.approx(r['mlm_loss'], rel=1e-3)
  assert 0 <= final['eval_mlm_accuracy'] <= 1


@pytest.mark.e2e
@pytest.mark.parametrize('name, arg, strategy', [
    ('bert_wwm', None, 'whole_word'), ('ngram_masking', None, 'ngram'),
    ('span_masking', None, 'span'), ('ernie', 'stage=mixed', 'entity')])
def test_masking_presets_train(data_dir, tmp_path, name, arg, strategy):
  """The masking presets on the trunk's BERT, 4 tiny steps each."""
  extra = {'model.num_layers': 2}
  if name == 'ernie':   # Units from a gazetteer of the corpus's own words.
    gazetteer = tmp_path / 'gazetteer.txt'
    gazetteer.write_text('the\nof the\nreturn\nthe value\n')
    extra['data.gazetteer_path'] = str(gazetteer)
  cfg = _tiny_preset(name, arg, data_dir, **extra)
  assert cfg.masking.strategy == strategy
  train.train_and_evaluate(cfg, str(tmp_path / name))
  records = _read_jsonl(str(tmp_path / name))
  assert [r['step'] for r in records] == [2, 4]
  assert all(math.isfinite(r['loss']) for r in records)
  if strategy != 'entity':   # Whole words and longer: units above 1 token.
    assert records[-1]['masking_unit_length_mean'] > 1


@pytest.mark.e2e
def test_scanned_rematerialized_layers_train(data_dir, tmp_path):
  """model.scan_layers with model.remat through the real trainer."""
  workdir = str(tmp_path / 'scan')
  cfg = _config(data_dir, total_steps=4, log_every_steps=2,
                eval_every_steps=4, checkpoint_every_steps=4,
                **{'model.scan_layers': True, 'model.remat': 'full'})
  train.train_and_evaluate(cfg, workdir)
  records = _read_jsonl(workdir)
  assert [r['step'] for r in records] == [2, 4]
  assert all(math.isfinite(r['loss']) for r in records)
  with open(os.path.join(workdir, 'sharding.txt')) as f:
    layout = f.read()
  assert "['layers']['scan']['layer']['ffn']['wi']['kernel']" in layout


@pytest.mark.e2e
def test_quantization_aware_pretraining_resumes_bitwise(data_dir, six_steps,
                                                        tmp_path):
  """model.quantize=int8 through the real trainer: it trains otherwise
  than float (the same run's), and a run resumed from its step-3
  checkpoint ends with the uninterrupted run's parameters, bit for bit."""
  cfg = _config(data_dir, **SIX_STEPS, **{'model.quantize': 'int8'})
  whole, resumed = str(tmp_path / 'whole'), str(tmp_path / 'resumed')
  train.train_and_evaluate(cfg, whole)
  shutil.copytree(whole, resumed)
  shutil.rmtree(os.path.join(resumed, 'checkpoints', '6'))
  train.train_and_evaluate(cfg, resumed)
  a, b = (jax.tree.leaves(checkpoint_lib.restore_as_saved(
      os.path.join(w, 'checkpoints'), 6)['params']) for w in (whole, resumed))
  assert all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
             for x, y in zip(a, b))
  assert _read_jsonl(resumed) == _read_jsonl(whole)
  _, floating, _ = six_steps
  assert _read_jsonl(floating)[0]['loss'] != _read_jsonl(whole)[0]['loss']
