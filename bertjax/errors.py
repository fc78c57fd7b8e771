"""The errors that are the user's to fix, not the code's.

A ``UserError`` says what was wrong in what a researcher gave (a config, a
corpus, a tokenizer, a workdir, a checkpoint, storage, a device budget)
and what to do about it. The command-line entry points print its message
alone, without a traceback (``reporting``); any other exception is a
defect and keeps its traceback.

Each such class also derives from the built-in error it is (``ValueError``
for a bad value, ``OSError`` for storage), so code that catches those
catches it as before.
"""

import contextlib
import sys
from typing import Callable

from absl import app
from absl import flags
from absl import logging


class UserError(Exception):
  """An error in the user's input, whose message tells them what to do."""


class ConfigError(UserError, ValueError):
  """A config (or a flag) with invalid values; the message names each and
  its fix."""


@contextlib.contextmanager
def reporting(command: str):
  """Ends ``command`` with the message of an error in what the user gave
  (``UserError``: a config, data, a workdir, a checkpoint, storage)
  as ``command: message`` on stderr and exit status 1, not a traceback;
  --verbosity=0 logs the traceback as well. Other errors (defects) keep
  their traceback."""
  try:
    yield
  except UserError as e:
    logging.info('%s stopped on an error in its input', command,
                 exc_info=True)
    sys.exit(f'{command}: {e}')


def flags_parser(command: str) -> Callable[[list[str]], list[str]]:
  """absl's flag parsing for ``command`` (``app.run(main,
  flags_parser=errors.flags_parser('train'))``), with the mistakes of a
  ``--config`` flag as ``command: message``, not a traceback: an override
  of a field the config lacks (ml_collections raises AttributeError or
  KeyError from inside absl's parsing), and a config file that does not
  load (ml_collections defers that error to the config's first use)."""

  def parse(argv: list[str]) -> list[str]:
    given = list(argv)
    try:
      argv = app.parse_flags_with_usage(argv)
      if 'config' in flags.FLAGS:   # A load error is raised at first use.
        getattr(flags.FLAGS['config'].value, 'seed', None)
    except OSError as e:
      name = next((a.split('=', 1)[1] for a in given
                   if a.startswith('--config=')), '')
      cause = e.__cause__ or e
      sys.exit(f'{command}: --config={name} does not load: '
               f'{type(cause).__name__}: {cause}')
    except (AttributeError, KeyError) as e:
      field = _plain(e).split("'")[1] if "'" in _plain(e) else ''
      overrides = [a.split('=')[0] for a in given
                   if a.startswith('--config.')]
      if not field or not any(field in o.split('.') for o in overrides):
        raise   # The config file's own error: a defect, with its trace.
      sys.exit(f'{command}: a --config.* override names a field the config '
               f'does not have: {_plain(e)}')
    return argv

  return parse


def _plain(e: Exception) -> str:
  """``e``'s message, without the quotes a KeyError puts around it."""
  text = str(e)
  for _ in range(2):   # A KeyError's repr, inside an AttributeError's.
    if len(text) > 1 and text[0] == text[-1] and text[0] in '\'"':
      text = text[1:-1].encode().decode('unicode_escape')
  return text
