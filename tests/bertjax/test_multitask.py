"""Multi-task fine-tuning: T5's mixing rates exactly, the sampler's shares
and determinism, heads a step does not read take no step, validation, and
end to end a run that resumes bitwise and whose workdir is an init of
fine-tuning."""

import fractions
import json
import math
import os
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import finetune
from bertjax import multitask
from bertjax.models import bert as bert_lib

# ---------------------------------------------------------------------------
# Mixing rates: T5 Sec. 3.5.2.


def _exact(weights):
  """``weights`` normalised in exact rational arithmetic, as floats."""
  total = sum(weights)
  return np.array([float(w / total) for w in weights])


def test_proportional_rates_are_t5s_with_and_without_a_cap():
  sizes = [100, 1000, 10000]
  np.testing.assert_allclose(
      multitask.mixing_rates(sizes, 'proportional'),
      _exact([fractions.Fraction(e) for e in sizes]), rtol=1e-15)
  # r_m = min(e_m, K) / sum_n min(e_n, K).
  np.testing.assert_allclose(
      multitask.mixing_rates(sizes, 'proportional', cap=500),
      _exact([fractions.Fraction(min(e, 500)) for e in sizes]), rtol=1e-15)
  np.testing.assert_array_equal(
      multitask.mixing_rates(sizes, 'proportional', cap=10**6),
      multitask.mixing_rates(sizes, 'proportional'))
  # The temperature does not enter proportional mixing.
  np.testing.assert_array_equal(
      multitask.mixing_rates(sizes, 'proportional', cap=500, temperature=7),
      multitask.mixing_rates(sizes, 'proportional', cap=500))


def test_temperature_rates_are_t5s():
  sizes = [100, 1000, 10000]
  for cap in (0, 500):
    # T = 1 is examples-proportional mixing (with the same cap).
    np.testing.assert_allclose(
        multitask.mixing_rates(sizes, 'temperature', cap, 1.0),
        multitask.mixing_rates(sizes, 'proportional', cap), rtol=1e-15)
    # r_m proportional to min(e_m, K)^(1/T), the cap first.
    capped = [min(e, cap) if cap else e for e in sizes]
    roots = np.sqrt(np.array(capped, np.float64))
    np.testing.assert_allclose(
        multitask.mixing_rates(sizes, 'temperature', cap, 2.0),
        roots / roots.sum(), rtol=1e-15)
  # A large T approaches uniform mixing.
  for temperature, tolerance in ((100.0, 0.01), (1e6, 1e-5)):
    np.testing.assert_allclose(
        multitask.mixing_rates(sizes, 'temperature', 0, temperature),
        np.full(3, 1 / 3), rtol=0, atol=tolerance)
  for temperature in (0.0, -1.0):
    with pytest.raises(ValueError, match='must be > 0'):
      multitask.mixing_rates(sizes, 'temperature', 0, temperature)


# ---------------------------------------------------------------------------
# The sampler.


def test_sampler_shares_are_exact_per_block_and_random_within():
  rates = multitask.mixing_rates([100, 300, 600], 'proportional')
  sampler = multitask.TaskSampler(rates, seed=0, block_steps=100)
  np.testing.assert_array_equal(sampler.slots, [10, 30, 60])
  tasks = np.array([sampler.locate(s)[0] for s in range(2000)])
  for block in tasks.reshape(20, 100):
    np.testing.assert_array_equal(np.bincount(block, minlength=3),
                                  [10, 30, 60])
  # Orders differ between blocks.
  assert len({tuple(b) for b in tasks.reshape(20, 100)}) == 20
  # A prefix of a block is a draw without replacement: the first 40
  # positions of each block hold each task within 5 hypergeometric
  # standard deviations of its expected share, summed over 20 blocks.
  n, total = 40, 100
  for task, slots in enumerate([10, 30, 60]):
    count = int((tasks.reshape(20, 100)[:, :n] == task).sum())
    p = slots / total
    sd = math.sqrt(20 * n * p * (1 - p) * (total - n) / (total - 1))
    assert abs(count - 20 * n * p) < 5 * sd, (task, count)
  np.testing.assert_array_equal(sampler.task_steps(2000), [200, 600, 1200])
  np.testing.assert_array_equal(sampler.task_steps(1037),
                                np.bincount(tasks[:1037], minlength=3))


