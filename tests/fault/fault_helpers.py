"""Shared by the fault-injection tests: the tiny run they all make, and the
comparison every recovered run ends with."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tests', 'bertjax'))
sys.path.insert(0, os.path.join(REPO, 'experiments'))
import kill_resume  # pylint: disable=g-import-not-at-top,wrong-import-position
import preset_helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

DEMO = os.path.join(REPO, 'experiments', 'configs', 'demo.py')
DRIVER = os.path.join(REPO, 'tests', 'fault', 'driver.py')
# 16 tiny steps, every one logged, a checkpoint every 4.
RUN = {**preset_helpers.TINY, 'total_steps': 16, 'log_every_steps': 1,
       'eval_every_steps': 8, 'checkpoint_every_steps': 4,
       'keep_checkpoints': 3}


def config(data_dir, **overrides):
  """The tiny run's config, for ``train.train_and_evaluate``."""
  cfg = preset_helpers.load_preset('demo')
  return preset_helpers.set_fields(
      cfg, {**RUN, 'data.data_dir': str(data_dir), **overrides})


def flags(data_dir, **overrides) -> list[str]:
  """The tiny run's config, as ``python -m bertjax.train`` flags."""
  return [f'--config.{k}={v}' for k, v in
          {**RUN, 'data.data_dir': str(data_dir), **overrides}.items()]


def env() -> dict:
  return dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')


def steps(directory) -> list[int]:
  """The checkpoint steps in ``directory``."""
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def assert_identical(reference, workdir) -> None:
  """metrics.jsonl byte for byte, the final parameters bit for bit."""
  assert kill_resume.compare(reference, workdir) == []
