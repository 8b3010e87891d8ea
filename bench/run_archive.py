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
      final_policy/            its final policy A (the deliverable; the
                               critic and optimizer state are not kept) as
                               an HF directory: config.json,
                               model.safetensors (float32 masters),
                               tokenizer files, export.json (checkpoint
                               step, A's steps), when its files take at
                               most MAX_POLICY_BYTES (CPU studies: ~2.6 MB)
      final_policy_too_large.json  else {bytes, max_bytes}: the policy is
                               not exported again on later passes (unless
                               MAX_POLICY_BYTES grows past its bytes)
  <archive>/warm_start_<env>/  the shared warm start: done.json (the config
                               it was behaviour-cloned with), its
                               eval_start*.json, command.txt (its metrics
                               hold 'sft' rows only: not kept), and
      warm_start/              its policy (the HF directory runs start
                               from) when under MAX_POLICY_BYTES (the CPU
                               studies' nano policies: ~2.5 MB)

Never checkpoints, replay shards, TensorBoard files, train.log or the
tokenizer, apart from the two small policies. The final policy is exported
from the run's latest checkpoint (the one launch/eval.py --workdir
evaluates) by ``python launch/export.py`` (rspo_jax/policy_export.py; a
subprocess of the --python interpreter, so this module imports no JAX)
into a temporary directory, with the run's run.json config, once: a
complete final_policy/ of the same training is not exported again, and a
run without checkpoint or run.json has none. Each file is written
atomically (tmp + os.replace), and only when its bytes change; a policy's
model.safetensors last (a policy without it is incomplete: ignored, redone),
eval_final.json last of all (a copy cut short is not a finished run). Files
are added or replaced, never removed; except that a finished run whose
archived copy is of another training (its eval_final.json differs) or was
cut short (has none) first has that copy's files removed, eval_final.json
first, then final_policy/ (weights first).

Reading (``run_dir``): a run is ``<root>/<name>`` when finished there --
root wins -- else ``<archive>/<name>`` when finished there; such a run
counts as finished (skipped, not trained again). An evaluation it lacks
(bench/sampled_eval.py ``sampled_final_eval``) is made of its archived
final_policy/ (``model.checkpoint_dir``; on the WebShop study's GiGPO
baseline its per-goal outcomes equal the checkpoint's, greedy and T = 0.4 x
3 seeds on 8 goals) and the file added here (``archive_file``). A run still
to train needs the warm start under root: ``restore_policy`` copies the
archived policy back (behaviour cloning is not reproducible bit for bit
across machines and sessions: a re-made warm start of the WebShop study
scored 24.6 % greedy where the archived one scored 28.5 %, so new runs must
start from the very policy the archived runs started from), else it is
re-made by SFT; ``restore`` copies the archived evaluations of it into root
instead of computing them again.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

FINAL = "eval_final.json"  # a finished run's mark (bench/run_files.py)
METRICS = "metrics.jsonl"
KEPT_FILES = ("run.json", "command.txt", "done.json")
KEPT_PATTERN = "eval*.json"
KEPT_PHASES = ("A", "B", "B_collect", "eval")
WARM_START = "warm_start_"  # prefix of a shared warm start's directory
POLICY = "warm_start"  # the warm start's policy, inside that directory
POLICY_WEIGHTS = "model.safetensors"  # written last: a complete policy
MAX_POLICY_BYTES = 32 << 20  # larger policies (paper scale) are not kept
FINAL_POLICY = "final_policy"  # a finished run's policy A, in its directory
TOO_LARGE = "final_policy_too_large.json"  # {bytes, max_bytes}: not kept
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT_PY = os.path.join(ROOT, "launch", "export.py")


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


def archive_run(workdir: str, archive: str,
                python: str = sys.executable) -> list[str]:
  """Copies a run's (or warm start's) small files into ``<archive>/<its
  name>``, and a finished run's final policy (``archive_final_policy``,
  exported with ``python``); returns the names written (none when all were
  up to date)."""
  dst = archived_dir(workdir, archive)
  if (is_finished(workdir) and os.path.isdir(dst)
      and not same_run(workdir, archive)):
    # Another training's files or a copy cut short: the finished mark first,
    # then its final policy (weights first), then the rest.
    if os.path.isfile(os.path.join(dst, FINAL)):
      os.remove(os.path.join(dst, FINAL))
    _remove_policy(os.path.join(dst, FINAL_POLICY))
    for n in sorted(os.listdir(dst)):
      if os.path.isfile(os.path.join(dst, n)):
        os.remove(os.path.join(dst, n))
  files = {n: _read(os.path.join(workdir, n)) for n in kept_files(workdir)}
  metrics = os.path.join(workdir, METRICS)
  if os.path.isfile(metrics) and (rows := kept_metrics(metrics)):
    files[METRICS] = rows
  if files:
    os.makedirs(dst, exist_ok=True)
  written = _copy_policy(workdir, dst) + archive_final_policy(
      workdir, dst, python)
  # The finished mark last: a copy cut short is not taken as finished.
  return written + [n for n in sorted(files, key=lambda n: n == FINAL)
                    if _write_atomic(os.path.join(dst, n), files[n])]


def _policy_files(policy: str) -> list[str]:
  """The files of a policy directory, its weights last."""
  return sorted((n for n in os.listdir(policy)
                 if os.path.isfile(os.path.join(policy, n))),
                key=lambda n: n == POLICY_WEIGHTS)


def _copy_policy(workdir: str, dst: str) -> list[str]:
  """Copies ``<workdir>/warm_start/`` (a warm start's policy) into
  ``<dst>/warm_start/`` (``_copy_policy_dir``); the names written."""
  src = os.path.join(workdir, POLICY)
  if not os.path.basename(os.path.normpath(workdir)).startswith(WARM_START):
    return []
  return _copy_policy_dir(src, os.path.join(dst, POLICY), POLICY)


def _copy_policy_dir(src: str, dst: str, label: str) -> list[str]:
  """Copies the policy directory ``src`` into ``dst`` when it is complete
  (has its weights) and its files take at most MAX_POLICY_BYTES, weights
  last; the names written, as ``<label>/<name>``."""
  if not os.path.isfile(os.path.join(src, POLICY_WEIGHTS)):
    return []
  names = _policy_files(src)
  if _policy_bytes(src) > MAX_POLICY_BYTES:
    return []
  os.makedirs(dst, exist_ok=True)
  return [f"{label}/{n}" for n in names if _write_atomic(
      os.path.join(dst, n), _read(os.path.join(src, n)))]


def _remove_policy(policy: str) -> None:
  """Removes a policy directory, its weights first (then it is no longer
  complete)."""
  if os.path.isdir(policy):
    for n in reversed(_policy_files(policy)):
      os.remove(os.path.join(policy, n))
    shutil.rmtree(policy)


def final_policy(run: str) -> Optional[str]:
  """``<run>/final_policy`` when it holds a complete policy, else None."""
  path = os.path.join(run, FINAL_POLICY)
  return path if os.path.isfile(os.path.join(path, POLICY_WEIGHTS)) else None


def has_checkpoint(workdir: str) -> bool:
  ckpts = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ckpts) and any(n.isdigit() for n in os.listdir(ckpts))