def test_sampler_frequencies_over_one_block_spanning_the_run():
  """mixing_block_steps=0: the run is one block (MT-DNN's shuffle of every
  task's batches), so the run's shares are exact; any window of it is
  within 5 standard deviations of the rates."""
  rates = multitask.mixing_rates([256, 2048], 'temperature', 0, 2.0)
  sampler = multitask.TaskSampler(rates, seed=3, block_steps=3000)
  tasks = np.array([sampler.locate(s)[0] for s in range(3000)])
  np.testing.assert_array_equal(np.bincount(tasks), sampler.slots)
  assert abs(sampler.slots[0] / 3000 - rates[0]) <= 1 / 3000
  for start in (0, 1000, 2500):
    window = tasks[start:start + 500]
    p = sampler.slots[0] / 3000
    sd = math.sqrt(500 * p * (1 - p))
    assert abs(np.sum(window == 0) - 500 * p) < 5 * sd


def test_a_step_is_a_function_of_seed_and_step():
  rates = multitask.mixing_rates([64, 640], 'proportional', cap=128)
  sequential = [multitask.TaskSampler(rates, 7, 50).locate(s)
                for s in range(300)]
  # Each task reads its batches in order: its n-th step, its n-th batch.
  for task in (0, 1):
    mine = [k for t, k in sequential if t == task]
    assert mine == list(range(len(mine)))
  # Any step alone, from a fresh sampler, in any order: the same.
  order = np.random.default_rng(0).permutation(300)
  fresh = multitask.TaskSampler(rates, 7, 50)
  assert all(fresh.locate(int(s)) == sequential[s] for s in order)
  other = [multitask.TaskSampler(rates, 8, 50).locate(s) for s in range(300)]
  assert other != sequential
  # The rows: the single-task harness's batches of that task's step.
  rows = [finetune.batch_rows(7, k, 64 if t == 0 else 640, 8)
          for t, k in sequential]
  again = [finetune.batch_rows(7, k, 64 if t == 0 else 640, 8)
           for t, k in sequential]
  assert all(np.array_equal(a, b) for a, b in zip(rows, again))


# ---------------------------------------------------------------------------
# Steps: what a task does not read takes no step.

SMALL = bert_lib.BertConfig(vocab_size=128, hidden_size=16, num_layers=1,
                            num_heads=2, intermediate_size=32,
                            max_position_embeddings=32)


def _leaves(tree, *parts):
  """{path: numpy leaf} of ``tree``'s leaves whose path holds every part."""
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in
          jax.tree_util.tree_flatten_with_path(tree)[0]
          if all(part in jax.tree_util.keystr(p) for part in parts)}


def _random_state(abstract, rng):
  """A state of ``abstract``'s shapes with every float drawn at random
  (second moments positive) and counters 0: an arbitrary point mid-run,
  where Adam's moments are not 0 (zero moments stay zero under a zero
  gradient, which would hide a head's moments being advanced). numpy
  arrays, so no init program to compile."""
  def draw(path, leaf):
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      return np.zeros(leaf.shape, leaf.dtype)
    value = rng.normal(0.0, 0.1, leaf.shape)
    if '.nu' in jax.tree_util.keystr(path):
      value = np.abs(value) * 1e-2
    return value.astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(draw, abstract)


def test_a_step_moves_only_what_its_task_reads():
  """A token task's step leaves the sentence tasks' heads and the shared
  pooler bitwise, parameters and Adam moments, with weight decay on; it
  moves the encoder and its own head. (That a sentence task's step moves
  the pooler, the end-to-end test sees.)"""
  specs = (multitask.HeadSpec('a', 'classification', 3),
           multitask.HeadSpec('b', 'token', 2),
           multitask.HeadSpec('c', 'regression', 1))
  model = multitask.MultitaskModel(SMALL, specs)
  cfg = multitask.base_config()
  cfg.max_seq_length = 8
  cfg.optimizer.learning_rate = 1e-2
  cfg.optimizer.warmup_proportion = 0.0
  assert cfg.optimizer.weight_decay > 0
  steps = multitask.make_steps(cfg, model, total_steps=10)
  abstract = jax.eval_shape(lambda: flax.linen.unbox(steps.init_state()))
  assert set(abstract.params) == {'embeddings', 'layer_0', 'pooler', 'heads'}
  assert set(abstract.params['heads']) == {'a', 'b', 'c'}
  rng = np.random.default_rng(0)
  before = _random_state(abstract, rng)
  # numpy, not jnp: each eager jnp op would compile a program of its own.
  ids = rng.integers(5, 128, (4, 8)).astype(np.int32)   # [batch, seq]
  batch = {'input_ids': ids, 'token_type_ids': np.zeros_like(ids),
           'attention_mask': np.ones_like(ids),
           'labels': rng.integers(-1, 2, (4, 8)).astype(np.int32)}
  after, _ = jax.jit(steps.train_steps[1])(before, batch)
  after = jax.tree.map(np.asarray, after)
  for parts in (("'heads'", "'a'"), ("'heads'", "'c'"), ("'pooler'",)):
    for tree in ('params', 'opt_state'):
      old = _leaves(getattr(before, tree), *parts)
      new = _leaves(getattr(after, tree), *parts)
      assert old and all(old[k].tobytes() == new[k].tobytes() for k in old), (
          parts, tree)
  for parts in (("'heads'", "'b'"), ("'layer_0'",), ("'embeddings'",)):
    for tree in ('params', 'opt_state'):
      old = _leaves(getattr(before, tree), *parts)
      new = _leaves(getattr(after, tree), *parts)
      assert any(old[k].tobytes() != new[k].tobytes() for k in old), (
          parts, tree)


