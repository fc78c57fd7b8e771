"""No function in the packages is long without saying why.

A function of ``bertjax/`` or ``data_pipelines/`` over ``MAX_LINES`` lines
(decorators to last line) must start its body with a comment that begins
``# Long:`` and gives the reason (its docstring may come first).
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('bertjax', 'data_pipelines')
MAX_LINES = 80


def _reasoned(lines: list[str], node) -> bool:
  """True when the function's first comment (after its docstring) starts
  with ``# Long:``."""
  body = node.body
  start = body[0].end_lineno if (
      isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                   ast.Constant)) else (
      node.body[0].lineno - 1)
  for line in lines[start:node.end_lineno]:
    text = line.strip()
    if text:
      return text.startswith('# Long:')
  return False


def long_functions(root: str = ROOT) -> list[str]:
  """``path:line name (n lines)`` of every unexplained long function."""
  found = []
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(root, package)):
      for name in sorted(files):
        if not name.endswith('.py'):
          continue
        path = os.path.join(directory, name)
        with open(path, encoding='utf-8') as f:
          text = f.read()
        lines = text.split('\n')
        for node in ast.walk(ast.parse(text)):
          if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
          first = min([node.lineno] + [d.lineno for d in
                                       node.decorator_list])
          length = node.end_lineno - first + 1
          if length > MAX_LINES and not _reasoned(lines, node):
            found.append(f'{os.path.relpath(path, root)}:{node.lineno} '
                         f'{node.name} ({length} lines)')
  return found


def test_every_long_function_says_why():
  assert not long_functions(), (
      f'functions over {MAX_LINES} lines with no "# Long:" reason at their '
      f'top (split them into named steps): {long_functions()}')


def test_the_check_sees_a_long_function_and_its_reason(tmp_path):
  package = tmp_path / 'bertjax'
  package.mkdir()
  body = '\n'.join(f'  x{i} = {i}' for i in range(MAX_LINES))
  (package / 'm.py').write_text(
      f'def long():\n  """Doc."""\n{body}\n\n'
      f'def explained():\n  """Doc."""\n  # Long: one table.\n{body}\n\n'
      f'def short():\n  return 1\n')
  (tmp_path / 'data_pipelines').mkdir()
  assert [f.split(' ')[1] for f in long_functions(str(tmp_path))] == ['long']
