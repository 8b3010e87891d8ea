"""Pieces every report uses: per-cell numbers over seeds, their
intervals, their text, and curves drawn atomically by launch/plot.py.

  mean_std(xs)        = {mean, std (ddof 0)} over seeds;
  cell_stats          success / score (%) after training and at the start;
  decodings           (label, start file, final file) per decoding;
  outcomes            x[r, g, s] (won) of evaluation files, same tasks;
  decoding_intervals  a cell's 95 % bootstrap intervals in one decoding:
                      success, final - start (paired), - base;
  nested_interval     a mean over groups of group means, with its interval;
  other_config_seeds  a cell's seeds trained with another config;
  fmt / fmt_ci        "m ± s" / "m [lo, hi]"; plot_atomic: a PNG or nothing.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Sequence

import numpy as np

from grid import config_key, sampled_names
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
  starts = [
      json.load(open(os.path.join(w, START)))
      for _, w in runs
      if os.path.isfile(os.path.join(w, START))
  ]
  configs = []
  for _, w in runs:
    p = os.path.join(w, RUN_JSON)
    configs.append(
        json.load(open(p)).get("config") if os.path.isfile(p) else None
    )
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


def plot_atomic(
    groups: dict[str, list[str]],
    metric: str,
    x: str,
    out_path: str,
    echo: bool = True,
    **kw,
) -> bool:
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


def save_figure(fig, out_path: str, dpi=None) -> None:
  """Writes a matplotlib figure as a PNG to ``out_path`` via a tmp file
  (a reader never sees half a file) and closes it; ``dpi`` as savefig's
  (None: matplotlib's default)."""
  import matplotlib.pyplot as plt  # noqa: PLC0415  (loaded with the figure)

  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = out_path + ".tmp"
  fig.savefig(tmp, format="png", dpi=dpi)
  plt.close(fig)
  os.replace(tmp, out_path)


def archive_note(report: dict) -> str:
  archive = report.get("archive")
  return f" and in the archive `{archive}`" if archive else ""


# ------------------------------------------------ intervals over outcomes
# A decoding's evaluation files hold per-task outcomes; x[r, g, s] stacks
# them over runs r, goals g and sampling seeds s (rspo_jax/intervals.py).


def decodings(sampled) -> tuple:
  """(label, start file, final file): greedy, then each of ``sampled``'s
  (label, tag, temperature)."""
  return (("greedy", START, FINAL),) + tuple(
      (label, *sampled_names(tag)) for label, tag, _ in sampled
  )


def outcomes(paths: Sequence[str]):
  """``x[r, g, s]`` (won) of evaluation files on the same tasks and seeds;
  None when one is missing or has no ``per_task``."""
  from rspo_jax import intervals  # noqa: PLC0415 -- numpy only

  mats = []
  for p in paths:
    if not os.path.isfile(p):
      return None
    per_task = json.load(open(p)).get("per_task")
    if not per_task:
      return None
    mats.append(intervals.outcome_matrix(per_task))
  if not mats or len({m.shape for m in mats}) != 1:
    return None
  return np.stack(mats)


def difference(a, b, seed: int) -> Optional[dict]:
  """a - b in points (intervals.method_difference: goals shared, training
  seeds resampled within each side); None without both or on other
  goals."""
  from rspo_jax import intervals  # noqa: PLC0415

  if a is None or b is None or a.shape[1] != b.shape[1]:
    return None
  return pct(intervals.method_difference(a, b, seed=seed))


def decoding_intervals(x, start, base, seed: int) -> dict:
  """A cell's intervals in one decoding, percent / points: ``success`` of
  its finals ``x``; ``final_minus_start`` paired with the shared warm
  start's ``start`` (its one run) on the same goals; ``minus_baseline``
  against the base cell's finals ``base`` (None: no base)."""
  from rspo_jax import intervals  # noqa: PLC0415

  if start is not None and x is not None and x.shape[1] != start.shape[1]:
    start = None  # another goal set: no pairing
  return {
      "success": None
      if x is None
      else pct(intervals.success_interval(x, seed=seed)),
      "final_minus_start": None
      if x is None or start is None
      else pct(intervals.paired_difference(x, start[0], seed=seed)),
      "minus_baseline": difference(x, base, seed),
  }


def start_intervals(starts: dict, seed: int) -> dict:
  """{decoding: the shared warm start's success interval (%) or None}."""
  from rspo_jax import intervals  # noqa: PLC0415

  return {
      d: None if x is None else pct(intervals.success_interval(x[0], seed=seed))
      for d, x in starts.items()
  }


def nested_interval(
    groups: Sequence[Sequence[float]],
    *,
    seed: int = 0,
    num_draws: int = 2000,
    level: float = 0.95,
) -> Optional[dict]:
  """Mean over groups (training seeds) of each group's mean (its loops or
  steps), with a percentile bootstrap interval: groups resampled, then
  values within each drawn group; None without values."""
  groups = [np.asarray(g, np.float64) for g in groups if len(g)]
  if not groups:
    return None
  rng = np.random.default_rng(seed)
  picked = rng.integers(0, len(groups), (num_draws, len(groups)))
  draws = np.zeros(num_draws)
  for j in range(len(groups)):  # slot j of every draw: a group, resampled
    for i, g in enumerate(groups):
      rows = picked[:, j] == i
      draws[rows] += g[rng.integers(0, len(g), (rows.sum(), len(g)))].mean(1)
  draws /= len(groups)
  lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
  return {
      "mean": float(np.mean([g.mean() for g in groups])),
      "lo": float(lo),
      "hi": float(hi),
      "level": level,
      "draws": num_draws,
      "n_groups": len(groups),
      "n_values": int(sum(len(g) for g in groups)),
  }


def other_config_seeds(configs: dict, spec: Callable, extra: str) -> list[int]:
  """The seeds of ``configs`` ({seed: run.json's config}) trained with
  another config (config_key) than ``spec(seed).config_arg(extra)``, the
  grid's (run names do not hold the overrides)."""
  return [
      s
      for s, c in configs.items()
      if c is not None
      and config_key(c) != config_key(spec(s).config_arg(extra))
  ]
