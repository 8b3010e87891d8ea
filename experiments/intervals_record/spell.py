"""The spell studies (one hidden letter, L = 4, 6, 8; GiGPO's rows):
``contrasts``, ``levels``, ``lifts`` and ``by_seed``, each that section's
spell entries in the record's order."""

from __future__ import annotations

from intervals_record.common import (
    SEEDS3,
    SEEDS5,
    by_seed_max,
    cell_outcomes,
    contrast,
    level,
    lift_summary,
    percent,
    rounded,
    run_lifts,
    seeds_run,
    task_lift,
)
from rspo_jax import intervals

SPELL = "spell"
L4, L6, L8 = "study_spell_L4_D1", "study_spell_L6_D1", "study_spell_L8_D1"
# 30 or 60 A steps more from GiGPO's 30-step policy (grid.START_FROM).
SWITCH = "study_spell_L4_D1_switch"
SWITCH_CELLS = (
    "from_gigpo_baseline_nopen",
    "from_gigpo_baseline_long_nopen",
    "from_gigpo_dense_only_partial2_nopen",
    "from_gigpo_dense_only_partial3_nopen",
    "from_gigpo_rspo_partial3_nopen",
)


def _l6_seeds(*cells) -> tuple:
  """The seeds at which every one of GiGPO's ``cells`` finished at L = 6,
  T = 1."""
  return seeds_run(L6, SPELL, "gigpo", *cells)


def _l4(a: str, b: str, quoted=None, seeds_a=SEEDS5, seeds_b=SEEDS5, study=L4):
  """Cell a - cell b at L = 4, T = 1 (``study``: the L = 4 archive they
  are in)."""
  return contrast(
      f"spell L=4 {a} - {b}",
      study,
      SPELL,
      "gigpo",
      a,
      b,
      "T=1",
      seeds_a,
      seeds_b,
      quoted,
  )


def _l6(a: str, b: str, quoted=None):
  """Cell a - cell b at L = 6, T = 1, each over the seeds it finished."""
  return contrast(
      f"spell L6 {a} - {b}",
      L6,
      SPELL,
      "gigpo",
      a,
      b,
      "T=1",
      _l6_seeds(a),
      _l6_seeds(b),
      quoted,
  )


def _by_seed(claim: str, study: str, a: str, others: tuple):
  """Cell a - max(others) seed by seed, T = 1, over the seeds at which
  all of them finished."""
  return by_seed_max(
      claim,
      study,
      SPELL,
      "gigpo",
      a,
      others,
      "T=1",
      seeds_run(study, SPELL, "gigpo", a, *others),
  )


