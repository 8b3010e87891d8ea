"""The WebShop studies (study_current, study_allrows (ws2), the sparse
gate and its LoRA cells, the B-lift study): ``contrasts``, ``gains``,
``levels`` and ``lifts``, each that section's WebShop entries in the
record's order."""

from __future__ import annotations

import json
import os

import numpy as np

from intervals_record.common import (
    ROOT,
    SEEDS3,
    contrast,
    gain,
    level,
    lift_summary,
    run_lifts,
)

WEBSHOP = "webshop"
GATE = "webshop_sparse_gate"
B_LIFT_FILE = "docs/results/b_lift/lift_2026-12-03.jsonl"


def b_lift_study(variant: str, key: str = "b_lift_success") -> list:
  """B's lift per loop of one variant of the B-lift study."""
  with open(os.path.join(ROOT, B_LIFT_FILE)) as f:
    return [r[key] for r in map(json.loads, f) if r["variant"] == variant]


def contrasts() -> list:
  """cell a - cell b over independent seeds: every row (today's code and
  the first), the gate (alpha 1/8, wins, k = 10), LoRA - full."""
  c = []
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
            WEBSHOP,
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
          WEBSHOP,
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
            GATE,
            WEBSHOP,
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
            GATE,
            WEBSHOP,
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
            GATE,
            WEBSHOP,
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
            GATE,
            WEBSHOP,
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
            GATE,
            WEBSHOP,
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
            GATE,
            WEBSHOP,
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
            GATE,
            WEBSHOP,
            "gigpo",
            "rspo_grpo_lora",
            "rspo_grpo",
            dec,
            (0,),
            (0, 200),
            q,
        )
    )
  return c


def gains() -> list:
  """final - the study's shared start, per seed."""
  g = []
  for cell, dec, q in (
      ("baseline", "T=0.4", "+5.3 [+1.3, +9.6]"),
      ("rspo", "T=0.4", "+5.5 [+0.7, +10.2]"),
  ):
    g.append(
        gain(
            f"webshop {cell} final - start (study_current)",
            "study_current",
            WEBSHOP,
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
            WEBSHOP,
            "gigpo",
            cell,
            "T=0.4",
            quoted=q,
        )
    )
  g.append(
      gain(
          "gate: GiGPO final - start",
          GATE,
          WEBSHOP,
          "gigpo",
          "baseline",
          "greedy",
          quoted="+5.6 [+1.6, +10.0]",
      )
  )
  g.append(
      gain(
          "gate: LoRA GiGPO final - start",
          GATE,
          WEBSHOP,
          "gigpo",
          "baseline_lora",
          "greedy",
          quoted="+4.2 [+1.2, +7.8]",
      )
  )
  g.append(
      gain(
          "gate: GRPO final - start",
          GATE,
          WEBSHOP,
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
          GATE,
          WEBSHOP,
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
              GATE,
              WEBSHOP,
              "gigpo",
              cell,
              dec,
              seeds,
              quoted=q,
          )
      )
  return g


def levels() -> list:
  """The gate's GiGPO and dense alone, greedy, over their seeds."""
  lv = []
  lv.append(
      level(
          "gate: GiGPO",
          GATE,
          WEBSHOP,
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
          GATE,
          WEBSHOP,
          "gigpo",
          "dense_only",
          "greedy",
          SEEDS3,
          "15.0 [10.8, 19.3]",
      )
  )
  return lv


def lifts() -> list:
  """B's lift per loop: the B-lift study by variant (and outcome -
  default, paired by loop), the gate's RSPO+GRPO runs."""
  li = []
  for variant, q in (
      ("default", "+8.9 [+3.1, +15.6]"),
      ("scale10", "+7.3 [+2.3, +13.3]"),
      ("scale10_warm", "+8.3 [+3.1, +15.6]"),
      ("outcome", "+11.2 [+3.9, +21.1]"),
  ):
    li.append(
        lift_summary(
            f"B's lift, WebShop, {variant}",
            b_lift_study(variant),
            q,
            B_LIFT_FILE,
        )
    )
  default, outcome = (np.array(b_lift_study(v)) for v in ("default", "outcome"))
  li.append(
      lift_summary(
          "B's lift, outcome - default, paired by loop",
          outcome - default,
          None,
          B_LIFT_FILE,
      )
  )
  li.append(
      lift_summary(
          "B's lift, gate RSPO+GRPO seeds 0 and 200",
          run_lifts(
              GATE,
              ["webshop_gigpo_rspo_grpo_s0", "webshop_gigpo_rspo_grpo_s200"],
          ),
          "+8.2 [+5.7, +11.5]",
          GATE,
      )
  )
  return li
