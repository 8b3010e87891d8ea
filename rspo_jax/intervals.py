r"""95 % bootstrap intervals for success rates over goals x seeds.

Data: an outcome array ``x[r, g, s]`` (1 = won, or a score) of training run
(seed) ``r``, evaluation goal ``g`` and sampling seed ``s``; a single
evaluation is ``x[g, s]`` (one run). The point estimate is the plain mean

    m(x) = 1/(R G S) sum_{r,g,s} x[r, g, s].

One bootstrap draw ``b`` resamples hierarchically, every level with
replacement:

    runs   r*_1..r*_R  uniform from 0..R-1            (training seeds)
    goals  g*_1..g*_G  uniform from 0..G-1            (evaluation goals)
    seeds  s*_{i,j,1..S} uniform from 0..S-1, drawn afresh for every
           resampled (run i, goal j)                  (sampling seeds)
    m*_b = 1/(R G S) sum_{i,j,k} x[r*_i, g*_j, s*_{i,j,k}].

A difference of two arrays ``a`` and ``b`` evaluated on the same goals
(final - start, or method 1 - method 2) draws ONE goal resample ``g*`` per
draw and uses it for both (the pairing: a goal's difficulty cancels), runs
and seeds independently for each side:

    d*_b = m*_b(a; g*) - m*_b(b; g*).

The interval is the percentile interval ``[q_{2.5 %}, q_{97.5 %}]`` of the
``num_draws`` values; deterministic for a given ``seed``.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

LEVEL = 0.95
NUM_DRAWS = 2000


def _as_runs(x) -> np.ndarray:
  """``[G, S]`` -> ``[1, G, S]``; ``[R, G, S]`` as is (float64)."""
  a = np.asarray(x, np.float64)
  if a.ndim == 2:
    a = a[None]
  if a.ndim != 3 or 0 in a.shape:
    raise ValueError(f"want a non-empty [goals, seeds] or [runs, goals, "
                     f"seeds] array, got shape {a.shape}")
  if not np.all(np.isfinite(a)):
    raise ValueError("outcomes must be finite (a missing episode?)")
  return a


def _draw_means(x: np.ndarray, goal_idx: np.ndarray,
                rng: np.random.Generator) -> np.ndarray:
  """m*_b for every draw b, given its goals ``goal_idx[b, G]``."""
  r, _, s = x.shape
  draws, g = goal_idx.shape
  run_idx = rng.integers(0, r, (draws, r))
  seed_idx = rng.integers(0, s, (draws, r, g, s))
  picked = x[run_idx[:, :, None, None], goal_idx[:, None, :, None], seed_idx]
  return picked.reshape(draws, -1).mean(axis=1)


def _interval(point: float, draws: np.ndarray, level: float) -> dict:
  lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
  return {"mean": float(point), "lo": float(lo), "hi": float(hi),
          "level": level, "draws": int(len(draws))}


def success_interval(x, *, seed: int = 0, num_draws: int = NUM_DRAWS,
                     level: float = LEVEL) -> dict:
  """(a) A success rate over goals x seeds (``x[g, s]``), or over training
  runs x goals x seeds (``x[r, g, s]``): ``{'mean', 'lo', 'hi', ...}``."""
  a = _as_runs(x)
  rng = np.random.default_rng(seed)
  goal_idx = rng.integers(0, a.shape[1], (num_draws, a.shape[1]))
  return _interval(a.mean(), _draw_means(a, goal_idx, rng), level)


def difference_interval(a, b, *, seed: int = 0, num_draws: int = NUM_DRAWS,
                        level: float = LEVEL) -> dict:
  """m(a) - m(b) for two arrays on the same goals (axis -2, same order),
  one goal resample shared by both per draw; runs and seeds resampled
  within each side. Either may be ``[G, S]`` or ``[R, G, S]``."""
  a, b = _as_runs(a), _as_runs(b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"different numbers of goals: {a.shape[1]} vs "
                     f"{b.shape[1]}")
  rng = np.random.default_rng(seed)
  goal_idx = rng.integers(0, a.shape[1], (num_draws, a.shape[1]))
  draws = _draw_means(a, goal_idx, rng) - _draw_means(b, goal_idx, rng)
  return _interval(a.mean() - b.mean(), draws, level)


def paired_difference(final, start, **kw) -> dict:
  """(b) final - start on the same goals (``[G, S]`` each, or a cell's
  finals ``[R, G, S]`` against the shared start ``[G, S]``)."""
  return difference_interval(final, start, **kw)


def method_difference(cell_a, cell_b, **kw) -> dict:
  """(c) cell a - cell b, each ``[training seeds, goals, sampling seeds]``:
  training seeds resampled within each cell, goals shared."""
  return difference_interval(cell_a, cell_b, **kw)


def outcome_matrix(per_task: Iterable[dict], key: str = "won",
                   task_ids: Sequence[int] | None = None) -> np.ndarray:
  """``x[g, s]`` from an evaluation's ``per_task`` list (rspo_jax/evaluate):
  goals by ``task_ids`` (default: every task id, sorted), seeds sorted.
  ValueError when a (task, seed) pair is missing."""
  entries = list(per_task)
  seeds = sorted({int(e["seed"]) for e in entries})
  if task_ids is None:
    task_ids = sorted({int(e["task_id"]) for e in entries})
  row = {t: i for i, t in enumerate(task_ids)}
  col = {s: j for j, s in enumerate(seeds)}
  x = np.full((len(task_ids), len(seeds)), np.nan)
  for e in entries:
    if int(e["task_id"]) in row:
      x[row[int(e["task_id"])], col[int(e["seed"])]] = float(e[key])
  if np.isnan(x).any():
    g, s = np.argwhere(np.isnan(x))[0]
    raise ValueError(f"no outcome for task {task_ids[g]} at seed {seeds[s]}")
  return x