def contrasts() -> list:
  """cell a - cell b over independent seeds, T = 1 (L = 6 and 8 also
  greedy): L = 4 at 5 seeds, the decoy, L = 6's partly misleading regime
  with fixed and adaptive B, L = 8."""
  c = []
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
    c.append(_l4(a, b, q))
  # The decoy at equal environment steps (GiGPO, 60 A steps, no
  # penalty) and against the decoy alone (3 seeds, with the penalty).
  c.append(
      _l4("rspo_decoy_nopen", "baseline_long_nopen", "-56.7 [-87.8, -26.0]")
  )
  c.append(
      _l4(
          "rspo_decoy",
          "dense_only_decoy",
          "+6.5 [+0.2, +18.1]",
          seeds_b=SEEDS3,
      )
  )
  # As first reported: RSPO (decoy) at 3 seeds against GiGPO's 5; the
  # no-penalty cells at 3 seeds each.
  c.append(
      contrast(
          "spell L=4 rspo_decoy (3 seeds) - baseline (5)",
          L4,
          SPELL,
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
          SPELL,
          "gigpo",
          "rspo_decoy_nopen",
          "baseline_nopen",
          "T=1",
          quoted="-38.9 [-80.3, +10.8]",
      )
  )
  for study, a in (
      (L6, "rspo"),
      (L8, "rspo_k30"),
  ):
    for dec in ("greedy", "T=1"):
      c.append(
          contrast(
              f"spell {study[12:14]} {a} - baseline",
              study,
              SPELL,
              "gigpo",
              a,
              "baseline",
              dec,
          )
      )
  c.append(
      contrast(
          "spell L6 dense_only - rspo",
          L6,
          SPELL,
          "gigpo",
          "dense_only",
          "rspo",
          "T=1",
      )
  )
  # The partly misleading regime, L = 6, m = 2, no penalty: GiGPO at
  # equal A steps (1 seed), at RSPO's environment steps, dense alone.
  for b, q in (
      ("baseline_nopen", "+29.6 [+0.0, +88.0] (3 vs 1)"),
      ("baseline_long_nopen", "+29.6 [+0.0, +88.0] (3 vs 3)"),
      ("dense_only_partial2_nopen", "-45.9 [-77.9, +12.2] (3 vs 3)"),
  ):
    a = "rspo_partial2_nopen"
    c.append(_l6(a, b, q))
  # Adaptive B (issue 50 item 6) in the same regime: against GiGPO at its
  # largest environment steps (90 A steps), dense alone at 30 and 90 A
  # steps, and fixed k.
  for b in (
      "baseline_nopen",  # 30 A steps: equal A steps (3 seeds)
      "baseline_x3_nopen",
      "dense_only_partial2_nopen",
      "dense_only_x3_partial2_nopen",  # 90 A steps: equal environment steps
      "rspo_partial2_nopen",
  ):
    a = "rspo_adaptive_partial2_nopen"
    c.append(_l6(a, b))
  # The knob at L = 6, m = 4 (session 9; the dense reward alone is hacked
  # from the start) and m = 3 (session 10): the same contrasts as m = 2's,
  # and RSPO_O.
  for m in (4, 3):
    for b in (
        "baseline_nopen",
        "baseline_long_nopen",
        f"dense_only_partial{m}_nopen",
        "rspo_o_nopen",
    ):
      c.append(_l6(f"rspo_partial{m}_nopen", b))
  # The partly misleading regime at L = 4, m = 2, no penalty (session 8;
  # its own regenerated warm start, the GiGPO cells archived earlier).
  for a, b in (
      ("rspo_partial2_nopen", "baseline_nopen"),
      ("rspo_partial2_nopen", "baseline_long_nopen"),
      ("rspo_partial2_nopen", "dense_only_partial2_nopen"),
      ("rspo_partial2_nopen", "rspo_o_nopen"),
      ("rspo_o_nopen", "baseline_nopen"),
  ):
    c.append(_l4(a, b))
  # The same with the invalid-action penalty, the check (5 seeds since
  # session 9).
  for b in ("baseline", "baseline_long", "dense_only_partial2", "rspo_o"):
    c.append(_l4("rspo_partial2", b))
  # The knob's second value, m = 3, no penalty (session 9; the same
  # regenerated start as m = 2).
  for b in (
      "baseline_nopen",
      "baseline_long_nopen",
      "dense_only_partial3_nopen",
      "rspo_o_nopen",
  ):
    c.append(_l4("rspo_partial3_nopen", b))
  # With the penalty at equal environment steps: GiGPO at 60 A steps ran
  # from the regenerated start (sessions 8-9), these cells from the
  # archived one.
  for a in ("rspo", "rspo_decoy", "rspo_o"):
    c.append(_l4(a, "baseline_long"))
  # The dense reward alone without the penalty (session 9), aligned and
  # decoy: the "− dense alone" contrasts of RSPO without the penalty.
  c.append(_l4("rspo_nopen", "dense_only_nopen"))
  c.append(_l4("rspo_decoy_nopen", "dense_only_decoy_nopen"))
  c.append(_l4("rspo_decoy_nopen", "rspo_o_nopen"))
  # L = 8: dense alone ran at seed 0 only.
  c.append(
      contrast(
          "spell L8 rspo_k30 (seed 0) - dense_only (seed 0)",
          L8,
          SPELL,
          "gigpo",
          "rspo_k30",
          "dense_only",
          "T=1",
          (0,),
          (0,),
      )
  )
  # From GiGPO's 30-step policy (session 10): RSPO with B on the m = 3
  # reward against GiGPO at equal A steps (30), at RSPO's environment
  # steps (60), and the dense reward alone; each dense reward alone
  # against GiGPO.
  for b in (
      "from_gigpo_baseline_nopen",
      "from_gigpo_baseline_long_nopen",
      "from_gigpo_dense_only_partial3_nopen",
  ):
    c.append(_l4("from_gigpo_rspo_partial3_nopen", b, study=SWITCH))
  for m in (2, 3):
    c.append(
        _l4(
            f"from_gigpo_dense_only_partial{m}_nopen",
            "from_gigpo_baseline_nopen",
            study=SWITCH,
        )
    )
  return c