def export_policy(workdir: str, config: str, out: str,
                  python: str = sys.executable) -> dict:
  """``python launch/export.py`` of ``workdir``'s latest policy A into
  ``out`` (rspo_jax/policy_export.py; params over MAX_POLICY_BYTES are not
  exported); its JSON line, or {'exported': False, 'reason': <its output's
  tail>} when it failed."""
  proc = subprocess.run(
      [python, EXPORT_PY, f"--config={config}", f"--workdir={workdir}",
       f"--out={out}", f"--max_bytes={MAX_POLICY_BYTES}"],
      cwd=ROOT, capture_output=True, text=True)
  lines = proc.stdout.strip().splitlines()
  if proc.returncode == 0 and lines:
    try:
      return json.loads(lines[-1])
    except ValueError:
      pass
  tail = (proc.stdout + proc.stderr).strip()[-2000:]
  return {"exported": False,
          "reason": f"exit code {proc.returncode}: {tail}"}


def archive_final_policy(workdir: str, dst: str,
                         python: str = sys.executable) -> list[str]:
  """A finished run's final policy A into ``<dst>/final_policy/``: exported
  from the run's latest checkpoint (``export_policy``, the run's run.json
  config) into a temporary directory, then copied (``_copy_policy_dir``:
  at most MAX_POLICY_BYTES, weights last). Nothing is done when ``dst``
  already holds a complete one (archive_run removed it first if it was of
  another training), or the run has no checkpoint or run.json. A failed
  export is reported on stderr; the names written."""
  meta = os.path.join(workdir, "run.json")
  if not (is_finished(workdir) and has_checkpoint(workdir)
          and os.path.isfile(meta)) or final_policy(dst) or too_large(dst):
    return []
  config = json.loads(_read(meta)).get("config")
  if not config:
    return []
  with tempfile.TemporaryDirectory(prefix="final_policy_") as tmp:
    out = os.path.join(tmp, FINAL_POLICY)
    info = export_policy(workdir, config, out, python)
    if not info.get("exported"):
      if "bytes" not in info:  # a failure, not a policy over the limit
        print(json.dumps({"final_policy": workdir, "not_archived":
                          info.get("reason")}), file=sys.stderr, flush=True)
        return []
      return _mark_too_large(dst, info["bytes"])
    size = _policy_bytes(out)
    if size > MAX_POLICY_BYTES:  # its files over the limit, not its params
      return _mark_too_large(dst, size)
    os.makedirs(dst, exist_ok=True)
    copied = _copy_policy_dir(out, os.path.join(dst, FINAL_POLICY),
                              FINAL_POLICY)
    if os.path.exists(os.path.join(dst, TOO_LARGE)):  # the limit grew
      os.remove(os.path.join(dst, TOO_LARGE))
    return copied


