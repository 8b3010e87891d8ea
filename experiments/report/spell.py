r"""The spell study (docs/results.md, sparse rewards): its report,
``study_spell_<world>``; the same report for WebShop's sparse study
(``--grid sparse``): ``study_<root's name>``, e.g.
study_webshop_sparse_gate.

  python experiments/reproduce.py --grid spell --seeds 0        # L4_D1
  python experiments/reproduce.py --grid spell --seeds 0 \
      --extra env.kwargs.word_length=6                         # L = 6
  python experiments/reproduce.py --grid spell --report_only    # tables only

The task (third_party_envs/spell.py): spell a hidden word of L letters one
letter a turn; letter i is a fixed cipher of code digit i shown in the
task; won iff every letter is right (outcome 10 * won), so a policy that
knows a share p of the letters wins ~p^L: the sparsity grows with L. The
dense reward B trains on (``rspo.dense_reward=oracle``, the env's):
'aligned' pays 1/L for each letter that extends a correct prefix,
'misaligned' 1/L for any letter of the word in any position (farmable:
typing the word's commonest letter every turn earns it without winning),
'decoy' 1/L for the letter after the right one (farmable in every world).

The grid (experiments/grid.py, ``spell_grid``): GiGPO x {baseline (GiGPO),
rspo (RSPO+GiGPO, aligned, k = 10), rspo_misaligned, rspo_decoy,
rspo_o (B trained on the outcome: B's extra data without the dense
reward), dense_only (one policy on the aligned dense reward alone),
dense_only_misaligned, dense_only_decoy, rspo_k3 (RSPO+GiGPO with
k = 3)} x seeds {0, 200, 400, 600, 800}, at
``SPELL_OVERRIDES``, all from one shared warm start per world
(``runs/spell/<spell_name>/warm_start_spell``, e.g. L4_D1). The world:
one hidden letter (``env.kwargs.cipher_digits=1``: every word is one
letter L times), so a random policy wins (1/5)^L; the warm start is
'nano' behaviour-cloned for 300 steps from the guessing expert that
knows no digit (``expert_digits=0,expert_unknown=guess``): the reply
format, uniform over the letters. With one letter the misaligned dense
reward pays the right letter at any position, regardless of the prefix:
it is not farmable there, so the misaligned cells need D > 1, where the
nano policy does not learn the cipher from reward; the decoy cells test a
misleading dense reward in the one-letter world
(docs/results/log.md, 2026-12-04). The pilot's world, the full cipher
with an expert that knows digits 0-1 (docs/results/study_spell_L4.md),
is ``--extra env.kwargs.cipher_digits=10,env.kwargs.expert_digits=2,
sft.steps=2000`` with its own ``--root``: the same world and warm start
recipe, not the same config strings (its RSPO cells ran k = 3), so the
pilot's archive refuses to be resumed from it.

The partly misleading study (``grid.partial_study``; docs/results.md, "The
claim where the paper makes it"):
the dense reward 'partial' with m decoy positions (aligned prefix credit
on the first L - m letters, decoys on the last m; m in PARTIAL_M), cells
GiGPO, GiGPO run 60 A steps (RSPO's environment steps, B's included),
RSPO_O, and per m the dense reward alone (dense_only_partial<m>) and
RSPO+GiGPO with B on it (rspo_partial<m>); ``_nopen`` without the
invalid-action penalty (the main setting), without the suffix with it
(the check):

  python experiments/reproduce.py --grid spell --seeds 0,200,400,600,800 \
      --variants baseline_nopen,baseline_long_nopen,rspo_o_nopen,\
dense_only_partial1_nopen,rspo_partial1_nopen,dense_only_partial2_nopen,\
rspo_partial2_nopen,dense_only_partial3_nopen,rspo_partial3_nopen \
      --extra env.kwargs.word_length=6

Its report adds, per RSPO cell, RSPO − GiGPO at equal environment steps,
RSPO − the dense reward alone and RSPO − the stronger of the two
(``EQUAL_COST``), the peak of each dense-only run's success (a rise then
a fall puts it above both ends) and the paper's Figure 3 for the
dense-only cells: dense return and success against A step, one figure
(``figure3``).

The report, per cell and decoding (greedy; T = 1.0, 3 seeds) on the 256
held-out tasks (valid_seen), with 95 % bootstrap intervals
(rspo_jax/intervals.py): success, final - start (paired, the shared warm
start), cell - its base (GiGPO, or ``BASES``) and the contrasts
``CONTRASTS`` (method_difference: goals shared, training seeds
resampled within each cell); A's rollout success over its first
``EARLY_STEPS`` steps (does a cell find wins sooner?); B's lift per
loop (metrics.jsonl B_collect rows: ``b_lift_success``,
``b_lift_dense_return``) with an interval over loops within seeds and
seeds; for the dense-only cells, the dense return
(L x dense reward per turn) against success over training, first
``EDGE_STEPS`` A steps against the last (reward hacking: dense return up,
success down); curves of rollout success and dense reward per turn.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Optional, Sequence

import numpy as np

import run_archive as ra
from grid import (
    B_K_MAX,
    DENSE,
    EQUAL_ENV_STEPS,
    PARTIAL_M,
    SAMPLED,
    SPARSE_OVERRIDES,
    SPARSE_VARIANTS,
    SPELL_ALGO,
    SPELL_ENV,
    SPELL_OVERRIDES,
    SPELL_SAMPLED,
    SPELL_VARIANTS,
    sparse_grid,
    spell_grid,
    spell_length,
    spell_name,
    with_rl_extra,
)
from report.common import (
    X_AXES,
    archive_note,
    decoding_intervals,
    decodings,
    difference,
    fmt_ci,
    load_plot_module,
    nested_interval,
    other_config_seeds,
    outcomes,
    pct,
    plot_atomic,
    save_figure,
    start_intervals,
)
from run_files import (
    finished_runs,
    run_config,
    warm_start_workdir,
    write_json,
    write_text,
)

LABELS = {
    "baseline": "GiGPO",
    "rspo": "RSPO+GiGPO (aligned), k = 10",
    "rspo_misaligned": "RSPO+GiGPO (misaligned)",
    "rspo_decoy": "RSPO+GiGPO (decoy)",
    "rspo_o": "RSPO_O+GiGPO (B on the outcome)",
    "dense_only": "Dense only (aligned)",
    "dense_only_misaligned": "Dense only (misaligned)",
    "dense_only_decoy": "Dense only (decoy)",
    "rspo_k3": "RSPO+GiGPO (aligned), k = 3",
    "rspo_k30": "RSPO+GiGPO (aligned), k = 30 (one loop)",
    "rspo_decoy_nopen": "RSPO+GiGPO (decoy), no invalid-action penalty",
    "baseline_nopen": "GiGPO, no invalid-action penalty",
    "rspo_nopen": "RSPO+GiGPO (aligned), k = 10, no invalid-action penalty",
    "dense_only_nopen": "Dense only (aligned), no invalid-action penalty",
    "dense_only_decoy_nopen": "Dense only (decoy), no invalid-action penalty",
    "baseline_lora": "GiGPO, LoRA r = 16",
    "rspo_lora": "RSPO+GiGPO (aligned), k = 10, LoRA r = 16",
    "baseline_lora3e3": "GiGPO, LoRA r = 16, lr 3e-3",
    "grpo": "GRPO",
    "grpo_lora": "GRPO, LoRA r = 16",
    "rspo_grpo": "RSPO+GRPO (aligned), k = 10",
    "rspo_grpo_lora": "RSPO+GRPO (aligned), k = 10, LoRA r = 16",
}
NOPEN = ", no invalid-action penalty"
LABELS.update(
    baseline_long=f"GiGPO, {EQUAL_ENV_STEPS} A steps (RSPO's environment"
    " steps)",
    baseline_long_nopen=f"GiGPO, {EQUAL_ENV_STEPS} A steps (RSPO's"
    f" environment steps){NOPEN}",
    rspo_o_nopen=f"RSPO_O+GiGPO (B on the outcome){NOPEN}",
)
for _m in PARTIAL_M:
  for _pen, _tail in (("", ""), ("_nopen", NOPEN)):
    LABELS[f"dense_only_partial{_m}{_pen}"] = (
        f"Dense only (partial, m = {_m}){_tail}"
    )
    LABELS[f"rspo_partial{_m}{_pen}"] = (
        f"RSPO+GiGPO (partial, m = {_m}), k = 10{_tail}"
    )
LABELS.update(
    rspo_adaptive_partial2_nopen="RSPO+GiGPO (partial, m = 2), adaptive B,"
    f" k = 10 up to {B_K_MAX}{NOPEN}",
    baseline_x3_nopen="GiGPO, 90 A steps (adaptive RSPO's largest"
    f" environment steps){NOPEN}",
    dense_only_x3_partial2_nopen="Dense only (partial, m = 2), 90 A steps"
    f"{NOPEN}",
)
# Figure 3 from a policy that wins (grid.START_FROM): 30 more A steps from
# GiGPO's 30-step policy, on the outcome or the dense reward alone; each
# dense cell's "− base" is the outcome's.
LABELS["from_gigpo_baseline_nopen"] = f"GiGPO, then 30 A steps more{NOPEN}"
for _m in (2, 3):
  LABELS[f"from_gigpo_dense_only_partial{_m}_nopen"] = (
      f"GiGPO, then 30 A steps on the dense reward alone (partial,"
      f" m = {_m}){NOPEN}"
  )
LABELS["from_gigpo_baseline_long_nopen"] = (
    f"GiGPO, then {EQUAL_ENV_STEPS} A steps more (RSPO's environment"
    f" steps){NOPEN}"
)
LABELS["from_gigpo_rspo_partial3_nopen"] = (
    f"GiGPO, then 30 A steps of RSPO+GiGPO (partial, m = 3), k = 10{NOPEN}"
)
PARTIAL_RSPO = tuple(
    f"rspo_partial{m}{pen}" for pen in ("_nopen", "") for m in PARTIAL_M
)
PARTIAL_DENSE = tuple(
    f"dense_only_partial{m}{pen}" for pen in ("_nopen", "") for m in PARTIAL_M
)
RSPO_CELLS = (
    "rspo",
    "rspo_misaligned",
    "rspo_decoy",
    "rspo_o",
    "rspo_k3",
    "rspo_k30",
    "rspo_decoy_nopen",
    "rspo_nopen",
    "rspo_o_nopen",
    *PARTIAL_RSPO,
    "rspo_adaptive_partial2_nopen",
    "rspo_lora",
    "rspo_grpo",
    "rspo_grpo_lora",
)
# The cell each one's "− base" column is taken against: the base algorithm
# with the same penalty and the same LoRA setting; every other cell's is
# GiGPO ("baseline").
BASES = {
    "from_gigpo_baseline_nopen": "baseline_nopen",
    "from_gigpo_dense_only_partial2_nopen": "from_gigpo_baseline_nopen",
    "from_gigpo_dense_only_partial3_nopen": "from_gigpo_baseline_nopen",
    "from_gigpo_rspo_partial3_nopen": "from_gigpo_baseline_nopen",
    "from_gigpo_baseline_long_nopen": "from_gigpo_baseline_nopen",
    "rspo_decoy_nopen": "baseline_nopen",
    "rspo_nopen": "baseline_nopen",
    "rspo_lora": "baseline_lora",
    "grpo_lora": "grpo",
    "rspo_grpo": "grpo",
    "rspo_grpo_lora": "grpo_lora",
    **{
        v: "baseline_nopen"
        for v in (
            "baseline_long_nopen",
            "rspo_o_nopen",
            "rspo_adaptive_partial2_nopen",
            "baseline_x3_nopen",
            "dense_only_x3_partial2_nopen",
            "dense_only_nopen",
            "dense_only_decoy_nopen",
            *PARTIAL_RSPO,
            *PARTIAL_DENSE,
        )
        if v.endswith("_nopen")
    },
}
DENSE_ONLY_CELLS = (
    "dense_only",
    "dense_only_misaligned",
    "dense_only_decoy",
    "dense_only_nopen",
    "dense_only_decoy_nopen",
    *PARTIAL_DENSE,
    "dense_only_x3_partial2_nopen",
)
# Issue 50 item 2: each RSPO cell against GiGPO at RSPO's environment
# steps (B's included: the 60-step cell) and against the dense reward it
# gives B, alone (None: no such cell). rspo cell -> (GiGPO long, dense).
EQUAL_COST = {
    "rspo": ("baseline_long", "dense_only"),
    "rspo_decoy": ("baseline_long", "dense_only_decoy"),
    "rspo_o": ("baseline_long", None),
    "rspo_nopen": ("baseline_long_nopen", "dense_only_nopen"),
    "rspo_decoy_nopen": ("baseline_long_nopen", "dense_only_decoy_nopen"),
    "rspo_o_nopen": ("baseline_long_nopen", None),
    **{
        v: (
            "baseline_long" + ("_nopen" if v.endswith("_nopen") else ""),
            v.replace("rspo_", "dense_only_", 1),
        )
        for v in PARTIAL_RSPO
    },
    "rspo_adaptive_partial2_nopen": (
        "baseline_x3_nopen",
        "dense_only_partial2_nopen",
    ),
}
# (a, b, what a - b answers), besides every cell - its base.
CONTRASTS = (
    ("rspo", "rspo_o", "what B's dense reward adds to RSPO's extra data"),
    ("rspo", "rspo_misaligned", "aligned vs misaligned dense reward in RSPO"),
    (
        "rspo_misaligned",
        "dense_only_misaligned",
        "RSPO vs the misaligned dense reward alone",
    ),
    (
        "dense_only",
        "dense_only_misaligned",
        "aligned vs misaligned, dense reward alone",
    ),
    ("rspo_decoy", "dense_only_decoy", "RSPO vs the decoy dense reward alone"),
    ("rspo", "rspo_k3", "B's steps a loop: k = 10 vs k = 3"),
    ("rspo_k30", "rspo", "B's steps a loop: k = 30 vs k = 10"),
    (
        "rspo_decoy_nopen",
        "baseline_nopen",
        "RSPO (decoy) - GiGPO, both without the invalid-action penalty",
    ),
    ("baseline_nopen", "baseline", "GiGPO without vs with the penalty"),
    (
        "rspo_nopen",
        "baseline_nopen",
        "RSPO+GiGPO - GiGPO, both without the invalid-action penalty",
    ),
    ("rspo_nopen", "rspo", "RSPO+GiGPO without vs with the penalty"),
    (
        "rspo_decoy_nopen",
        "rspo_decoy",
        "RSPO (decoy) without vs with the penalty",
    ),
    ("baseline_lora3e3", "baseline_lora", "LoRA at lr 3e-3 vs 1e-3"),
    ("rspo_lora", "rspo", "LoRA - full fine-tuning, RSPO+GiGPO"),
    ("grpo", "baseline", "GRPO - GiGPO"),
    ("rspo_grpo_lora", "rspo_grpo", "LoRA - full fine-tuning, RSPO+GRPO"),
    (
        "baseline_long_nopen",
        "baseline_nopen",
        f"GiGPO: {EQUAL_ENV_STEPS} vs 30 A steps, no penalty",
    ),
    ("baseline_long", "baseline", f"GiGPO: {EQUAL_ENV_STEPS} vs 30 A steps"),
    (
        "rspo_adaptive_partial2_nopen",
        "rspo_partial2_nopen",
        "adaptive B (up to 20 steps) vs fixed k = 10, m = 2, no penalty",
    ),
    *(
        (
            v,
            f"rspo_o{pen}",
            "what B's partly misleading dense reward adds"
            " to RSPO's extra data",
        )
        for v, pen in (
            (v, "_nopen" if v.endswith("_nopen") else "") for v in PARTIAL_RSPO
        )
    ),
)


def base_of(variant: str) -> str:
  """The cell ``variant``'s "− base" column is taken against (BASES)."""
  return BASES.get(variant, "baseline")


