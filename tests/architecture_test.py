"""docs/architecture.md names every module and script, and only real ones.

Every .py file under rspo_jax/, launch/, bench/, experiments/, configs/,
scripts/ and at the top level of third_party_envs/ must appear in the doc by
its path from the repository root, and every ``rspo_jax/...``, ``bench/...``
and ``experiments/...`` path the doc names must exist, so adding, moving or
removing a module without the doc fails here.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
TREES = ("rspo_jax", "launch", "bench", "experiments", "configs", "scripts")


def _modules() -> list[str]:
  """Every module and script the doc must list, as root-relative paths."""
  files = [p for tree in TREES for p in (ROOT / tree).rglob("*.py")]
  files += (ROOT / "third_party_envs").glob("*.py")
  return sorted(
      str(p.relative_to(ROOT)) for p in files if "__pycache__" not in p.parts
  )


def test_every_module_and_script_is_in_the_doc():
  doc = DOC.read_text()
  missing = [path for path in _modules() if f"`{path}`" not in doc]
  assert (
      not missing
  ), f"docs/architecture.md does not list (as `path`): {missing}"


def test_every_module_path_the_doc_names_exists():
  doc = DOC.read_text()
  named = set(
      re.findall(r"(?<![\w/.])(?:rspo_jax|bench|experiments)/[\w/.]*\w/?", doc)
  )
  absent = sorted(p for p in named if not (ROOT / p).exists())
  assert (
      named and not absent
  ), f"docs/architecture.md names paths that do not exist: {absent}"