def too_large(dst: str) -> bool:
  """``<dst>/TOO_LARGE`` says the run's final policy took more bytes than
  MAX_POLICY_BYTES allows now: not exported again on every archive pass
  (a subprocess loading a checkpoint; paper scale) unless the limit grew."""
  path = os.path.join(dst, TOO_LARGE)
  return (os.path.isfile(path)
          and json.loads(_read(path))["bytes"] > MAX_POLICY_BYTES)


def _mark_too_large(dst: str, size: int) -> list[str]:
  os.makedirs(dst, exist_ok=True)
  data = json.dumps({"bytes": int(size), "max_bytes": MAX_POLICY_BYTES})
  return [TOO_LARGE] if _write_atomic(os.path.join(dst, TOO_LARGE),
                                      data.encode()) else []


def _policy_bytes(policy: str) -> int:
  """The bytes of a policy directory's files."""
  return sum(os.path.getsize(os.path.join(policy, n))
             for n in _policy_files(policy))


def archive_file(src: str, run: str) -> bool:
  """Copies the file ``src`` into the archived run directory ``run`` (an
  evaluation of its archived final policy); False when it held it."""
  return _write_atomic(os.path.join(run, os.path.basename(src)), _read(src))


def restore_policy(workdir: str, archive: Optional[str]) -> bool:
  """Copies an archived warm start (its policy, then done.json) into
  ``workdir`` when the archive has a complete one; True when it did."""
  if not archive:
    return False
  src = archived_dir(workdir, archive)
  policy = os.path.join(src, POLICY)
  if not (os.path.isfile(os.path.join(policy, POLICY_WEIGHTS))
          and os.path.isfile(os.path.join(src, "done.json"))):
    return False
  os.makedirs(os.path.join(workdir, POLICY), exist_ok=True)
  for n in _policy_files(policy):
    _write_atomic(os.path.join(workdir, POLICY, n),
                  _read(os.path.join(policy, n)))
  _write_atomic(os.path.join(workdir, "done.json"),
                _read(os.path.join(src, "done.json")))
  return True


def archive_root(root: str, archive: str,
                 python: str = sys.executable) -> dict[str, list[str]]:
  """Archives every finished run and every warm start under ``root``
  (final policies exported with ``python``); {directory name: names
  written} of those that changed."""
  if not os.path.isdir(root):
    return {}
  changed = {}
  for name in sorted(os.listdir(root)):
    wd = os.path.join(root, name)
    if os.path.isdir(wd) and (is_finished(wd) or name.startswith(WARM_START)):
      written = archive_run(wd, archive, python)
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
