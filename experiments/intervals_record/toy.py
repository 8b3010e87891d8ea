"""``toy`` and ``toy_more``: the toy mechanism study
(docs/results/toy_mechanism.json), RSPO+GRPO against GRPO at equal A
steps, at about equal environment steps, and against the aligned dense
reward alone; Welch's t and the exact p."""

from __future__ import annotations

import json
import os

import numpy as np

from intervals_record.common import RESULTS, rounded, two_sample
from rspo_jax import intervals


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
      "per_seed_rspo": [rounded(v) for v in by["rspo"]],
      "per_seed_grpo": [rounded(v) for v in by["grpo"]],
      "welch": {k: rounded(w[k]) for k in ("mean", "lo", "hi", "df")},
      "permutation_p": rounded(
          intervals.permutation_p(by["rspo"], by["grpo"]), 3
      ),
      "rank_p": rounded(intervals.rank_p(by["rspo"], by["grpo"]), 3),
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
      **two_sample(xa, xb),
  }


def toy_more() -> list:
  """The toy at equal environment steps, against the dense reward alone,
  and at step 12, each from the seeds' outcome matrices."""
  return [
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
