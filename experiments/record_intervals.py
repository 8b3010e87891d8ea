r"""The record's few-unit results, recomputed from the committed archives.

  python experiments/record_intervals.py > docs/results/record_intervals.json

Issue 50 item 1. Every result the README and docs/results.md rest on 2-5
training seeds or B loops, with, beside the percentile bootstrap the
reports print (rspo_jax/intervals.py, draw seed 0, so the reports'
numbers come back), a t interval over the units and an exact p:

  contrasts  cell a - cell b, independent seeds: Welch's t interval over
             the per-seed success rates, the exact permutation p of the
             difference in means and the exact rank (Mann-Whitney) p;
  gains      final - start against a shared start: the t interval over
             the seeds' gains and the exact sign-flip p;
  lifts      B's lift (stored - first success of B's collections) per
             loop: the t interval over loops and the exact sign-flip p;
             where B_collect rows log per-task wins, also over the
             paired tasks (t interval; too many for an exact p);
  levels     one cell's success: the t interval over its seeds;
  by_seed    RSPO - the stronger of two cells, seed by seed: the t
             interval over the seeds' differences and the sign-flip p;
  toy_more   the toy study at equal environment steps and against the
             dense reward alone: Welch's t and the exact p.

A seed's success is its mean over held-out goals x sampling seeds, in
percent (points for differences). ``replay`` gives, per RSPO run, the
setting it ran with (alpha = the replayed share w_off of A's samples,
and the replay rule read from the win share of replayed trajectories
by position in the loop) and the spread over A's steps of
``ratio_mean_off`` (mean pi_theta / pi_B on replayed tokens, a step's
updates averaged) and ``replay_logp_b_minus_old`` (mean log pi_B -
log pi_old on replayed tokens at the step's start): min, median, max
of the per-step values and the step of the max. Per-token maxima and
medians of log pi_B - log pi_old are not logged; the share of replayed
tokens with |log pi_old - log pi_B| > 0.2 (``replay_log_c_big_frac``) is.

Runs not archived (the first every-row GRPO study, ALFWorld) cannot be
recomputed here; docs/results.md says so where it quotes them.
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rspo_jax import intervals  # noqa: E402

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


def _r(x, nd=1):
  return None if x is None else round(float(x), nd)


def _pct(d: dict, keys=("mean", "lo", "hi")) -> dict:
  out = dict(d)
  for k in keys:
    out[k] = _r(100 * d[k])
  return out


def _outcomes(path: str) -> np.ndarray:
  return intervals.outcome_matrix(json.load(open(path))["per_task"])


def _cell(study: str, env: str, algo: str, cell: str, seeds, decoding: str):
  """x[r, g, s] of a cell's runs (seed order) at a decoding."""
  return np.stack(
      [
          _outcomes(
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


def _start(study: str, env: str, decoding: str) -> np.ndarray:
  return _outcomes(
      os.path.join(ARCHIVE, study, f"warm_start_{env}", START_FILES[decoding])
  )


def _per_seed(x: np.ndarray) -> list:
  return [_r(100 * v) for v in x.mean(axis=(1, 2))]


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
  xa = _cell(study, env, algo, a, seeds_a, decoding)
  xb = _cell(study, env, algo, b, seeds_b, decoding)
  return {
      "claim": name,
      "study": study,
      "a": a,
      "b": b,
      "decoding": decoding,
      "quoted": quoted,
      **_two_sample(xa, xb),
  }


def _two_sample(xa: np.ndarray, xb: np.ndarray) -> dict:
  """a - b from x[r, g, s] of two sets of independent seeds: the seeds'
  means, the percentile bootstrap (draw seed 0), the exact permutation
  and rank p and their floor, and Welch's t interval (None with one
  seed: no spread to estimate)."""
  sa, sb = 100 * xa.mean(axis=(1, 2)), 100 * xb.mean(axis=(1, 2))
  welch = None
  if len(sa) >= 2 and len(sb) >= 2:
    w = intervals.welch_interval(sa, sb)
    welch = {k: _r(w[k]) for k in ("mean", "lo", "hi", "df")}
  return {
      "n_a": len(sa),
      "n_b": len(sb),
      "per_seed_a": _per_seed(xa),
      "per_seed_b": _per_seed(xb),
      "bootstrap": _pct(intervals.method_difference(xa, xb, seed=0)),
      "permutation_p": _r(intervals.permutation_p(sa, sb), 3),
      "rank_p": _r(intervals.rank_p(sa, sb), 3),
      "smallest_possible_p": _r(_smallest_p(len(sa), len(sb)), 3),
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
  x = _cell(study, env, algo, cell, seeds, decoding)
  start = _start(study, env, decoding)
  d = 100 * (x.mean(axis=(1, 2)) - start.mean())
  t = intervals.t_interval(d)
  return {
      "claim": name,
      "study": study,
      "cell": cell,
      "decoding": decoding,
      "n": len(seeds),
      "quoted": quoted,
      "per_seed_gain": [_r(v) for v in d],
      "bootstrap": _pct(intervals.paired_difference(x, start[...], seed=0)),
      "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
      "sign_flip_p": _r(intervals.sign_flip_p(d), 3),
      "smallest_possible_p": _r(2 / 2 ** len(seeds), 3),
  }


def level(name, study, env, algo, cell, decoding, seeds, quoted=None):
  x = _cell(study, env, algo, cell, seeds, decoding)
  t = intervals.t_interval(100 * x.mean(axis=(1, 2)))
  return {
      "claim": name,
      "study": study,
      "cell": cell,
      "decoding": decoding,
      "n": len(seeds),
      "quoted": quoted,
      "per_seed": _per_seed(x),
      "bootstrap": _pct(intervals.success_interval(x, seed=0)),
      "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
  }


def _lift_summary(name, lifts, quoted=None, source="") -> dict:
  d = 100 * np.asarray(lifts, np.float64)
  t = intervals.t_interval(d)
  boot = intervals.success_interval(d[:, None], seed=0)
  return {
      "claim": name,
      "source": source,
      "n_loops": len(d),
      "quoted": quoted,
      "per_loop": [_r(v) for v in d],
      "bootstrap": {k: _r(boot[k]) for k in ("mean", "lo", "hi")},
      "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
      "sign_flip_p": _r(intervals.sign_flip_p(d), 3) if len(d) <= 20 else None,
      "smallest_possible_p": _r(2 / 2 ** len(d), 4) if len(d) <= 20 else None,
  }


def task_lift(name, study: str, runs, quoted=None) -> dict:
  """B's lift over paired tasks: per task of each B_collect row, (stored
  - first wins) / group size, in points. The tasks are clustered by loop
  and seed; the t interval over them ignores that."""
  d, g = [], None
  for run in runs:
    run_dir = os.path.join(ARCHIVE, study, run)
    g = _group_size(json.load(open(os.path.join(run_dir, "run.json"))))
    for r in _rows(run_dir, "B_collect"):
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
      "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
      "note": "t over tasks, ignoring their clustering by loop and seed",
  }


def _group_size(run_json: dict) -> int:
  """train.group_size from a run.json's config overrides."""
  m = re.search(r"train\.group_size=(\d+)", json.dumps(run_json))
  return int(m.group(1))


def by_seed_max(name, study, env, algo, a, others, decoding, seeds=SEEDS3):
  """a - max(others) seed by seed, each seed's value its mean success."""
  sa = 100 * _cell(study, env, algo, a, seeds, decoding).mean(axis=(1, 2))
  so = np.stack(
      [
          100 * _cell(study, env, algo, b, seeds, decoding).mean(axis=(1, 2))
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
      "per_seed_difference": [_r(v) for v in d],
      "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
      "sign_flip_p": _r(intervals.sign_flip_p(d), 3),
  }


def _rows(run_dir: str, phase: str) -> list:
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("phase") == phase]


def run_lifts(study: str, runs, key: str = "b_lift_success") -> list:
  return [
      r[key]
      for run in runs
      for r in _rows(os.path.join(ARCHIVE, study, run), "B_collect")
      if key in r
  ]


def b_lift_study(variant: str, key: str = "b_lift_success") -> list:
  path = os.path.join(RESULTS, "b_lift", "lift_2026-12-03.jsonl")
  with open(path) as f:
    return [r[key] for r in map(json.loads, f) if r["variant"] == variant]


def _spread(values, steps) -> dict | None:
  v = np.asarray(values, np.float64)
  if not v.size:
    return None
  i = int(np.argmax(v))
  return {
      "min": _r(v.min(), 3),
      "median": _r(np.median(v), 3),
      "mean": _r(v.mean(), 3),
      "max": _r(v.max(), 3),
      "step_of_max": int(steps[i]),
      "steps": int(v.size),
  }


def replay_run(study: str, run: str) -> dict:
  """alpha, replay rule and the replayed tokens' ratios of one RSPO run."""
  a = _rows(os.path.join(ARCHIVE, study, run), "A")
  rep = [r for r in a if r.get("replay_trajectories")]
  k = len(a) // max(1, len({r["loop"] for r in a}))
  by_pos = {}
  for i, r in enumerate(rep):
    pos = r.get("loop_step", i % k if k else 0)
    by_pos.setdefault(int(pos), []).append(r["replay_success_frac"])
  steps = [r["step"] for r in rep]
  lr = [
      (r["step"], r["replay_logp_b_minus_old"])
      for r in rep
      if "replay_logp_b_minus_old" in r
  ]
  big = [
      r["replay_log_c_big_frac"] for r in rep if "replay_log_c_big_frac" in r
  ]
  return {
      "study": study,
      "run": run,
      "alpha": sorted({r["w_off"] for r in rep}),
      "rule_logged": "loop_step" in (rep[0] if rep else {}),
      "win_share_by_position": [
          _r(np.mean(by_pos[p]), 2) for p in sorted(by_pos)
      ][:12],
      "replayed_steps_all_wins": sum(
          r["replay_success_frac"] == 1.0 for r in rep
      ),
      "replayed_steps": len(rep),
      "ratio_mean_off": _spread([r["ratio_mean_off"] for r in rep], steps),
      "replay_logp_b_minus_old": _spread(
          [v for _, v in lr], [s for s, _ in lr]
      ),
      "replay_log_c_big_frac_max": _r(max(big), 4) if big else None,
      "ratio_mean_off_above_1_05": {
          int(r["step"]): _r(r["ratio_mean_off"], 3)
          for r in rep
          if r["ratio_mean_off"] > 1.05
      },
  }


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
  start = _outcomes(os.path.join(base, "eval_start.json"))
  xr, xg = (np.stack([_outcomes(p) for p in ps]) for ps in (rspo, grpo))
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
        "per_seed_gain": [_r(v) for v in d],
        "bootstrap": _pct(intervals.paired_difference(x, start, seed=0)),
        "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
        "sign_flip_p": _r(intervals.sign_flip_p(d), 3),
    }
  sr, sg = 100 * xr.mean(axis=(1, 2)), 100 * xg.mean(axis=(1, 2))
  w = intervals.welch_interval(sr, sg)
  out["RSPO+GRPO - GRPO"] = {
      "n_a": 3,
      "n_b": 3,
      "quoted": "+0.0 [-3.6, +4.2]",
      "bootstrap": _pct(intervals.method_difference(xr, xg, seed=0)),
      "welch": {k: _r(w[k]) for k in ("mean", "lo", "hi", "df")},
      "permutation_p": _r(intervals.permutation_p(sr, sg), 3),
      "rank_p": _r(intervals.rank_p(sr, sg), 3),
  }
  # The score (0-1), three decimals: final - start and RSPO+GRPO - GRPO.
  start = intervals.outcome_matrix(
      json.load(open(os.path.join(base, "eval_start.json")))["per_task"],
      "score",
  )
  xr, xg = (
      np.stack(
          [
              intervals.outcome_matrix(json.load(open(p))["per_task"], "score")
              for p in ps
          ]
      )
      for ps in (rspo, grpo)
  )
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
        "per_seed_gain": [_r(v, 3) for v in d],
        "bootstrap": {k: _r(b[k], 3) for k in ("mean", "lo", "hi")},
        "t": {k: _r(t[k], 3) for k in ("mean", "lo", "hi")},
        "sign_flip_p": _r(intervals.sign_flip_p(d), 3),
    }
  sr, sg = xr.mean(axis=(1, 2)), xg.mean(axis=(1, 2))
  w = intervals.welch_interval(sr, sg)
  b = intervals.method_difference(xr, xg, seed=0)
  out["RSPO+GRPO - GRPO score"] = {
      "n_a": 3,
      "n_b": 3,
      "quoted": "+0.024 [+0.000, +0.051]",
      "bootstrap": {k: _r(b[k], 3) for k in ("mean", "lo", "hi")},
      "welch": {k: _r(w[k], 3) for k in ("mean", "lo", "hi", "df")},
      "permutation_p": _r(intervals.permutation_p(sr, sg), 3),
      "rank_p": _r(intervals.rank_p(sr, sg), 3),
  }
  return out


def toy(step: int = 6) -> dict:
  """The toy mechanism study (docs/results/toy_mechanism.json): RSPO+GRPO
  - GRPO in A's held-out T = 1 success at A step ``step``, 5 seeds."""
  cells = json.load(open(os.path.join(RESULTS, "toy_mechanism.json")))["cells"]
  by = {
      arm: [
          100
          * next(
              e["t1_success_rate"] for e in c["evals"] if e["a_step"] == step
          )
          for c in cells.values()
          if c["arm"] == arm
      ]
      for arm in ("rspo", "grpo")
  }
  w = intervals.welch_interval(by["rspo"], by["grpo"])
  return {
      "claim": f"toy RSPO+GRPO - GRPO at A step {step}, T = 1",
      "quoted": "+10.8 [3.1, 18.8]",
      "n_a": len(by["rspo"]),
      "n_b": len(by["grpo"]),
      "per_seed_rspo": [_r(v) for v in by["rspo"]],
      "per_seed_grpo": [_r(v) for v in by["grpo"]],
      "welch": {k: _r(w[k]) for k in ("mean", "lo", "hi", "df")},
      "permutation_p": _r(intervals.permutation_p(by["rspo"], by["grpo"]), 3),
      "rank_p": _r(intervals.rank_p(by["rspo"], by["grpo"]), 3),
  }


def _toy_t1(arm: str, step: int):
  """x[r, g, s] of an arm's held-out T = 1 outcomes at A step ``step``,
  seeds in order, and its mean environment steps there."""
  cells = json.load(open(os.path.join(RESULTS, "toy_mechanism.json")))["cells"]
  evals = [
      next(e for e in c["evals"] if e["a_step"] == step)
      for c in sorted(cells.values(), key=lambda c: c["seed"])
      if c["arm"] == arm
  ]
  x = np.array([np.asarray(e["t1_won"], np.float64).T for e in evals])
  return x, float(np.mean([e["env_steps"] for e in evals]))


def toy_contrast(name, arm_a, step_a, arm_b, step_b, quoted=None) -> dict:
  """The toy study: arm a at A step a - arm b at A step b, T = 1, 5 vs 5
  seeds; the bootstrap draws as the toy report's (seed 0)."""
  xa, ea = _toy_t1(arm_a, step_a)
  xb, eb = _toy_t1(arm_b, step_b)
  return {
      "claim": name,
      "a": f"{arm_a} at A step {step_a}, {ea:.0f} env steps",
      "b": f"{arm_b} at A step {step_b}, {eb:.0f} env steps",
      "quoted": quoted,
      **_two_sample(xa, xb),
  }


def main() -> dict:
  ws, sp = "webshop", "spell"
  L4 = "study_spell_L4_D1"
  gate = "webshop_sparse_gate"
  out = {
      "command": "python experiments/record_intervals.py",
      "units": (
          "percent / points; a seed's success is its mean over held-out goals "
          "x sampling seeds"
      ),
      "contrasts": [],
      "gains": [],
      "levels": [],
      "lifts": [],
      "replay": [],
      "not_archived": [
          "study_allrows GRPO cells (RSPO+GRPO - GRPO -1.1, GRPO +6.4): "
          "only their report's pooled intervals are committed",
          "ALFWorld study (2 seeds): only the pooled intervals",
      ],
  }
  c = out["contrasts"]
  # Spell, one hidden letter, L = 4, T = 1, 5 seeds (alpha 1/8, wins).
  for a, b, q in (
      ("rspo", "baseline", "+63.0 [+32.9, +85.9]"),
      ("rspo", "rspo_o", "+41.0 [+6.9, +71.3]"),
      ("rspo_o", "baseline", "+22.0 [-11.7, +56.4]"),
      ("rspo_k3", "baseline", "+36.7 [-4.3, +73.0]"),
      ("dense_only", "baseline", "+72.0 [+49.1, +86.8]"),
      ("dense_only", "rspo", None),
      ("rspo", "rspo_k3", "+26.4 [-10.6, +63.8]"),
      ("rspo_nopen", "baseline_nopen", "+24.4 [+4.0, +56.1]"),
      ("rspo_nopen", "baseline_long_nopen", "-9.6 [-15.9, -4.1]"),
      ("baseline_long_nopen", "baseline_nopen", "+34.0 [+14.9, +64.8]"),
      ("baseline_nopen", "baseline", "+44.9 [+8.3, +73.7]"),
      ("rspo_nopen", "rspo", "+6.3 [-7.4, +26.5]"),
      ("rspo_decoy", "baseline", "-11.1 [-35.5, +9.1]"),
      ("rspo_decoy_nopen", "baseline_nopen", "-22.6 [-61.6, +18.8]"),
      # Across settings: dense alone ran with the penalty only.
      ("rspo_nopen", "dense_only", "-2.6 [-7.7, +2.2]"),
  ):
    c.append(
        contrast(
            f"spell L=4 {a} - {b}",
            L4,
            sp,
            "gigpo",
            a,
            b,
            "T=1",
            SEEDS5,
            SEEDS5,
            q,
        )
    )
  # The decoy at equal environment steps (GiGPO, 60 A steps, no
  # penalty) and against the decoy alone (3 seeds, with the penalty).
  c.append(
      contrast(
          "spell L=4 rspo_decoy_nopen - baseline_long_nopen",
          L4,
          sp,
          "gigpo",
          "rspo_decoy_nopen",
          "baseline_long_nopen",
          "T=1",
          SEEDS5,
          SEEDS5,
          "-56.7 [-87.8, -26.0]",
      )
  )
  c.append(
      contrast(
          "spell L=4 rspo_decoy - dense_only_decoy",
          L4,
          sp,
          "gigpo",
          "rspo_decoy",
          "dense_only_decoy",
          "T=1",
          SEEDS5,
          SEEDS3,
          "+6.5 [+0.2, +18.1]",
      )
  )
  # As first reported: RSPO (decoy) at 3 seeds against GiGPO's 5; the
  # no-penalty cells at 3 seeds each.
  c.append(
      contrast(
          "spell L=4 rspo_decoy (3 seeds) - baseline (5)",
          L4,
          sp,
          "gigpo",
          "rspo_decoy",
          "baseline",
          "T=1",
          SEEDS3,
          SEEDS5,
          "-16.9 [-40.4, -2.6]",
      )
  )
  c.append(
      contrast(
          "spell L=4 rspo_decoy_nopen - baseline_nopen, 3 seeds",
          L4,
          sp,
          "gigpo",
          "rspo_decoy_nopen",
          "baseline_nopen",
          "T=1",
          quoted="-38.9 [-80.3, +10.8]",
      )
  )
  for study, a in (
      ("study_spell_L6_D1", "rspo"),
      ("study_spell_L8_D1", "rspo_k30"),
  ):
    for dec in ("greedy", "T=1"):
      c.append(
          contrast(
              f"spell {study[12:14]} {a} - baseline",
              study,
              sp,
              "gigpo",
              a,
              "baseline",
              dec,
          )
      )
  c.append(
      contrast(
          "spell L6 dense_only - rspo",
          "study_spell_L6_D1",
          sp,
          "gigpo",
          "dense_only",
          "rspo",
          "T=1",
      )
  )
  # The partly misleading regime, L = 6, m = 2, no penalty: GiGPO at
  # equal A steps (1 seed), at RSPO's environment steps, dense alone.
  L6 = "study_spell_L6_D1"

  def l6(*cells):
    return seeds_run(L6, sp, "gigpo", *cells)

  for b, q in (
      ("baseline_nopen", "+29.6 [+0.0, +88.0] (3 vs 1)"),
      ("baseline_long_nopen", "+29.6 [+0.0, +88.0] (3 vs 3)"),
      ("dense_only_partial2_nopen", "-45.9 [-77.9, +12.2] (3 vs 3)"),
  ):
    a = "rspo_partial2_nopen"
    c.append(
        contrast(
            f"spell L6 {a} - {b}", L6, sp, "gigpo", a, b, "T=1", l6(a), l6(b), q
        )
    )
  # Adaptive B (issue 50 item 6) in the same regime: against GiGPO at its
  # largest environment steps (90 A steps), dense alone at 30 and 90 A
  # steps, and fixed k.
  for b in (
      "baseline_x3_nopen",
      "dense_only_partial2_nopen",
      "dense_only_x3_partial2_nopen",  # 90 A steps: equal environment steps
      "rspo_partial2_nopen",
  ):
    a = "rspo_adaptive_partial2_nopen"
    c.append(
        contrast(
            f"spell L6 {a} - {b}", L6, sp, "gigpo", a, b, "T=1", l6(a), l6(b)
        )
    )
  # L = 8: dense alone ran at seed 0 only.
  c.append(
      contrast(
          "spell L8 rspo_k30 (seed 0) - dense_only (seed 0)",
          "study_spell_L8_D1",
          sp,
          "gigpo",
          "rspo_k30",
          "dense_only",
          "T=1",
          (0,),
          (0,),
      )
  )
  # WebShop every row, today's code (alpha 1/4, one-pass replay).
  for dec, q in (
      ("T=0.4", "+0.2 [-3.5, +4.0]"),
      ("greedy", "+0.1 [-4.0, " "+4.6]"),
      ("T=1", "+1.5 [-1.9, +5.2]"),
  ):
    c.append(
        contrast(
            "webshop RSPO+GiGPO - GiGPO (study_current)",
            "study_current",
            ws,
            "gigpo",
            "rspo",
            "baseline",
            dec,
            quoted=q,
        )
    )
  c.append(
      contrast(
          "webshop RSPO+GiGPO - GiGPO, first code (ws2)",
          "study_allrows",
          ws,
          "gigpo",
          "rspo",
          "baseline",
          "T=0.4",
          quoted="-0.7 [-4.3, +3.2]",
      )
  )
  # The gate (alpha 1/8, wins, RSPO k = 10).
  for dec, q in (
      ("greedy", "+1.2 [-3.1, +5.1]"),
      ("T=0.4", "+1.0 [-1.9, " "+3.8]"),
      ("T=1", "+0.4 [-2.0, +2.7]"),
  ):
    c.append(
        contrast(
            "gate: dense alone - GiGPO",
            gate,
            ws,
            "gigpo",
            "dense_only",
            "baseline",
            dec,
            quoted=q,
        )
    )
  for dec, q in (
      ("greedy", "-2.0 [-4.7, +0.8]"),
      ("T=0.4", "-1.8 [-4.6, " "+0.9]"),
      ("T=1", "-0.3 [-3.1, +2.3]"),
  ):
    c.append(
        contrast(
            "gate: RSPO+GRPO - GRPO",
            gate,
            ws,
            "gigpo",
            "rspo_grpo",
            "grpo",
            dec,
            (0, 200),
            (0, 200),
            q,
        )
    )
  for dec, q in (
      ("greedy", "-4.0 [-8.6, -0.4]"),
      ("T=0.4", "-2.4 [-5.6, " "+0.3]"),
  ):
    c.append(
        contrast(
            "gate: RSPO+GiGPO (seed 0) - GiGPO",
            gate,
            ws,
            "gigpo",
            "rspo",
            "baseline",
            dec,
            (0,),
            SEEDS3,
            q,
        )
    )
  for dec in ("greedy", "T=0.4"):
    c.append(
        contrast(
            "gate: RSPO+GiGPO (seed 0) - dense alone",
            gate,
            ws,
            "gigpo",
            "rspo",
            "dense_only",
            dec,
            (0,),
            SEEDS3,
        )
    )
  for dec, q in (
      ("greedy", "-1.4 [-6.1, +2.3]"),
      ("T=0.4", "-1.3 [-4.3, " "+1.5]"),
      ("T=1", "-0.8 [-2.9, +1.2]"),
  ):
    c.append(
        contrast(
            "LoRA - full, GiGPO",
            gate,
            ws,
            "gigpo",
            "baseline_lora",
            "baseline",
            dec,
            quoted=q,
        )
    )
  for dec, q in (
      ("greedy", "-1.0 [-3.7, +2.0]"),
      ("T=0.4", "-0.9 [-3.8, " "+1.9]"),
      ("T=1", "-1.1 [-3.5, +1.2]"),
  ):
    c.append(
        contrast(
            "LoRA - full, GRPO",
            gate,
            ws,
            "gigpo",
            "grpo_lora",
            "grpo",
            dec,
            (0, 200),
            (0, 200),
            q,
        )
    )
  for dec, q in (
      ("greedy", "-1.8 [-4.7, +0.8]"),
      ("T=0.4", "-0.5 [-3.0, " "+1.9]"),
      ("T=1", "-1.8 [-4.6, +0.9]"),
  ):
    c.append(
        contrast(
            "LoRA - full, RSPO+GRPO",
            gate,
            ws,
            "gigpo",
            "rspo_grpo_lora",
            "rspo_grpo",
            dec,
            (0,),
            (0, 200),
            q,
        )
    )

  g = out["gains"]
  for cell, dec, q in (
      ("baseline", "T=0.4", "+5.3 [+1.3, +9.6]"),
      ("rspo", "T=0.4", "+5.5 [+0.7, +10.2]"),
  ):
    g.append(
        gain(
            f"webshop {cell} final - start (study_current)",
            "study_current",
            ws,
            "gigpo",
            cell,
            dec,
            quoted=q,
        )
    )
  for cell, q in (
      ("baseline", "+7.4 [+3.1, +11.7]"),
      ("rspo", "+6.7 [+2.3, +11.1]"),
  ):
    g.append(
        gain(
            f"webshop {cell} final - start, first code (ws2)",
            "study_allrows",
            ws,
            "gigpo",
            cell,
            "T=0.4",
            quoted=q,
        )
    )
  g.append(
      gain(
          "gate: GiGPO final - start",
          gate,
          ws,
          "gigpo",
          "baseline",
          "greedy",
          quoted="+5.6 [+1.6, +10.0]",
      )
  )
  g.append(
      gain(
          "gate: LoRA GiGPO final - start",
          gate,
          ws,
          "gigpo",
          "baseline_lora",
          "greedy",
          quoted="+4.2 [+1.2, +7.8]",
      )
  )
  g.append(
      gain(
          "gate: GRPO final - start",
          gate,
          ws,
          "gigpo",
          "grpo",
          "greedy",
          (0, 200),
          quoted="+5.3 [+2.0, +8.4]",
      )
  )
  g.append(
      gain(
          "gate: LoRA GRPO final - start",
          gate,
          ws,
          "gigpo",
          "grpo_lora",
          "greedy",
          (0, 200),
          quoted="+4.3 [+1.6, +7.4]",
      )
  )

  for cell, seeds, qs in (
      ("baseline", SEEDS3, ("+5.2 [+1.8, +8.6]", "+3.1 [+0.3, +5.9]")),
      ("baseline_lora", SEEDS3, ("+3.8 [+1.2, +6.7]", "+2.3 [-0.3, +4.7]")),
      ("grpo", (0, 200), ("+6.1 [+2.9, +9.3]", "+3.5 [+0.9, +6.1]")),
      ("grpo_lora", (0, 200), ("+5.1 [+2.3, +8.5]", "+2.4 [+0.0, +4.8]")),
  ):
    for dec, q in zip(("T=0.4", "T=1"), qs):
      g.append(
          gain(
              f"gate: {cell} final - start",
              gate,
              ws,
              "gigpo",
              cell,
              dec,
              seeds,
              quoted=q,
          )
      )

  lv = out["levels"]
  for cell, q in (
      ("baseline", "17.6 [3.3, 41.1]"),
      ("rspo", "80.6 [61.0, 91.8]"),
      ("rspo_o", "39.6 [13.5, 66.7]"),
      ("rspo_k3", "54.3 [21.6, 85.7]"),
      ("dense_only", "89.6 [87.3, 91.8]"),
      ("baseline_nopen", "62.5 [31.8, 81.6]"),
      ("rspo_nopen", "87.0 [80.8, 92.5]"),
      ("rspo_decoy", "6.5 [0.2, 18.1]"),
      ("rspo_decoy_nopen", "39.9 [8.7, 70.9]"),
  ):
    lv.append(
        level(f"spell L=4 {cell}", L4, sp, "gigpo", cell, "T=1", SEEDS5, q)
    )
  lv.append(
      level(
          "spell L=4 rspo_nopen, D from fresh tasks",
          "spell_fresh_d",
          sp,
          "gigpo",
          "rspo_nopen",
          "T=1",
          SEEDS5,
          "89.2 [83.6, 92.7]",
      )
  )
  lv.append(
      level(
          "spell L=4 dense_only_decoy",
          L4,
          sp,
          "gigpo",
          "dense_only_decoy",
          "T=1",
          SEEDS3,
          "0.0 [0.0, 0.0]",
      )
  )
  lv.append(
      level(
          "spell L=6 rspo",
          "study_spell_L6_D1",
          sp,
          "gigpo",
          "rspo",
          "T=1",
          SEEDS3,
          "42.2 [0.0, 70.1]",
      )
  )
  lv.append(
      level(
          "spell L=6 dense_only",
          "study_spell_L6_D1",
          sp,
          "gigpo",
          "dense_only",
          "T=1",
          SEEDS3,
          "83.5 [79.4, 87.1]",
      )
  )
  lv.append(
      level(
          "spell L=8 rspo_k30",
          "study_spell_L8_D1",
          sp,
          "gigpo",
          "rspo_k30",
          "T=1",
          SEEDS3,
          "8.0 [4.3, 12.9]",
      )
  )
  lv.append(
      level(
          "gate: GiGPO",
          gate,
          ws,
          "gigpo",
          "baseline",
          "greedy",
          SEEDS3,
          "13.8 [9.2, 18.5]",
      )
  )
  lv.append(
      level(
          "gate: dense alone",
          gate,
          ws,
          "gigpo",
          "dense_only",
          "greedy",
          SEEDS3,
          "15.0 [10.8, 19.3]",
      )
  )

  li = out["lifts"]
  for variant, q in (
      ("default", "+8.9 [+3.1, +15.6]"),
      ("scale10", "+7.3 [+2.3, +13.3]"),
      ("scale10_warm", "+8.3 [+3.1, +15.6]"),
      ("outcome", "+11.2 [+3.9, +21.1]"),
  ):
    li.append(
        _lift_summary(
            f"B's lift, WebShop, {variant}",
            b_lift_study(variant),
            q,
            "docs/results/b_lift/lift_2026-12-03.jsonl",
        )
    )
  default, outcome = (np.array(b_lift_study(v)) for v in ("default", "outcome"))
  li.append(
      _lift_summary(
          "B's lift, outcome - default, paired by loop",
          outcome - default,
          None,
          "docs/results/b_lift/lift_2026-12-03.jsonl",
      )
  )
  li.append(
      _lift_summary(
          "B's lift, gate RSPO+GRPO seeds 0 and 200",
          run_lifts(
              gate,
              ["webshop_gigpo_rspo_grpo_s0", "webshop_gigpo_rspo_grpo_s200"],
          ),
          "+8.2 [+5.7, +11.5]",
          gate,
      )
  )
  li.append(
      _lift_summary(
          "B's lift, spell L=8 k=30",
          run_lifts(
              "study_spell_L8_D1",
              [f"spell_gigpo_rspo_k30_s{s}" for s in SEEDS3],
          ),
          "+55.7 [+54.7, +56.2]",
          "study_spell_L8_D1",
      )
  )
  li.append(
      _lift_summary(
          "B's lift, spell L=6 k=10",
          run_lifts(
              "study_spell_L6_D1", [f"spell_gigpo_rspo_s{s}" for s in SEEDS3]
          ),
          "+18.9 [+0.5, +37.0]",
          "study_spell_L6_D1",
      )
  )
  for cell, q in (
      ("rspo", "+27.1 [+16.0, +37.7]"),
      ("rspo_nopen", "+24.2 [+14.1, +34.8]"),
  ):
    li.append(
        _lift_summary(
            f"B's lift, spell L=4 {cell}",
            run_lifts(L4, [f"spell_gigpo_{cell}_s{s}" for s in SEEDS5]),
            q,
            L4,
        )
    )

  li.append(
      _lift_summary(
          "B's lift, spell L=6 partial m=2 no penalty, over loops",
          run_lifts(
              L6,
              [
                  f"spell_gigpo_rspo_partial2_nopen_s{s}"
                  for s in seeds_run(L6, sp, "gigpo", "rspo_partial2_nopen")
              ],
          ),
          "+5.9 [+0.0, +17.7]",
          L6,
      )
  )
  li.append(
      task_lift(
          "B's lift, spell L=6 partial m=2 no penalty, over paired tasks",
          L6,
          [
              f"spell_gigpo_rspo_partial2_nopen_s{s}"
              for s in seeds_run(L6, sp, "gigpo", "rspo_partial2_nopen")
          ],
      )
  )
  li.append(
      task_lift(
          "B's lift, spell L=6 partial m=2 no penalty, adaptive B, over"
          " paired tasks",
          L6,
          [
              f"spell_gigpo_rspo_adaptive_partial2_nopen_s{s}"
              for s in seeds_run(
                  L6, sp, "gigpo", "rspo_adaptive_partial2_nopen"
              )
          ],
      )
  )
  li.append(
      task_lift(
          "B's lift, spell L=6 RSPO_O no penalty (seed 0), over paired tasks",
          L6,
          ["spell_gigpo_rspo_o_nopen_s0"],
      )
  )

  out["default_run"] = default_run()
  out["toy"] = toy()
  for study in sorted(os.listdir(ARCHIVE)):
    for run in sorted(os.listdir(os.path.join(ARCHIVE, study))):
      if (
          "rspo" in run
          and "dense_only" not in run
          and os.path.isfile(os.path.join(ARCHIVE, study, run, "metrics.jsonl"))
      ):
        out["replay"].append(replay_run(study, run))
  out["by_seed"] = [
      by_seed_max(
          "spell L6 rspo_partial2_nopen - max(GiGPO at RSPO's env steps,"
          " dense alone), by seed",
          L6,
          sp,
          "gigpo",
          "rspo_partial2_nopen",
          ("baseline_long_nopen", "dense_only_partial2_nopen"),
          "T=1",
          seeds_run(
              L6,
              sp,
              "gigpo",
              "rspo_partial2_nopen",
              "baseline_long_nopen",
              "dense_only_partial2_nopen",
          ),
      ),
      by_seed_max(
          "spell L6 rspo_adaptive_partial2_nopen - max(GiGPO at its largest"
          " env steps, dense alone), by seed",
          L6,
          sp,
          "gigpo",
          "rspo_adaptive_partial2_nopen",
          ("baseline_x3_nopen", "dense_only_partial2_nopen"),
          "T=1",
          seeds_run(
              L6,
              sp,
              "gigpo",
              "rspo_adaptive_partial2_nopen",
              "baseline_x3_nopen",
              "dense_only_partial2_nopen",
          ),
      ),
      by_seed_max(
          "spell L6 rspo_adaptive_partial2_nopen - max(GiGPO, dense alone),"
          " both at 90 A steps (its largest env steps), by seed",
          L6,
          sp,
          "gigpo",
          "rspo_adaptive_partial2_nopen",
          ("baseline_x3_nopen", "dense_only_x3_partial2_nopen"),
          "T=1",
          seeds_run(
              L6,
              sp,
              "gigpo",
              "rspo_adaptive_partial2_nopen",
              "baseline_x3_nopen",
              "dense_only_x3_partial2_nopen",
          ),
      ),
  ]
  # D from fresh tasks - D from B's first batch's tasks: the same seeds,
  # paired; the bootstrap resamples the seeds' paired outcome differences.
  fresh = _cell("spell_fresh_d", sp, "gigpo", "rspo_nopen", SEEDS5, "T=1")
  first = _cell(L4, sp, "gigpo", "rspo_nopen", SEEDS5, "T=1")
  d = 100 * (fresh.mean(axis=(1, 2)) - first.mean(axis=(1, 2)))
  t = intervals.t_interval(d)
  out["by_seed"].append(
      {
          "claim": "spell L=4 rspo_nopen, D fresh - D first, paired by seed",
          "study": "spell_fresh_d - study_spell_L4_D1",
          "decoding": "T=1",
          "n": len(SEEDS5),
          "quoted": "+2.2 [-1.5, +7.0]",
          "per_seed_difference": [_r(v) for v in d],
          "bootstrap": _pct(intervals.success_interval(fresh - first, seed=0)),
          "t": {k: _r(t[k]) for k in ("mean", "lo", "hi")},
          "sign_flip_p": _r(intervals.sign_flip_p(d), 3),
      }
  )
  out["toy_more"] = [
      toy_contrast(
          "toy RSPO+GRPO at step 6 - GRPO at step 12: about equal"
          " environment steps, T = 1",
          "rspo",
          6,
          "grpo",
          12,
          "31.2 vs 49.4 %",
      ),
      toy_contrast(
          "toy RSPO+GRPO - the aligned dense reward alone at step 12, T = 1",
          "rspo",
          12,
          "dense_only",
          12,
          "59.2 vs 67.5 %",
      ),
      toy_contrast(
          "toy RSPO+GRPO - GRPO at step 12, T = 1",
          "rspo",
          12,
          "grpo",
          12,
          "+9.8 [-1.9, 20.6]",
      ),
  ]
  return out


if __name__ == "__main__":
  json.dump(main(), sys.stdout, indent=1)
  print()
