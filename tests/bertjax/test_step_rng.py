"""config.step_rng: the train step's random bits from threefry or rbg."""

import jax
import numpy as np

from bertjax import config_lib
from bertjax import objectives
from bertjax import train
from data_pipelines import pipeline
import preset_helpers


def _first_step(step_rng: str):
  """Loss and updated parameters after one step of a tiny BERT on a fixed
  random batch, with the paper's dropout."""
  cfg = preset_helpers.set_fields(config_lib.base_config(), {
      **preset_helpers.TINY, 'model.num_layers': 2, 'step_rng': step_rng})
  task = objectives.get(cfg.objective.name).make_task(cfg, 512)
  spec = pipeline.batch_spec(cfg)
  rng = np.random.default_rng(0)
  (b, l), p = spec['input_ids'][0], spec['masked_ids'][0][1]
  positions = np.sort(np.stack([rng.choice(l, p, replace=False)
                                for _ in range(b)]), axis=1)
  ids = rng.integers(5, 400, (b, l))
  batch = {'input_ids': ids, 'token_type_ids': np.zeros((b, l)),
           'attention_mask': np.ones((b, l)), 'masked_positions': positions,
           'masked_ids': np.take_along_axis(ids, positions, 1),
           'masked_weights': np.ones((b, p)), 'masked_unit_start': positions,
           'next_sentence_labels': rng.integers(0, 2, b)}
  batch = {k: v.astype(spec[k][1]) for k, v in batch.items()}
  steps = train.make_steps(cfg, task, spec)
  state, metrics = jax.jit(steps.train_step)(jax.jit(steps.init_state)(),
                                             batch)
  return float(metrics['loss']), jax.tree.leaves(state.params)


def test_rbg_is_reproducible_and_draws_other_masks():
  loss, params = _first_step('rbg')
  again, params_again = _first_step('rbg')
  assert loss == again
  assert all(np.array_equal(a, b) for a, b in zip(params, params_again))
  # The parameters start from the same (threefry) key either way and the
  # batch is the same: only the dropout masks differ.
  threefry, _ = _first_step('threefry')
  assert np.isfinite(loss) and np.isfinite(threefry) and loss != threefry
