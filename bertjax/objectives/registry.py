"""The objectives by ``objective.name``.

Each objective's module registers its ``Objective`` when it is imported
(``register(OBJECTIVE)`` at its end); ``bertjax.objectives`` imports the
built-in ones, so importing the package is enough to find them. A new
objective is a new module that does the same: nothing else changes.
"""

from __future__ import annotations

from bertjax import errors
from bertjax.objectives import base

_OBJECTIVES: dict[str, base.Objective] = {}


def register(objective: base.Objective) -> base.Objective:
  """Adds ``objective`` under its name; a name is registered once."""
  if objective.name in _OBJECTIVES and _OBJECTIVES[objective.name] is not (
      objective):
    raise ValueError(f'objective {objective.name!r} is already registered.')
  _OBJECTIVES[objective.name] = objective
  return objective


def unregister(name: str) -> None:
  """Removes ``name`` (a test's own objective, once the test is done)."""
  _OBJECTIVES.pop(name, None)


def names() -> tuple[str, ...]:
  """The registered objective names, in registration order."""
  return tuple(_OBJECTIVES)


def get(name: str) -> base.Objective:
  """The objective registered as ``name``."""
  if name not in _OBJECTIVES:
    raise errors.ConfigError(
        f'objective.name={name!r}; use one of {names()}.')
  return _OBJECTIVES[name]


def sections() -> dict[str, base.Objective]:
  """Config section name -> the objective that owns it."""
  return {o.section: o for o in _OBJECTIVES.values() if o.section}
