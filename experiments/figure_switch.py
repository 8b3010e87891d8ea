r"""Figure 3 on spell: the dense reward alone from a policy that wins.

  python experiments/figure_switch.py  # spell_L4_figure3_switch.png

GiGPO trains 30 A steps from the warm start (``baseline_nopen``), then
30 more from its final policy (grid.START_FROM): on the outcome
(``from_gigpo_baseline_nopen``) or on the dense reward alone with m = 2
or 3 decoy positions (``from_gigpo_dense_only_partial{2,3}_nopen``), or
as RSPO+GiGPO with B on the m = 3 reward (``from_gigpo_rspo_partial3_
nopen``).
Left: A's rollout success by A step, 1-30 the GiGPO start, 31-60 each
branch; right: the branches' dense return (L x the mean dense reward a
turn; a won episode's is (L - m) / L, typing the decoys on the last m
positions earns 1). Thin lines are seeds, thick ones their mean over
the seeds whose start wins (``WINNING``). Reads the archive alone
(docs/results/archive/study_spell_L4_D1_switch). ``summary`` prints
the numbers docs/results.md quotes, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rspo_jax.metrics import metrics_path, read_metrics  # noqa: E402

ARCHIVE = os.path.join(
    ROOT, "docs", "results", "archive", "study_spell_L4_D1_switch"
)
OUT = os.path.join(ROOT, "docs", "results", "spell_L4_figure3_switch.png")
START = "baseline_nopen"
BRANCHES = {
    "from_gigpo_baseline_nopen": "GiGPO on the outcome",
    "from_gigpo_dense_only_partial2_nopen": "dense alone, m = 2",
    "from_gigpo_dense_only_partial3_nopen": "dense alone, m = 3",
    "from_gigpo_rspo_partial3_nopen": "RSPO+GiGPO, B on m = 3",
    "from_gigpo_baseline_long_nopen": "GiGPO, 60 steps (RSPO's env steps)",
}
SEEDS = (0, 200, 400, 600, 800)
# Seeds whose 30-step GiGPO policy wins (its last rollouts 55-70 %, the
# archived baseline_nopen; seed 200's 2 %), fixed before the runs
# (docs/results/log.md, 2026-12-07, session 10).
WINNING = (0, 400, 600, 800)
WORD_LENGTH = 4
EDGE = 3  # steps averaged at each end


def curves(archive: str, variant: str, seed: int) -> dict:
  """A's rows of one run: {'success': %, 'dense': dense return} by step."""
  run = os.path.join(archive, f"spell_gigpo_{variant}_s{seed}")
  rows = read_metrics(metrics_path(run), "A")
  return {
      "success": np.array([100 * r["rollout_success_rate"] for r in rows]),
      "dense": np.array([WORD_LENGTH * r["dense_reward_mean"] for r in rows]),
  }


def summary(archive: str = ARCHIVE) -> dict:
  """Per branch and seed: success over the start's last EDGE steps and
  the branch's first and last EDGE steps, and the branch's dense return
  over its first and last EDGE steps."""
  out = {}
  for v in BRANCHES:
    per = {}
    for seed in SEEDS:
      start, c = curves(archive, START, seed), curves(archive, v, seed)
      per[seed] = {
          "start_success": round(float(start["success"][-EDGE:].mean()), 1),
          "first_success": round(float(c["success"][:EDGE].mean()), 1),
          "last_success": round(float(c["success"][-EDGE:].mean()), 1),
          "first_dense": round(float(c["dense"][:EDGE].mean()), 3),
          "last_dense": round(float(c["dense"][-EDGE:].mean()), 3),
      }
    out[v] = per
  return out


def _seeds_and_mean(ax, x, ys, color, label, seed_color=None) -> None:
  """One thin line a seed (in ``seed_color``, default ``color``) and a
  thick one for their mean, labelled."""
  for y in ys:
    ax.plot(x, y, color=seed_color or color, lw=0.5, alpha=0.6)
  ax.plot(x, np.mean(ys, 0), color=color, lw=2, label=label)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--archive", default=ARCHIVE)
  p.add_argument("--out", default=OUT)
  p.add_argument("--summary", action="store_true", help="print JSON only")
  args = p.parse_args(argv)
  if args.summary:
    print(json.dumps(summary(args.archive), indent=1))
    return
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from report.common import save_figure  # noqa: PLC0415

  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  start = [curves(args.archive, START, s)["success"] for s in WINNING]
  n = len(start[0])
  _seeds_and_mean(
      left, np.arange(1, n + 1), start, "k", "GiGPO (the start)", "gray"
  )
  for i, (v, label) in enumerate(BRANCHES.items()):
    runs = [curves(args.archive, v, s) for s in WINNING]
    x = np.arange(n + 1, n + 1 + len(runs[0]["success"]))
    _seeds_and_mean(left, x, [r["success"] for r in runs], f"C{i}", label)
    if "dense" in label:
      _seeds_and_mean(
          right,
          x,
          [r["dense"] for r in runs],
          f"C{i}",
          f"{label}: dense return",
      )
      right.plot(
          x,
          np.mean([r["success"] for r in runs], 0) / 100,
          color=f"C{i}",
          lw=2,
          ls="--",
          label=f"{label}: success",
      )
  left.axvline(n + 0.5, color="gray", ls=":")
  left.set_xlabel("A step")
  left.set_ylabel("A's rollout success, %")
  left.legend(fontsize=7, loc="center left")
  left.set_title("success: 30 GiGPO steps, then each branch", fontsize=9)
  right.set_xlabel("A step")
  right.set_ylabel("dense return / success (fraction)")
  right.set_title("the dense-alone branches", fontsize=9)
  right.legend(fontsize=7)
  fig.suptitle(
      "Spell L = 4, no penalty: the dense reward alone from a policy that"
      f" wins (seeds {', '.join(map(str, WINNING))})",
      fontsize=10,
  )
  fig.tight_layout()
  save_figure(fig, args.out, dpi=110)
  print(args.out)


if __name__ == "__main__":
  main()
