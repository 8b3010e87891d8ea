"""The CPU study's report: ``study_<env>.{json,md}`` and its curves.

Per cell and decoding (greedy, then each of ``grid.SAMPLED``), 95 %
bootstrap intervals (rspo_jax/intervals.py) over training seeds x goals x
sampling seeds: the final success rate, the paired final - start against
the shared warm start on the same goals, and the cell - baseline
difference (same algorithm, goals shared). Percent / points.
"""

from __future__ import annotations

import datetime
import os
from typing import Optional, Sequence

import mechanism
import run_archive as ra
from grid import (
    ALGO_LABELS,
    DENSE,
    ENV_LABELS,
    SAMPLED,
    STUDY_VARIANTS,
    RunSpec,
    paper_success,
    study_cells,
    study_extra,
    with_rl_extra,
)
from report.common import (
    CURVE_METRIC,
    X_AXES,
    archive_note,
    decoding_intervals,
    decodings,
    fmt_ci,
    other_config_seeds,
    outcomes,
    pct,
    plot_atomic,
    start_intervals,
)
from run_files import (
    finished_runs,
    run_config,
    warm_start_workdir,
    write_json,
    write_text,
)

DECODINGS = decodings(SAMPLED)


def _study_label(algo: str, variant: str) -> str:
  name = ALGO_LABELS[algo]
  return {
      "baseline": name,
      "rspo": f"RSPO+{name}",
      "sample_variance": f"RSPO+{name} (variance sampling)",
      "sample_random": f"RSPO+{name} (random sampling)",
  }[variant]


def _other_config_seeds(
    env: str,
    algo: str,
    variant: str,
    configs: dict,
    rl_extra: str,
    extra: Optional[str],
) -> list[int]:
  """other_config_seeds against the study grid's spec with ``rl_extra``
  and ``extra`` (default study_extra(env))."""
  extra = study_extra(env) if extra is None else extra
  return other_config_seeds(
      configs,
      lambda seed: with_rl_extra(
          RunSpec(env, algo, variant, seed, STUDY_VARIANTS[variant]), rl_extra
      ),
      extra,
  )


def study_report(
    root: str,
    env: str,
    out_dir: str,
    algos: Optional[Sequence[str]] = None,
    seed: int = 0,
    echo: bool = True,
    rl_extra: str = "",
    archive: str = "",
    extra: Optional[str] = None,
) -> dict:
  """Writes study_<env>.{json,md} and its curves; returns the JSON object.
  Runs and the warm start's evaluations: under root, else in ``archive``.
  A cell's ``other_config_seeds``: its runs trained with another config
  than this grid's with ``rl_extra`` and ``extra`` (_other_config_seeds;
  run names do not hold the overrides), named in the markdown.

  Per cell and decoding (rspo_jax/intervals.py, 95 % bootstrap): the final
  success rate over training seeds x goals x sampling seeds, the paired
  final - start against the shared warm start's evaluation on the same
  goals, and the cell - baseline difference (same algorithm) resampling
  training seeds within each cell and goals shared. Percent / points.
  """
  ws = warm_start_workdir(root, env)
  starts = {
      name: outcomes([ra.find_file(ws, archive, s)]) for name, s, _ in DECODINGS
  }
  cells, curves = [], {}
  for algo in algos or tuple(study_cells(env)):
    groups, finals = {}, {}
    for variant in study_cells(env).get(algo, ()):
      runs = finished_runs(root, env, algo, variant, archive)
      label = _study_label(algo, variant)
      groups[label] = [w for _, w in runs]
      configs = {s: run_config(w) for s, w in runs}
      cell = {
          "algo": algo,
          "variant": variant,
          "label": label,
          "n": len(runs),
          "seeds": [s for s, _ in runs],
          "paper_success": paper_success(env, algo, variant),
          "paper_vs_baseline": None,
          "configs": sorted(set(configs.values()) - {None}),
          "other_config_seeds": _other_config_seeds(
              env, algo, variant, configs, rl_extra, extra
          ),
      }
      base_paper = paper_success(env, algo, "baseline")
      if (
          variant != "baseline"
          and cell["paper_success"] is not None
          and base_paper is not None
      ):
        cell["paper_vs_baseline"] = round(cell["paper_success"] - base_paper, 1)
      for name, _, final_name in DECODINGS:
        x = outcomes([os.path.join(w, final_name) for _, w in runs])
        finals[variant, name] = x
        base = None if variant == "baseline" else finals.get(("baseline", name))
        cell[name] = decoding_intervals(x, starts[name], base, seed)
      workdirs = [w for _, w in runs]
      cell["b_lift"] = mechanism.b_lift(workdirs, seed=seed)
      cell["replay_win_share_by_position"] = mechanism.replay_by_position(
          workdirs
      )
      cells.append(cell)
    for xa in X_AXES:
      name = f"study_{env}_{algo}_{xa}.png"
      if plot_atomic(
          groups,
          CURVE_METRIC,
          xa,
          os.path.join(out_dir, name),
          echo=echo,
          phase="A",
          band="std",
          title=f"{ENV_LABELS[env]} {ALGO_LABELS[algo]} study: "
          "rollout success",
      ):
        curves.setdefault(algo, []).append(name)
  report = {
      "env": env,
      "root": os.path.abspath(root),
      "archive": os.path.abspath(archive) if archive else None,
      "generated": datetime.datetime.now().isoformat(timespec="seconds"),
      "units": "percent (success) and points (differences); 95 % "
      "bootstrap intervals (rspo_jax/intervals.py)",
      "overrides": study_extra(env, rl_extra),
      "rl_extra": rl_extra,
      "dense_reward": DENSE,
      "start": start_intervals(starts, seed),
      "cells": cells,
      "curves": curves,
  }
  write_json(os.path.join(out_dir, f"study_{env}.json"), report)
  write_text(os.path.join(out_dir, f"study_{env}.md"), study_markdown(report))
  return report


