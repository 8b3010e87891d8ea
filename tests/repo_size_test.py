"""The tracked tree stays small: every clone and CI run pays for it.

Weights are regenerated, not committed (experiments/run_archive.py keeps a
policy's sha256 and the command that regenerates it). Sizes are those of
the files ``git ls-files`` lists, as checked out; outside a git checkout
the tests skip.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_DOCS_FILE_BYTES = 1 << 20  # 1 MiB: any one tracked file under docs/
MAX_TREE_BYTES = 40 << 20  # 40 MiB: the whole tracked tree


def tracked_sizes() -> dict[str, int]:
  """{path: bytes} of the tracked files present in the working tree."""
  if shutil.which("git") is None:
    pytest.skip("git is not installed")
  proc = subprocess.run(
      ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True
  )
  if proc.returncode != 0:
    pytest.skip("not a git checkout")
  paths = [p for p in proc.stdout.decode().split("\0") if p]
  return {
      p: os.path.getsize(os.path.join(ROOT, p))
      for p in paths
      if os.path.isfile(os.path.join(ROOT, p))
  }


def test_no_tracked_docs_file_over_1_mib():
  big = {
      p: n
      for p, n in tracked_sizes().items()
      if p.startswith("docs/") and n > MAX_DOCS_FILE_BYTES
  }
  assert not big, f"tracked files under docs/ over 1 MiB: {big}"


def test_no_weights_under_docs():
  weights = [
      p
      for p in tracked_sizes()
      if p.startswith("docs/") and p.endswith(".safetensors")
  ]
  assert not weights, f"weights tracked under docs/: {weights[:5]}"


def test_tracked_tree_under_40_mib():
  sizes = tracked_sizes()
  total = sum(sizes.values())
  largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
  assert total <= MAX_TREE_BYTES, (
      f"the tracked tree holds {total} bytes, over {MAX_TREE_BYTES};"
      f" largest: {largest}"
  )
