"""ELECTRA: in-step masking, sampling, losses, the shared-embedding model,
its parameter counts, the preset, and a tiny end-to-end run."""

import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_check
from bertjax import config_lib
from bertjax import objectives
from bertjax.objectives import electra
from bertjax import train
from bertjax.models import electra as electra_model
from data_pipelines import masking
from data_pipelines.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID
import preset_helpers

REPO, CONFIGS = preset_helpers.REPO, preset_helpers.CONFIGS
# As tests/bertjax/test_train.py's TINY, with ELECTRA's widths: a 2-layer
# 32-wide discriminator over 16-wide embeddings, an 8-wide generator.
TINY = {**preset_helpers.TINY, 'model.num_layers': 2,
        'model.embedding_size': 16}
TIMING_FIELDS = preset_helpers.TIMING_FIELDS


def _preset(arg=None):
  return preset_helpers.load_preset('electra', arg)


def _tiny(**overrides):
  return preset_helpers.set_fields(_preset('size=small'), {**TINY, **overrides})


def _batch(b=4, length=32, p=4, seed=0):
  """A pipeline-shaped batch: [CLS] tokens [SEP] then padding, masked by
  the host pipeline's own token masking."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(length // 2, length + 1, b)
  ids = rng.integers(5, 300, (b, length)).astype(np.int32)
  real = np.arange(length)[None, :] < lengths[:, None]
  ids[:, 0] = CLS_ID
  ids[np.arange(b), lengths - 1] = SEP_ID
  ids[~real] = PAD_ID
  batch = {'input_ids': ids, 'attention_mask': real.astype(np.int32),
           'example_index': np.arange(b), 'mask_epoch': np.zeros(b, np.int64)}
  out = masking.mask_batch(batch, masking.MaskingConfig(
      vocab_size=300, max_predictions_per_seq=p), seed=seed)
  return ids, {
      'input_ids': out['input_ids'],
      'token_type_ids': np.zeros((b, length), np.int32),
      'attention_mask': out['attention_mask'],
      'masked_positions': out['masked_positions'],
      'masked_ids': out['masked_ids'],
      'masked_weights': out['masked_weights'],
      'masked_unit_start': out['masked_unit_start'],
      'next_sentence_labels': np.zeros(b, np.int32)}


def _sigmoid_ce(x, y):
  return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0) - x * y


# ---- (a) The losses, against hand computations.


def test_original_ids_undo_the_pipelines_masking():
  original, batch = _batch(b=8, seed=1)
  assert (batch['input_ids'] != original).any()   # [MASK] and random ids.
  np.testing.assert_array_equal(electra.original_ids(batch), original)


def test_rtd_and_electra_loss_match_a_hand_computation():
  # Two rows of 6; row 1 has two pad tokens. Slots: row 0 writes 3 samples
  # (one equal to the original), row 1 writes 1 and has an unused slot.
  ids = np.array([[2, 10, 11, 12, 13, 3], [2, 20, 21, 3, 0, 0]], np.int32)
  attention = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]], np.int32)
  positions = np.array([[1, 3, 4], [2, 0, 0]], np.int32)
  weights = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
  sampled = np.array([[10, 40, 41], [42, 43, 44]], np.int32)
  fake, replaced = electra.replace_tokens(ids, positions, weights, sampled)
  np.testing.assert_array_equal(fake, [[2, 10, 11, 40, 41, 3],
                                       [2, 20, 42, 3, 0, 0]])
  # A sample equal to the original (10 at position 1) is "real".
  np.testing.assert_array_equal(replaced, [[0, 0, 0, 1, 1, 0],
                                           [0, 0, 1, 0, 0, 0]])

  rng = np.random.default_rng(0)
  rtd_logits = rng.normal(size=(2, 6)).astype(np.float32) * 3
  rtd_logits[1, 4:] = 50.0   # Pads: a huge loss if they were counted.
  labels = np.asarray(replaced)
  mask = attention.astype(bool)
  hand_rtd = _sigmoid_ce(rtd_logits, labels)[mask].mean()
  rtd_loss, rtd = electra.replaced_token_detection(
      jnp.asarray(rtd_logits), replaced, jnp.asarray(attention))
  np.testing.assert_allclose(rtd_loss, hand_rtd, rtol=1e-5)
  assert float(rtd['rtd_count']) == 10
  assert float(rtd['rtd_correct']) == ((rtd_logits > 0) == labels)[mask].sum()
  assert float(rtd['rtd_replaced_count']) == 3

  v = 50
  gen_logits = rng.normal(size=(2, 3, v)).astype(np.float32)
  masked_ids = np.take_along_axis(ids, positions, axis=1)
  log_probs = gen_logits - np.log(np.exp(gen_logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, masked_ids[..., None], -1)[..., 0]
  hand_mlm = (weights * nll).sum() / (weights.sum() + 1e-5)
  total, metrics = electra.electra_objective(
      jnp.asarray(gen_logits), jnp.asarray(masked_ids), jnp.asarray(weights),
      jnp.asarray(rtd_logits), replaced, jnp.asarray(attention),
      generator_weight=1.0, discriminator_weight=50.0)
  np.testing.assert_allclose(total, hand_mlm + 50.0 * hand_rtd, rtol=1e-5)
  np.testing.assert_allclose(metrics['mlm_loss_sum'], (weights * nll).sum(),
                             rtol=1e-5)
  assert float(metrics['mlm_count']) == 4


# ---- (b) Masking inside the step.


def _rows(b, length, seed):
  """Original ids of varied lengths with [SEP]s and [MASK]s inside."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, b)
  ids = rng.integers(5, 500, (b, length)).astype(np.int32)
  ids[rng.random((b, length)) < 0.05] = SEP_ID
  ids[rng.random((b, length)) < 0.02] = MASK_ID
  ids[:, 0] = CLS_ID
  real = np.arange(length)[None, :] < lengths[:, None]
  ids[~real] = PAD_ID
  return ids, real.astype(np.int32)


