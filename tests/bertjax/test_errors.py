"""Errors in the user's input end a command with their message alone;
every error class the packages define is one, or is named here as not."""

import ast
import importlib
import os
import subprocess
import sys

import pytest

from bertjax import errors
from bertjax import objectives
from bertjax import train
from bertjax.runtime import checkpoint as checkpoint_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# Exceptions that are not errors in the input: a preemption notice ends
# the run on purpose (the trainer exits with its own status).
NOT_USER_ERRORS = {'bertjax.runtime.preemption.Preempted'}


def _exception_classes() -> list[str]:
  """Dotted names of the classes in bertjax/ and data_pipelines/ that
  derive from an exception class (found by their bases' names)."""
  found = []
  for package in ('bertjax', 'data_pipelines'):
    for directory, _, files in os.walk(os.path.join(REPO, package)):
      for name in sorted(files):
        if not name.endswith('.py'):
          continue
        path = os.path.join(directory, name)
        module = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
        with open(path, encoding='utf-8') as f:
          tree = ast.parse(f.read())
        for node in tree.body:
          bases = [ast.unparse(b) for b in getattr(node, 'bases', ())]
          if isinstance(node, ast.ClassDef) and any(
              b.endswith(('Error', 'Exception', 'Failed')) for b in bases):
            found.append(f'{module.removesuffix(".__init__")}.{node.name}')
  return found


def test_every_error_class_is_a_user_error_or_named_as_not():
  found = _exception_classes()
  assert len(found) >= 20, found   # The walk sees the packages.
  missing = []
  for dotted in found:
    module, _, name = dotted.rpartition('.')
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Exception), dotted
    if dotted not in NOT_USER_ERRORS and not issubclass(
        cls, errors.UserError):
      missing.append(dotted)
  assert not missing, (
      f'{missing}: derive from errors.UserError (and the built-in error '
      'it is), or add to NOT_USER_ERRORS if it is not an input error.')


def test_reporting_ends_with_the_message_and_keeps_defects_tracebacks():
  with pytest.raises(SystemExit) as stopped:
    with errors.reporting('finetune'):
      raise checkpoint_lib.CorruptCheckpointError('no intact checkpoint')
  assert stopped.value.code == 'finetune: no intact checkpoint'
  # An error that is not the user's is a defect: its traceback stays.
  with pytest.raises(KeyError):
    with errors.reporting('finetune'):
      raise KeyError('params')
  # A built-in error the user error derives from still catches it.
  with pytest.raises(OSError):
    raise checkpoint_lib.CheckpointSaveError('disk full')


def test_a_mistyped_objective_or_a_workdir_that_is_a_file_is_the_users(
    tmp_path):
  with pytest.raises(errors.ConfigError, match="objective.name='electr'; "
                     "use one of"):
    objectives.get('electr')
  workdir = tmp_path / 'notes.txt'
  workdir.write_text('notes')
  with pytest.raises(errors.ConfigError, match='is a file'):
    checkpoint_lib.check_directory(str(workdir))
  # Fine-tuning, multi-task and task distillation check it first too.
  with pytest.raises(errors.ConfigError, match='is a file'):
    train.refuse_other_settings(str(workdir), 'finetune_meta.json', {}, {},
                                ValueError, 'a fine-tuning run')
  assert workdir.read_text() == 'notes'


@pytest.mark.e2e
def test_an_invalid_config_stops_the_trainer_with_its_message(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'bertjax.train',
       '--config=' + os.path.join(REPO, 'experiments', 'configs', 'demo.py'),
       f'--workdir={tmp_path / "run"}',
       '--config.optimizer.learning_rate=-1'],
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
      cwd=REPO)
  assert result.returncode == 1, result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  assert result.stderr.rstrip().endswith(
      'train: invalid config:\n'
      '  optimizer.learning_rate=-1.0 must be > 0.'), result.stderr
  assert not (tmp_path / 'run').exists()
  # A config file that is not there (a typo in its name).
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'finetune.py'),
       '--config=experiments/configs/finetun.py',
       f'--workdir={tmp_path / "run"}', '--config.seed=1'],
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
      cwd=REPO)
  assert result.returncode == 1, result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  assert result.stderr.startswith(
      'finetune: --config=experiments/configs/finetun.py does not load: '
      ), result.stderr
  assert 'No such file' in result.stderr, result.stderr
  assert not (tmp_path / 'run').exists()
