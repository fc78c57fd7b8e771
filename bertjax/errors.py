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
