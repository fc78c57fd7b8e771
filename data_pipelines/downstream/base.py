"""What every module of the package shares: task kinds, the ignored label and
the error type, with the checks that raise it.

The bottom of the package's imports: it imports none of the other modules.
"""

from __future__ import annotations

from bertjax import errors

KINDS = ('classification', 'regression', 'token', 'span')
# The label of an encoded position that carries none (token tasks: later
# sub-tokens, specials, padding). Losses and metrics skip it.
IGNORE = -1


class TaskError(errors.UserError, ValueError):
  """A task cannot be loaded, encoded or scored; the message says what to do."""


def check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise TaskError(f'task kind {kind!r}; use one of {KINDS}.')


def check_string(value, where: str, name: str) -> str:
  """``value``, which must be a str: field ``name`` at ``where`` (for the
  error, e.g. 'train.jsonl:3' or 'example 3')."""
  if not isinstance(value, str):
    raise TaskError(f'{where}: field {name!r} is a {type(value).__name__}, '
                    'not a string.')
  return value