def _versus(cell: dict) -> str:
  """The suffix " vs <label>" after a "− base" number not taken against
  GiGPO."""
  base = cell["base"]
  return "" if base in (None, "baseline") else f" vs {LABELS[base]}"


LIFT_KEYS = ("b_lift_success", "b_lift_dense_return")
EARLY_STEPS = 12  # the sparse WebShop gate (docs/results.md): 12 steps
EDGE_STEPS = 3  # the first / last A steps of the hacking table


def _rows(workdir: str, phase: str) -> list[dict]:
  from rspo_jax import metrics  # noqa: PLC0415 -- json only

  if not metrics.has_metrics(workdir):  # plain, or gzipped when archived
    return []
  out = metrics.read_metrics(metrics.metrics_path(workdir), phase)
  # A resumed run may write a step twice: the last row of a step wins.
  by_step = {}
  for row in out:
    by_step[(row.get("step"), row.get("loop"))] = row
  return list(by_step.values())


def lift_values(workdir: str) -> dict[str, list[float]]:
  """{key: [value of each loop]} of a run's B_collect rows (LIFT_KEYS)."""
  rows = _rows(workdir, "B_collect")
  return {
      k: [float(r[k]) for r in rows if r.get(k) is not None] for k in LIFT_KEYS
  }


