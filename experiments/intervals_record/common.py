"""What every section of the record's intervals uses: the archive's
outcome matrices, B's logged lifts, and one JSON record per interval.

  cell_outcomes   x[r, g, s] of a cell's archived runs at a decoding;
  start_outcomes  x[g, s] of a study's shared warm start;
  seeds_run       the seeds at which every named cell finished;
  contrast        cell a - cell b over independent seeds (two_sample);
  gain            final - shared start, per seed;
  level           one cell's success over its seeds;
  by_seed_max     a - max(others), seed by seed;
  lift_summary    B's lift per loop; task_lift: over paired tasks;
  run_lifts       B's logged lifts of archived runs;
  rounded / percent  the rounding every record prints.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from rspo_jax import intervals
from rspo_jax.metrics import metrics_path, read_metrics

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
ARCHIVE = os.path.join(ROOT, "docs", "results", "archive")
RESULTS = os.path.join(ROOT, "docs", "results")
FILES = {
    "greedy": "eval_final.json",
    "T=0.4": "eval_final_t04.json",
    "T=1": "eval_final_t10.json",
}
START_FILES = {
    "greedy": "eval_start.json",
    "T=0.4": "eval_start_t04.json",
    "T=1": "eval_start_t10.json",
}
SEEDS3, SEEDS5 = (0, 200, 400), (0, 200, 400, 600, 800)


def rounded(x, nd=1):
  """x to nd decimals as a float; None stays None."""
  return None if x is None else round(float(x), nd)


def percent(d: dict, keys=("mean", "lo", "hi")) -> dict:
  """An interval's dict with ``keys`` in percent, one decimal; the rest
  (level, draws) as they are."""
  out = dict(d)
  for k in keys:
    out[k] = rounded(100 * d[k])
  return out


def outcomes(path: str, key: str = "won") -> np.ndarray:
  """x[g, s] of one evaluation file: won (default) or score."""
  return intervals.outcome_matrix(json.load(open(path))["per_task"], key)


def cell_outcomes(
    study: str, env: str, algo: str, cell: str, seeds, decoding: str
):
  """x[r, g, s] of a cell's runs (seed order) at a decoding."""
  return np.stack(
      [
          outcomes(
              os.path.join(
                  ARCHIVE, study, f"{env}_{algo}_{cell}_s{s}", FILES[decoding]
              )
          )
          for s in seeds
      ]
  )


def seeds_run(study: str, env: str, algo: str, *cells, decoding="T=1"):
  """The seeds of SEEDS5 at which every one of ``cells`` has a finished
  run at ``decoding`` in the archive: a study that gains seeds is
  recomputed over all of them."""
  return tuple(
      s
      for s in SEEDS5
      if all(
          os.path.isfile(
              os.path.join(
                  ARCHIVE, study, f"{env}_{algo}_{c}_s{s}", FILES[decoding]
              )
          )
          for c in cells
      )
  )


def start_outcomes(study: str, env: str, decoding: str) -> np.ndarray:
  return outcomes(
      os.path.join(ARCHIVE, study, f"warm_start_{env}", START_FILES[decoding])
  )


def _per_seed(x: np.ndarray) -> list:
  return [rounded(100 * v) for v in x.mean(axis=(1, 2))]


def contrast(
    name,
    study,
    env,
    algo,
    a,
    b,
    decoding,
    seeds_a=SEEDS3,
    seeds_b=SEEDS3,
    quoted=None,
) -> dict:
  """cell a - cell b over independent training seeds."""
  xa = cell_outcomes(study, env, algo, a, seeds_a, decoding)
  xb = cell_outcomes(study, env, algo, b, seeds_b, decoding)
  return {
      "claim": name,
      "study": study,
      "a": a,
      "b": b,
      "decoding": decoding,
      "quoted": quoted,
      **two_sample(xa, xb),
  }


def two_sample(xa: np.ndarray, xb: np.ndarray) -> dict:
  """a - b from x[r, g, s] of two sets of independent seeds: the seeds'
  means, the percentile bootstrap (draw seed 0), the exact permutation
  and rank p and their floor, and Welch's t interval (None with one
  seed: no spread to estimate)."""
  sa, sb = 100 * xa.mean(axis=(1, 2)), 100 * xb.mean(axis=(1, 2))
  welch = None
  if len(sa) >= 2 and len(sb) >= 2:
    w = intervals.welch_interval(sa, sb)
    welch = {k: rounded(w[k]) for k in ("mean", "lo", "hi", "df")}
  return {
      "n_a": len(sa),
      "n_b": len(sb),
      "per_seed_a": _per_seed(xa),
      "per_seed_b": _per_seed(xb),
      "bootstrap": percent(intervals.method_difference(xa, xb, seed=0)),
      "permutation_p": rounded(intervals.permutation_p(sa, sb), 3),
      "rank_p": rounded(intervals.rank_p(sa, sb), 3),
      "smallest_possible_p": rounded(_smallest_p(len(sa), len(sb)), 3),
      "welch": welch,
  }


