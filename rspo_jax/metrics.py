"""Run metrics: one JSON line per event in ``metrics.jsonl``, TensorBoard,
and optionally Weights & Biases.

Each line is ``{"step": <A's step>, "phase": ..., "time": ..., <name>: value}``;
``launch/plot.py`` reads these files back. TensorBoard and W&B get every
numeric value of a line as ``<phase>/<name>`` (the same keys in both); W&B
also gets ``<phase>/step`` as that phase's x-axis (phases count their own
steps: the warm start's ``sft`` restarts at 0 before RL does).

W&B is on for a workdir once ``setup_wandb`` has written
``<workdir>/wandb.json`` (``build.build_run`` does, from
``metrics.wandb_project``): every ``MetricsWriter`` of that workdir then logs
to the run it names. The file keeps the run id, so a resumed run (the same
workdir started again) continues the same W&B run. ``WANDB_MODE=offline``
works as usual (``wandb sync <workdir>/wandb/offline-run-*`` uploads later).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import time
import uuid
from typing import Any, Optional

WANDB_FILE = "wandb.json"
METRICS_FILE = "metrics.jsonl"
GZ = ".gz"  # an archived run's metrics file: METRICS_FILE + GZ


def _clean(v):
  if isinstance(v, (bool, int, str, list)) or v is None:
    return v
  try:
    f = float(v)
  except (TypeError, ValueError):
    return str(v)
  return f if math.isfinite(f) else str(f)


# Per-item outcomes (an evaluation's ``per_task``) stay in the evaluation's
# own JSON file (eval_*.json); the metrics stream keeps its aggregates.
PER_ITEM_KEYS = ("per_task",)


def _flatten(d: dict, prefix: str = "") -> dict:
  """Nested dicts become dotted keys ({'a': {'b': 1}} -> {'a.b': 1});
  ``PER_ITEM_KEYS`` are left out."""
  out = {}
  for k, v in d.items():
    if k in PER_ITEM_KEYS:
      continue
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(v, (list, tuple)):
      out[f"{prefix}{k}"] = [_clean(x) for x in v]
    else:
      out[f"{prefix}{k}"] = v
  return out


def scalars(row: dict) -> dict:
  """The TensorBoard / W&B values of a metrics row: ``<phase>/<name>`` ->
  number, for every numeric field but ``step`` and ``time``."""
  phase = row["phase"]
  return {
      f"{phase}/{k}": v
      for k, v in row.items()
      if k not in ("step", "time", "phase") and isinstance(v, (int, float))
  }


class MetricsWriter:

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._f = open(self.path, "a", buffering=1)
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, "tb"))
      except ImportError:  # TensorBoard is optional
        self._tb = None
    self._wandb = _WandbLog.open(workdir)

  def write(self, step: int, phase: str, metrics: dict) -> None:
    row = {"step": int(step), "phase": phase, "time": time.time()}
    for k, v in _flatten(metrics).items():
      row[k] = _clean(v)
    self._f.write(json.dumps(row) + "\n")
    values = scalars(row)
    if self._tb is not None:
      for k, v in values.items():
        self._tb.add_scalar(k, v, step)
    if self._wandb is not None:
      self._wandb.log(phase, int(step), values)

  def close(self) -> None:
    self._f.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()
      self._wandb = None


# ------------------------------------------------------------ W&B


def wandb_settings(cfg) -> dict:
  """The W&B settings of a config.

  Its keys ``metrics.wandb_*``::

    metrics.wandb_project  ''  = off
    metrics.wandb_entity   ''  = the account's default entity
    metrics.wandb_name     ''  = the workdir's name
  """
  m = cfg.metrics
  return {
      "project": str(m.wandb_project or ""),
      "entity": str(m.wandb_entity or ""),
      "name": str(m.wandb_name or ""),
  }


def setup_wandb(
    workdir: str,
    project: str,
    *,
    entity: str = "",
    name: str = "",
    config: Optional[dict] = None,
) -> dict:
  """Writes ``<workdir>/wandb.json`` for the workdir's ``MetricsWriter``s.

  The run id is made once and kept: the same workdir started again (a
  resume) logs to the same W&B run. ``project=''`` turns W&B off for the
  workdir (the id stays, should it be turned on again). Returns the file's
  contents. Raises ImportError naming the extra when ``wandb`` is missing.
  """
  if project and importlib.util.find_spec("wandb") is None:
    from rspo_jax.errors import MissingPackage  # an ImportError, one line

    raise MissingPackage(
        "metrics.wandb_project is set but wandb is not installed: pip "
        "install 'rspo_jax[wandb]' (or wandb), or unset the project"
    )
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, WANDB_FILE)
  old = _read_json(path) or {}
  info = {
      "project": project,
      "entity": entity,
      "name": name or os.path.basename(os.path.abspath(workdir)),
      "id": old.get("id") or uuid.uuid4().hex[:12],
      "config": config or {},
  }
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(info, f, indent=1, default=str)
  os.replace(tmp, path)
  return info


def setup_wandb_from_config(workdir: str, cfg) -> Optional[dict]:
  """``setup_wandb`` from ``metrics.wandb_*``; None when W&B is off and
  the workdir never had it (nothing is written then)."""
  s = wandb_settings(cfg)
  path = os.path.join(workdir, WANDB_FILE)
  if not s["project"] and not os.path.exists(path):
    return None
  config = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
  return setup_wandb(
      workdir, s["project"], entity=s["entity"], name=s["name"], config=config
  )


class _WandbLog:
  """One W&B run per workdir in this process, shared by its writers
  (counted; finished when the last one closes)."""

  _open: dict[str, "_WandbLog"] = {}

  def __init__(self, key: str, run: Any):
    self.key, self.run, self.users = key, run, 0
    self.phases: set[str] = set()

  @classmethod
  def open(cls, workdir: str) -> Optional["_WandbLog"]:
    key = os.path.abspath(workdir)
    if key in cls._open:
      log = cls._open[key]
    else:
      info = _read_json(os.path.join(key, WANDB_FILE))
      if not info or not info.get("project"):
        return None
      import wandb

      run = wandb.init(
          project=info["project"],
          entity=info.get("entity") or None,
          name=info.get("name") or None,
          id=info["id"],
          resume="allow",
          dir=key,
          config=info.get("config") or None,
      )
      log = cls._open[key] = cls(key, run)
    log.users += 1
    return log

  def log(self, phase: str, step: int, values: dict) -> None:
    if phase not in self.phases:  # each phase on its own x-axis
      self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
      self.phases.add(phase)
    self.run.log({f"{phase}/step": step, **values})

  def close(self) -> None:
    self.users -= 1
    if self.users <= 0:
      self.run.finish()
      del self._open[self.key]


def _read_json(path: str) -> Optional[dict]:
  try:
    with open(path) as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def metrics_path(workdir: str) -> str:
  """``<workdir>/metrics.jsonl``; its gzipped form ``metrics.jsonl.gz``
  when only that exists; the plain path when neither does.

  A live run writes the plain file (``MetricsWriter``); an archived run
  (experiments/run_archive.py) keeps its metrics gzipped, so that the
  committed archive stays small (tests/repo_size_test.py). Readers of a
  run's metrics take this path and ``read_metrics`` it.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path) and os.path.exists(path + GZ):
    return path + GZ
  return path


def has_metrics(workdir: str) -> bool:
  """Whether ``workdir`` holds a metrics file, plain or gzipped."""
  return os.path.isfile(metrics_path(workdir))


def _open_text(path: str):
  """``path`` opened for reading text: gunzipped when it ends in ``.gz``,
  or when it does not exist and ``path + '.gz'`` does (an archived run's
  metrics.jsonl: ``metrics_path``)."""
  if not os.path.exists(path) and os.path.exists(path + GZ):
    path += GZ
  if path.endswith(GZ):
    return gzip.open(path, "rt")
  return open(path)


def read_metrics(path: str, phase: Optional[str] = None) -> list[dict]:
  """The rows of the metrics file ``path`` (of ``phase`` only, when given),
  in order; blank lines skipped. ``path`` may be gzipped (``<name>.gz``),
  and a missing ``path`` is read from ``path + '.gz'`` when that exists
  (an archived run's metrics: ``metrics_path``)."""
  rows = []
  with _open_text(path) as f:
    for line in f:
      line = line.strip()
      if line:
        row = json.loads(line)
        if phase is None or row.get("phase") == phase:
          rows.append(row)
  return rows