# log pi_B - log pi_old on A's replayed response tokens, per A step: the
# tokens' mean, median and largest value, and the k3 estimate of
# KL(pi_B || pi_old) (runs before 2026-12-06 logged the mean only).
DIVERGENCE_KEYS = {
    "mean": "replay_logp_b_minus_old",
    "median": "replay_logp_b_minus_old_median",
    "max": "replay_logp_b_minus_old_max",
    "k3": "replay_kl_b_old_k3",
}


def divergence(workdirs: Sequence[str]) -> Optional[dict]:
  """B - A on replayed tokens over the A steps of ``workdirs`` that
  replayed: {'steps': how many, 'mean': mean of the steps' token means,
  'median': median of their token medians, 'max': the largest token
  value, 'k3': mean of their k3}; a statistic no step logged is None;
  None when no step replayed."""
  rows = [
      r
      for w in workdirs
      for r in _rows(w, "A")
      if r.get(DIVERGENCE_KEYS["mean"]) is not None
  ]
  if not rows:
    return None
  how = {"mean": np.mean, "median": np.median, "max": np.max, "k3": np.mean}
  out = {"steps": len(rows)}
  for name, key in DIVERGENCE_KEYS.items():
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    out[name] = float(how[name](vals)) if vals else None
  return out


def a_series(workdir: str, key: str, scale: float = 1.0) -> list[float]:
  """``key`` of a run's A rows in step order, times ``scale``."""
  rows = sorted(_rows(workdir, "A"), key=lambda r: r["step"])
  return [scale * float(r[key]) for r in rows if r.get(key) is not None]


