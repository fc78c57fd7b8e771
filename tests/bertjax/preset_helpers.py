"""Shared by the end-to-end tests: load a preset, set fields, read metrics."""

import importlib.util
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, 'experiments', 'configs')
# Metrics that depend on the machine's speed, left out of run comparisons.
TIMING_FIELDS = ('tokens_per_second', 'tflops_per_second', 'mfu')


def load_preset(name: str, arg=None):
  """``experiments/configs/NAME.py``'s ``get_config(arg)``."""
  spec = importlib.util.spec_from_file_location(
      f'{name}_preset', os.path.join(CONFIGS, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def set_fields(cfg, fields: dict):
  """Sets dotted ``fields`` ({'model.hidden_size': 32, ...}) in ``cfg``."""
  for key, value in fields.items():
    *parents, leaf = key.split('.')
    section = cfg
    for p in parents:
      section = section[p]
    section[leaf] = value
  return cfg


def read_jsonl(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]
