r"""Learning curves from runs' ``metrics.jsonl`` files, one PNG.

  python launch/plot.py --runs runs/grpo,runs/rspo --labels grpo,rspo \
      --metric rollout_success_rate --x step --out fig.png
  python launch/plot.py --runs 'g0,g200,g400;r0,r200,r400' --labels grpo,rspo \
      --metric success_rate --phase eval --x env_steps --band std --out e.png

``--runs`` holds groups separated by ``;``, the runs (seeds) of one group by
``,``; without a ``;`` every run is its own group. A group is drawn as the
mean over its runs with a shaded band: min..max (``--band minmax``), mean +-
one std (``--band std``) or none.

Rows come from one phase of :mod:`rspo_jax.metrics`' files: ``A`` (training
steps of agent A, the default), ``B`` (agent B's) or ``eval``
(evaluations). ``--x step`` is A's step, or for rows that carry ``b_step``
(B's rows) B's own 1-based step counter: B's rows are written at A's step
of their loop, so before ``b_step`` existed a loop's B rows shared one x
and only the last was drawn (a one-line warning says so when every row
does). ``--x env_steps`` is the environment-step counter, which ``eval``
rows take from the ``A`` row of the same step (0 before any A row). A metric
name may index nested dicts with dots (``success_by_type.pick``); a dict
stored as its repr string is read back too.

Runs of one group are put on a common x grid -- the union of their x values
inside the range all of them cover -- by linear interpolation (exact when
they share x values, as seeds of one config do for ``step``). When a run
logged one x twice (a resumed run redoes a step), its last row wins.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from rspo_jax.metrics import metrics_path, read_metrics

X_AXES = ("step", "env_steps")
BANDS = ("minmax", "std", "none")


@dataclasses.dataclass
class Curve:
  """One group's aggregate: x grid, mean over runs and the band [lo, hi]."""

  x: np.ndarray
  mean: np.ndarray
  lo: np.ndarray
  hi: np.ndarray
  n_runs: int


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def _metrics_path(run: str) -> str:
  """A run directory's metrics file (plain, or gzipped when archived:
  rspo_jax/metrics.py ``metrics_path``), or ``run`` itself when it names
  one."""
  path = run if run.endswith((".jsonl", ".jsonl.gz")) else metrics_path(run)
  if not os.path.isfile(path):
    raise ValueError(f"run {run!r}: no metrics file at {path!r}")
  return path


def _as_dict(v) -> Optional[dict]:
  """A dict, or the repr string of one (metrics.py stringifies dicts)."""
  if isinstance(v, dict):
    return v
  if isinstance(v, str) and v.startswith("{"):
    try:
      v = ast.literal_eval(v)
    except (ValueError, SyntaxError):
      return None
    return v if isinstance(v, dict) else None
  return None


def _lookup(row: dict, metric: str):
  """row[metric], or row[a][b] for metric 'a.b'; None when absent."""
  if metric in row:
    return row[metric]
  v = row
  for part in metric.split("."):
    v = _as_dict(v)
    if v is None or part not in v:
      return None
    v = v[part]
  return v


def _as_float(v) -> Optional[float]:
  """Numbers and the 'nan'/'inf' strings metrics.py writes; else None."""
  if isinstance(v, bool):
    return float(v)
  if isinstance(v, (int, float)):
    return float(v)
  if isinstance(v, str):
    try:
      return float(v)
    except ValueError:
      return None
  return None


def _numeric_keys(rows: list[dict]) -> list[str]:
  keys = set()
  for row in rows:
    for k, v in row.items():
      if k in ("step", "phase", "time"):
        continue
      if _as_dict(v) is not None:
        keys.update(f"{k}.{s}" for s in _as_dict(v))
      elif _as_float(v) is not None:
        keys.add(k)
  return sorted(keys)


