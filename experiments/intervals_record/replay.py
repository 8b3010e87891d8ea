"""``replay``: per RSPO run in the archive, the setting it ran with and
its replayed tokens' ratios, from its ``metrics.jsonl``.

alpha = the replayed share w_off of A's samples, and the replay rule is
read from the win share of replayed trajectories by position in the
loop; ``ratio_mean_off`` (mean pi_theta / pi_B on replayed tokens, a
step's updates averaged) and ``replay_logp_b_minus_old`` (mean log pi_B
- log pi_old on replayed tokens at the step's start) are spread over A's
steps: min, median, max of the per-step values and the step of the max.
Per-token maxima and medians of log pi_B - log pi_old are not logged;
the share of replayed tokens with |log pi_old - log pi_B| > 0.2
(``replay_log_c_big_frac``) is.
"""

from __future__ import annotations

import os

import numpy as np

from intervals_record.common import ARCHIVE, phase_rows, rounded
from rspo_jax.metrics import has_metrics


def _spread(values, steps) -> dict | None:
  v = np.asarray(values, np.float64)
  if not v.size:
    return None
  i = int(np.argmax(v))
  return {
      "min": rounded(v.min(), 3),
      "median": rounded(np.median(v), 3),
      "mean": rounded(v.mean(), 3),
      "max": rounded(v.max(), 3),
      "step_of_max": int(steps[i]),
      "steps": int(v.size),
  }


def replay_run(study: str, run: str) -> dict:
  """alpha, replay rule and the replayed tokens' ratios of one RSPO run."""
  a = phase_rows(os.path.join(ARCHIVE, study, run), "A")
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
          rounded(np.mean(by_pos[p]), 2) for p in sorted(by_pos)
      ][:12],
      "replayed_steps_all_wins": sum(
          r["replay_success_frac"] == 1.0 for r in rep
      ),
      "replayed_steps": len(rep),
      "ratio_mean_off": _spread([r["ratio_mean_off"] for r in rep], steps),
      "replay_logp_b_minus_old": _spread(
          [v for _, v in lr], [s for s, _ in lr]
      ),
      "replay_log_c_big_frac_max": rounded(max(big), 4) if big else None,
      "ratio_mean_off_above_1_05": {
          int(r["step"]): rounded(r["ratio_mean_off"], 3)
          for r in rep
          if r["ratio_mean_off"] > 1.05
      },
  }


def replay_runs() -> list:
  """replay_run of every archived run with RSPO's replay (a cell named
  rspo, not dense alone) that logged metrics, by study and run name."""
  out = []
  for study in sorted(os.listdir(ARCHIVE)):
    for run in sorted(os.listdir(os.path.join(ARCHIVE, study))):
      if (
          "rspo" in run
          and "dense_only" not in run
          and has_metrics(os.path.join(ARCHIVE, study, run))
      ):
        out.append(replay_run(study, run))
  return out