def levels() -> list:
  """Each quoted cell's success over its seeds, T = 1."""
  lv = []
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
      ("baseline_long_nopen", None),
      ("dense_only_partial2_nopen", None),
      ("rspo_partial2_nopen", None),
      ("rspo_o_nopen", None),
  ):
    lv.append(
        level(f"spell L=4 {cell}", L4, SPELL, "gigpo", cell, "T=1", SEEDS5, q)
    )
  for cell in (
      "baseline_long",
      "dense_only_partial2",
      "rspo_partial2",
      "dense_only_partial3_nopen",
      "rspo_partial3_nopen",
      "dense_only_nopen",
      "dense_only_decoy_nopen",
  ):
    lv.append(
        level(f"spell L=4 {cell}", L4, SPELL, "gigpo", cell, "T=1", SEEDS5)
    )
  # The partly misleading regime at L = 6, every cell over its seeds.
  for cell in (
      "baseline_nopen",
      "baseline_long_nopen",
      "baseline_x3_nopen",
      "dense_only_partial2_nopen",
      "dense_only_x3_partial2_nopen",
      "rspo_partial2_nopen",
      "rspo_adaptive_partial2_nopen",
      "rspo_o_nopen",
      "dense_only_partial4_nopen",
      "rspo_partial4_nopen",
      "dense_only_partial3_nopen",
      "rspo_partial3_nopen",
  ):
    lv.append(
        level(
            f"spell L=6 {cell}",
            L6,
            SPELL,
            "gigpo",
            cell,
            "T=1",
            _l6_seeds(cell),
            None,
        )
    )
  lv.append(
      level(
          "spell L=4 rspo_nopen, D from fresh tasks",
          "spell_fresh_d",
          SPELL,
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
          SPELL,
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
          L6,
          SPELL,
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
          L6,
          SPELL,
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
          L8,
          SPELL,
          "gigpo",
          "rspo_k30",
          "T=1",
          SEEDS3,
          "8.0 [4.3, 12.9]",
      )
  )
  for cell in ("baseline_nopen",) + SWITCH_CELLS:
    lv.append(
        level(
            f"spell L=4 {cell} (switch study)",
            SWITCH,
            SPELL,
            "gigpo",
            cell,
            "T=1",
            SEEDS5,
        )
    )
  return lv


