"""Orbax checkpoints of the train state and the Grain iterator.

Each checkpoint step holds two items: ``state`` (step, parameters, optimizer
state; restored straight onto the current mesh's shardings, whatever mesh
wrote it) and ``data`` (the Grain iterator's position), so a resumed run
sees exactly the batches the uninterrupted run would have seen. Every host's
iterator is at the same position of the global batch stream (it reads its
rows of the same global batches), so one state serves any number of hosts:
a run saved by 2 hosts resumes on 1 or on 4.

What a failure can do to them, and what happens then:

* A kill during a save: orbax writes each step to a temporary directory and
  renames it when complete (in a bucket, which cannot rename a directory,
  it writes the step in place and ``commit_success.txt`` last), so the
  previous checkpoint stays the latest; the leftover is never restored
  from and is removed when the next run starts.
* Corruption at rest (a flipped byte, a truncated or missing file): every
  step is sealed with ``bertjax_manifest.json`` (the size and SHA-256 of each
  file), written before the rename (or the commit file), so a checkpoint
  and its manifest appear together, and orbax's metadata of the step says
  it was sealed (a manifest gone is damage too). ``restore_latest`` checks
  the manifest before restoring; a step that fails (on any host: the hosts
  share their verdicts) is moved to ``checkpoints_corrupt/`` (kept, never
  deleted) and the next older one is tried. ``restore_as_saved``
  (fine-tuning, export) and ``init_from`` check it too, and fail on a
  damaged step.
* A failed save (a full disk, a lost mount): ``CheckpointSaveError`` says
  which step was lost and which complete checkpoint remains; the partial
  directory is removed so that the space it took is free again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
from typing import Any, Callable

from etils import epath
import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import errors
from bertjax import storage
from bertjax.runtime import distributed

_ITERATOR_STATE = 'iterator_state.json'
# The seal of a checkpoint step (see the module docstring), and orbax's own
# bookkeeping files, which it rewrites at the commit after the seal and
# which the manifest therefore leaves out.
MANIFEST = 'bertjax_manifest.json'
_COMMIT_FILES = ('_CHECKPOINT_METADATA', 'commit_success.txt')
_TMP_SUFFIX = '.orbax-checkpoint-tmp'
# Where checkpoints that fail their manifest are moved, beside checkpoints/.
CORRUPT_SUFFIX = '_corrupt'


class CorruptCheckpointError(errors.UserError, ValueError):
  """A checkpoint step whose files do not match its manifest."""


class CheckpointSaveError(errors.UserError, OSError):
  """A save that failed; the checkpoints written before it are intact."""


def _sealed_files(step_dir: str) -> dict[str, int]:
  """The files a manifest covers: everything but itself and orbax's commit
  bookkeeping, as {path relative to ``step_dir``: bytes}, sorted."""
  return {os.path.relpath(path, step_dir): stat.size
          for path, stat in storage.find(step_dir).items()
          if os.path.basename(path) not in (*_COMMIT_FILES, MANIFEST)}


def write_manifest(step_dir: str) -> None:
  """Seals ``step_dir``: the size and SHA-256 of each of its files."""
  files = {rel: {'bytes': size,
                 'sha256': storage.sha256(os.path.join(step_dir, rel))}
           for rel, size in _sealed_files(step_dir).items()}
  storage.write_text(os.path.join(step_dir, MANIFEST),
                     json.dumps({'files': files}, indent=1, sort_keys=True))


def verify(step_dir: str) -> bool:
  """Checks ``step_dir`` against its manifest.

  Returns:
    True when it matches, False when the step has no manifest and was
    written without one (before manifests existed, or by ``save_params``).

  Raises:
    CorruptCheckpointError: naming the first file that differs, or the
      manifest, gone from a step whose orbax metadata says it was sealed.
  """
  try:
    expected = json.loads(storage.read_text(
        os.path.join(step_dir, MANIFEST)))['files']
  except FileNotFoundError:
    if _said_sealed(step_dir):
      raise CorruptCheckpointError(
          f'{step_dir}: its manifest {MANIFEST} is gone, and the step was '
          'saved sealed (its files cannot be checked).') from None
    return False
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptCheckpointError(
        f'{step_dir}: its manifest {MANIFEST} is unreadable ({e}).') from e
  present = _sealed_files(step_dir)
  missing = sorted(set(expected) - set(present))
  extra = sorted(set(present) - set(expected))
  if missing or extra:
    raise CorruptCheckpointError(
        f'{step_dir}: files missing {missing[:3]}, unexpected {extra[:3]} '
        f'(against {MANIFEST}).')
  for rel, want in sorted(expected.items()):
    full = os.path.join(step_dir, rel)
    size = present[rel]
    if size != want['bytes']:
      raise CorruptCheckpointError(
          f'{step_dir}: {rel} has {size} bytes, {want["bytes"]} were '
          'written (truncated or overwritten).')
    if storage.sha256(full) != want['sha256']:
      raise CorruptCheckpointError(
          f'{step_dir}: {rel} does not match the SHA-256 it was written '
          'with (its bytes changed on disk).')
  return True


# In the step's orbax metadata (``custom_metadata``): the step was sealed,
# so a missing manifest is damage, not an older checkpoint.
_SEALED = 'bertjax_sealed'


def _said_sealed(step_dir: str) -> bool:
  try:
    metadata = json.loads(storage.read_text(
        os.path.join(step_dir, _COMMIT_FILES[0])))
    return bool(metadata.get('custom_metadata', {}).get(_SEALED))
  except (OSError, ValueError, AttributeError):
    return False


def verify_on_every_process(step_dir: str) -> bool:
  """``verify(step_dir)`` as every process agrees on it (a collective with
  more than one process): every process raises CorruptCheckpointError if
  any found the step damaged, else OSError if any could not read it (a
  read that failed says nothing of the step: it is not set aside), and
  it counts as sealed if any read its seal.

  Each process reads the step itself, and a read can differ (a transient
  error on one host's mount, a file deleted by the writer's retention
  between listing and reading). Were each to act on its own verdict, some
  would set the step aside or stop while the others restored it, and they
  would wait at barriers that never match.
  """
  sealed, why, failed = False, None, None
  try:
    sealed = verify(step_dir)
  except CorruptCheckpointError as e:
    why = str(e)
  except OSError as e:
    failed = e
  if jax.process_count() > 1:
    sealed, why, unread = _gathered(step_dir, sealed, why, failed is not None)
  else:
    unread = []
  if why is not None:
    raise CorruptCheckpointError(why)
  if failed is not None:
    raise failed
  if unread:
    raise OSError(f'{step_dir} could not be read on process(es) {unread} '
                  '(their log says why); every process stops. Rerun when '
                  'the storage answers again.')
  return sealed


def _gathered(step_dir: str, sealed: bool, why: str | None, failed: bool
              ) -> tuple[bool, str | None, list[int]]:
  """(sealed, why damaged, the processes whose read failed) over every
  process's own verdict."""
  count = jax.process_count()
  flags = np.zeros((3, count))
  flags[:, jax.process_index()] = why is not None, sealed, failed
  damaged, seals, unread = distributed.sum_over_processes(flags).reshape(
      3, count)
  if why is None and damaged.any():
    hosts = [i for i in range(count) if damaged[i]]
    why = (f'{step_dir} failed its check on process(es) {hosts} (their '
           'log says why), though it passed here; every process treats it '
           'as damaged.')
  return (bool(seals.any()), why,
          [i for i in range(count) if unread[i]])


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


