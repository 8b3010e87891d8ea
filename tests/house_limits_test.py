"""The house limits on the library's size (issue 52), as the tree is written.

Every .py file under rspo_jax/ holds at most ``MAX_FILE_LINES`` lines;
every function (``def`` or ``async def``, methods and nested functions
included) spans at most ``MAX_FUNCTION_LINES`` lines, and every class at
most ``MAX_CLASS_LINES``, where a span is ``end_lineno - lineno + 1`` of
its ``ast`` node (its ``def``/``class`` line to its last line, decorators
excluded). The lines are those of the formatted tree (``pyink .``, run by
.ci/run as ``pyink --check .``), so a change that the formatter stretches
past a limit fails here. A failure names every file, function and class
over its limit; move a cohesive piece into a module of its own.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rspo_jax"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
MAX_CLASS_LINES = 450


def _sources() -> dict[str, str]:
  """{path from the repository root: text} of every module in rspo_jax/."""
  return {
      str(p.relative_to(ROOT)): p.read_text()
      for p in sorted(PACKAGE.rglob("*.py"))
      if "__pycache__" not in p.parts
  }


def _spans(tree: ast.AST, kinds: tuple) -> list[tuple[int, str, int]]:
  """(lines, name, first line) of every node of ``kinds`` in ``tree``."""
  return [
      (node.end_lineno - node.lineno + 1, node.name, node.lineno)
      for node in ast.walk(tree)
      if isinstance(node, kinds)
  ]


def test_the_scan_sees_the_package():
  sources = _sources()
  assert "rspo_jax/rspo.py" in sources and len(sources) > 50


def test_no_module_is_longer_than_the_limit():
  over = [
      f"{path}: {n} lines"
      for path, text in _sources().items()
      if (n := len(text.splitlines())) > MAX_FILE_LINES
  ]
  assert not over, (
      f"modules over {MAX_FILE_LINES} lines (move a cohesive piece into a"
      f" module of its own): {over}"
  )


def test_no_function_is_longer_than_the_limit():
  over = [
      f"{path}:{line} {name}: {n} lines"
      for path, text in _sources().items()
      for n, name, line in _spans(
          ast.parse(text, path), (ast.FunctionDef, ast.AsyncFunctionDef)
      )
      if n > MAX_FUNCTION_LINES
  ]
  assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_no_class_is_longer_than_the_limit():
  over = [
      f"{path}:{line} {name}: {n} lines"
      for path, text in _sources().items()
      for n, name, line in _spans(ast.parse(text, path), (ast.ClassDef,))
      if n > MAX_CLASS_LINES
  ]
  assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}"
