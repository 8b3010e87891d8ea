"""rspo_jax/intervals.py: bootstrap intervals on hand-checkable data."""

import math

import numpy as np
import pytest

from rspo_jax import intervals


def test_all_equal_outcomes_give_a_zero_width_interval():
  r = intervals.success_interval(np.full((10, 3), 1.0))
  assert (r["mean"], r["lo"], r["hi"]) == (1.0, 1.0, 1.0)
  r = intervals.method_difference(np.ones((3, 5, 2)), np.zeros((2, 5, 2)))
  assert (r["mean"], r["lo"], r["hi"]) == (1.0, 1.0, 1.0)


def test_goals_are_resampled():
  # Goal 0 always won, goal 1 never: a draw's mean is 0, 1/2 or 1 with
  # probabilities 1/4, 1/2, 1/4, so the 2.5 / 97.5 % quantiles are 0 and 1.
  r = intervals.success_interval([[1.0], [0.0]])
  assert (r["mean"], r["lo"], r["hi"]) == (0.5, 0.0, 1.0)


def test_seeds_are_resampled_within_a_goal():
  # One goal, seeds won / lost: the same 0, 1/2, 1 distribution.
  r = intervals.success_interval([[1.0, 0.0]])
  assert (r["mean"], r["lo"], r["hi"]) == (0.5, 0.0, 1.0)


def test_training_seeds_are_resampled_in_a_method_difference():
  # Cell a: run 0 wins everything, run 1 nothing; cell b never wins.
  # Goals and sampling seeds are all alike: only the runs vary, 0, 1/2, 1.
  a = np.stack([np.ones((4, 2)), np.zeros((4, 2))])
  r = intervals.method_difference(a, np.zeros((3, 4, 2)))
  assert (r["mean"], r["lo"], r["hi"]) == (0.5, 0.0, 1.0)


def test_paired_difference_cancels_goal_difficulty():
  # Scores 0.0, 0.1, ..., 0.9 at the start, each goal +0.2 at the end:
  # every draw picks the same goals for both, so every d* is 0.2 exactly.
  start = np.arange(10.0)[:, None] / 10
  r = intervals.paired_difference(start + 0.2, start)
  assert r["mean"] == pytest.approx(0.2)
  assert r["lo"] == pytest.approx(0.2) and r["hi"] == pytest.approx(0.2)
  # Unpaired (a's goals reversed) the same means are far from certain.
  r = intervals.paired_difference(start[::-1] + 0.2, start)
  assert r["mean"] == pytest.approx(0.2) and r["hi"] - r["lo"] > 0.3


def test_width_matches_the_normal_approximation():
  # 256 goals, 77 won (p = 0.30), one seed: 2 * 1.96 * sqrt(p (1-p) / 256)
  # = 0.112; the bootstrap's width is within sampling noise of that.
  x = np.zeros((256, 1))
  x[:77] = 1.0
  r = intervals.success_interval(x, num_draws=4000)
  assert r["mean"] == pytest.approx(77 / 256)
  assert r["hi"] - r["lo"] == pytest.approx(0.112, abs=0.012)
  assert r["lo"] < r["mean"] < r["hi"]


def test_deterministic_by_seed_and_contains_the_point_estimate():
  rng = np.random.default_rng(7)
  final = (rng.random((3, 64, 3)) < 0.4).astype(float)
  start = (rng.random((64, 3)) < 0.2).astype(float)
  one = intervals.paired_difference(final, start, seed=3)
  assert one == intervals.paired_difference(final, start, seed=3)
  assert one != intervals.paired_difference(final, start, seed=4)
  assert one["lo"] <= one["mean"] <= one["hi"]
  assert one["mean"] == pytest.approx(final.mean() - start.mean())
  assert one["level"] == 0.95 and one["draws"] == intervals.NUM_DRAWS


def test_shapes_are_checked():
  with pytest.raises(ValueError, match="different numbers of goals"):
    intervals.difference_interval(np.zeros((4, 1)), np.zeros((5, 1)))
  with pytest.raises(ValueError, match="shape"):
    intervals.success_interval(np.zeros(4))
  with pytest.raises(ValueError, match="finite"):
    intervals.success_interval([[np.nan]])


def test_outcome_matrix_from_per_task():
  per_task = [
      {"seed": s, "task_id": t, "won": int(t == s), "score": t / 10}
      for s in (1, 0)
      for t in (2, 0, 1)
  ]
  np.testing.assert_array_equal(
      intervals.outcome_matrix(per_task), [[1, 0], [0, 1], [0, 0]]
  )
  np.testing.assert_allclose(
      intervals.outcome_matrix(per_task, "score", task_ids=[2, 1]),
      [[0.2, 0.2], [0.1, 0.1]],
  )
  with pytest.raises(ValueError, match="no outcome for task 1 at seed 0"):
    intervals.outcome_matrix(per_task[:-1])