def check_directory(directory: str) -> None:
  """Raises ``errors.ConfigError`` where ``directory`` is a file, or where
  orbax would write its checkpoints unreadable: its merge of a step's
  parts globs the step's path, and a bracket pair there (a workdir named
  ``lr[3e-4]``) is a character class that finds none of them (orbax 0.12:
  saved, then restore fails)."""
  if storage.isfile(directory):
    raise errors.ConfigError(
        f'{directory!r} is a file: a workdir and its checkpoints are a '
        'directory. Give --workdir a new path (or the run\'s directory).')
  if '[' in directory and ']' in directory.split('[', 1)[1]:
    raise errors.ConfigError(
        f'{directory!r}: a checkpoint directory whose path has a [...] '
        "pair cannot be written readably by orbax (it globs the path); "
        'name the workdir without brackets, e.g. lr_3e-4.')


def _sync(name: str) -> None:
  """A barrier across processes (none with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


# Errors of a save that are the code's, not the filesystem's: raised as
# they are, with their traceback, not as a CheckpointSaveError.
_DEFECTS = (TypeError, AttributeError, NameError, KeyError, IndexError,
            AssertionError)


class Checkpointer:
  """Periodic async saves, keep-N, sealed steps, and restore of the latest
  intact step (see the module docstring for failures)."""

  def __init__(self, directory: str, save_every_steps: int, keep: int,
               async_save: bool = True):
    self._directory = storage.absolute(directory)
    check_directory(self._directory)
    self._save_every_steps = save_every_steps
    self._async = async_save
    self._saving = None        # The step whose save may still be running.
    self._manager = ocp.CheckpointManager(
        self._directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save,
            create=True,
            # Saves cut short by a kill leave temporary directories; they are
            # never restored from, and are removed when the next run starts.
            cleanup_tmp_directories=True,
            # On process 0, after every process has written its part and
            # before the rename that commits the step.
            async_options=ocp.AsyncOptions(
                post_finalization_callback=self._seal) if async_save
            else None),
        item_handlers={'state': ocp.StandardCheckpointHandler(),
                       'data': IteratorHandler()})

  @property
  def directory(self) -> str:
    return self._directory

  def _seal(self) -> None:
    if storage.is_remote(self._directory):   # Written in place.
      write_manifest(os.path.join(self._directory, str(self._saving)))
      return
    # The workdir's own name may hold other glob characters (runs/lr*).
    pattern = os.path.join(glob.escape(self._directory),
                           f'{self._saving}{_TMP_SUFFIX}*')
    found = glob.glob(pattern)
    if len(found) != 1:
      raise CheckpointSaveError(
          f'cannot seal step {self._saving}: expected one temporary '
          f'directory {pattern}, found {found}.')
    write_manifest(found[0])

  def latest_step(self, agreed: bool = True) -> int | None:
    """The newest committed step. ``agreed``: process 0's answer on every
    process (a collective: every process asks at the same point), since
    each lists the directory itself and one host's listing can lag; False:
    this process's own listing (for a message)."""
    step = self._manager.latest_step()
    return distributed.process_zero_choice(step) if agreed else step

  def is_due(self, step: int) -> bool:
    return step % self._save_every_steps == 0

  def save(self, step: int, state: Any, data_iterator=None,
           force: bool = False) -> bool:
    """Saves if ``step`` is due (or ``force``); returns whether it did.

    Due means a multiple of ``save_every_steps`` (orbax on its own would
    also save the first step it sees, a full extra copy of the state).
    A failure of this save, or of the previous one still being written,
    raises ``CheckpointSaveError``.
    """
    if not force and not self.is_due(step):
      return False
    items = {'state': ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items['data'] = IteratorSave(data_iterator)
    self.wait()        # The previous save's failure, reported as its own.
    self._saving = step
    with self._reporting_failure():
      saved = self._manager.save(step, args=ocp.args.Composite(**items),
                                 force=True, custom_metadata={_SEALED: True})
    if saved and not self._async:
      if jax.process_index() == 0:
        write_manifest(os.path.join(self._directory, str(step)))
      _sync('bertjax_checkpoint_sealed')
    return saved

  def check(self) -> None:
    """Raises ``CheckpointSaveError`` if the save in flight has failed;
    cheap (no waiting), so the trainer asks after every step.

    Only once orbax's finalize thread is done: asking it for the error
    before takes the error from that thread, which then goes on to delete
    the steps retention drops, the previous one (with keep=1 the only one)
    among them."""
    if self._saving is not None and not self._manager.is_saving_in_progress():
      self.wait()

  def wait(self) -> None:
    """Waits for the save in flight; raises ``CheckpointSaveError`` if it
    failed."""
    with self._reporting_failure():
      self._manager.wait_until_finished()
    self._saving = None

  @contextlib.contextmanager
  def _reporting_failure(self):
    try:
      yield
    except Exception as e:  # pylint: disable=broad-exception-caught
      self._fail(e)

  def _fail(self, error: Exception) -> None:
    step, self._saving = self._saving, None
    if jax.process_index() == 0:   # Frees what the partial save took.
      for tmp in glob.glob(os.path.join(glob.escape(self._directory),
                                        f'{step}{_TMP_SUFFIX}*')):
        shutil.rmtree(tmp, ignore_errors=True)
      partial = os.path.join(self._directory, str(step))
      if storage.is_remote(partial) and not storage.exists(
          os.path.join(partial, 'commit_success.txt')):
        storage.rmtree(partial)
    kept = [s for s in ocp.utils.checkpoint_steps(self._directory)
            if s != step]
    intact = (f'the checkpoint at step {max(kept)} is intact, and rerunning '
              'resumes from it' if kept else 'no earlier checkpoint exists')
    if isinstance(error, _DEFECTS):   # Not the filesystem: keep its trace.
      raise error
    raise CheckpointSaveError(
        f'the checkpoint at step {step} in {self._directory} was not '
        f'written ({type(error).__name__}: {error}); {intact}. Free space '
        'or fix the filesystem, then rerun.') from error

  def restore(self, step: int, abstract_state: Any, data_iterator,
              defaults: Callable[[], dict] | None = None) -> Any:
    """The state at ``step``, sharded like ``abstract_state``'s leaves.

    ``data_iterator`` is moved to the saved position in place (None: a
    run whose batches are a function of the step saves no iterator).
    ``defaults``: for a dataclass state, the values of fields added since
    the checkpoint was written (``{field: value}``; for a dict field whose
    keys were added to, the value holds them), so that it restores.
    """
    target, added, grown, fill = abstract_state, [], {}, None
    if defaults is not None and dataclasses.is_dataclass(abstract_state):
      saved = self._manager.item_metadata(step)['state']
      names = [f.name for f in dataclasses.fields(abstract_state)]
      added = [n for n in names if n not in saved]
      for n in names:
        value = getattr(abstract_state, n)
        if n in saved and isinstance(value, dict):
          new_keys = [k for k in value if k not in saved[n]]
          if new_keys:   # Only what ``defaults`` gives (else not ours).
            fill = defaults() if fill is None else fill
            if set(new_keys) <= set(fill.get(n, {})):
              grown[n] = new_keys
      if added or grown:
        target = {n: getattr(abstract_state, n) for n in names
                  if n in saved}
        for n, new_keys in grown.items():
          target[n] = {k: v for k, v in target[n].items()
                       if k not in new_keys}
    items = {'state': ocp.args.StandardRestore(target)}
    if data_iterator is not None:
      items['data'] = IteratorRestore(data_iterator)
    state = self._manager.restore(step, args=ocp.args.Composite(**items)
                                  )['state']
    if added or grown:
      fill = defaults() if fill is None else fill
      state = dict(state)
      for n, new_keys in grown.items():
        state[n] = {**state[n], **{k: fill[n][k] for k in new_keys}}
      state = abstract_state.replace(**state, **{n: fill[n] for n in added})
    return state

  def restore_latest(self, abstract_state: Any, data_iterator,
                     say: Callable[[str], None] = print,
                     defaults: Callable[[], dict] | None = None
                     ) -> tuple[Any, int] | None:
    """The newest intact step's state and its step, or None if there is
    no checkpoint.

    A step that fails its manifest, or that has none and fails to restore,
    is moved to ``checkpoints_corrupt/`` with a message through ``say``,
    and the next older step is tried. ``defaults``: as in ``restore``. A
    step whose manifest holds but whose restore fails is not corrupt (e.g.
    another model's checkpoint): that error is raised as it is.
    """
    while True:
      step = self.latest_step()
      if step is None:
        # Steps set aside by this start or an earlier one: a run was here.
        set_aside = storage.listdir(self._directory + CORRUPT_SUFFIX)
        if distributed.process_zero_choice(len(set_aside)):
          raise CorruptCheckpointError(
              f'no intact checkpoint remains in {self._directory}: steps '
              f'{", ".join(set_aside)} were unusable and are in '
              f'{self._directory + CORRUPT_SUFFIX}. Starting over here '
              'would discard them silently: move a step back if you can '
              'repair it, or train in a new --workdir.')
        return None
      step_dir = os.path.join(self._directory, str(step))
      try:
        sealed = verify_on_every_process(step_dir)
      except CorruptCheckpointError as e:
        self._quarantine(step, str(e), say)
        continue
      try:
        return self.restore(step, abstract_state, data_iterator,
                            defaults), step
      except Exception as e:  # pylint: disable=broad-exception-caught
        if sealed:
          raise
        self._quarantine(step, f'{step_dir} has no {MANIFEST} and does not '
                         f'restore ({type(e).__name__}: {e})', say)

  def _quarantine(self, step: int, why: str, say: Callable[[str], None]
                  ) -> None:
    target = os.path.join(self._directory + CORRUPT_SUFFIX, str(step))
    if jax.process_index() == 0:
      storage.makedirs(os.path.dirname(target))
      suffix = 0
      while storage.exists(target + (f'.{suffix}' if suffix else '')):
        suffix += 1
      target += f'.{suffix}' if suffix else ''
      storage.move(os.path.join(self._directory, str(step)), target)
    _sync(f'bertjax_quarantine_{step}')
    self._manager.reload()
    older = self.latest_step()
    say(f'warning: checkpoint step {step} is unusable: {why} Moved it to '
        f'{target}; ' + (f'falling back to step {older}.' if older is not None
                         else 'no older checkpoint remains.'))

  def close(self) -> None:
    self.wait()
    self._manager.close()


def latest_step(directory: str) -> int | None:
  """The latest complete checkpoint step in ``directory``, without writing,
  as this process lists it (for a check or a message; the step to restore
  is ``choose_step``'s)."""
  steps = _complete_steps(directory)
  return steps[-1] if steps else None


def _complete_steps(directory: str) -> list[int]:
  """``directory``'s complete checkpoint steps, ascending, as this process
  lists them (none where it does not exist)."""
  return sorted(ocp.utils.checkpoint_steps(directory)) if (
      storage.isdir(directory)) else []


def choose_step(directory: str, step: int | None = None
                ) -> tuple[int | None, list[int]]:
  """(the step of ``directory`` to restore, this process's list of its
  complete steps). The step is ``step``, or the latest where None; None
  where ``directory`` has no complete checkpoint, or not that step.

  Decided on process 0's listing, on every process (a collective; see
  ``distributed.process_zero_choice``): while a run commits steps, hosts
  that listed the directory moments apart would otherwise restore
  different steps.
  """
  available = _complete_steps(directory)
  wanted = available[-1] if step is None and available else step
  return distributed.process_zero_choice(
      wanted if wanted in available else None), available


def restore_as_saved(directory: str, step: int) -> Any:
  """The state saved at ``step`` in ``directory`` (local or a bucket), as
  it was saved: nested arrays on the default device, no target needed.
  Checked against its manifest first (``verify``; a collective with more
  than one process, so that every process raises if any read fails)."""
  verify_on_every_process(os.path.join(storage.absolute(directory),
                                      str(step)))
  with ocp.CheckpointManager(
      storage.absolute(directory),
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    return manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore()))['state']


