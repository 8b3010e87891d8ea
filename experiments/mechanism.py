"""What RSPO's parts did in a cell's runs, from their metrics.jsonl.

  b_lift            B's lift over its phase (``B_collect`` rows): the
                    success rate and dense return per trajectory of B's
                    stored collection minus those of its first training
                    collection (B = A), on the same tasks and seeds; mean
                    and 95 % bootstrap interval over loops x training
                    seeds, each (seed, loop) one sample;
  replay_by_position the share of replayed trajectories that won
                    (``replay_success_frac`` of ``A`` rows) by the A step's
                    position in its loop (``loop_step`` 0 .. k-1), mean
                    over loops and seeds.
Runs older than these metrics give None. numpy only.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

LIFT_KEYS = ("b_lift_success", "b_lift_dense_return")


def _rows(workdir: str, phase: str) -> list[dict]:
  from rspo_jax import metrics  # noqa: PLC0415 -- json only

  if not metrics.has_metrics(workdir):  # plain, or gzipped when archived
    return []
  return metrics.read_metrics(metrics.metrics_path(workdir), phase)


def b_lift(workdirs: Sequence[str], seed: int = 0) -> Optional[dict]:
  """{key: {mean, lo, hi}, 'samples': n} over every (run, loop) with a
  B_collect row holding the key; None when no run has one."""
  from rspo_jax import intervals  # noqa: PLC0415

  out = {}
  for key in LIFT_KEYS:
    x = [
        r[key]
        for w in workdirs
        for r in _rows(w, "B_collect")
        if r.get(key) is not None
    ]
    if x:
      out[key] = intervals.success_interval(
          np.asarray(x, np.float64)[:, None], seed=seed
      )
      out["samples"] = len(x)
  return out or None


def replay_by_position(workdirs: Sequence[str]) -> Optional[list]:
  """[mean replay_success_frac at loop position p for p = 0 .. k-1];
  None when no A row has both fields."""
  by = {}
  for w in workdirs:
    for r in _rows(w, "A"):
      if "loop_step" in r and r.get("replay_trajectories"):
        by.setdefault(int(r["loop_step"]), []).append(r["replay_success_frac"])
  if not by:
    return None
  return [float(np.mean(by.get(p, [np.nan]))) for p in range(max(by) + 1)]
