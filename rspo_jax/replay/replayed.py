"""Replayed rows: selected trajectories with their advantages from D.

A replayed trajectory keeps the advantage it has in its *whole original
group* of D, with the outcome reward (the reward swap):

  r_t   = credit.step_rewards(every record of D, 'outcome')
  A_off = credit.compute_advantages(every record of D, r)   (GRPO / GiGPO)

so the one win of a group of 8 with one success comes with a large positive
advantage, whichever of its group mates are replayed beside it. PPO has no
groups: its replayed rows get GAE with A's critic at the step, as fresh
rows do (``advantages_in_buffer`` returns None).

Metrics of a step's replayed rows (token-weighted over response tokens;
``metric_sums`` per host, summed over hosts, then ``metrics``):
  replay_nonzero_adv_frac  share of replayed response tokens whose
                           advantage is non-zero;
  replay_adv_mean          mean advantage of replayed response tokens;
  replay_success_frac      share of replayed trajectories that won;
  replay_trajectories      replayed trajectories.
numpy only.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from rspo_jax import credit
from rspo_jax.types import StepRecord, Trajectory


def advantages_in_buffer(
    trajectories: Sequence[Trajectory],
    algo_cfg,
    *,
    invalid_action_penalty: float,
) -> Optional[dict[int, np.ndarray]]:
  """{traj_id: [steps] advantages, in step order} of every trajectory of
  D against its whole group (module docstring); None for PPO."""
  if algo_cfg.name == "ppo" or not trajectories:
    return None
  records = [s for t in trajectories for s in t.steps]
  rewards = credit.step_rewards(
      records, "outcome", invalid_action_penalty=invalid_action_penalty
  )
  adv, _ = credit.compute_advantages(records, rewards, algo_cfg)
  out, i = {}, 0
  for t in trajectories:
    out[t.steps[0].traj_id] = np.asarray(adv[i : i + len(t.steps)], np.float32)
    i += len(t.steps)
  return out


def rows(
    selected: Sequence[Trajectory],
    adv: Optional[dict[int, np.ndarray]],
) -> tuple[list[StepRecord], Optional[np.ndarray]]:
  """(step records of ``selected``, trajectory by trajectory; their
  advantages, or None when ``adv`` is None)."""
  records = [s for t in selected for s in t.steps]
  if adv is None:
    return records, None
  if not selected:
    return records, np.zeros(0, np.float32)
  return records, np.concatenate(
      [adv[t.steps[0].traj_id] for t in selected]
  ).astype(np.float32)


def metric_sums(
    records: Sequence[StepRecord], adv: Optional[np.ndarray]
) -> np.ndarray:
  """[tokens, tokens with A != 0, sum of A over tokens, trajectories, won
  trajectories] of replayed rows (``adv`` per record)."""
  tokens = np.array([len(r.response_ids) for r in records], np.float64)
  a = np.zeros(len(records)) if adv is None else np.asarray(adv, np.float64)
  trajs = {r.traj_id for r in records}
  won = {r.traj_id for r in records if r.won}  # ``won`` is on every step
  return np.array(
      [
          tokens.sum(),
          tokens[a != 0].sum(),
          (tokens * a).sum(),
          len(trajs),
          len(won),
      ],
      np.float64,
  )


def metrics(sums: np.ndarray) -> dict:
  """The replay metrics (module docstring) from (summed) ``metric_sums``."""
  tokens, nonzero, adv_sum, n_traj, n_won = (float(x) for x in sums)
  return {
      "replay_nonzero_adv_frac": nonzero / tokens if tokens else 0.0,
      "replay_adv_mean": adv_sum / tokens if tokens else 0.0,
      "replay_success_frac": n_won / n_traj if n_traj else 0.0,
      "replay_trajectories": n_traj,
  }