def lifts() -> list:
  """B's lift per loop (L = 8, 6, 4), and over paired tasks at L = 6."""
  li = []
  li.append(
      lift_summary(
          "B's lift, spell L=8 k=30",
          run_lifts(
              L8,
              [f"spell_gigpo_rspo_k30_s{s}" for s in SEEDS3],
          ),
          "+55.7 [+54.7, +56.2]",
          L8,
      )
  )
  li.append(
      lift_summary(
          "B's lift, spell L=6 k=10",
          run_lifts(L6, [f"spell_gigpo_rspo_s{s}" for s in SEEDS3]),
          "+18.9 [+0.5, +37.0]",
          L6,
      )
  )
  for cell, q in (
      ("rspo", "+27.1 [+16.0, +37.7]"),
      ("rspo_nopen", "+24.2 [+14.1, +34.8]"),
  ):
    li.append(
        lift_summary(
            f"B's lift, spell L=4 {cell}",
            run_lifts(L4, [f"spell_gigpo_{cell}_s{s}" for s in SEEDS5]),
            q,
            L4,
        )
    )

  li.append(
      lift_summary(
          "B's lift, spell L=6 partial m=2 no penalty, over loops",
          run_lifts(
              L6,
              [
                  f"spell_gigpo_rspo_partial2_nopen_s{s}"
                  for s in _l6_seeds("rspo_partial2_nopen")
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
              for s in _l6_seeds("rspo_partial2_nopen")
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
              for s in _l6_seeds("rspo_adaptive_partial2_nopen")
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
  return li


def by_seed() -> list:
  """RSPO - the stronger of GiGPO and dense alone, seed by seed, at L = 6
  and 4 (m = 2); D from fresh tasks - D from B's first batch at L = 4,
  paired by seed."""
  env = "GiGPO at RSPO's env steps, dense alone"
  out = [
      _by_seed(
          f"spell L6 rspo_partial2_nopen - max({env}), by seed",
          L6,
          "rspo_partial2_nopen",
          ("baseline_long_nopen", "dense_only_partial2_nopen"),
      ),
      _by_seed(
          "spell L6 rspo_adaptive_partial2_nopen - max(GiGPO at its largest"
          " env steps, dense alone), by seed",
          L6,
          "rspo_adaptive_partial2_nopen",
          ("baseline_x3_nopen", "dense_only_partial2_nopen"),
      ),
      _by_seed(
          "spell L6 rspo_adaptive_partial2_nopen - max(GiGPO, dense alone),"
          " both at 90 A steps (its largest env steps), by seed",
          L6,
          "rspo_adaptive_partial2_nopen",
          ("baseline_x3_nopen", "dense_only_x3_partial2_nopen"),
      ),
      _by_seed(
          f"spell L6 rspo_partial4_nopen - max({env}), by seed",
          L6,
          "rspo_partial4_nopen",
          ("baseline_long_nopen", "dense_only_partial4_nopen"),
      ),
      _by_seed(
          f"spell L6 rspo_partial3_nopen - max({env}), by seed",
          L6,
          "rspo_partial3_nopen",
          ("baseline_long_nopen", "dense_only_partial3_nopen"),
      ),
      _by_seed(
          "spell L=4 from_gigpo_rspo_partial3_nopen - max(GiGPO at RSPO's"
          " env steps, dense alone), both from GiGPO's 30-step policy,"
          " by seed",
          SWITCH,
          "from_gigpo_rspo_partial3_nopen",
          (
              "from_gigpo_baseline_long_nopen",
              "from_gigpo_dense_only_partial3_nopen",
          ),
      ),
      _by_seed(
          f"spell L=4 rspo_partial2_nopen - max({env}), by seed",
          L4,
          "rspo_partial2_nopen",
          ("baseline_long_nopen", "dense_only_partial2_nopen"),
      ),
      _by_seed(
          f"spell L=4 rspo_partial2 (penalty) - max({env}), by seed",
          L4,
          "rspo_partial2",
          ("baseline_long", "dense_only_partial2"),
      ),
      _by_seed(
          f"spell L=4 rspo_partial3_nopen - max({env}), by seed",
          L4,
          "rspo_partial3_nopen",
          ("baseline_long_nopen", "dense_only_partial3_nopen"),
      ),
      _by_seed(
          f"spell L=4 rspo_nopen - max({env}), by seed",
          L4,
          "rspo_nopen",
          ("baseline_long_nopen", "dense_only_nopen"),
      ),
  ]
  # D from fresh tasks - D from B's first batch's tasks: the same seeds,
  # paired; the bootstrap resamples the seeds' paired outcome differences.
  fresh = cell_outcomes(
      "spell_fresh_d", SPELL, "gigpo", "rspo_nopen", SEEDS5, "T=1"
  )
  first = cell_outcomes(L4, SPELL, "gigpo", "rspo_nopen", SEEDS5, "T=1")
  d = 100 * (fresh.mean(axis=(1, 2)) - first.mean(axis=(1, 2)))
  t = intervals.t_interval(d)
  out.append(
      {
          "claim": "spell L=4 rspo_nopen, D fresh - D first, paired by seed",
          "study": "spell_fresh_d - study_spell_L4_D1",
          "decoding": "T=1",
          "n": len(SEEDS5),
          "quoted": "+2.2 [-1.5, +7.0]",
          "per_seed_difference": [rounded(v) for v in d],
          "bootstrap": percent(
              intervals.success_interval(fresh - first, seed=0)
          ),
          "t": {k: rounded(t[k]) for k in ("mean", "lo", "hi")},
          "sign_flip_p": rounded(intervals.sign_flip_p(d), 3),
      }
  )
  return out
