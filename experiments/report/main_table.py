"""The main table's report: ``<env>.{json,md}`` and the learning curves.

Per (algo, variant) of the main grid: success rate and score (%) on the
evaluation split, mean +- std (ddof 0) over the finished seeds, n, the
start-of-RL success, and the paper's success rate beside ours;
``<env>_<algo>_{step,env_steps}.png``: A's rollout success, baseline and
RSPO overlaid, mean +- std band over seeds.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Iterable, Sequence

from grid import (ALGO_LABELS, ALGOS, ENV_LABELS, MAIN_VARIANTS, PAPER_SUCCESS)
from report.common import (
    CURVE_METRIC,
    X_AXES,
    archive_note,
    cell_stats,
    fmt,
    plot_atomic,
)
from run_files import finished_runs, run_config, write_json, write_text


def env_report(
    root: str,
    env: str,
    out_dir: str,
    algos: Sequence[str] = ALGOS,
    echo: bool = True,
    archive: str = "",
) -> dict:
  """Writes <env>.json, <env>.md and the curves of the finished runs under
  root or in ``archive``; returns the JSON object."""
  cells, curves = [], {}
  for algo in algos:
    groups = {}
    for variant in MAIN_VARIANTS:
      runs = finished_runs(root, env, algo, variant, archive)
      label = (
          ALGO_LABELS[algo]
          if variant == "baseline"
          else (f"RSPO+{ALGO_LABELS[algo]}")
      )
      cells.append(
          {
              "algo": algo,
              "variant": variant,
              "label": label,
              "paper_success": PAPER_SUCCESS.get((env, algo, variant)),
              **cell_stats(runs),
          }
      )
      groups[label] = [w for _, w in runs]
    for x in X_AXES:
      name = f"{env}_{algo}_{x}.png"
      if plot_atomic(
          groups,
          CURVE_METRIC,
          x,
          os.path.join(out_dir, name),
          echo=echo,
          phase="A",
          band="std",
          title=f"{ENV_LABELS[env]} {ALGO_LABELS[algo]}: " "rollout success",
      ):
        curves.setdefault(algo, []).append(name)
  report = {
      "env": env,
      "root": os.path.abspath(root),
      "generated": datetime.datetime.now().isoformat(timespec="seconds"),
      "archive": os.path.abspath(archive) if archive else None,
      "units": "percent; mean and std (ddof 0) over finished seeds",
      "dense_reward": dense_rewards(
          w
          for algo in algos
          for _, w in finished_runs(root, env, algo, "rspo", archive)
      ),
      "cells": cells,
      "curves": curves,
  }
  write_json(os.path.join(out_dir, f"{env}.json"), report)
  write_text(os.path.join(out_dir, f"{env}.md"), env_markdown(report))
  return report


def dense_rewards(workdirs: Iterable[str]) -> list[str]:
  """The ``rspo.dense_reward`` (B's reward) each RSPO run was trained
  with, from its run.json config, sorted and distinct."""
  from configs import base

  found = set()
  for w in workdirs:
    path, _, overrides = (run_config(w) or "").partition(":")
    name = re.fullmatch(r"(\w+)_(\w+)\.py", os.path.basename(path))
    if not name:  # not configs/<env>_<algo>.py
      continue
    try:
      found.add(base.make_config(*name.groups(), overrides).rspo.dense_reward)
    except ValueError:  # an override today's configs refuse: as written
      given = re.findall(r"(?:^|,)rspo\.dense_reward=([^,]+)", overrides)
      found.add(given[-1] if given else "unknown")
  return sorted(found)


def _dense_note(report: dict) -> str:
  dense = report.get("dense_reward") or []
  if not dense:
    return (
        "RSPO's dense reward: unknown (no finished RSPO run with its"
        " config in run.json)."
    )
  return (
      "RSPO's agent B trained on the dense reward "
      + " / ".join(f"`rspo.dense_reward={d}`" for d in dense)
      + " (oracle: the environment's own progress score; prm: a"
      " learned process reward model)."
  )


def env_markdown(report: dict) -> str:
  env = report["env"]
  lines = [
      f"# {ENV_LABELS[env]}: results grid",
      "",
      f"Written by `python experiments/reproduce.py --grid main --envs {env}`"
      f" ({report['generated']}) from the finished runs under"
      f" `{report['root']}`{archive_note(report)}.",
      "",
      "Success rate and score (%) of agent A on the fixed evaluation split"
      " after training, mean ± std (ddof 0) over the n finished seeds;"
      " *start* is the success rate at the start of RL. *Paper* is the"
      " paper's success rate (Qwen2.5-1.5B, the paper's Table 1)."
      f" {_dense_note(report)}",
      "",
      "| Method | Success | Score | n | Start | Paper |",
      "|---|---:|---:|---:|---:|---:|",
  ]
  for c in report["cells"]:
    paper = "—" if c["paper_success"] is None else f"{c['paper_success']:.1f}"
    lines.append(
        f"| {c['label']} | {fmt(c['success'])} | {fmt(c['score'])}"
        f" | {c['n']} | {fmt(c['start_success'])} | {paper} |"
    )
  if report["curves"]:
    lines += [
        "",
        "## Learning curves",
        "",
        "Rollout success rate of A's training batches (phase 'A'),"
        " mean ± std over seeds, by A's step and by environment steps"
        " (all roles, B's included).",
        "",
    ]
    for algo, names in report["curves"].items():
      for name in names:
        lines.append(
            f"![{ALGO_LABELS[algo]} vs RSPO+{ALGO_LABELS[algo]}]" f"({name})"
        )
  return "\n".join(lines) + "\n"
