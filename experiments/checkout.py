"""Which checkout's code a study's subprocesses import: this one's.

An editable install maps the package name ``rspo_launch`` to the launch/
of the checkout it was installed from, and supplies rspo_jax from there
too. ``python launch/train.py`` puts only launch/ on sys.path, so a study
run from a pinned worktree would import another checkout's rspo_jax and
launch/ modules (run_absl, plot, xla_flags) unless its subprocesses get
``checkout_env``: a directory whose ``rspo_launch`` links to this
checkout's launch/, then the repo root, first on PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LAUNCH_LINK: list[str] = []


def checkout_paths() -> list[str]:
  """The sys.path entries that make this checkout's code the one imported:
  the ``rspo_launch`` link's directory (made once per process, under the
  temporary directory), then the repo root (rspo_jax, configs,
  third_party_envs)."""
  if not _LAUNCH_LINK:
    d = tempfile.mkdtemp(prefix="rspo_checkout_")
    os.symlink(os.path.join(ROOT, "launch"), os.path.join(d, "rspo_launch"))
    _LAUNCH_LINK.append(d)
  return [_LAUNCH_LINK[0], ROOT]


def checkout_env(env: Optional[dict] = None) -> dict:
  """``env`` (default os.environ) with ``checkout_paths()`` first on
  PYTHONPATH."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (*checkout_paths(), env.get("PYTHONPATH", "")) if p
  )
  return env


def use_this_checkout() -> None:
  """Puts ``checkout_paths()`` first on this process's sys.path, before
  any rspo_launch import (the reports load launch/plot.py)."""
  for p in reversed(checkout_paths()):
    if p not in sys.path:
      sys.path.insert(0, p)
