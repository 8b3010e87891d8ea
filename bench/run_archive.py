r"""An archive of finished runs inside the repository (bench/reproduce.py
``--archive DIR``): the small files the reports read, kept across working
sessions that each start from a fresh clone (runs/ is git-ignored).

  <archive>/<run name>/        a finished run (its eval_final.json exists):
      run.json                 the --config argument it was trained with
      eval*.json               every evaluation, per_task included
      metrics.jsonl            its rows of phases A, B, B_collect and eval,
                               verbatim (the curve plots, bench/ablations.py
                               and bench/study_probes.py read the A rows);
                               dropped: the 'time', 'B_time' and 'compile'
                               rows (seconds per phase, compile counts)
      command.txt              when present
  <archive>/warm_start_<env>/  the shared warm start: done.json (the config
                               it was behaviour-cloned with), its
                               eval_start*.json, command.txt (its metrics
                               hold 'sft' rows only: not kept)

Never checkpoints, replay shards, TensorBoard files, train.log or the
tokenizer. Each file is written atomically (tmp + os.replace), and only
when its bytes change, eval_final.json last (a copy cut short is not a
finished run). Files are added or replaced, never removed; except that a
finished run whose archived copy is of another training (its
eval_final.json differs) or was cut short (has none) first has that copy's
files removed, eval_final.json first.

Reading (``run_dir``): a run is ``<root>/<name>`` when finished there --
root wins -- else ``<archive>/<name>`` when finished there; such a run
counts as finished (skipped, not trained again). The warm start's
checkpoint is not archived: a run still to train re-creates it under root
by SFT, and ``restore`` copies the archived evaluations of it into root
instead of computing them again.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Optional

FINAL = "eval_final.json"  # a finished run's mark (bench/reproduce.py)
METRICS = "metrics.jsonl"
KEPT_FILES = ("run.json", "command.txt", "done.json")
KEPT_PATTERN = "eval*.json"
KEPT_PHASES = ("A", "B", "B_collect", "eval")
WARM_START = "warm_start_"  # prefix of a shared warm start's directory


def is_finished(workdir: str) -> bool:
  return os.path.isfile(os.path.join(workdir, FINAL))


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def _write_atomic(path: str, data: bytes) -> bool:
  """Writes ``data`` via ``<path>.tmp``; False when the file already holds
  it."""
  if os.path.isfile(path) and _read(path) == data:
    return False
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)
  return True


def kept_files(workdir: str) -> list[str]:
  """The names of the small files of ``workdir`` the archive keeps (the
  metrics file apart)."""
  return sorted(
      n for n in os.listdir(workdir)
      if os.path.isfile(os.path.join(workdir, n))
      and (n in KEPT_FILES or fnmatch.fnmatch(n, KEPT_PATTERN)))


def kept_metrics(path: str) -> bytes:
  """The lines of a metrics.jsonl whose phase is in KEPT_PHASES, verbatim
  (a torn last line is left out)."""
  kept = []
  with open(path, "rb") as f:
    for line in f:
      try:
        phase = json.loads(line).get("phase")
      except ValueError:
        continue
      if phase in KEPT_PHASES:
        kept.append(line.rstrip(b"\n") + b"\n")
  return b"".join(kept)


def archived_dir(workdir: str, archive: str) -> str:
  return os.path.join(archive, os.path.basename(os.path.normpath(workdir)))


def same_run(workdir: str, archive: Optional[str]) -> bool:
  """Both the run under root and its archived copy are finished, and from
  the same training: the same eval_final.json."""
  if not archive:
    return False
  dst = archived_dir(workdir, archive)
  return (is_finished(workdir) and is_finished(dst) and _read(
      os.path.join(workdir, FINAL)) == _read(os.path.join(dst, FINAL)))


def archive_run(workdir: str, archive: str) -> list[str]:
  """Copies a run's (or warm start's) small files into ``<archive>/<its
  name>``; returns the names written (none when all were up to date)."""
  dst = archived_dir(workdir, archive)
  if (is_finished(workdir) and os.path.isdir(dst)
      and not same_run(workdir, archive)):
    # Another training's files or a copy cut short, the finished mark first.
    for n in sorted(os.listdir(dst), key=lambda n: n != FINAL):
      if os.path.isfile(os.path.join(dst, n)):
        os.remove(os.path.join(dst, n))
  files = {n: _read(os.path.join(workdir, n)) for n in kept_files(workdir)}
  metrics = os.path.join(workdir, METRICS)
  if os.path.isfile(metrics) and (rows := kept_metrics(metrics)):
    files[METRICS] = rows
  if files:
    os.makedirs(dst, exist_ok=True)
  # The finished mark last: a copy cut short is not taken as finished.
  return [n for n in sorted(files, key=lambda n: n == FINAL)
          if _write_atomic(os.path.join(dst, n), files[n])]


def archive_root(root: str, archive: str) -> dict[str, list[str]]:
  """Archives every finished run and every warm start under ``root``;
  {directory name: names written} of those that changed."""
  if not os.path.isdir(root):
    return {}
  changed = {}
  for name in sorted(os.listdir(root)):
    wd = os.path.join(root, name)
    if os.path.isdir(wd) and (is_finished(wd) or name.startswith(WARM_START)):
      written = archive_run(wd, archive)
      if written:
        changed[name] = written
  return changed


def run_dir(root: str, archive: Optional[str], name: str) -> str:
  """``<root>/<name>``, or ``<archive>/<name>`` when only that one is
  finished."""
  wd = os.path.join(root, name)
  if archive and not is_finished(wd):
    archived = os.path.join(archive, name)
    if is_finished(archived):
      return archived
  return wd


def find_file(workdir: str, archive: Optional[str], name: str) -> str:
  """``<workdir>/<name>`` when it exists, else the archive's copy when that
  exists (the same directory name under ``archive``), else the former."""
  path = os.path.join(workdir, name)
  if archive and not os.path.exists(path):
    archived = os.path.join(archived_dir(workdir, archive), name)
    if os.path.isfile(archived):
      return archived
  return path


def restore(workdir: str, archive: Optional[str], name: str) -> bool:
  """Copies the archive's ``name`` of this directory into ``workdir`` when
  ``workdir`` lacks it; True when ``workdir`` now holds the archive's."""
  src = find_file(workdir, archive, name)
  if src == os.path.join(workdir, name):
    return False
  os.makedirs(workdir, exist_ok=True)
  _write_atomic(os.path.join(workdir, name), _read(src))
  return True