_mask_tokens = jax.jit(electra.mask_tokens, static_argnums=(3, 4))


def test_masking_counts_positions_and_corruption():
  b, length = 4000, 32
  ids, attention = _rows(b, length, seed=0)
  masked, positions, weights = map(np.asarray, _mask_tokens(
      jax.random.key(0), ids, attention, 0.15, 0.85))
  slots = electra.num_slots(0.15, length)
  assert slots == 4 and positions.shape == (b, slots)
  candidates = (attention > 0) & ~np.isin(ids, [CLS_ID, SEP_ID, MASK_ID])
  # electra's num_to_predict (float32, as TensorFlow), capped by the
  # candidates: all of them when there are fewer.
  budget = np.clip(np.round(attention.sum(1).astype(np.float32) *
                            np.float32(0.15)), 1, slots)
  expected = np.minimum(budget, candidates.sum(1))
  np.testing.assert_array_equal(weights.sum(1), expected)
  assert (expected < slots).any() and (expected == slots).any()
  rows = np.arange(b)[:, None]
  used = weights > 0
  chosen = np.zeros_like(candidates)
  chosen[np.broadcast_to(rows, positions.shape)[used], positions[used]] = True
  assert chosen.sum() == used.sum()          # Distinct positions.
  assert not (chosen & ~candidates).any()    # Never specials or pad.
  assert (positions[~used] == 0).all()
  # Outside the chosen positions nothing changes; a chosen token is [MASK]
  # or kept, never a random token.
  np.testing.assert_array_equal(masked[~chosen], ids[~chosen])
  at = masked[chosen]
  assert ((at == MASK_ID) | (at == ids[chosen])).all()
  n, rate = at.size, float((at == MASK_ID).mean())
  assert abs(rate - 0.85) < 4 * math.sqrt(0.85 * 0.15 / n), (rate, n)


def test_masking_is_uniform_over_candidates():
  # Full rows of 32 with 30 candidates: each is chosen with p = 4 / 30.
  b, length = 3000, 32
  ids = np.random.default_rng(1).integers(5, 500, (b, length)).astype(
      np.int32)
  ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
  _, positions, weights = map(np.asarray, _mask_tokens(
      jax.random.key(1), ids, np.ones_like(ids), 0.15, 0.85))
  assert (weights.sum(1) == 4).all()
  counts = np.bincount(positions.ravel(), minlength=length)
  assert counts[0] == counts[-1] == 0
  expected = 4 * b / 30
  chi2 = ((counts[1:-1] - expected) ** 2 / expected).sum()
  assert chi2 < 59.7, chi2   # Chi-square, 29 dof, p = 0.001.


