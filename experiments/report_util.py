"""Pieces every report uses: per-cell numbers over seeds, their text,
and curves drawn atomically by launch/plot.py.

  mean_std(xs)   = {mean, std (ddof 0)} over seeds;
  cell_stats     success / score (%) after training and at the start;
  fmt / fmt_ci   "m ± s" / "m [lo, hi]"; plot_atomic: a PNG or nothing.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import numpy as np

from run_files import FINAL, RUN_JSON, START

CURVE_METRIC = "rollout_success_rate"
X_AXES = ("step", "env_steps")


def mean_std(xs: Sequence[float]) -> dict:
  """{'mean', 'std'} with std over seeds at ddof 0; None for no seeds."""
  if not len(xs):
    return {"mean": None, "std": None}
  a = np.asarray(xs, np.float64)
  return {"mean": float(a.mean()), "std": float(a.std())}


def cell_stats(runs: Sequence[tuple[int, str]]) -> dict:
  """Success / score (%) after training and at the start of RL."""
  finals = [json.load(open(os.path.join(w, FINAL))) for _, w in runs]
  starts = [json.load(open(os.path.join(w, START))) for _, w in runs
            if os.path.isfile(os.path.join(w, START))]
  configs = []
  for _, w in runs:
    p = os.path.join(w, RUN_JSON)
    configs.append(json.load(open(p)).get("config") if os.path.isfile(p)
                   else None)
  return {
      "n": len(runs),
      "seeds": [s for s, _ in runs],
      "success": mean_std([100 * f["success_rate"] for f in finals]),
      "score": mean_std([100 * f["score"] for f in finals]),
      "start_success": mean_std([100 * s["success_rate"] for s in starts]),
      "per_seed_success": [100 * f["success_rate"] for f in finals],
      "configs": sorted({c for c in configs if c}),
  }


def fmt(ms: dict, digits: int = 1) -> str:
  if ms["mean"] is None:
    return "—"
  return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f}"


def fmt_ci(ci: Optional[dict], signed: bool = False, digits: int = 1) -> str:
  if ci is None:
    return "—"
  f = f"{'+' if signed else ''}.{digits}f"
  return f"{ci['mean']:{f}} [{ci['lo']:{f}}, {ci['hi']:{f}}]"


def pct(ci: dict) -> dict:
  return {**ci, **{k: 100 * ci[k] for k in ("mean", "lo", "hi")}}


def load_plot_module():
  """launch/plot.py (installed as rspo_launch.plot), imported on first
  use (matplotlib loads with it)."""
  from rspo_launch import plot  # noqa: PLC0415
  return plot


def plot_atomic(groups: dict[str, list[str]], metric: str, x: str,
                out_path: str, echo: bool = True, **kw) -> bool:
  """plot_curves into ``out_path`` via a tmp file; False when skipped."""
  groups = {k: v for k, v in groups.items() if v}
  if not groups:
    return False
  tmp = out_path + ".tmp"
  try:
    load_plot_module().plot_curves(groups, metric, x, tmp, **kw)
  except ValueError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if echo:
      print(json.dumps({"plot": out_path, "skipped": str(e)}), flush=True)
    return False
  os.replace(tmp, out_path)
  return True


def save_figure(fig, out_path: str) -> None:
  """Writes a matplotlib figure as a PNG to ``out_path`` via a tmp file
  (a reader never sees half a file) and closes it."""
  import matplotlib.pyplot as plt  # noqa: PLC0415  (loaded with the figure)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = out_path + ".tmp"
  fig.savefig(tmp, format="png")
  plt.close(fig)
  os.replace(tmp, out_path)


def archive_note(report: dict) -> str:
  archive = report.get("archive")
  return f" and in the archive `{archive}`" if archive else ""
