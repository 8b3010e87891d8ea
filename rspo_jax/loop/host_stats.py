"""Means and counts over every host's records (one process: its own).

``multihost`` False: plain numpy on this process's values; True: a sum
over hosts (``distributed.global_sum``) that every host calls together.
"""

from __future__ import annotations

import numpy as np

from rspo_jax import distributed


def mean(xs) -> float:
  """The mean of ``xs``; 0 when empty."""
  return float(np.mean(xs)) if len(xs) else 0.0


def dense_rewards(records) -> list:
  """The finite dense rewards of ``records`` (NaN: swapped out)."""
  return [r.dense_reward for r in records if np.isfinite(r.dense_reward)]


def global_mean(values, multihost: bool) -> float:
  """Mean over every host's values (``mean`` with one process)."""
  if not multihost:
    return mean(values)
  total, n = distributed.global_sum(
      np.array([np.sum(values), len(values)], np.float64)
  )
  return float(total / n) if n else 0.0


def reward_means(records, multihost: bool) -> dict:
  """Dense and outcome reward means over a collection's step rows."""
  return {
      "dense_reward_mean": global_mean(dense_rewards(records), multihost),
      "outcome_reward_mean": global_mean(
          [r.outcome_reward for r in records], multihost
      ),
  }


def play_stats(records, multihost: bool) -> dict:
  """Success rate (share of trajectories that won) and dense return
  (mean over trajectories of sum_t dense r_t) of a collection, over
  every host's records."""
  won, dense = {}, {}
  for r in records:
    won[r.traj_id] = won.get(r.traj_id, False) or bool(r.won)
    dense[r.traj_id] = dense.get(r.traj_id, 0.0) + float(r.dense_reward)
  return {
      "success": global_mean(list(won.values()), multihost),
      "dense_return": global_mean(
          [v for v in dense.values() if np.isfinite(v)], multihost
      ),
  }


def wins_by_task(records, task_ids, multihost: bool) -> list:
  """Won episodes of each task in ``task_ids`` (that order), over
  every host's records: B's lift task by task."""
  won = {}
  for r in records:
    won[r.traj_id] = (
        int(r.task_id),
        won.get(r.traj_id, (0, False))[1] or bool(r.won),
    )
  at = {int(t): i for i, t in enumerate(task_ids)}
  counts = np.zeros(len(at), np.float64)
  for task, w in won.values():
    if task in at:
      counts[at[task]] += w
  if multihost:
    counts = distributed.global_sum(counts)
  return [int(c) for c in counts]