def test_masking_is_a_function_of_the_key():
  ids, attention = _rows(64, 32, seed=2)
  first = _mask_tokens(jax.random.key(5), ids, attention, 0.15, 0.85)
  again = _mask_tokens(jax.random.key(5), ids, attention, 0.15, 0.85)
  other = _mask_tokens(jax.random.key(6), ids, attention, 0.15, 0.85)
  for x, y in zip(first, again):
    np.testing.assert_array_equal(x, y)
  assert (np.asarray(first[1]) != np.asarray(other[1])).any()
  assert (np.asarray(first[0]) != np.asarray(other[0])).any()


# ---- (c) Sampling, and no gradient through it.


def test_gumbel_max_frequencies_match_the_tempered_softmax():
  logits = jnp.array([2.0, 1.0, 0.0, -1.0, 0.5])
  temperature, n = 2.0, 100_000
  draws = jax.jit(electra.sample, static_argnums=2)(
      jax.random.key(0), jnp.broadcast_to(logits, (n, 5)), temperature)
  counts = np.bincount(np.asarray(draws), minlength=5)
  expected = n * np.asarray(jax.nn.softmax(logits / temperature))
  chi2 = ((counts - expected) ** 2 / expected).sum()
  assert chi2 < 18.47, (counts, expected)   # 4 dof, p = 0.001.
  # At temperature 1 the frequencies are visibly different.
  assert abs(counts[0] / n - float(jax.nn.softmax(logits)[0])) > 0.05


@pytest.fixture(scope='module')
def tiny():
  """(task, params, batch) of the tiny preset without dropout."""
  cfg = _tiny(**{'model.hidden_dropout_rate': 0.0,
                 'model.attention_dropout_rate': 0.0})
  task = objectives.get(cfg.objective.name).make_task(cfg, 512)
  _, batch = _batch(b=4, length=32, p=4)
  # Jitted: op-by-op initialization costs twice the compile on this CPU.
  params = nn.unbox(jax.jit(task.init)(jax.random.key(0), batch))
  return task, params, batch


def test_no_gradient_reaches_the_generator_through_the_samples(tiny):
  """The discriminator's loss reaches the shared embeddings but nothing
  that only the generator uses: the draws carry no gradient."""
  task, params, batch = tiny

  def rtd_term(p):
    return task.loss(p, batch, jax.random.key(3), False)[1]['rtd_loss_sum']

  grads = jax.jit(jax.grad(rtd_term))(params)
  reached = {}
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    if electra_model.is_generator_only(path):
      assert not np.any(np.asarray(g)), jax.tree_util.keystr(path)
    reached[path[0].key] = reached.get(path[0].key, 0) + np.abs(g).sum()
  assert set(reached) >= set(electra_model.GENERATOR_ONLY)
  for name in ('embeddings', 'discriminator_encoder', 'rtd_transform',
               'rtd_output'):
    assert reached[name] > 0, name


# ---- (d) Shared embeddings, logical names, parameter counts.


def test_one_word_table_tied_to_the_generators_decoder(tiny):
  _, params, batch = tiny
  vocab = params['generator_output_bias'].shape[0]
  tables = [jax.tree_util.keystr(p) for p, x in
            jax.tree_util.tree_flatten_with_path(params)[0]
            if x.ndim == 2 and x.shape[0] == vocab]
  assert tables == ["['embeddings']['word']['embedding']"]
  assert params['embeddings']['word']['embedding'].shape == (vocab, 16)
  # With the shared table zeroed the generator's logits are its bias alone:
  # the decoder is that table.
  cfg = _tiny()
  disc, gen = electra.model_configs(cfg, vocab)
  model = electra_model.Electra(disc, gen)
  zeroed = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x) if 'word' in jax.tree_util.keystr(p)
      else x, params)
  logits = model.apply({'params': zeroed}, batch['input_ids'],
                       batch['token_type_ids'], batch['attention_mask'],
                       batch['masked_positions'],
                       method=electra_model.Electra.generate)
  np.testing.assert_allclose(
      logits, np.broadcast_to(params['generator_output_bias'], logits.shape),
      atol=1e-6)
  logits = model.apply({'params': params}, batch['input_ids'],
                       batch['token_type_ids'], batch['attention_mask'],
                       batch['masked_positions'],
                       method=electra_model.Electra.generate)
  assert np.abs(np.asarray(logits) - params['generator_output_bias']).max() > 0


