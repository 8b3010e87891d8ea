"""``default_run``: the default run and GRPO alone against their shared
start, in success (percent) and in score (0-1, three decimals)."""

from __future__ import annotations

import os

import numpy as np

from intervals_record.common import (
    RESULTS,
    SEEDS3,
    outcomes,
    percent,
    rounded,
)
from rspo_jax import intervals


def default_run() -> dict:
  """The default run (RSPO+GRPO, 3 A steps, T = 0.4, one sample a goal)
  and GRPO alone, training seeds 0, 200, 400, against the shared start."""
  base = os.path.join(RESULTS, "default_run")
  rspo = [
      os.path.join(base, d, "eval_final.json")
      for d in ("", "seed_200", "seed_400")
  ]
  grpo = [
      os.path.join(base, "grpo_alone", f"seed_{s}", "eval_final.json")
      for s in SEEDS3
  ]
  start = outcomes(os.path.join(base, "eval_start.json"))
  xr, xg = (np.stack([outcomes(p) for p in ps]) for ps in (rspo, grpo))
  out = {}
  for name, x, q in (
      ("RSPO+GRPO final - start", xr, "+2.3 [-0.4, +5.2]"),
      ("GRPO final - start", xg, "+2.3 [-1.2, +6.0]"),
  ):
    d = 100 * (x.mean(axis=(1, 2)) - start.mean())
    t = intervals.t_interval(d)
    out[name] = {
        "n": 3,
        "quoted": q,
        "per_seed_gain": [rounded(v) for v in d],
        "bootstrap": percent(intervals.paired_difference(x, start, seed=0)),
        "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
        "sign_flip_p": rounded(intervals.sign_flip_p(d), 3),
    }
  sr, sg = 100 * xr.mean(axis=(1, 2)), 100 * xg.mean(axis=(1, 2))
  w = intervals.welch_interval(sr, sg)
  out["RSPO+GRPO - GRPO"] = {
      "n_a": 3,
      "n_b": 3,
      "quoted": "+0.0 [-3.6, +4.2]",
      "bootstrap": percent(intervals.method_difference(xr, xg, seed=0)),
      "welch": {k: rounded(w[k]) for k in ("mean", "lo", "hi", "df")},
      "permutation_p": rounded(intervals.permutation_p(sr, sg), 3),
      "rank_p": rounded(intervals.rank_p(sr, sg), 3),
  }
  # The score (0-1), three decimals: final - start and RSPO+GRPO - GRPO.
  start = outcomes(os.path.join(base, "eval_start.json"), "score")
  xr, xg = (np.stack([outcomes(p, "score") for p in ps]) for ps in (rspo, grpo))
  for name, x, q in (
      ("RSPO+GRPO score final - start", xr, "+0.025 [+0.001, +0.053]"),
      ("GRPO score final - start", xg, None),
  ):
    d = x.mean(axis=(1, 2)) - start.mean()
    t = intervals.t_interval(d)
    b = intervals.paired_difference(x, start, seed=0)
    out[name] = {
        "n": 3,
        "quoted": q,
        "per_seed_gain": [rounded(v, 3) for v in d],
        "bootstrap": {k: rounded(b[k], 3) for k in ("mean", "lo", "hi")},
        "t": {k: rounded(t[k], 3) for k in ("mean", "lo", "hi")},
        "sign_flip_p": rounded(intervals.sign_flip_p(d), 3),
    }
  sr, sg = xr.mean(axis=(1, 2)), xg.mean(axis=(1, 2))
  w = intervals.welch_interval(sr, sg)
  b = intervals.method_difference(xr, xg, seed=0)
  out["RSPO+GRPO - GRPO score"] = {
      "n_a": 3,
      "n_b": 3,
      "quoted": "+0.024 [+0.000, +0.051]",
      "bootstrap": {k: rounded(b[k], 3) for k in ("mean", "lo", "hi")},
      "welch": {k: rounded(w[k], 3) for k in ("mean", "lo", "hi", "df")},
      "permutation_p": rounded(intervals.permutation_p(sr, sg), 3),
      "rank_p": rounded(intervals.rank_p(sr, sg), 3),
  }
  return out