def load_series(
    run: str, metric: str, x: str = "step", phase: str = "A"
) -> tuple[np.ndarray, np.ndarray]:
  """(xs, ys) of one run, sorted by x, one value per x (the last logged).

  Non-finite values (NaN, "inf" strings) are dropped. Raises ValueError
  naming the run when the file, the phase, the x axis or the metric is
  missing.
  """
  if x not in X_AXES:
    raise ValueError(f"unknown x axis {x!r}; expected one of {X_AXES}")
  all_rows = read_metrics(_metrics_path(run))
  rows = [r for r in all_rows if r.get("phase") == phase]
  if not rows:
    phases = sorted({str(r.get("phase")) for r in all_rows})
    raise ValueError(
        f"run {run!r}: no rows of phase {phase!r}; phases present: {phases}"
    )
  if all(_lookup(r, metric) is None for r in rows):
    raise ValueError(
        f"run {run!r}: unknown metric {metric!r} in phase {phase!r}; "
        f"available: {_numeric_keys(rows)}"
    )
  if x == "step" and not any("b_step" in r for r in rows):
    steps = {r["step"] for r in rows}
    if len(rows) > 1 and len(steps) == 1:
      print(
          f"plot.py: warning: run {run!r}: all {len(rows)} rows of phase"
          f" {phase!r} carry step {steps.pop()} and no b_step (a run from"
          " before b_step was logged): one point is drawn",
          file=sys.stderr,
      )
  # eval rows carry no env_steps: take it from A's row of the same step.
  env_at_step = {
      int(r["step"]): r["env_steps"]
      for r in all_rows
      if r.get("phase") == "A" and "env_steps" in r
  }
  by_x: dict[float, float] = {}
  for r in rows:
    y = _as_float(_lookup(r, metric))
    if y is None:
      continue
    if x == "step":
      xv = r.get("b_step", r["step"])
    elif "env_steps" in r:
      xv = r["env_steps"]
    else:
      step = int(r["step"])
      earlier = [s for s in env_at_step if s <= step]
      if step > 0 and not earlier:
        raise ValueError(
            f"run {run!r}: phase {phase!r} row at step {step} has no "
            "env_steps and no A row gives it; use --x step"
        )
      xv = env_at_step[max(earlier)] if earlier else 0
    by_x[float(xv)] = y
  xs = np.array(sorted(by_x), np.float64)
  ys = np.array([by_x[v] for v in xs], np.float64)
  keep = np.isfinite(ys)
  return xs[keep], ys[keep]


# --------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------