def _shapes(size, vocab):
  disc, gen = electra.model_configs(_preset(f'size={size}'), vocab)
  model = electra_model.Electra(disc, gen)
  ids = jnp.zeros((1, 8), jnp.int32)
  boxed = jax.eval_shape(lambda: model.init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32)))
  return disc, gen, boxed['params']


def _counts(params):
  generator = discriminator = 0
  for path, x in jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]:
    if electra_model.is_generator_only(path):
      generator += int(np.prod(x.shape))
    else:
      discriminator += int(np.prod(x.shape))
  return discriminator, generator


def test_every_parameter_has_logical_names():
  _, _, boxed = _shapes('small', 512)
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(
      x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) and
                        len(x.names) == len(x.value.shape) for x in leaves)
  rules = dict(config_lib.DEFAULT_RULES)
  assert all(name in rules for x in leaves for name in x.names)


@pytest.mark.parametrize('size, paper', [('small', 13.5e6), ('base', 110e6)])
def test_discriminator_has_the_papers_parameter_count(size, paper):
  """The discriminator with its RTD head and the shared embeddings, at
  ELECTRA's vocabulary (30522, BERT's uncased WordPiece), unpadded.

  Small: 13,549,057 (the generator's own parts add 647,162: 14.20M in
  all); base: 109,483,009 (+ 9,903,418: 119.4M). The paper's "14M" and
  "110M" (Table 1, the README) are the discriminator alone: base with its
  generator would be 119M, and the released ELECTRA-Small, trained with a
  full-width generator, is still listed at 14M.
  """
  disc, gen, params = _shapes(size, 30522)
  discriminator, generator = _counts(params)
  assert abs(discriminator - paper) <= 0.02 * paper, discriminator
  # The generator is ELECTRA's get_generator_config of the discriminator.
  width = {'small': 64, 'base': 256}[size]
  assert (gen.hidden_size, gen.num_layers, gen.num_heads,
          gen.intermediate_size) == (width, 12, max(1, width // 64),
                                     4 * width)
  wi = params['generator_encoder']['layer_0']['ffn']['wi']['kernel']
  assert wi.value.shape == (width, 4 * width)
  assert generator < discriminator / 4
  assert disc.embedding_width == {'small': 128, 'base': 768}[size]


# ---- The preset.


@pytest.mark.parametrize('size, hidden, embedding, lr, batch, steps, seq', [
    ('small', 256, 128, 5e-4, 128, 1_000_000, 128),
    ('base', 768, 768, 2e-4, 256, 766_000, 512),
])
def test_preset_is_the_papers(size, hidden, embedding, lr, batch, steps,
                              seq):
  c = _preset(f'size={size}')
  config_lib.validate(c)
  assert (c.model.hidden_size, c.model.num_layers, c.model.embedding_size,
          c.model.intermediate_size, c.model.num_heads) == (
              hidden, 12, embedding, 4 * hidden, hidden // 64)
  o = c.optimizer
  assert (o.name, o.schedule, o.learning_rate, o.warmup_steps, o.eps,
          o.weight_decay, o.grad_clip_norm) == (
              'bert_adamw', 'electra', lr, 10_000, 1e-6, 0.01, 1.0)
  assert (c.batch_size, c.total_steps, c.data.max_seq_length) == (
      batch, steps, seq)
  assert (c.objective.name, c.data.layout, c.objective.nsp_weight) == (
      'electra', 'full_sentences', 0.0)
  e = c.electra
  assert (e.mask_prob, e.mask_token_prob, e.generator_weight,
          e.discriminator_weight, e.temperature) == (0.15, 0.85, 1.0, 50.0,
                                                     1.0)
  assert config_check.errors_for(c) == []
  assert config_check.warnings_for(c) == []
  with pytest.raises(ValueError, match='size='):
    _preset('size=large')


# ---- (e) End to end.


E2E = {**TINY, 'total_steps': 4, 'log_every_steps': 2,
       'eval_every_steps': 4, 'checkpoint_every_steps': 4,
       'optimizer.learning_rate': 1e-3}


def _records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


@pytest.mark.e2e
def test_preset_trains_end_to_end_deterministically(tmp_path):
  """The preset at a tiny size, twice on the same data: in this process
  and then from the command line (which finds this run's programs in the
  suite's compilation cache: the same executables, not compiled twice)."""
  data_dir = str(tmp_path / 'data')
  cfg = preset_helpers.set_fields(_preset('size=small'),
                                  {**E2E, 'data.data_dir': data_dir})
  final = train.train_and_evaluate(cfg, str(tmp_path / 'here'))
  flags = [f'--config.{k}={v}' for k, v in
           {**E2E, 'data.data_dir': data_dir}.items()]
  with open(tmp_path / 'cli.log', 'w') as log:
    returncode = subprocess.run(
        [sys.executable, '-m', 'bertjax.train',
         f'--config={os.path.join(CONFIGS, "electra.py")}:size=small',
         f'--workdir={tmp_path / "cli"}', *flags],
        env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'),
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
  assert returncode == 0, (tmp_path / 'cli.log').read_text()[-3000:]
  records = _records(tmp_path / 'here')
  assert [r['step'] for r in records] == [2, 4]
  for r in records:
    for key in ('loss', 'mlm_loss', 'rtd_loss', 'rtd_accuracy',
                'rtd_replaced_accuracy', 'generator_sample_accuracy'):
      assert math.isfinite(r[key]), (key, r)
    # The total is 1 x generator MLM + 50 x RTD of the same batch.
    assert r['loss'] == pytest.approx(r['mlm_loss'] + 50 * r['rtd_loss'],
                                      rel=1e-3)
  assert 'eval_rtd_accuracy' in records[-1]
  assert 0 <= final['eval_mlm_accuracy'] <= 1
  strip = lambda r: {k: v for k, v in r.items() if k not in TIMING_FIELDS}
  assert ([strip(r) for r in _records(tmp_path / 'cli')]
          == [strip(r) for r in records])


def test_generator_never_samples_a_padding_id():
  """500 ids in a 512-row table, the 12 padding rows made the likeliest by
  far: the generator's softmax still gives them nothing, at any
  temperature."""
  cfg = _tiny()
  disc, gen = electra.model_configs(cfg, 500)
  assert (disc.vocab_size, disc.output_vocab_size) == (512, 500)
  model = electra_model.Electra(disc, gen)
  _, batch = _batch(b=4, length=32, p=4)
  inputs = (batch['input_ids'], batch['token_type_ids'],
            batch['attention_mask'], batch['masked_positions'])
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), *inputs)['params'])
  # The padding rows start at zero (and have no gradient: test_bert.py).
  assert not np.any(params['embeddings']['word']['embedding'][500:])
  params['generator_output_bias'] = params['generator_output_bias'].at[
      500:].set(1e6)
  params['embeddings']['word']['embedding'] = params['embeddings']['word'][
      'embedding'].at[500:].set(10.0)
  logits = jax.jit(lambda p: model.apply(
      {'params': p}, *inputs, method=electra_model.Electra.generate))(params)
  # Unmasked, these rows would win every draw.
  assert np.all(np.asarray(logits[..., :500]).max(-1) < 1e5)
  assert np.all(np.asarray(logits[..., 500:])
                < electra_model.bert_lib.PADDING_LOGIT / 2)
  draw = jax.jit(jax.vmap(electra.sample, (0, None, None)),
                 static_argnums=2)
  for temperature in (1.0, 1e12):
    ids = draw(jax.random.split(jax.random.key(1), 256), logits, temperature)
    assert int(ids.max()) < 500, temperature
  # At a huge temperature the real ids are drawn near uniformly, so the
  # draws do reach the top of the real vocabulary.
  assert int(ids.max()) >= 490
