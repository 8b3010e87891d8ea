"""What a run directory holds, and where the runs of a cell are.

A run's workdir holds ``run.json`` (the ``--config`` it was started with,
and the code it ran: ``code_version``),
``train.log``, ``eval_start.json`` and, once finished, ``eval_final.json``
(``is_finished``). A cell's finished runs are looked up under ``--root``,
else in the ``--archive`` (experiments/run_archive.py; root wins). Reports and
marks are written atomically (tmp + rename).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Optional

import run_archive as ra

FINAL, START, RUN_JSON, LOG = (
    "eval_final.json",
    "eval_start.json",
    "run.json",
    "train.log",
)


def is_finished(workdir: str) -> bool:
  return os.path.isfile(os.path.join(workdir, FINAL))


def run_config(workdir: str) -> Optional[str]:
  """The ``--config`` a run was started with (its run.json), if known."""
  meta = os.path.join(workdir, RUN_JSON)
  return json.load(open(meta)).get("config") if os.path.isfile(meta) else None


def code_version(repo: str) -> dict:
  """``{"commit": sha, "dirty": bool}`` of the git checkout at ``repo``
  (dirty: tracked files outside docs/ changed since the commit; a study
  writes its reports and archive under docs/), or ``{}`` outside one
  (an installed wheel). Two runs of one config at one clean commit play
  the same rollouts; the commit says which code a number came from."""

  def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()

  try:
    commit = git("rev-parse", "HEAD")
    dirty = bool(
        git(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)docs",
        )
    )
  except (OSError, subprocess.SubprocessError):
    return {}
  return {"commit": commit, "dirty": dirty}


def warm_start_workdir(root: str, env: str) -> str:
  return os.path.join(root, f"warm_start_{env}")


def finished_runs(
    root: str, env: str, algo: str, variant: str, archive: str = ""
) -> list[tuple[int, str]]:
  """(seed, workdir) of the finished runs of a cell, any seed, by seed:
  under root, else in ``archive`` (experiments/run_archive.py; root wins)."""
  pat = re.compile(re.escape(f"{env}_{algo}_{variant}_s") + r"(\d+)$")
  names = {
      d
      for top in (root, archive)
      if top and os.path.isdir(top)
      for d in os.listdir(top)
      if pat.match(d)
  }
  found = []
  for d in names:
    wd = ra.run_dir(root, archive, d)
    if is_finished(wd):
      found.append((int(pat.match(d).group(1)), wd))
  return sorted(found)


def write_json(path: str, obj) -> None:
  write_text(path, json.dumps(obj, indent=1) + "\n")


def write_text(path: str, text: str) -> None:
  """Atomic: a reader sees the old file or the new one, never half."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)