def _ci_pct(ci: Optional[dict]) -> Optional[dict]:
  return None if ci is None else pct(ci)


def _other_config_seeds(
    env: str, variant: str, configs: dict, extra: str, rl_extra: str
) -> list[int]:
  grid = spell_grid if env == SPELL_ENV else sparse_grid
  return other_config_seeds(
      configs,
      lambda s: with_rl_extra(grid(seeds=[s], variants=[variant])[0], rl_extra),
      extra,
  )


def _study(env: str, root: str, extra: str) -> dict:
  """What differs between the spell study and WebShop's sparse one."""
  if env == SPELL_ENV:
    world = spell_name(extra)
    return {
        "name": f"study_spell_{world}",
        "world": world,
        "length": spell_length(extra),
        "variants": tuple(SPELL_VARIANTS),
        "overrides": SPELL_OVERRIDES,
        "sampled": SPELL_SAMPLED,
        "tasks": "words",
        "grid": "--grid spell",
        "title": f"Spell, {world}",
    }
  world = os.path.basename(os.path.abspath(root))
  return {
      "name": f"study_{world}",
      "world": world,
      "length": 1,
      "variants": SPARSE_VARIANTS,
      "overrides": SPARSE_OVERRIDES,
      "sampled": SAMPLED,
      "tasks": "goals",
      "grid": f"--grid sparse --root runs/{world}",
      "title": "WebShop, sparse outcomes",
  }


