r"""B's success by loop, before and after its dense-reward steps (a figure).

  python experiments/figure_b_by_loop.py  # docs/results/spell_L4_b_by_loop.png

For each archived RSPO run of spell L = 4, no penalty, m = 2 and m = 3
decoy positions (docs/results/archive/study_spell_L4_D1), one segment a
loop: B's success on its first batch's tasks at its first collection
(B = A) and at its stored collection after its k dense-reward steps
(the B_collect row's ``b_first_success`` and ``b_stored_success``). A
segment that falls is B misled by its dense reward within its k steps.
Report: docs/results.md, "The knob at three values, L = 4".
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rspo_jax.metrics import metrics_path, read_metrics  # noqa: E402

ARCHIVE = os.path.join(ROOT, "docs", "results", "archive", "study_spell_L4_D1")
RUN = "spell_gigpo_rspo_partial{m}_nopen_s{seed}"
SEEDS = (0, 200, 400, 600, 800)
# The dense reward alone at T = 1 over the same seeds (docs/results.md).
TITLES = {2: "m = 2: dense alone 48.6 %", 3: "m = 3: dense alone 0 % (hacked)"}


def loops(workdir: str) -> list[tuple[int, float, float]]:
  """[(loop, first success %, stored success %)] of a run's B_collect
  rows."""
  rows = read_metrics(metrics_path(workdir), "B_collect")
  return [
      (
          int(r["loop"]) + 1,
          100 * r["b_first_success"],
          100 * r["b_stored_success"],
      )
      for r in rows
  ]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--archive", default=ARCHIVE)
  p.add_argument(
      "--out",
      default=os.path.join(ROOT, "docs", "results", "spell_L4_b_by_loop.png"),
  )
  args = p.parse_args(argv)
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from report.common import save_figure  # noqa: PLC0415

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
  for ax, m in zip(axes, TITLES):
    for i, seed in enumerate(SEEDS):
      run = os.path.join(args.archive, RUN.format(m=m, seed=seed))
      for loop, first, stored in loops(run):
        ax.plot(
            [loop - 0.2, loop + 0.2],
            [first, stored],
            "-o",
            ms=3,
            color=f"C{i}",
            label=f"seed {seed}" if loop == 1 else None,
        )
    ax.set_title(TITLES[m])
    ax.set_xticks([1, 2, 3])
    ax.set_xlabel("loop: B's first collection (left) -> stored (right)")
  axes[0].set_ylabel("B's success on its first batch's tasks, %")
  axes[0].legend(fontsize=7)
  fig.suptitle(
      "Spell L = 4, RSPO+GiGPO, no penalty: what 10 dense-reward steps do"
      " to B, by loop",
      fontsize=10,
  )
  fig.tight_layout()
  save_figure(fig, args.out, dpi=110)
  print(args.out)


if __name__ == "__main__":
  main()
