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
setting it ran with (alpha and the replay rule) and the spread over A's
steps of its replayed tokens' ratios (intervals_record/replay.py says
which).

Runs not archived (the first every-row GRPO study, ALFWorld) cannot be
recomputed here; docs/results.md says so where it quotes them.

Each section's code is in intervals_record/ (its __init__ lists the
modules); this script puts them in the record's order.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from intervals_record import (  # noqa: E402
    default_run,
    replay,
    spell,
    toy,
    webshop,
)


def main() -> dict:
  return {
      "command": "python experiments/record_intervals.py",
      "units": (
          "percent / points; a seed's success is its mean over held-out goals "
          "x sampling seeds"
      ),
      "contrasts": spell.contrasts() + webshop.contrasts(),
      "gains": webshop.gains(),
      "levels": spell.levels() + webshop.levels(),
      "lifts": webshop.lifts() + spell.lifts(),
      "replay": replay.replay_runs(),
      "not_archived": [
          "study_allrows GRPO cells (RSPO+GRPO - GRPO -1.1, GRPO +6.4): "
          "only their report's pooled intervals are committed",
          "ALFWorld study (2 seeds): only the pooled intervals",
      ],
      "default_run": default_run.default_run(),
      "toy": toy.toy(),
      "by_seed": spell.by_seed(),
      "toy_more": toy.toy_more(),
  }


if __name__ == "__main__":
  json.dump(main(), sys.stdout, indent=1)
  print()