def test_electras_head_and_layer_decay_with_shared_heads():
  """ELECTRA's recipe in multi-task fine-tuning: with pooling='first'
  there is no pooler, and with layer-wise decay 0.5 a step moves every
  head at the full rate, the layer at 0.5^2 and the embeddings at 0.5^3
  of the step without it (as its ``task_specific/`` key takes every head)."""
  specs = (multitask.HeadSpec('a', 'classification', 3),
           multitask.HeadSpec('b', 'regression', 1))
  model = multitask.MultitaskModel(SMALL, specs, pooling='first')
  ids = np.random.default_rng(1).integers(5, 128, (4, 8)).astype(np.int32)
  batch = {'input_ids': ids, 'token_type_ids': np.zeros_like(ids),
           'attention_mask': np.ones_like(ids),
           'label': np.array([0.5, 1.0, -1.0, 2.0], np.float32)}
  moved = []
  for decay in (0.0, 0.5):
    cfg = multitask.base_config()
    cfg.max_seq_length = 8
    cfg.optimizer.learning_rate, cfg.optimizer.warmup_proportion = 1e-2, 0.
    cfg.optimizer.layerwise_lr_decay = decay
    steps = multitask.make_steps(cfg, model, total_steps=10)
    state = jax.jit(lambda: flax.linen.unbox(steps.init_state()))()
    after, _ = jax.jit(steps.train_steps[1])(state, batch)
    before = flax.traverse_util.flatten_dict(state.params)
    moved.append({k: np.asarray(v) - before[k] for k, v in
                  flax.traverse_util.flatten_dict(after.params).items()})
  assert not any(k[0] == 'pooler' for k in moved[0])
  expected = {'embeddings': 0.125, 'layer_0': 0.25, 'heads': 1.0}
  for key, plain in moved[0].items():
    np.testing.assert_allclose(moved[1][key], expected[key[0]] * plain,
                               rtol=1e-4, atol=1e-7, err_msg='/'.join(key))
  assert np.abs(moved[0][('heads', 'b', 'classifier', 'kernel')]).max() > 0
  # ELECTRA's schedule keeps the warmup's fraction: 1.5 steps of 15, so
  # step 1 runs at (1 - 1/15) * (1 / 1.5) of the peak (2 steps: 1/2).
  cfg.optimizer.schedule, cfg.optimizer.warmup_proportion = 'electra', 0.1
  steps = multitask.make_steps(cfg, model, total_steps=15)
  state = jax.jit(lambda: flax.linen.unbox(steps.init_state()))()
  _, metrics = jax.jit(steps.train_steps[1])(state.replace(step=1), batch)
  assert float(metrics['learning_rate']) == pytest.approx(
      1e-2 * (1 - 1 / 15) / 1.5, rel=1e-6)


# ---------------------------------------------------------------------------
# Validation: before any work.


def _config(**tasks):
  cfg = multitask.base_config()
  for key, section in tasks.items():
    cfg.tasks[key] = section
  return cfg


