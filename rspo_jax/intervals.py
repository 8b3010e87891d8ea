r"""95 % bootstrap intervals for success rates over goals x seeds; t
intervals and exact p over a few units (seeds, loops), at the end.

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

import itertools
import math
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
    raise ValueError(
        f"want a non-empty [goals, seeds] or [runs, goals, "
        f"seeds] array, got shape {a.shape}"
    )
  if not np.all(np.isfinite(a)):
    raise ValueError("outcomes must be finite (a missing episode?)")
  return a


def _draw_means(
    x: np.ndarray, goal_idx: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
  """m*_b for every draw b, given its goals ``goal_idx[b, G]``."""
  r, _, s = x.shape
  draws, g = goal_idx.shape
  run_idx = rng.integers(0, r, (draws, r))
  seed_idx = rng.integers(0, s, (draws, r, g, s))
  picked = x[run_idx[:, :, None, None], goal_idx[:, None, :, None], seed_idx]
  return picked.reshape(draws, -1).mean(axis=1)


def _interval(point: float, draws: np.ndarray, level: float) -> dict:
  lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
  return {
      "mean": float(point),
      "lo": float(lo),
      "hi": float(hi),
      "level": level,
      "draws": int(len(draws)),
  }


def success_interval(
    x, *, seed: int = 0, num_draws: int = NUM_DRAWS, level: float = LEVEL
) -> dict:
  """(a) A success rate over goals x seeds (``x[g, s]``), or over training
  runs x goals x seeds (``x[r, g, s]``): ``{'mean', 'lo', 'hi', ...}``."""
  a = _as_runs(x)
  rng = np.random.default_rng(seed)
  goal_idx = rng.integers(0, a.shape[1], (num_draws, a.shape[1]))
  return _interval(a.mean(), _draw_means(a, goal_idx, rng), level)


def difference_interval(
    a, b, *, seed: int = 0, num_draws: int = NUM_DRAWS, level: float = LEVEL
) -> dict:
  """m(a) - m(b) for two arrays on the same goals (axis -2, same order),
  one goal resample shared by both per draw; runs and seeds resampled
  within each side. Either may be ``[G, S]`` or ``[R, G, S]``."""
  a, b = _as_runs(a), _as_runs(b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(
        f"different numbers of goals: {a.shape[1]} vs " f"{b.shape[1]}"
    )
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


def outcome_matrix(
    per_task: Iterable[dict],
    key: str = "won",
    task_ids: Sequence[int] | None = None,
) -> np.ndarray:
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


# ------------------------------------------------------------ few units
# With n <= 5 training seeds or loops the percentile bootstrap above
# returns about the observed range. Beside it the record reports a
# Student t interval over the n units and an exact p (docs/results.md).
#
# One sample x_1..x_n (units: a cell's seeds, B's loops, paired
# differences):
#
#     mean +- t_{(1+level)/2, n-1} s / sqrt(n),   s^2 = sum (x_i - m)^2/(n-1).
#
# Two independent samples a (n_a) and b (n_b), Welch:
#
#     m_a - m_b +- t_{(1+level)/2, df} se,   se^2 = s_a^2/n_a + s_b^2/n_b,
#     df = se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1)).
#
# Exact two-sided p of the difference in means: every one of the
# C(n_a+n_b, n_a) ways to split the pooled values into groups of n_a and
# n_b (permutation_p), or every one of the 2^n sign patterns of paired
# differences (sign_flip_p); p = share of them with |statistic| >= the
# observed one. rank_p: the same enumeration with the Mann-Whitney U
# (midranks for ties) as the statistic. The smallest possible p is
# 2 / C(n_a+n_b, n_a) (0.10 at 3 vs 3 seeds, 0.33 at 2 vs 2) and
# 2 / 2^n: with so few units a p above 0.05 may be all the data allow.

MAX_ENUMERATION = 1 << 20


def _regularized_beta(x: float, a: float, b: float) -> float:
  """I_x(a, b), the regularized incomplete beta function, by its
  continued fraction (modified Lentz; Numerical Recipes 6.4)."""
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast below
    return 1.0 - _regularized_beta(1.0 - x, b, a)
  log_front = (
      math.lgamma(a + b)
      - math.lgamma(a)
      - math.lgamma(b)
      + a * math.log(x)
      + b * math.log1p(-x)
  )
  tiny = 1e-300
  c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  f = d
  for m in range(1, 400):
    for num in (
        m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
        -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
    ):
      d = 1.0 + num * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + num / c
      c = c if abs(c) > tiny else tiny
      f *= c * d
    if abs(c * d - 1.0) < 1e-15:
      break
  return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
  """P(T <= t) for Student's t with ``df`` degrees of freedom:
  1 - I_x(df/2, 1/2) / 2 at x = df / (df + t^2), for t >= 0."""
  if df <= 0:
    raise ValueError(f"degrees of freedom must be > 0, got {df}")
  tail = 0.5 * _regularized_beta(df / (df + t * t), df / 2.0, 0.5)
  return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
  """The t with P(T <= t) = p, by bisection on t_cdf (to 1e-12)."""
  if not 0.0 < p < 1.0:
    raise ValueError(f"want 0 < p < 1, got {p}")
  if p < 0.5:
    return -t_quantile(1.0 - p, df)
  lo, hi = 0.0, 1.0
  while t_cdf(hi, df) < p:
    lo, hi = hi, hi * 2.0
  while hi - lo > 1e-12 * max(1.0, hi):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
  return 0.5 * (lo + hi)


def _units(x, name: str = "x") -> np.ndarray:
  a = np.asarray(x, np.float64).ravel()
  if a.size < 2:
    raise ValueError(
        f"{name}: a t interval needs at least 2 units, got " f"{a.size}"
    )
  if not np.all(np.isfinite(a)):
    raise ValueError(f"{name}: values must be finite")
  return a


def t_interval(x, *, level: float = LEVEL) -> dict:
  """Student t interval of the mean of ``x`` (n >= 2 units):
  ``{'mean', 'lo', 'hi', 'n', 'df', 'level'}``. For paired differences
  pass the differences."""
  a = _units(x)
  n, m = a.size, float(a.mean())
  se = float(a.std(ddof=1)) / math.sqrt(n)
  half = t_quantile((1 + level) / 2, n - 1) * se
  return {
      "mean": m,
      "lo": m - half,
      "hi": m + half,
      "n": int(n),
      "df": float(n - 1),
      "level": level,
  }


def welch_interval(a, b, *, level: float = LEVEL) -> dict:
  """Welch's t interval of mean(a) - mean(b), a and b independent
  (n >= 2 units each): ``{'mean', 'lo', 'hi', 'n_a', 'n_b', 'df',
  'level'}``. Both variances 0: a zero-width interval at the difference."""
  a, b = _units(a, "a"), _units(b, "b")
  va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
  m = float(a.mean() - b.mean())
  se2 = va + vb
  if se2 == 0.0:
    df = float(a.size + b.size - 2)
    half = 0.0
  else:
    df = float(se2**2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)))
    half = t_quantile((1 + level) / 2, df) * math.sqrt(se2)
  return {
      "mean": m,
      "lo": m - half,
      "hi": m + half,
      "n_a": int(a.size),
      "n_b": int(b.size),
      "df": df,
      "level": level,
  }


def _splits(n_a: int, n_b: int):
  total = math.comb(n_a + n_b, n_a)
  if total > MAX_ENUMERATION:
    raise ValueError(
        f"{total} splits of {n_a} + {n_b} units: too many to "
        f"enumerate exactly (at most {MAX_ENUMERATION})"
    )
  return itertools.combinations(range(n_a + n_b), n_a)


def _share_at_least(stats: np.ndarray, observed: float) -> float:
  """Share of |stats| >= |observed|, ties within float rounding counted."""
  tol = 1e-9 * max(1.0, abs(observed))
  return float(np.mean(np.abs(stats) >= abs(observed) - tol))


def permutation_p(a, b) -> float:
  """Exact two-sided permutation p of mean(a) - mean(b), two independent
  groups: every split of the pooled values into n_a and n_b."""
  a = np.asarray(a, np.float64).ravel()
  b = np.asarray(b, np.float64).ravel()
  pooled, total = np.concatenate([a, b]), a.sum() + b.sum()
  stats = []
  for idx in _splits(a.size, b.size):
    s = pooled[list(idx)].sum()
    stats.append(s / a.size - (total - s) / b.size)
  return _share_at_least(np.array(stats), a.mean() - b.mean())


def rank_p(a, b) -> float:
  """Exact two-sided Mann-Whitney p: U = #(a_i > b_j) + #(a_i = b_j)/2,
  its distance from n_a n_b / 2 against every split of the pooled
  midranks."""
  a = np.asarray(a, np.float64).ravel()
  b = np.asarray(b, np.float64).ravel()
  pooled = np.concatenate([a, b])
  order = pooled.argsort(kind="stable")
  ranks = np.empty(pooled.size)
  ranks[order] = np.arange(1, pooled.size + 1)
  for v in np.unique(pooled):  # midranks for ties
    ranks[pooled == v] = ranks[pooled == v].mean()
  centre = a.size * b.size / 2
  shift = a.size * (a.size + 1) / 2  # U = rank sum of a - shift
  stats = [
      ranks[list(idx)].sum() - shift - centre for idx in _splits(a.size, b.size)
  ]
  return _share_at_least(
      np.array(stats), ranks[: a.size].sum() - shift - centre
  )


def sign_flip_p(d) -> float:
  """Exact two-sided sign-flip p of mean(d) = 0 for paired differences
  d: every one of the 2^n sign patterns."""
  d = np.asarray(d, np.float64).ravel()
  if 2**d.size > MAX_ENUMERATION:
    raise ValueError(
        f"2^{d.size} sign patterns: too many to enumerate "
        f"exactly (at most {MAX_ENUMERATION})"
    )
  signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
  return _share_at_least(signs @ d / d.size, d.mean())
