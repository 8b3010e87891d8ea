"""rspo_jax/intervals.py: bootstrap intervals on hand-checkable data."""

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
  per_task = [{"seed": s, "task_id": t, "won": int(t == s), "score": t / 10}
              for s in (1, 0) for t in (2, 0, 1)]
  np.testing.assert_array_equal(intervals.outcome_matrix(per_task),
                                [[1, 0], [0, 1], [0, 0]])
  np.testing.assert_allclose(
      intervals.outcome_matrix(per_task, "score", task_ids=[2, 1]),
      [[0.2, 0.2], [0.1, 0.1]])
  with pytest.raises(ValueError, match="no outcome for task 1 at seed 0"):
    intervals.outcome_matrix(per_task[:-1])