def spell_report(
    root: str,
    out_dir: str,
    *,
    env: str = SPELL_ENV,
    extra: str = "",
    rl_extra: str = "",
    archive: str = "",
    seed: int = 0,
    echo: bool = True,
) -> dict:
  """Writes ``study_spell_<world>.{json,md}`` (``spell_name``: L4_D1;
  ``env="webshop"``: ``study_<root's name>``, WebShop's sparse study) and
  its curves into ``out_dir`` from the finished runs under ``root`` (else
  in ``archive``); ``extra``: the grid's (SPELL_OVERRIDES or
  SPARSE_OVERRIDES, and --extra; gives the world and the configs the runs
  should have been trained with). Returns the JSON object, with
  ``markdown``: the .md path."""
  study = _study(env, root, extra)
  length, world, name = study["length"], study["world"], study["name"]
  variants, decs = study["variants"], decodings(study["sampled"])
  ws = warm_start_workdir(root, env)
  starts = {d: outcomes([ra.find_file(ws, archive, s)]) for d, s, _ in decs}
  runs = {v: finished_runs(root, env, SPELL_ALGO, v, archive) for v in variants}
  finals = {
      (v, d): outcomes([os.path.join(w, f) for _, w in runs[v]])
      for v in variants
      for d, _, f in decs
  }

  def diff(a, b):
    return difference(a, b, seed)

  cells = []
  for v in variants:
    configs = {s: run_config(w) for s, w in runs[v]}
    base = None if v == "baseline" else base_of(v)
    cell = {
        "variant": v,
        "label": LABELS[v],
        "n": len(runs[v]),
        "base": base,
        "seeds": [s for s, _ in runs[v]],
        "configs": sorted(set(configs.values()) - {None}),
        "other_config_seeds": _other_config_seeds(
            env, v, configs, extra, rl_extra
        ),
    }
    for d, _, _ in decs:
      cell[d] = decoding_intervals(
          finals[v, d],
          starts[d],
          None if base is None else finals[base, d],
          seed,
      )
    wds = [w for _, w in runs[v]]
    cell["early_success"] = _ci_pct(
        nested_interval(
            [a_series(w, "rollout_success_rate")[:EARLY_STEPS] for w in wds],
            seed=seed,
        )
    )
    if v in RSPO_CELLS:
      lifts = [lift_values(w) for w in wds]
      cell["b_lift"] = {
          k: nested_interval([lv[k] for lv in lifts], seed=seed)
          for k in LIFT_KEYS
      }
      cell["b_lift"]["b_lift_success"] = _ci_pct(
          cell["b_lift"]["b_lift_success"]
      )
      cell["divergence"] = divergence(wds)
    if v in DENSE_ONLY_CELLS or v == "baseline":
      cell["hacking"] = _hacking(wds, length, seed)
    cells.append(cell)
  contrasts = [
      {
          "a": a,
          "b": b,
          "question": q,
          **{d: diff(finals[a, d], finals[b, d]) for d, _, _ in decs},
      }
      for a, b, q in CONTRASTS
      if a in variants and b in variants
  ]
  by_variant = {c["variant"]: c for c in cells}
  equal_cost = [
      _equal_cost(v, by_variant, finals, decs, diff)
      for v in EQUAL_COST
      if v in variants and runs[v]
  ]
  curves = _curves(runs, out_dir, name, study["title"], echo)
  curves += _figure3(runs, length, out_dir, name, study["title"], echo)
  report = {
      "env": env,
      "algo": SPELL_ALGO,
      "word_length": length,
      "world": world,
      "title": study["title"],
      "tasks": study["tasks"],
      "grid": study["grid"],
      "decodings": [d for d, _, _ in decs],
      "extra": extra.removeprefix(study["overrides"]).strip(","),
      "root": os.path.abspath(root),
      "archive": os.path.abspath(archive) if archive else None,
      "generated": datetime.datetime.now().isoformat(timespec="seconds"),
      "units": "percent (success) and points (differences); dense return "
      "in units of a won episode's (1); 95 % bootstrap intervals",
      "overrides": ",".join(p for p in (extra, rl_extra) if p),
      "rl_extra": rl_extra,
      "dense_reward": DENSE,
      "start": start_intervals(starts, seed),
      "cells": cells,
      "contrasts": contrasts,
      "equal_cost": equal_cost,
      "curves": curves,
  }
  md = os.path.join(out_dir, f"{name}.md")
  write_json(os.path.join(out_dir, f"{name}.json"), report)
  write_text(md, spell_markdown(report))
  return {**report, "markdown": md}


def _equal_cost(v: str, cells: dict, finals: dict, decs, diff) -> dict:
  """RSPO cell ``v`` against GiGPO at its environment steps and against
  its dense reward alone (EQUAL_COST), and against the stronger of the
  two by mean success in each decoding (the paper's claim: does RSPO beat
  max(base at equal environment steps, dense alone)?)."""
  long, dense = EQUAL_COST[v]
  out = {"variant": v, "long": long, "dense": dense}
  for d, _, _ in decs:
    others = {}
    for o in (long, dense):
      ok = o is not None and o in cells and cells[o]["n"]
      if ok and cells[o][d]["success"] is not None:
        others[o] = cells[o][d]["success"]["mean"]
    best = max(others, key=others.get) if others else None
    out[d] = {
        "minus_long": None
        if long not in others
        else diff(finals[v, d], finals[long, d]),
        "minus_dense": None
        if dense not in others
        else diff(finals[v, d], finals[dense, d]),
        "best": best,
        "minus_best": None
        if best is None
        else diff(finals[v, d], finals[best, d]),
    }
  return out


