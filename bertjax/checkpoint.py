"""Orbax checkpoints of the train state and the Grain iterator.

Each checkpoint step holds two items: ``state`` (step, parameters, optimizer
state; restored straight onto the current mesh's shardings, whatever mesh
wrote it) and ``data`` (the Grain iterator's position), so a resumed run
sees exactly the batches the uninterrupted run would have seen. Every host's
iterator is at the same position of the global batch stream (it reads its
rows of the same global batches), so one state serves any number of hosts:
a run saved by 2 hosts resumes on 1 or on 4. Saves are asynchronous and atomic: orbax
writes to a temporary directory and renames it when complete, so a crash
mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from etils import epath
import grain
import jax
import orbax.checkpoint as ocp

_ITERATOR_STATE = 'iterator_state.json'


class IteratorHandler(grain.checkpoint.CheckpointHandler):
  """Grain's handler, with one iterator state for all hosts.

  Grain's own writes one file per process, named for the process count, and
  so cannot restore on a different number of hosts. Here process 0 writes
  the state (the same on every host, see the module docstring) and any
  number of processes restores it. Checkpoints written by Grain's handler
  (one file per process) still restore on the same number of processes.
  """

  def save(self, directory: epath.Path, item=None, args=None):
    item = item or args.item
    if jax.process_index() == 0:
      (directory / _ITERATOR_STATE).write_text(
          json.dumps(item.get_state(), indent=2))

  def restore(self, directory: epath.Path, item=None, args=None):
    item = item or args.item
    path = directory / _ITERATOR_STATE
    if not path.exists():   # Written by Grain's per-process handler.
      return super().restore(directory, item=item, args=args)
    item.set_state(json.loads(path.read_text()))
    item.start_prefetch()    # As Grain's handler does after set_state.
    return item


@ocp.args.register_with_handler(IteratorHandler, for_save=True)
@dataclasses.dataclass
class IteratorSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(IteratorHandler, for_restore=True)
@dataclasses.dataclass
class IteratorRestore(ocp.args.CheckpointArgs):
  item: Any


class Checkpointer:
  """Periodic async saves, keep-N, and restore of the latest step."""

  def __init__(self, directory: str, save_every_steps: int, keep: int,
               async_save: bool = True):
    self._save_every_steps = save_every_steps
    self._manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save,
            create=True,
            # Saves cut short by a kill leave temporary directories; they are
            # never restored from, and are removed when the next run starts.
            cleanup_tmp_directories=True),
        item_handlers={'state': ocp.StandardCheckpointHandler(),
                       'data': IteratorHandler()})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def is_due(self, step: int) -> bool:
    return step % self._save_every_steps == 0

  def save(self, step: int, state: Any, data_iterator=None,
           force: bool = False) -> bool:
    """Saves if ``step`` is due (or ``force``); returns whether it did.

    Due means a multiple of ``save_every_steps`` (orbax on its own would
    also save the first step it sees, a full extra copy of the state).
    """
    if not force and not self.is_due(step):
      return False
    items = {'state': ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items['data'] = IteratorSave(data_iterator)
    return self._manager.save(step, args=ocp.args.Composite(**items),
                              force=True)

  def restore(self, step: int, abstract_state: Any, data_iterator) -> Any:
    """The state at ``step``, sharded like ``abstract_state``'s leaves.

    ``data_iterator`` is moved to the saved position in place (None: a
    run whose batches are a function of the step saves no iterator).
    """
    items = {'state': ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items['data'] = IteratorRestore(data_iterator)
    return self._manager.restore(step, args=ocp.args.Composite(**items)
                                 )['state']

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def latest_step(directory: str) -> int | None:
  """The latest complete checkpoint step in ``directory``, without writing."""
  if not os.path.isdir(directory):
    return None
  steps = ocp.utils.checkpoint_steps(directory)
  return max(steps) if steps else None


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
  from bertjax import config_lib  # pylint: disable=g-import-not-at-top
  meta_path = os.path.join(workdir, 'run_meta.json')
  tokenizer_path = os.path.join(workdir, 'tokenizer.model')
  if is_params_only(workdir):
    meta_path = os.path.join(workdir, 'config.json')
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  for path in (meta_path, tokenizer_path):
    if not os.path.isfile(path):
      raise ValueError(f'{workdir!r} is not a bertjax workdir: {path!r} is '
                       'missing (give the --workdir of a training run).')
  available = sorted(ocp.utils.checkpoint_steps(directory)) if os.path.isdir(
      directory) else []
  if not available:
    raise ValueError(f'{workdir!r} has no complete checkpoint.')
  step = available[-1] if step is None else step
  if step not in available:
    raise ValueError(f'{workdir!r} has no checkpoint at step {step}; it has '
                     f'steps {available}.')
  with open(meta_path) as f:
    meta = json.load(f)
  if is_params_only(workdir):
    from data_pipelines import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    meta = {'config': meta, 'vocab_size': tokenizer_lib.Tokenizer.load(
        tokenizer_path).vocab_size}
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    state = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore()))['state']
  return SavedRun(workdir, step, config_lib.from_saved(meta['config']),
                  state['params'], meta['vocab_size'], tokenizer_path)


# A workdir holding only parameters (an import) says so in this file.
_PARAMS_ONLY = 'params_only.json'


def save_params(workdir: str, params: Any, source: str) -> None:
  """``params`` as step 0 of ``workdir``'s checkpoints, without optimizer
  state: a run with ``init_from=workdir`` starts from them."""
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    manager.save(0, args=ocp.args.Composite(
        state=ocp.args.StandardSave({'params': params})))
    manager.wait_until_finished()
  with open(os.path.join(workdir, _PARAMS_ONLY), 'w') as f:
    json.dump({'source': source}, f)


def is_params_only(workdir: str) -> bool:
  return os.path.isfile(os.path.join(workdir, _PARAMS_ONLY))


def restore_params(workdir: str, abstract_params: Any) -> Any:
  """The parameters ``save_params`` wrote, onto ``abstract_params``'
  shapes and shardings; a model of another shape is an error naming it."""
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    try:
      return manager.restore(0, args=ocp.args.Composite(
          state=ocp.args.StandardRestore({'params': abstract_params})
      ))['state']['params']
    except (ValueError, KeyError) as e:
      raise ValueError(
          f'the parameters imported in {workdir!r} do not fit the model '
          f'of this config ({e}); train with the config the import wrote '
          '(experiments/configs/imported.py:WORKDIR/config.json).') from e