def _smallest_p(n_a: int, n_b: int) -> float:
  """The exact test's floor: 1 (or 2 for equal sizes, the mirror split)
  of C(n_a + n_b, n_a) splits."""
  from math import comb  # noqa: PLC0415

  return (2 if n_a == n_b else 1) / comb(n_a + n_b, n_a)


def gain(
    name, study, env, algo, cell, decoding, seeds=SEEDS3, quoted=None
) -> dict:
  """final - shared start, per seed."""
  x = cell_outcomes(study, env, algo, cell, seeds, decoding)
  start = start_outcomes(study, env, decoding)
  d = 100 * (x.mean(axis=(1, 2)) - start.mean())
  t = intervals.t_interval(d)
  return {
      "claim": name,
      "study": study,
      "cell": cell,
      "decoding": decoding,
      "n": len(seeds),
      "quoted": quoted,
      "per_seed_gain": [rounded(v) for v in d],
      "bootstrap": percent(intervals.paired_difference(x, start[...], seed=0)),
      "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
      "sign_flip_p": rounded(intervals.sign_flip_p(d), 3),
      "smallest_possible_p": rounded(2 / 2 ** len(seeds), 3),
  }


def level(name, study, env, algo, cell, decoding, seeds, quoted=None):
  x = cell_outcomes(study, env, algo, cell, seeds, decoding)
  t = intervals.t_interval(100 * x.mean(axis=(1, 2)))
  return {
      "claim": name,
      "study": study,
      "cell": cell,
      "decoding": decoding,
      "n": len(seeds),
      "quoted": quoted,
      "per_seed": _per_seed(x),
      "bootstrap": percent(intervals.success_interval(x, seed=0)),
      "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
  }


def lift_summary(name, lifts, quoted=None, source="") -> dict:
  d = 100 * np.asarray(lifts, np.float64)
  t = intervals.t_interval(d)
  boot = intervals.success_interval(d[:, None], seed=0)
  return {
      "claim": name,
      "source": source,
      "n_loops": len(d),
      "quoted": quoted,
      "per_loop": [rounded(v) for v in d],
      "bootstrap": {k: rounded(boot[k]) for k in ("mean", "lo", "hi")},
      "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
      "sign_flip_p": rounded(intervals.sign_flip_p(d), 3)
      if len(d) <= 20
      else None,
      "smallest_possible_p": rounded(2 / 2 ** len(d), 4)
      if len(d) <= 20
      else None,
  }


def task_lift(name, study: str, runs, quoted=None) -> dict:
  """B's lift over paired tasks: per task of each B_collect row, (stored
  - first wins) / group size, in points. The tasks are clustered by loop
  and seed; the t interval over them ignores that."""
  d, g = [], None
  for run in runs:
    run_dir = os.path.join(ARCHIVE, study, run)
    g = _group_size(json.load(open(os.path.join(run_dir, "run.json"))))
    for r in phase_rows(run_dir, "B_collect"):
      if "b_first_wins_by_task" in r:
        first = np.asarray(r["b_first_wins_by_task"], np.float64)
        stored = np.asarray(r["b_stored_wins_by_task"], np.float64)
        d.extend(100 * (stored - first) / g)
  d = np.asarray(d)
  t = intervals.t_interval(d)
  return {
      "claim": name,
      "source": study,
      "runs": list(runs),
      "n_tasks": int(d.size),
      "group_size": g,
      "quoted": quoted,
      "tasks_won_more": int((d > 0).sum()),
      "tasks_won_less": int((d < 0).sum()),
      "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
      "note": "t over tasks, ignoring their clustering by loop and seed",
  }


def _group_size(run_json: dict) -> int:
  """train.group_size from a run.json's config overrides."""
  m = re.search(r"train\.group_size=(\d+)", json.dumps(run_json))
  return int(m.group(1))


def by_seed_max(name, study, env, algo, a, others, decoding, seeds=SEEDS3):
  """a - max(others) seed by seed, each seed's value its mean success."""
  sa = 100 * cell_outcomes(study, env, algo, a, seeds, decoding).mean(
      axis=(1, 2)
  )
  so = np.stack(
      [
          100
          * cell_outcomes(study, env, algo, b, seeds, decoding).mean(
              axis=(1, 2)
          )
          for b in others
      ]
  )
  d = sa - so.max(axis=0)
  t = intervals.t_interval(d)
  return {
      "claim": name,
      "study": study,
      "a": a,
      "others": list(others),
      "decoding": decoding,
      "n": len(seeds),
      "per_seed_difference": [rounded(v) for v in d],
      "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
      "sign_flip_p": rounded(intervals.sign_flip_p(d), 3),
  }


def phase_rows(run_dir: str, phase: str) -> list:
  """The rows of ``phase`` of an archived run's metrics (gzipped:
  rspo_jax/metrics.py ``metrics_path``)."""
  return read_metrics(metrics_path(run_dir), phase)


def run_lifts(study: str, runs, key: str = "b_lift_success") -> list:
  return [
      r[key]
      for run in runs
      for r in phase_rows(os.path.join(ARCHIVE, study, run), "B_collect")
      if key in r
  ]