# ------------------------------------------------------------ few units
def test_t_distribution_against_closed_forms():
  # df = 1 is Cauchy: F(t) = 1/2 + atan(t)/pi, so F(1) = 3/4 and the
  # 97.5 % quantile is tan(0.475 pi) = 12.706205.
  assert intervals.t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
  assert intervals.t_quantile(0.975, 1) == pytest.approx(
      math.tan(0.475 * math.pi), rel=1e-9
  )
  # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)); solving F(t) = 0.975,
  # t = 0.95 sqrt(2 / (1 - 0.95^2)) = 4.302653.
  assert intervals.t_cdf(2.0, 2) == pytest.approx(0.5 + 2 / (2 * 6**0.5))
  assert intervals.t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
  # Tables: t_{0.975, 4} = 2.776445, t_{0.975, 10} = 2.228139; a large df
  # is the normal's 1.959964.
  assert intervals.t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
  assert intervals.t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)
  assert intervals.t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
  assert intervals.t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
  assert intervals.t_cdf(0.0, 3) == 0.5


def test_t_interval_of_three_units():
  # [1, 2, 3]: mean 2, s = 1, 2 +- 4.302653 / sqrt(3) = 2 +- 2.484138.
  r = intervals.t_interval([1.0, 2.0, 3.0])
  assert r["mean"] == 2.0 and r["n"] == 3 and r["df"] == 2
  assert r["lo"] == pytest.approx(2 - 2.484138, abs=1e-6)
  assert r["hi"] == pytest.approx(2 + 2.484138, abs=1e-6)
  r = intervals.t_interval([0.5, 0.5])  # no spread: zero width
  assert (r["lo"], r["hi"]) == (0.5, 0.5)
  with pytest.raises(ValueError, match="at least 2 units"):
    intervals.t_interval([1.0])


def test_welch_interval():
  # [4, 5, 6] - [1, 2, 3]: 3; s^2 = 1 each, se^2 = 1/3 + 1/3, df =
  # (2/3)^2 / (2 (1/3)^2 / 2) = 4; 3 +- 2.776445 sqrt(2/3) = 3 +- 2.266958.
  r = intervals.welch_interval([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
  assert r["mean"] == 3.0 and r["df"] == pytest.approx(4.0)
  assert (r["n_a"], r["n_b"]) == (3, 3)
  assert r["lo"] == pytest.approx(3 - 2.266958, abs=1e-6)
  assert r["hi"] == pytest.approx(3 + 2.266958, abs=1e-6)
  # One side without spread: df = n - 1 of the other, here 2; se^2 = 1/3.
  r = intervals.welch_interval([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
  assert r["df"] == pytest.approx(2.0)
  assert r["hi"] - r["mean"] == pytest.approx(2.484138, abs=1e-6)
  r = intervals.welch_interval([1.0, 1.0], [0.0, 0.0, 0.0])
  assert (r["mean"], r["lo"], r["hi"]) == (1.0, 1.0, 1.0)


def test_exact_permutation_p():
  # [1, 2, 3] vs [4, 5, 6]: of the C(6, 3) = 20 splits only this one and
  # its mirror reach |difference| 3, p = 2 / 20.
  assert intervals.permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
  # [0, 1] vs [1, 2], difference -1. The 6 splits of {0, 1, 1', 2}:
  # {0,1} {0,1'} -1, {0,2} {1,1'} 0, {1,2} {1',2} +1: 4 of 6 reach 1.
  assert intervals.permutation_p([0, 1], [1, 2]) == pytest.approx(4 / 6)
  assert intervals.permutation_p([1, 1], [1, 1]) == 1.0
  with pytest.raises(ValueError, match="too many"):
    intervals.permutation_p(np.arange(15), np.arange(15))


def test_exact_rank_p():
  # No overlap, 3 vs 3: U = 0, as extreme as only the mirror, p = 2/20.
  assert intervals.rank_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
  # 5 vs 5, U = 22 of 25 (a beats b in 22 pairs). Of the 252 splits,
  # U >= 22 in 1 + 1 + 2 + 3 = 7 (U = 25, 24, 23, 22) and U <= 3 in 7:
  # p = 14 / 252 = 0.0556.
  a = [91.9, 77.7, 93.2, 81.8, 90.1]
  b = [70.4, 2.6, 85.4, 75.0, 79.2]
  assert intervals.rank_p(a, b) == pytest.approx(14 / 252)
  # Ties take midranks: [1, 2] vs [2, 3], U = 0 + 1/2 = 1/2 of 4, centre
  # 2; the splits of ranks {1, 2.5, 2.5, 4} give U - 2 = -1.5, -1.5, 0,
  # 0, 1.5, 1.5: 4 of 6 as far as 1.5.
  assert intervals.rank_p([1, 2], [2, 3]) == pytest.approx(4 / 6)


def test_exact_sign_flip_p():
  # [1, 2, 3]: only +++ and --- reach |mean| 2, p = 2 / 8.
  assert intervals.sign_flip_p([1, 2, 3]) == pytest.approx(0.25)
  # [1, -2, 3], sum 2: the 8 sums +-1 +-2 +-3 are 6, 0, 2, -4, 4, -2, 0,
  # -6; six reach |sum| >= 2.
  assert intervals.sign_flip_p([1, -2, 3]) == pytest.approx(0.75)
  assert intervals.sign_flip_p([0, 0]) == 1.0
