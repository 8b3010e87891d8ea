"""The ablations' report: ``ablations.{json,md}`` and the dense-only plot.

One row per (group, setting) of ``grid.ABLATION_ROWS``: success rate and
score (%) after training, mean +- std (ddof 0) over the finished seeds, n,
the paper's success rate, and the repeated-state count -- per run the mean
of ``rollout_repeated_states`` over A's training steps, then mean +- std
over seeds. Another env/algo than WebShop GRPO writes
``ablations_<env>_<algo>.*``. ``ablations_dense_only.png``: the dense-only
run's ``dense_reward_mean`` (left axis) and ``rollout_success_rate``
(right axis) by A step, mean +- std over seeds; hacking shows as the first
rising while the second falls.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Optional, Sequence

from grid import ABLATION_PAPER_CELL, ABLATION_ROWS, ALGO_LABELS, ENV_LABELS
from report.common import (
    cell_stats,
    fmt,
    load_plot_module,
    mean_std,
    save_figure,
)
from run_files import finished_runs, write_json, write_text

REPEAT_METRIC = "rollout_repeated_states"
DENSE_PLOT = "ablations_dense_only.png"


def run_mean(workdir: str, metric: str, phase: str = "A") -> Optional[float]:
  """Mean of ``metric`` over a run's ``phase`` rows; None when absent."""
  try:
    _, ys = load_plot_module().load_series(workdir, metric, "step", phase)
  except ValueError:
    return None
  return float(ys.mean()) if len(ys) else None


def report_name(env: str, algo: str) -> str:
  return (
      "ablations"
      if (env, algo) == ABLATION_PAPER_CELL
      else f"ablations_{env}_{algo}"
  )


def ablation_report(
    root: str,
    env: str = "webshop",
    algo: str = "grpo",
    out_dir: str = "docs/results",
    echo: bool = True,
    archive: str = "",
) -> str:
  """Writes the JSON/MD tables and the dense-only plot of the finished runs
  under root or in ``archive`` (experiments/run_archive.py); returns the MD
  path."""
  name = report_name(env, algo)
  rows = []
  for group, setting, variant, paper in ABLATION_ROWS:
    runs = finished_runs(root, env, algo, variant, archive)
    repeats = [run_mean(w, REPEAT_METRIC) for _, w in runs]
    rows.append(
        {
            "group": group,
            "setting": setting,
            "variant": variant,
            "paper_success": (
                paper if (env, algo) == ABLATION_PAPER_CELL else None
            ),
            **cell_stats(runs),
            "repeated_states": mean_std([r for r in repeats if r is not None]),
        }
    )
  dense_runs = [
      w for _, w in finished_runs(root, env, algo, "dense_only", archive)
  ]
  plot = None
  if dense_runs:
    plot = f"{name}_dense_only.png" if name != "ablations" else DENSE_PLOT
    if not dense_only_plot(dense_runs, os.path.join(out_dir, plot), echo):
      plot = None
  report = {
      "env": env,
      "algo": algo,
      "root": os.path.abspath(root),
      "generated": datetime.datetime.now().isoformat(timespec="seconds"),
      "units": "percent; mean and std (ddof 0) over finished seeds",
      "rows": rows,
      "dense_only_plot": plot,
  }
  write_json(os.path.join(out_dir, f"{name}.json"), report)
  md_path = os.path.join(out_dir, f"{name}.md")
  write_text(md_path, ablation_markdown(report))
  return md_path


def ablation_markdown(report: dict) -> str:
  env, algo = report["env"], report["algo"]
  title = f"{ENV_LABELS[env]} {ALGO_LABELS[algo]}"
  lines = [
      f"# Ablations: {title}",
      "",
      "Written by `python experiments/reproduce.py --grid ablations` "
      f"({report['generated']}) from the finished runs under"
      f" `{report['root']}`.",
      "",
      "Success rate and score (%) after training, mean ± std (ddof 0) over"
      " the n finished seeds. *Repeated states*: per run, the mean over A's"
      " training steps of the repeated-state count of its rollouts (visits"
      " to an already seen state within the window), then mean ± std over"
      " seeds. *Paper*: the paper's success rate (WebShop GRPO).",
      "",
      "| Ablation | Setting | Success | Score | n | Repeated states | Paper |",
      "|---|---|---:|---:|---:|---:|---:|",
  ]
  for r in report["rows"]:
    paper = "—" if r["paper_success"] is None else f"{r['paper_success']:.1f}"
    lines.append(
        f"| {r['group']} | {r['setting']} | {fmt(r['success'])} |"
        f" {fmt(r['score'])} | {r['n']} |"
        f" {fmt(r['repeated_states'], 2)} | {paper} |"
    )
  if report["dense_only_plot"]:
    lines += [
        "",
        "## Dense reward alone",
        "",
        "Dense reward and rollout success of the policy trained on the"
        " dense reward only, by A step (mean ± std over seeds).",
        "",
        f"![dense-only run]({report['dense_only_plot']})",
    ]
  return "\n".join(lines) + "\n"


def dense_only_plot(
    runs: Sequence[str], out_path: str, echo: bool = True
) -> bool:
  """dense_reward_mean (left) and rollout_success_rate (right) by A step."""
  plot = load_plot_module()
  curves = {}
  try:
    for metric in ("dense_reward_mean", "rollout_success_rate"):
      series = [plot.load_series(w, metric, "step", "A") for w in runs]
      curves[metric] = plot.aggregate_runs(series, "std")
  except ValueError as e:
    if echo:
      print(json.dumps({"plot": out_path, "skipped": str(e)}), flush=True)
    return False

  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, left = plt.subplots(figsize=(6.4, 4.0), dpi=120)
  right = left.twinx()
  for ax, metric, color in (
      (left, "dense_reward_mean", "tab:orange"),
      (right, "rollout_success_rate", "tab:blue"),
  ):
    c = curves[metric]
    ax.plot(
        c.x,
        c.mean,
        color=color,
        lw=1.6,
        label=metric,
        marker="o" if len(c.x) == 1 else None,
    )
    if c.n_runs > 1:
      ax.fill_between(c.x, c.lo, c.hi, color=color, alpha=0.2, lw=0)
    ax.set_ylabel(metric, color=color)
  left.set_xlabel("A step")
  n = curves["rollout_success_rate"].n_runs
  left.set_title(f"Dense reward alone (n={n})")
  left.grid(alpha=0.3)
  fig.tight_layout()
  save_figure(fig, out_path)
  return True
