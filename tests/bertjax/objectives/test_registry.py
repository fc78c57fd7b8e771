"""An objective is one module: a new one registers itself and trains."""

import jax.numpy as jnp
import ml_collections
import pytest

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from bertjax.models import bert as bert_lib
from bertjax.models import config as model_config_lib
from bertjax.objectives import base
from bertjax.objectives import losses
import preset_helpers

# ---- What a new objective's module holds: all of it, here. ----

NAME = 'half_mlm'


def _defaults():
  section = ml_collections.ConfigDict()
  section.mlm_weight = 0.5
  return section


def _check(cfg, errors):
  if cfg.half_mlm.mlm_weight <= 0:
    errors.append(f'half_mlm.mlm_weight={cfg.half_mlm.mlm_weight} must be '
                  '> 0.')


def _encoder_config(cfg, vocab_size):
  return model_config_lib.encoder_config(cfg.model, vocab_size)


def _make_task(cfg, vocab_size):
  """MLM alone, at the section's weight."""
  model = bert_lib.BertForPreTraining(_encoder_config(cfg, vocab_size))
  weight = cfg.half_mlm.mlm_weight

  def init(key, batch):
    return model.init(key, *base.model_inputs(batch))['params']

  def loss(params, batch, key, deterministic):
    outputs = model.apply({'params': params}, *base.model_inputs(batch),
                          deterministic=deterministic,
                          rngs=None if deterministic else {'dropout': key})
    mlm, metrics = losses.masked_lm(outputs['mlm_logits'],
                                    batch['masked_ids'],
                                    batch['masked_weights'])
    metrics['half_mlm_loss_sum'] = weight * metrics['mlm_loss_sum']
    metrics['half_mlm_count'] = metrics['mlm_count']
    return weight * mlm, metrics

  return base.Task(init, loss, flops_per_token=1.0)


HALF_MLM = base.Objective(
    name=NAME, make_task=_make_task, encoder_config=_encoder_config,
    export_family=lambda cfg: 'bert', section=NAME, defaults=_defaults,
    check=_check)

# ---- The test. ----


@pytest.fixture
def registered():
  objectives.register(HALF_MLM)
  yield
  objectives.unregister(NAME)


@pytest.mark.e2e
@pytest.mark.usefixtures('registered')
def test_a_new_objective_module_needs_no_edit_elsewhere(tmp_path):
  assert NAME in objectives.names()
  cfg = preset_helpers.load_preset('demo')   # Its section is in the config.
  assert cfg.half_mlm.mlm_weight == 0.5
  preset_helpers.set_fields(cfg, {
      **preset_helpers.TINY, 'data.data_dir': str(tmp_path / 'data'),
      'objective.name': NAME, 'objective.nsp_weight': 0.0,
      'data.layout': 'full_sentences', 'total_steps': 3,
      'log_every_steps': 1, 'eval_every_steps': 3,
      'checkpoint_every_steps': 3})
  bad = cfg.copy_and_resolve_references()
  bad.half_mlm.mlm_weight = 0.0
  with pytest.raises(ValueError, match='half_mlm.mlm_weight=0.0 must be'):
    config_lib.validate(bad)
  final = train.train_and_evaluate(cfg, str(tmp_path / 'run'))
  # Its loss is half the MLM loss, in the metrics its summaries name.
  assert final['eval_half_mlm_loss'] == pytest.approx(
      0.5 * final['eval_mlm_loss'], rel=1e-6)
  records = preset_helpers.read_jsonl(str(tmp_path / 'run'))
  assert [r['step'] for r in records] == [1, 2, 3]
  assert all(jnp.isfinite(r['loss']) for r in records)


def test_names_are_unique_and_lookup_says_what_exists():
  with pytest.raises(ValueError, match='already registered'):
    objectives.register(base.Objective(
        name='bert', make_task=_make_task, encoder_config=_encoder_config,
        export_family=lambda cfg: 'bert'))
  with pytest.raises(ValueError, match=r"objective.name='nope'; use one of"):
    objectives.get('nope')
  with pytest.raises(ValueError, match='a section needs its defaults'):
    base.Objective(name='x', make_task=_make_task,
                   encoder_config=_encoder_config,
                   export_family=lambda cfg: 'bert', section='x')
  assert set(objectives.sections()) == {'electra', 'distillation', 'tinybert',
                                        'mobilebert'}