# A workdir holding only parameters (an import) says so in this file.
_PARAMS_ONLY = 'params_only.json'


def save_params(workdir: str, params: Any, source: str) -> None:
  """``params`` as step 0 of ``workdir``'s checkpoints, without optimizer
  state: a run with ``init_from=workdir`` starts from them."""
  directory = storage.absolute(os.path.join(workdir, 'checkpoints'))
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    manager.save(0, args=ocp.args.Composite(
        state=ocp.args.StandardSave({'params': params})))
    manager.wait_until_finished()
  storage.write_text(os.path.join(workdir, _PARAMS_ONLY),
                     json.dumps({'source': source}))


def is_params_only(workdir: str) -> bool:
  return storage.isfile(os.path.join(workdir, _PARAMS_ONLY))


def parameter_differences(saved: Any, mine: Any) -> list[str]:
  """``'name: shape there, shape here'`` for each parameter that one tree
  lacks (``missing``) or whose shapes differ; trees of arrays or of
  orbax's metadata."""
  shapes = lambda tree: {
      jax.tree_util.keystr(path): tuple(leaf.shape)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
  saved, mine = shapes(saved), shapes(mine)
  return [f'{name}: {saved.get(name, "missing")} there, '
          f'{mine.get(name, "missing")} here'
          for name in sorted(saved.keys() | mine.keys())
          if saved.get(name) != mine.get(name)]


def name_differences(wrong: list[str], shown: int = 4) -> str:
  """``wrong`` (``parameter_differences``) for a message: the count and
  the first ``shown``."""
  return (f'{len(wrong)} parameter(s) differ ({"; ".join(wrong[:shown])}'
          f'{"; ..." if len(wrong) > shown else ""})')


def restore_params(workdir: str, abstract_params: Any) -> Any:
  """The parameters ``save_params`` wrote, onto ``abstract_params``'
  shapes and shardings; a model of another shape is an error naming the
  parameters that differ."""
  directory = storage.absolute(os.path.join(workdir, 'checkpoints'))
  with ocp.CheckpointManager(
      directory,
      item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
    wrong = parameter_differences(
        manager.item_metadata(0)['state']['params'], abstract_params)
    if wrong:
      raise ValueError(
          f'the parameters imported in {workdir!r} do not fit the model of '
          f'this config: {name_differences(wrong)}. Train with the config '
          'the import wrote '
          '(experiments/configs/imported.py:WORKDIR/config.json).')
    try:
      return manager.restore(0, args=ocp.args.Composite(
          state=ocp.args.StandardRestore({'params': abstract_params})
      ))['state']['params']
    except (ValueError, KeyError) as e:
      raise ValueError(
          f'the parameters imported in {workdir!r} do not fit the model '
          f'of this config ({e}); train with the config the import wrote '
          '(experiments/configs/imported.py:WORKDIR/config.json).') from e
