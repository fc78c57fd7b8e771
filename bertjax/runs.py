"""A finished run read back from its workdir: its config (fields added
since at their defaults), its tokenizer and its parameters at one step.

What export (bertjax/interop/hf_convert.py), fine-tuning
(bertjax/finetune.py) and the experiment scripts read of a run. It sits
above the config (bertjax/config_lib.py), which completes a saved config
with today's defaults, and the checkpoint code
(bertjax/runtime/checkpoint.py), which finds, verifies and restores the
steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from bertjax.runtime import checkpoint as checkpoint_lib
from bertjax import config_lib
from bertjax import storage
from data_pipelines import tokenizer as tokenizer_lib


@dataclasses.dataclass(frozen=True)
class SavedRun:
  """A training run's parameters at one step, with what they need: the
  run's config (fields added since at their defaults), its tokenizer and
  its (unpadded) vocabulary size."""
  workdir: str
  step: int
  config: Any            # ml_collections.ConfigDict
  params: Any            # Nested dict of arrays, no logical-axis boxes.
  vocab_size: int
  tokenizer_path: str


def load_run(workdir: str, step: int | None = None) -> SavedRun:
  """The parameters of ``workdir``'s checkpoint at ``step`` (default: the
  latest), on the default device; raises ValueError saying what is missing.

  ``workdir`` is a training run's, or an import's (experiments/import_hf.py:
  its ``config.json`` and step-0 parameters).
  """
  meta_path = os.path.join(workdir, 'run_meta.json')
  tokenizer_path = os.path.join(workdir, 'tokenizer.model')
  if checkpoint_lib.is_params_only(workdir):
    meta_path = os.path.join(workdir, 'config.json')
  directory = storage.absolute(os.path.join(workdir, 'checkpoints'))
  for path in (meta_path, tokenizer_path):
    if not storage.isfile(path):
      raise ValueError(f'{workdir!r} is not a bertjax workdir: {path!r} is '
                       'missing (give the --workdir of a training run).')
  chosen, available = checkpoint_lib.choose_step(directory, step)
  if chosen is None and (step is None or not available):
    raise ValueError(f'{workdir!r} has no complete checkpoint.')
  if chosen is None:
    raise ValueError(f'{workdir!r} has no checkpoint at step {step}; it has '
                     f'steps {available}.')
  step = chosen
  try:   # Checked against its manifest first.
    state = checkpoint_lib.restore_as_saved(directory, step)
  except checkpoint_lib.CorruptCheckpointError as e:
    raise ValueError(f'{workdir!r} step {step} is corrupt: {e} Give an '
                     f'earlier step (available: {available}).') from e
  meta = json.loads(storage.read_text(meta_path))
  if checkpoint_lib.is_params_only(workdir):
    meta = {'config': meta, 'vocab_size': tokenizer_lib.Tokenizer.load(
        tokenizer_path).vocab_size}
  return SavedRun(workdir, step, config_lib.from_saved(meta['config']),
                  state['params'], meta['vocab_size'], tokenizer_path)