@pytest.mark.parametrize('change, message', [
    (lambda c: None, 'tasks is empty'),
    (lambda c: c.tasks.update({'x': multitask.task_config('nope')}),
     "tasks.x.name='nope' is not a task"),
    (lambda c: c.tasks.update({'a': multitask.task_config('embedded'),
                               'b': multitask.task_config('embedded')}),
     'tasks.b and tasks.a are the same task'),
    (lambda c: c.tasks.update({'f': multitask.task_config('files')}),
     "tasks.f.kind=''"),
    (lambda c: c.update({'mixing_temperature': 0.0}),
     'mixing_temperature=0.0 must be > 0'),
    (lambda c: c.update({'mixing_temperature': -2.0}),
     'mixing_temperature=-2.0 must be > 0'),
    (lambda c: c.update({'mixing_cap': -1}), 'mixing_cap=-1 must be >= 0'),
    (lambda c: c.update({'mixing': 'uniform'}), "mixing='uniform'; use one"),
    (lambda c: c.update({'batch_size': 0}), 'batch_size=0 must be > 0'),
    (lambda c: c.update({'log_every_steps': 0}),
     'log_every_steps=0 and checkpoint_every_steps=1000 must be > 0'),
    (lambda c: c.tasks.update({'x': multitask.task_config('embedded',
                                                          bogus=1)}),
     "tasks.x has no field ['bogus']"),
    (lambda c: c.update({'mixing_block_steps': -1}),
     'mixing_block_steps=-1 must hold a step of each'),
    (lambda c: c.update({'loss_reduction': 'sum', 'tasks': {
        'ner': multitask.task_config('conll2003')}}),
     "loss_reduction='sum' with a token task (tasks.ner)"),
    # 128 tokens, doc_stride 128, questions of 64: windows cannot overlap.
    (lambda c: c.tasks.update({'qa': multitask.task_config('squad')}),
     'tasks.qa: doc_stride=128 with max_seq_length=128'),
    (lambda c: c.optimizer.update({'grad_clip': 'per-tensor'}),
     "optimizer.grad_clip='per-tensor'; use one of"),
])
def test_bad_configs_are_refused_naming_the_field(change, message):
  cfg = multitask.base_config()
  change(cfg)
  with pytest.raises(multitask.MultitaskError) as e:
    multitask.validate(cfg, check_init=False)
  assert message in str(e.value)


def test_a_bad_config_fails_before_any_work(tmp_path):
  cfg = _config(a=multitask.task_config('embedded'),
                b=multitask.task_config('embedded'))
  cfg.init = str(tmp_path / 'nothing')
  cfg.mixing_temperature = 0.0
  with pytest.raises(multitask.MultitaskError) as e:
    multitask.multitask(cfg, str(tmp_path / 'out'))
  for part in ('holds no checkpoint', 'same task', 'mixing_temperature'):
    assert part in str(e.value)
  assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('arg', ['mixing=proportional', 'mixing=temperature'])
def test_the_experiment_config_is_valid(arg):
  import preset_helpers  # pylint: disable=g-import-not-at-top
  cfg = preset_helpers.load_module('multitask').get_config(arg)
  multitask.validate(cfg, check_init=False)
  assert multitask.task_keys(cfg) == ['embedded', 'embedded_top4']
  assert cfg.mixing == arg.split('=')[1]
  # Tasks of different sizes: 32 examples per class of embedded's 8 (256)
  # and the whole of embedded_top4 (over 3 times as many: the embedded
  # tasks' tests check it).
  assert cfg.tasks.embedded.examples_per_class == 32
  assert cfg.tasks.embedded_top4.examples_per_class == 0


# ---------------------------------------------------------------------------
# End to end: a tiny pretrained run, two file tasks of different kinds.


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  """A 2-step demo run of one layer: its compiles are most of this
  module's time, and a second layer would test nothing more."""
  import test_hf_convert  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('pretrained')
  return test_hf_convert._train_tiny(root / 'run', root / 'data',  # pylint: disable=protected-access
                                     **{'model.num_layers': 1})


@pytest.fixture(scope='module')
def tasks(tmp_path_factory):
  import test_finetune  # pylint: disable=g-import-not-at-top
  return test_finetune._write_tasks(tmp_path_factory.mktemp('tasks'))  # pylint: disable=protected-access


def _files_task(tasks, kind):
  prefix = {'classification': 'cls', 'token': 'tok'}[kind]
  return multitask.task_config('files', kind=kind,
                               train_path=tasks[f'{prefix}_train'],
                               eval_path=tasks[f'{prefix}_eval'])


