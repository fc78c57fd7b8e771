"""The packages' imports form no cycle, and none hides inside a function.

Walks every module of ``bertjax`` and ``data_pipelines`` with ``ast``: an
edge for each import of another module of the two packages (``from a
import b`` counts as ``a.b`` when that is a module). A package's
``__init__`` may import its submodules; a submodule importing its package
back is a cycle (it would see the package half-initialized).
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('bertjax', 'data_pipelines')


def _modules() -> dict[str, str]:
  """Dotted module name -> its file."""
  found = {}
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if not name.endswith('.py'):
          continue
        path = os.path.join(directory, name)
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
        found[dotted.removesuffix('.__init__')] = path
  return found


def _targets(node, modules) -> list[str]:
  """The package modules an import statement loads."""
  if isinstance(node, ast.Import):
    names = [alias.name for alias in node.names]
  else:
    names = [f'{node.module}.{alias.name}' for alias in node.names]
    names = [n if n in modules else node.module for n in names]
  return [n for n in names if n in modules]


def _imports(modules):
  """(module-level edges, function-level imports) of every module."""
  edges, hidden = {}, []
  for name, path in modules.items():
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read())
    edges[name] = set()
    for node in tree.body:
      if isinstance(node, (ast.Import, ast.ImportFrom)) and (
          not isinstance(node, ast.ImportFrom) or not node.level):
        edges[name].update(_targets(node, modules))
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for inner in ast.walk(node):
          if isinstance(inner, (ast.Import, ast.ImportFrom)) and (
              _targets(inner, modules)):
            hidden.append(f'{name}.{node.name}: '
                          f'{", ".join(_targets(inner, modules))}')
  return edges, hidden


def _cycle(edges) -> list[str]:
  """One cycle of ``edges`` (as a path), or [] when there is none."""
  state, stack = {}, []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for target in sorted(edges.get(node, ())):
      if state.get(target) == 'open':
        return stack[stack.index(target):] + [target]
      if target not in state and (found := visit(target)):
        return found
    stack.pop()
    state[node] = 'done'
    return []

  for node in sorted(edges):
    if node not in state and (found := visit(node)):
      return found
  return []


def test_no_import_cycle_and_none_inside_a_function():
  modules = _modules()
  assert 'bertjax.objectives.registry' in modules   # The walk finds them.
  edges, hidden = _imports(modules)
  assert not _cycle(edges), ' -> '.join(_cycle(edges))
  assert not hidden, ('imports of package modules inside functions (import '
                      f'them at the top): {hidden}')


@pytest.mark.parametrize('edges, expected', [
    ({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}, ['a', 'b', 'c', 'a']),
    ({'a': {'b'}, 'b': {'c'}, 'c': set()}, []),
    ({'p': {'p.x'}, 'p.x': {'p.y'}, 'p.y': set()}, []),
    ({'p': {'p.x'}, 'p.x': {'p'}}, ['p', 'p.x', 'p']),
])
def test_the_cycle_finder_on_known_graphs(edges, expected):
  found = _cycle(edges)
  assert found == expected