def smooth(y: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average: s_i = mean(y[max(0, i - w + 1) : i + 1])."""
  if window <= 1 or len(y) == 0:
    return y
  c = np.cumsum(np.insert(y, 0, 0.0))
  i = np.arange(1, len(y) + 1)
  start = np.maximum(i - window, 0)
  return (c[i] - c[start]) / (i - start)


def aggregate_runs(
    series: Sequence[tuple[np.ndarray, np.ndarray]], band: str = "minmax"
) -> Curve:
  """Mean of several runs on their common x grid, with a band.

  Run i's points are (x_i, ys_i):

    grid  = union of the runs' x in [max_i min x_i, min_i max x_i]
    y_i   = interp(grid, x_i, ys_i)
    mean  = mean_i y_i
    band  = [min_i y_i, max_i y_i]            (minmax)
          | mean -+ std_i y_i (ddof 0)        (std)
          | [mean, mean]                      (none)
  """
  if band not in BANDS:
    raise ValueError(f"unknown band {band!r}; expected one of {BANDS}")
  series = [(np.asarray(a, float), np.asarray(b, float)) for a, b in series]
  if not series or any(len(xs) == 0 for xs, _ in series):
    raise ValueError("aggregate_runs: every run needs at least one point")
  lo_x = max(xs[0] for xs, _ in series)
  hi_x = min(xs[-1] for xs, _ in series)
  if lo_x > hi_x:
    raise ValueError(
        f"aggregate_runs: runs share no x range (starts up to {lo_x}, ends"
        f" from {hi_x})"
    )
  grid = np.unique(np.concatenate([xs for xs, _ in series]))
  grid = grid[(grid >= lo_x) & (grid <= hi_x)]
  ys = np.stack([np.interp(grid, xs, y) for xs, y in series])
  mean = ys.mean(axis=0)
  if band == "minmax":
    lo, hi = ys.min(axis=0), ys.max(axis=0)
  elif band == "std":
    sd = ys.std(axis=0)
    lo, hi = mean - sd, mean + sd
  else:
    lo, hi = mean, mean
  return Curve(x=grid, mean=mean, lo=lo, hi=hi, n_runs=len(series))


# --------------------------------------------------------------------------
# Plotting
# --------------------------------------------------------------------------


def plot_curves(
    groups: dict[str, list[str]],
    metric: str,
    x: str,
    out_path: str,
    phase: str = "A",
    *,
    band: str = "minmax",
    smooth_window: int = 0,
    title: Optional[str] = None,
) -> dict[str, Curve]:
  """Draws one mean line (+ band) per group into a PNG at ``out_path``.

  Args:
    groups: label -> run directories (or metrics.jsonl[.gz] paths); the
      runs of a label are seeds of one configuration.
    metric: key of the rows to plot (dots index nested dicts).
    x: 'step' or 'env_steps'.
    out_path: PNG to write (parent directories are created).
    phase: 'A' for training curves, 'B' for B's (x: ``b_step``), 'eval' for
      evaluation curves (any phase present in the files works).
    band: 'minmax', 'std' or 'none'.
    smooth_window: trailing moving-average window applied to each run before
      aggregation (0 or 1 = none).
    title: figure title (default: the metric and phase).

  Returns:
    label -> Curve, the plotted numbers.
  """
  if not groups:
    raise ValueError("plot_curves: no groups to plot")
  for label, runs in groups.items():
    if not runs:
      raise ValueError(f"plot_curves: group {label!r} has no runs")
  if band not in BANDS:
    raise ValueError(f"unknown band {band!r}; expected one of {BANDS}")
  curves = {}
  for label, runs in groups.items():
    series = []
    for run in runs:
      xs, ys = load_series(run, metric, x, phase)
      if len(xs) == 0:
        raise ValueError(
            f"run {run!r}: metric {metric!r} has no finite values in phase"
            f" {phase!r}"
        )
      series.append((xs, smooth(ys, smooth_window)))
    curves[label] = aggregate_runs(series, band)

  import matplotlib  # noqa: PLC0415 -- only the plotting path needs it

  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt  # noqa: PLC0415

  # Many curves: 20 distinct colours and the legend below the axes, so
  # it covers no curve and no two curves share a colour.
  many = len(curves) > 5
  fig, ax = plt.subplots(
      figsize=(6.4, 4.0 + (0.2 * len(curves) if many else 0.0)), dpi=120
  )
  colours = plt.get_cmap("tab20").colors
  for i, (label, c) in enumerate(curves.items()):
    name = f"{label} (n={c.n_runs})" if c.n_runs > 1 else label
    (line,) = ax.plot(
        c.x,
        c.mean,
        label=name,
        lw=1.6,
        marker="o" if len(c.x) == 1 else None,
        color=colours[i % len(colours)] if many else None,
    )
    if band != "none" and c.n_runs > 1:
      ax.fill_between(c.x, c.lo, c.hi, color=line.get_color(), alpha=0.2, lw=0)
  ax.set_xlabel(
      f"{'B' if phase == 'B' else 'A'} step"
      if x == "step"
      else "environment steps"
  )
  ax.set_ylabel(metric)
  ax.set_title(title or f"{metric} ({phase})")
  ax.grid(alpha=0.3)
  if many:
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        fontsize="x-small",
        frameon=False,
    )
  else:
    ax.legend(loc="best", fontsize="small")
  fig.tight_layout()
  parent = os.path.dirname(os.path.abspath(out_path))
  os.makedirs(parent, exist_ok=True)
  fig.savefig(out_path, format="png", bbox_inches="tight")
  plt.close(fig)
  return curves


def _series_or_none(run: str, metric: str, phase: str):
  """(xs, ys) of ``load_series``, or None when the run has no such rows."""
  try:
    xs, ys = load_series(run, metric, "step", phase)
  except ValueError:
    return None
  return (xs, ys) if len(xs) else None


def b_lift_points(run: str):
  """(xs, ys) of B's lift, two points a loop: the success of B's first
  batch at its first step and of its stored collection, which replays that
  batch's tasks and seeds (``rspo.b_lift_tasks=first``), at its last; None
  without B_collect rows that carry ``b_first_success``."""
  xs, ys, steps = [], [], []
  for row in read_metrics(metrics_path(run)):
    if row.get("phase") == "B" and "b_step" in row:
      steps.append(row["b_step"])
    elif (
        row.get("phase") == "B_collect"
        and steps
        and (row.get("b_first_success") is not None)
    ):
      xs += [min(steps), max(steps), math.nan]
      ys += [row["b_first_success"], row["b_stored_success"], math.nan]
      steps = []
  return (xs[:-1], ys[:-1]) if xs else None


def plot_run(run: str, out_path: str) -> dict:
  """One run's learning curves in one PNG (what launch/train.py leaves in
  its workdir as ``curves.png``).

  Left: the success rate of A's training batches against A's step, the
  start and end evaluations (held-out goals, rollout.eval_temperature)
  marked. Right, when B ran: B's dense reward (right-hand axis), the
  success rate of its batches against B's own step (``b_step``) and, a
  loop at a time, B's lift (:func:`b_lift_points`): the batches play new
  tasks every step, the lift the same tasks before and after.

  Returns {name: (xs, ys)} of the series drawn; ValueError when the run has
  neither A rows nor evaluations.
  """
  drawn = {}
  for name, metric, phase in (
      ("A success", "rollout_success_rate", "A"),
      ("eval success", "success_rate", "eval"),
      ("B success", "rollout_success_rate", "B"),
      ("B dense reward", "dense_reward_mean", "B"),
  ):
    series = _series_or_none(run, metric, phase)
    if series is not None:
      drawn[name] = series
  if "A success" not in drawn and "eval success" not in drawn:
    raise ValueError(f"run {run!r}: no A steps or evaluations to draw")

  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

  has_b = "B success" in drawn or "B dense reward" in drawn
  fig, axes = plt.subplots(
      1,
      2 if has_b else 1,
      dpi=120,
      figsize=(10.0 if has_b else 5.6, 3.8),
      squeeze=False,
  )
  ax = axes[0, 0]
  if "A success" in drawn:
    ax.plot(
        *drawn["A success"],
        marker="o",
        lw=1.6,
        label="A's training batches (T = 1)",
    )
  if "eval success" in drawn:
    xs, ys = drawn["eval success"]
    ax.plot(
        xs,
        ys,
        ls="none",
        marker="s",
        ms=7,
        color="black",
        label="evaluation (held-out goals)",
    )
    for x, y in zip(xs, ys):
      ax.annotate(
          f"{100 * y:.1f} %",
          (x, y),
          textcoords="offset points",
          xytext=(6, -12),
          fontsize="small",
      )
  ax.set_xlabel("A step")
  ax.set_ylabel("success rate")
  ax.set_title("agent A (outcome reward)")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.grid(alpha=0.3)
  ax.legend(loc="best", fontsize="small")
  if has_b:
    ax = axes[0, 1]
    lines = []
    if "B success" in drawn:
      lines += ax.plot(
          *drawn["B success"],
          marker="o",
          lw=1.6,
          color="tab:orange",
          label="B's batches: success",
      )
    lift = b_lift_points(run)
    if lift is not None:
      drawn["B lift"] = lift
      lines += ax.plot(
          *lift,
          marker="s",
          ms=6,
          lw=1.2,
          ls=":",
          color="black",
          label="B's lift: its first batch's tasks, replayed",
      )
    ax.set_xlabel("B step")
    ax.set_ylabel("success rate")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if "B dense reward" in drawn:
      twin = ax.twinx()
      lines += twin.plot(
          *drawn["B dense reward"],
          marker="^",
          lw=1.2,
          ls="--",
          color="tab:green",
          label="B's batches: dense reward",
      )
      twin.set_ylabel("dense reward (mean return)")
    ax.set_title("agent B (dense reward), re-made from A each loop")
    ax.grid(alpha=0.3)
    ax.legend(
        lines, [ln.get_label() for ln in lines], loc="best", fontsize="small"
    )
  fig.suptitle(os.path.basename(os.path.normpath(run)), fontsize="medium")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, format="png")
  plt.close(fig)
  return drawn


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def parse_groups(
    runs: str, labels: Optional[str] = None
) -> dict[str, list[str]]:
  """'a0,a1;b0' -> {label: [runs]}; without ';' each run is its own group.

  Labels default to each group's first run's directory name.
  """
  runs = runs.strip()
  if not runs:
    raise ValueError("--runs is empty")
  if ";" in runs:
    groups = [
        [r.strip() for r in g.split(",") if r.strip()]
        for g in runs.split(";")
        if g.strip()
    ]
  else:
    groups = [[r.strip()] for r in runs.split(",") if r.strip()]
  if labels:
    names = [s.strip() for s in labels.split(",")]
    if len(names) != len(groups):
      raise ValueError(
          f"--labels gives {len(names)} labels for {len(groups)} run groups"
      )
  else:
    names = [os.path.basename(os.path.normpath(g[0])) for g in groups]
  if len(set(names)) != len(names):
    raise ValueError(f"labels must be distinct, got {names}")
  return dict(zip(names, groups))


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(
      description="Plot learning curves from runs' metrics.jsonl files."
  )
  p.add_argument(
      "--runs",
      required=True,
      help="run dirs: ',' between seeds, ';' between groups",
  )
  p.add_argument("--labels", default=None, help="one label per group, ','")
  p.add_argument("--metric", default="rollout_success_rate")
  p.add_argument("--x", default="step", choices=X_AXES)
  p.add_argument(
      "--phase",
      default="A",
      help="'A' (training), 'B' (B's training) or 'eval'",
  )
  p.add_argument("--band", default="minmax", choices=BANDS)
  p.add_argument(
      "--smooth",
      type=int,
      default=0,
      help="moving-average window per run (0 = none)",
  )
  p.add_argument("--title", default=None)
  p.add_argument("--out", required=True, help="output PNG path")
  args = p.parse_args(argv)
  try:
    groups = parse_groups(args.runs, args.labels)
    curves = plot_curves(
        groups,
        args.metric,
        args.x,
        args.out,
        args.phase,
        band=args.band,
        smooth_window=args.smooth,
        title=args.title,
    )
  except ValueError as e:
    print(f"plot.py: error: {e}", file=sys.stderr)
    return 2
  for label, c in curves.items():
    last = c.mean[-1] if len(c.mean) else math.nan
    print(f"{label}: n={c.n_runs} points={len(c.x)} last={last:.4g}")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