PEAK_WINDOW = 3  # A steps averaged before a run's success peak is read


def peak(
    series: Sequence[float], window: int = PEAK_WINDOW
) -> tuple[float, int]:
  """(max, its A step) of the trailing ``window``-step mean of a run's
  series (step 1 = the first value); the first step of ties."""
  y = np.asarray(series, np.float64)
  c = np.cumsum(np.insert(y, 0, 0.0))
  i = np.arange(1, len(y) + 1)
  start = np.maximum(i - window, 0)
  means = (c[i] - c[start]) / (i - start)
  j = int(np.argmax(means))
  return float(means[j]), j + 1


def _hacking(workdirs: Sequence[str], length: int, seed: int) -> dict:
  """First vs last EDGE_STEPS A steps of each run: rollout success (%)
  and dense return (L x dense reward per turn; an episode is L turns),
  means with intervals over seeds and steps, and the change (last -
  first) with one over seeds; and success's peak (``peak``: the highest
  PEAK_WINDOW-step mean, with an interval over seeds, and the median A
  step of the runs' peaks): a rise then a fall puts the peak above
  both ends."""
  out = {}
  for key, scale, unit in (
      ("rollout_success_rate", 100.0, "success"),
      ("dense_reward_mean", float(length), "dense_return"),
  ):
    series = [a_series(w, key, scale) for w in workdirs]
    series = [s for s in series if len(s) >= 2 * EDGE_STEPS]
    first = [s[:EDGE_STEPS] for s in series]
    last = [s[-EDGE_STEPS:] for s in series]
    out[unit] = {
        "first": nested_interval(first, seed=seed),
        "last": nested_interval(last, seed=seed),
        "change": nested_interval(
            [[np.mean(b) - np.mean(a)] for a, b in zip(first, last)], seed=seed
        ),
    }
    peaks = [peak(s) for s in series]
    out[unit]["peak"] = nested_interval([[p] for p, _ in peaks], seed=seed)
    out[unit]["peak_step"] = (
        float(np.median([j for _, j in peaks])) if peaks else None
    )
  return out


def _curves(
    runs: dict, out_dir: str, name: str, title: str, echo: bool
) -> list[str]:
  groups = {LABELS[v]: [w for _, w in r] for v, r in runs.items() if r}
  made = []
  for xa in X_AXES:
    png = f"{name}_success_{xa}.png"
    if plot_atomic(
        groups,
        "rollout_success_rate",
        xa,
        os.path.join(out_dir, png),
        echo=echo,
        phase="A",
        band="std",
        title=f"{title}: A's rollout success",
    ):
      made.append(png)
  dense = {
      LABELS[v]: groups[LABELS[v]]
      for v in ("baseline",) + DENSE_ONLY_CELLS
      if runs.get(v)
  }
  png = f"{name}_dense_step.png"
  if plot_atomic(
      dense,
      "dense_reward_mean",
      "step",
      os.path.join(out_dir, png),
      echo=echo,
      phase="A",
      band="std",
      title=f"{title}: dense reward per turn",
  ):
    made.append(png)
  return made


def _figure3(
    runs: dict, length: int, out_dir: str, name: str, title: str, echo: bool
) -> list[str]:
  """The paper's Figure 3 for the dense-only cells of the partly
  misleading reward (PARTIAL_DENSE), one figure without the penalty and
  one with it: dense return (L x dense reward per turn, solid) and
  rollout success (dashed) of A's training batches against A step, one
  colour per m, mean and std band over seeds. Hacked: the dense return
  rises while success falls."""
  made = []
  for tag, pen in (("", "_nopen"), ("_penalty", "")):
    groups = {
        f"m = {m}": [w for _, w in runs[v]]
        for m, v in ((m, f"dense_only_partial{m}{pen}") for m in PARTIAL_M)
        if runs.get(v)
    }
    if not groups:
      continue
    png = f"{name}_figure3{tag}_step.png"
    try:
      figure3(
          groups,
          length,
          os.path.join(out_dir, png),
          f"{title}: the dense reward alone"
          + (" (no invalid-action penalty)" if pen else ""),
      )
    except ValueError as e:
      if echo:
        print(json.dumps({"plot": png, "skipped": str(e)}), flush=True)
      continue
    made.append(png)
  return made


def figure3(
    groups: dict[str, list[str]], length: int, out_path: str, title: str
) -> None:
  """Dense return (L x ``dense_reward_mean``, solid) and rollout success
  (dashed) against A step, one colour per group (label -> run dirs),
  into the PNG ``out_path`` (atomically); ValueError when a run lacks
  them."""
  plot = load_plot_module()
  import matplotlib  # noqa: PLC0415 -- only the plotting path needs it

  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
  for i, (label, wds) in enumerate(groups.items()):
    colour = f"C{i}"
    n = f" (n={len(wds)})" if len(wds) > 1 else ""
    for metric, scale, style, what in (
        ("dense_reward_mean", float(length), "-", "dense return"),
        ("rollout_success_rate", 1.0, "--", "success"),
    ):
      c = plot.aggregate_runs(
          [
              (xs, scale * ys)
              for xs, ys in (
                  plot.load_series(w, metric, "step", "A") for w in wds
              )
          ],
          band="std",
      )
      ax.plot(
          c.x, c.mean, style, color=colour, lw=1.6, label=f"{label}: {what}{n}"
      )
      if len(wds) > 1:
        ax.fill_between(c.x, c.lo, c.hi, color=colour, alpha=0.15, lw=0)
  ax.set_xlabel("A step")
  ax.set_ylabel("dense return (a won episode's = 1) / success")
  ax.set_ylim(-0.02, 1.02)
  ax.set_title(title, fontsize="medium")
  ax.grid(alpha=0.3)
  ax.legend(loc="best", fontsize="x-small")
  fig.tight_layout()
  save_figure(fig, out_path)