def _run(pretrained, tasks, workdir, **fields):
  """Two file tasks, 'cla' (classification) and 'tok' (token), 8 steps."""
  cfg = _config(**{k[:3]: _files_task(tasks, k)
                   for k in ('classification', 'token')})
  cfg.init = pretrained
  cfg.max_seq_length = 16
  cfg.batch_size = 8
  cfg.num_steps = 8
  cfg.mixing_cap = 32
  cfg.optimizer.learning_rate = 1e-3
  cfg.log_every_steps = 4
  cfg.checkpoint_every_steps = 4
  cfg.keep_checkpoints = 2
  cfg.update(fields)
  return multitask.multitask(cfg, str(workdir))


def _final_params(workdir):
  import test_finetune  # pylint: disable=g-import-not-at-top
  return test_finetune._final_params(workdir)  # pylint: disable=protected-access


@pytest.fixture(scope='module')
def first_run(pretrained, tasks, tmp_path_factory):
  """A two-task run (classification and token), 8 steps, checkpoints at 4
  and 8: (workdir, its multitask.json)."""
  workdir = tmp_path_factory.mktemp('multitask') / 'a'
  return workdir, _run(pretrained, tasks, workdir)


@pytest.mark.e2e
def test_multitask_writes_per_task_metrics_and_resumes_bitwise(
    pretrained, tasks, first_run, tmp_path):
  workdir, first = first_run
  # Per-task held-out metrics, the task's own, with the steps it got.
  written = json.loads((workdir / multitask.RESULT).read_text())
  assert written == json.loads(json.dumps(first))
  cls, tok = first['tasks']['cla'], first['tasks']['tok']
  assert set(cls['metrics']) == {'accuracy', 'f1'}
  assert set(tok['metrics']) == {'accuracy'} and tok['kind'] == 'token'
  assert cls['steps'] + tok['steps'] == 8 and min(cls['steps'],
                                                  tok['steps']) >= 1
  assert cls['rate'] == pytest.approx(0.5, abs=1e-12)   # Both capped at 32.
  predictions = np.array(cls['eval_predictions'])
  assert predictions.shape == (24,) and 'eval_predictions' not in tok
  assert cls['metrics']['accuracy'] == pytest.approx(
      np.mean(predictions == np.array(cls['eval_labels'])), abs=1e-12)

  # Stopped after step 4's checkpoint and continued: the same run, bitwise.
  shutil.copytree(workdir, tmp_path / 'b')
  shutil.rmtree(tmp_path / 'b' / 'checkpoints' / '8')
  os.remove(tmp_path / 'b' / multitask.RESULT)
  resumed = _run(pretrained, tasks, tmp_path / 'b')
  assert resumed['tasks'] == first['tasks']
  a, b = _final_params(workdir), _final_params(tmp_path / 'b')
  assert a.keys() == b.keys()
  assert all(a[k].tobytes() == b[k].tobytes() for k in a)
  with pytest.raises(multitask.MultitaskError, match='other settings'):
    _run(pretrained, tasks, workdir, mixing='temperature')
  # A span task's windows: another stride reads other batches.
  with pytest.raises(multitask.MultitaskError, match='whose doc_stride'):
    _run(pretrained, tasks, workdir, doc_stride=64)
  # 2 steps of a 1000-step block (seed 0): 'cla' would get none, and its
  # untrained head be reported; refused before anything is written.
  with pytest.raises(multitask.MultitaskError, match=r"\['cla'\] get no"):
    _run(pretrained, tasks, tmp_path / 'c', num_steps=2,
         mixing_block_steps=1000)
  assert not (tmp_path / 'c').exists()


@pytest.mark.e2e
def test_the_workdir_is_an_init_of_fine_tuning(pretrained, first_run):
  """The multi-task workdir is an init of fine-tuning (T5's multi-task
  training + fine-tuning): its latest encoder and the pooler its sentence
  task trained, no head."""
  workdir, _ = first_run
  loaded = finetune.load_pretrained(str(workdir))
  trained = _final_params(workdir)
  encoder = flax.traverse_util.flatten_dict(loaded.params)
  assert loaded.step == 8 and {k[0] for k in encoder} == {
      'embeddings', 'layer_0', 'pooler'}
  assert all(encoder[k].tobytes() == trained[k].tobytes() for k in encoder)
  start = finetune.load_pretrained(pretrained)
  assert loaded.model == start.model
  assert loaded.tokenizer.vocab_size == start.tokenizer.vocab_size
  start = flax.traverse_util.flatten_dict(start.params)
  assert start.keys() == encoder.keys()
  assert all(start[k].tobytes() != encoder[k].tobytes() for k in start)
