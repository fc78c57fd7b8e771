"""Orbax checkpoints of the train state and the Grain iterator.

Each checkpoint step holds two items: ``state`` (step, parameters, optimizer
state; restored straight onto the current mesh's shardings) and ``data`` (the
Grain iterator's position), so a resumed run sees exactly the batches the
uninterrupted run would have seen. Saves are asynchronous and atomic: orbax
writes to a temporary directory and renames it when complete, so a crash
mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import orbax.checkpoint as ocp


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
                       'data': grain.checkpoint.CheckpointHandler()})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, data_iterator, force: bool = False
           ) -> bool:
    """Saves if ``step`` is due (or ``force``); returns whether it did.

    Due means a multiple of ``save_every_steps`` (orbax on its own would
    also save the first step it sees, a full extra copy of the state).
    """
    if not force and step % self._save_every_steps:
      return False
    return self._manager.save(
        step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iterator)),
        force=True)

  def restore(self, step: int, abstract_state: Any, data_iterator) -> Any:
    """The state at ``step``, sharded like ``abstract_state``'s leaves.

    ``data_iterator`` is moved to the saved position in place.
    """
    restored = self._manager.restore(
        step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=grain.checkpoint.CheckpointRestore(data_iterator)))
    return restored['state']

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