def study_markdown(report: dict) -> str:
  env = report["env"]
  lines = [
      f"# {ENV_LABELS[env]}: CPU study",
      "",
      f"Written by `python experiments/reproduce.py --grid study --envs {env}"
      + (f" --rl_extra {report['rl_extra']}" if report.get("rl_extra") else "")
      + "`"
      f" ({report['generated']}) from the finished runs under"
      f" `{report['root']}`{archive_note(report)}. Overrides:"
      f" `{report['overrides'] or '(none)'}`;"
      f" every cell names its dense reward: `{report['dense_reward']}` (the"
      " environment's privileged progress signal).",
  ]
  other = [
      f"{c['label']} (seeds"
      f" {', '.join(str(s) for s in c['other_config_seeds'])})"
      for c in report["cells"]
      if c.get("other_config_seeds")
  ]
  if other:
    lines += [
        "",
        "**Trained with other overrides than these** (their"
        f" run.json; `configs` in study_{env}.json): " + "; ".join(other) + ".",
    ]
  lines += [
      "",
      "Success rate (%) of agent A on the held-out goals after training;"
      " *final − start*: points gained over the shared warm start on the"
      " same goals (paired); *− baseline*: points over the same"
      " algorithm's baseline cell. Each as mean [95 % bootstrap interval]:"
      " goals resampled (shared by both sides of a difference), sampling"
      " seeds within a goal, training seeds within a cell"
      " (rspo_jax/intervals.py). *Paper*: the paper's success rate"
      " (Qwen2.5-1.5B) and its difference to the paper's baseline.",
  ]
  for name, _, _ in DECODINGS:
    lines += [
        "",
        f"## {name}",
        "",
        f"Start (shared warm start): {fmt_ci(report['start'][name])}",
        "",
        "| Method | n | Success | Final − start | − baseline | Paper"
        " | Paper − baseline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cells"]:
      d = c[name]
      paper = (
          "—" if c["paper_success"] is None else (f"{c['paper_success']:.1f}")
      )
      pdiff = (
          "—"
          if c["paper_vs_baseline"] is None
          else (f"{c['paper_vs_baseline']:+.1f}")
      )
      lines.append(
          f"| {c['label']} | {c['n']} | {fmt_ci(d['success'])}"
          f" | {fmt_ci(d['final_minus_start'], True)}"
          f" | {fmt_ci(d['minus_baseline'], True)} | {paper} | {pdiff} |"
      )
  mech = [
      c
      for c in report["cells"]
      if c.get("b_lift") or c.get("replay_win_share_by_position")
  ]
  if mech:
    lines += [
        "",
        "## RSPO's mechanism",
        "",
        "*B's lift*: success (points) and dense return of B's stored"
        " collection minus its first training collection (B = A), on"
        " the same tasks and seeds, mean [95 % interval] over loops x"
        " seeds. *Replayed wins by position*: the share of A's"
        " replayed trajectories that won, at A's 1st, 2nd, ... step"
        " of a loop.",
        "",
        "| Method | B's lift: success | B's lift: dense return"
        " | (loop, seed) samples | Replayed wins by position |",
        "|---|---:|---:|---:|---|",
    ]
    for c in mech:
      lift = c.get("b_lift") or {}
      suc = lift.get("b_lift_success")
      dense = lift.get("b_lift_dense_return")
      pos = c.get("replay_win_share_by_position")
      lines.append(
          f"| {c['label']} | {fmt_ci(pct(suc), True) if suc else '—'}"
          f" | {_fmt_plain(dense)} | {lift.get('samples', 0)}"
          f" | {', '.join(f'{100 * p:.0f} %' for p in pos) if pos else '—'}"
          " |"
      )
  if report["curves"]:
    lines += [
        "",
        "## Learning curves",
        "",
        "Rollout success rate of A's training batches (phase 'A'),"
        " mean ± std over training seeds, by A's step and by"
        " environment steps (all roles, B's included).",
        "",
    ]
    for algo, names in report["curves"].items():
      for n in names:
        lines.append(f"![{ALGO_LABELS[algo]} study]({n})")
  return "\n".join(lines) + "\n"


def _fmt_plain(ci: Optional[dict]) -> str:
  """A mean [lo, hi] in the quantity's own units."""
  if not ci:
    return "—"
  return f"{ci['mean']:+.3f} [{ci['lo']:+.3f}, {ci['hi']:+.3f}]"