def _step(x: Optional[float]) -> str:
  return "—" if x is None else f"{x:g}"


def spell_markdown(report: dict) -> str:
  ran = [c for c in report["cells"] if c["n"]]  # cells not run: no rows
  cells = {c["variant"]: c for c in ran}
  extra, tasks = report.get("extra"), report["tasks"]
  decs = report["decodings"]
  per_turn = report["env"] != SPELL_ENV  # no fixed episode length
  lines = [
      f"# {report['title']}: RSPO+GiGPO vs GiGPO, and the dense reward"
      " alone",
      "",
      f"Written by `python experiments/reproduce.py {report['grid']}"
      + (f" --extra {extra}" if extra else "")
      + (f" --rl_extra {report['rl_extra']}" if report.get("rl_extra") else "")
      + f"` ({report['generated']}) from the finished runs"
      f" under `{report['root']}`{archive_note(report)}. Overrides:"
      f" `{report['overrides']}`; B's dense reward: `{report['dense_reward']}`"
      + (
          ""
          if per_turn
          else " (the environment's own: aligned,"
          " misaligned or decoy by `env.kwargs.dense`)"
      )
      + ".",
      "",
      "**Setting**: the RSPO cells ran at the `rspo.alpha` of the overrides"
      " above, the wins replay rule (`rspo.replay_reuse=wins`) and k = 10"
      " unless a cell names its k. With 2-5 training seeds a percentile"
      " bootstrap is about the seeds' range: t intervals over the seeds and"
      " exact p, with the per-seed values, are in"
      " [record_intervals.json](record_intervals.json)"
      " (`python experiments/record_intervals.py`).",
  ]
  other = [
      f"{c['label']} (seeds"
      f" {', '.join(str(s) for s in c['other_config_seeds'])})"
      for c in ran
      if c.get("other_config_seeds")
  ]
  if other:
    lines += [
        "",
        "**Trained with other overrides than these** (their"
        " run.json): " + "; ".join(other) + ".",
    ]
  lines += [
      "",
      f"Success rate (%) of A on the 256 held-out {tasks} after training;"
      " *final − start*: points over the shared warm start on the same"
      f" {tasks} (paired); *− base*: points over the GiGPO cell, or over"
      " the cell named beside it (the same base algorithm, penalty and"
      " LoRA setting). Mean"
      f" [95 % bootstrap interval]: {tasks} resampled (shared by both"
      " sides of a difference), sampling seeds within one, training seeds"
      " within a cell (rspo_jax/intervals.py).",
  ]
  for d in decs:
    lines += [
        "",
        f"## {d}",
        "",
        f"Start (shared warm start): {fmt_ci(report['start'][d])}",
        "",
        "| Method | n | Success | Final − start | − base |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in ran:
      x = c[d]
      lines.append(
          f"| {c['label']} | {c['n']} | {fmt_ci(x['success'])}"
          f" | {fmt_ci(x['final_minus_start'], True)}"
          f" | {fmt_ci(x['minus_baseline'], True)}"
          f"{_versus(c)} |"
      )
  contrasts = [
      k for k in report["contrasts"] if k["a"] in cells and k["b"] in cells
  ]
  if contrasts:
    lines += [
        "",
        "## Contrasts",
        "",
        f"Points, a − b (method_difference, {tasks} shared).",
        "",
        "| a − b | question | " + " | ".join(d for d in decs) + " |",
        "|---|---|" + "---:|" * len(decs),
    ]
  for k in contrasts:
    lines.append(
        f"| {LABELS[k['a']]} − {LABELS[k['b']]} | {k['question']}"
        " | " + " | ".join(fmt_ci(k[d], True) for d in decs) + " |"
    )
  costs = [k for k in report.get("equal_cost", ()) if k["variant"] in cells]
  if costs:
    lines += [
        "",
        "## Equal cost, and the dense reward alone",
        "",
        "Points, RSPO − each (method_difference, the same held-out"
        f" {tasks}): GiGPO at equal A steps (the *− base* column"
        f" above), GiGPO run {EQUAL_ENV_STEPS} A steps (RSPO's"
        " environment steps, B's included: 59.25 x GiGPO's 30-step"
        " run's; 60 gives GiGPO 1.3 % more), the dense reward RSPO's"
        " B trains on, alone (same m and penalty), and the stronger"
        " of those two by mean success: does RSPO beat max(GiGPO at"
        " equal environment steps, dense alone)? — : that cell has"
        " not run (or has no such cell).",
        "",
    ]
  for d in decs if costs else ():
    lines += [
        f"### {d}",
        "",
        "| Method | − GiGPO, equal A steps | − GiGPO, equal env"
        " steps | − dense alone | − the stronger (which) |",
        "|---|---:|---:|---:|---:|",
    ]
    for k in costs:
      x, cell = k[d], cells[k["variant"]]
      best = (
          ""
          if x["best"] is None
          else (
              " (GiGPO, equal env steps)"
              if x["best"] == k["long"]
              else " (dense alone)"
          )
      )
      lines.append(
          f"| {cell['label']}"
          f" | {fmt_ci(cell[d]['minus_baseline'], True)}"
          f" | {fmt_ci(x['minus_long'], True)}"
          f" | {fmt_ci(x['minus_dense'], True)}"
          f" | {fmt_ci(x['minus_best'], True)}{best} |"
      )
    lines.append("")
  if costs:
    lines.pop()
  lines += [
      "",
      f"## Finding wins: A's rollout success, first {EARLY_STEPS}" " A steps",
      "",
      "Mean rollout success (%) of A's fresh training episodes over"
      f" its first {EARLY_STEPS} steps (T = 1.0; a dense-only run's"
      " A is the policy trained on the dense reward), 95 % interval"
      " over seeds and steps.",
      "",
      "| Method | n | Success |",
      "|---|---:|---:|",
  ]
  for c in ran:
    lines.append(
        f"| {c['label']} | {c['n']} |" f" {fmt_ci(c['early_success'])} |"
    )
  rspo_cells = [v for v in RSPO_CELLS if v in cells]
  if rspo_cells:
    lines += [
        "",
        "## B's lift per loop",
        "",
        "B's stored collection against its first training collection"
        " (B = A), same tasks and sampling seeds: success (points) and"
        " dense return (a won episode's = 1), mean [95 % interval over"
        " loops within seeds and seeds]; loops counted.",
        "",
        "| Method | loops | Success lift | Dense-return lift |",
        "|---|---:|---:|---:|",
    ]
    for v in rspo_cells:
      c = cells[v]
      s, dr = (
          c["b_lift"]["b_lift_success"],
          c["b_lift"]["b_lift_dense_return"],
      )
      n = 0 if s is None else s["n_values"]
      lines.append(
          f"| {c['label']} | {n} | {fmt_ci(s, True)}"
          f" | {fmt_ci(dr, True, 2)} |"
      )
    num = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
    div_rows = [
        f"| {cells[v]['label']} | {dv['steps']} | {num(dv['mean'])}"
        f" | {num(dv['median'])} | {num(dv['max'])} | {num(dv['k3'])} |"
        for v in rspo_cells
        if (dv := cells[v].get("divergence")) is not None
    ]
    if div_rows:
      lines += [
          "",
          "## B − A on replayed tokens",
          "",
          "log pi_B − log pi_old on the response tokens of A's replayed"
          " trajectories (nats), over every A step that replayed, all"
          " seeds: the mean of the steps' token means, the median of their"
          " token medians, the largest token, and the mean k3 estimate of"
          " KL(pi_B || pi_old). '—': not logged by runs this old.",
          "",
          "| Method | A steps | mean | median | max | k3 |",
          "|---|---:|---:|---:|---:|---:|",
          *div_rows,
      ]
  lines += [
      "",
      "## Reward hacking: dense return against success",
      "",
      f"A's first {EDGE_STEPS} and last {EDGE_STEPS} training steps:"
      " rollout success (%) and "
      + (
          "the dense reward per turn"
          if per_turn
          else "dense return per episode (L x the dense reward per turn; a"
          " won episode earns 1 under either dense reward)"
      )
      + ", and the change (last − first), mean [95 % interval over"
      " seeds]. Hacked: dense reward up, success down. *Peak*: the"
      f" highest {PEAK_WINDOW}-step mean of a run's success, mean"
      " over seeds [interval], at the median A step of the runs'"
      " peaks: a rise then a fall puts it above both ends (the"
      " paper's Figure 3).",
      "",
      "| Method | n | Success first | last | change"
      f" | Dense {'per turn' if per_turn else 'return'} first | last"
      " | change | Success peak | at A step |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for v in (v for v in ("baseline",) + DENSE_ONLY_CELLS if v in cells):
    h = cells[v]["hacking"]
    su, de = h["success"], h["dense_return"]
    lines.append(
        f"| {cells[v]['label']} | {cells[v]['n']} | {fmt_ci(su['first'])}"
        f" | {fmt_ci(su['last'])} | {fmt_ci(su['change'], True)}"
        f" | {fmt_ci(de['first'], digits=2)} | {fmt_ci(de['last'], digits=2)}"
        f" | {fmt_ci(de['change'], True, 2)} | {fmt_ci(su.get('peak'))}"
        f" | {_step(su.get('peak_step'))} |"
    )
  if report["curves"]:
    lines += [
        "",
        "## Curves",
        "",
        "A's rollout success by A step and by environment steps (all"
        " roles), and the dense reward per turn of the GiGPO and"
        " dense-only cells, mean ± std over seeds; *figure3*: the"
        " dense reward alone on the partly misleading reward, dense"
        " return (solid) and success (dashed) against A step, one"
        " colour per m.",
        "",
    ]
    lines += [f"![{n}]({n})" for n in report["curves"]]
  return "\n".join(lines) + "\n"
