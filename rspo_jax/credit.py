"""Rewards and advantages of a set of step records (host side, numpy).

Step rewards (:func:`step_rewards`), by ``source``:
  * 'outcome' -- r_t = env_reward_t (10 * won on the winning step, plus the
    invalid-action penalty p_t on an invalid step); Agent A, the baselines,
    and every trajectory in the replay buffer (the *reward swap*);
  * 'dense'   -- r_t = dense_reward_t + p_t + N(0, sigma^2); Agent B.

Credit (:func:`compute_advantages`), by ``algo.credit_mode``
(docs/credit.md gives verl-agent's code behind each line):
  * 'verl_agent' (default) -- every step row is a sample. Its score is the
    episode reward plus its own penalty,
        s_t = sum_{k in tau} (r_k - p_k) + p_t,
    (outcome: 10 * won, plus -0.1 on an invalid row; dense: the PRM's
    R_hat = sum_k r_hat_k, plus the penalty on the invalid row);
      grpo : A_t = (s_t - mean_g s) / (std_g s + eps), over the group's rows
             (verl-agent's ``compute_mean_std_cross_steps=True``);
      gigpo: A_E from the row scores as GRPO's; step returns
             R_t = sum_{k>=t} gamma^(k-t) (r_k - p_k) + p_t;
      ppo  : A_{t,j} = s_t - V_{t,j} on response token j, ret_t = s_t
             (each row its own one-step episode, as verl-agent's GAE;
             V_{t,j} the critic's value before token j), whitened over
             the response tokens.
  * 'trajectory' -- the earlier credit: R(tau) = sum_t r_t (penalties summed
    into the trajectory reward, on all its steps), group statistics over
    trajectories; PPO: turn-level GAE across an episode's steps with the
    critic's step values.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from rspo_jax import advantages as adv_lib
from rspo_jax.types import StepRecord

SOURCES = ("outcome", "dense")
CREDIT_MODES = ("verl_agent", "trajectory")


def step_rewards(
    records: Sequence[StepRecord],
    source: str,
    *,
    invalid_action_penalty: float = -0.1,
    noise_sigma: float = 0.0,
    rng: Optional[np.random.Generator] = None,
    dense_scale: float = 1.0,
) -> np.ndarray:
  """[S] per-step rewards r_t of ``source`` (see module docstring), the
  invalid-action penalty included on the invalid step. Dense:
  r_t = dense_scale * (d_t + N(0, noise_sigma^2)) + p_t (``dense_scale``
  puts a progress signal in [0, 1] into the outcome's units, 10 * won)."""
  if source == "outcome":
    return np.array([r.env_reward for r in records], np.float64)
  if source != "dense":
    raise ValueError(f"unknown reward source {source!r}; known: {SOURCES}")
  dense = np.array([r.dense_reward for r in records], np.float64)
  if np.isnan(dense).any():
    raise ValueError(
        f"{int(np.isnan(dense).sum())} step records have no dense reward;"
        " fill them (environment progress or PRM) before training on them"
    )
  if noise_sigma > 0:
    rng = rng if rng is not None else np.random.default_rng(0)
    dense = dense + rng.normal(0.0, noise_sigma, size=dense.shape)
  return dense_scale * dense + step_penalties(records, invalid_action_penalty)


def step_penalties(
    records: Sequence[StepRecord], invalid_action_penalty: float
) -> np.ndarray:
  """[S] p_t = penalty on invalid steps, 0 elsewhere."""
  return np.array(
      [invalid_action_penalty if r.invalid else 0.0 for r in records],
      np.float64,
  )


def _traj_index(records: Sequence[StepRecord]):
  ids = np.array([r.traj_id for r in records])
  uniq, inv = np.unique(ids, return_inverse=True)
  group_of = {}
  for r in records:
    group_of[r.traj_id] = r.group_id
  return inv.ravel(), np.array([group_of[t] for t in uniq])


def compute_advantages(
    records: Sequence[StepRecord],
    rewards: np.ndarray,
    algo_cfg,
    values: Optional[Sequence] = None,
    *,
    token_counts: Optional[Sequence[int]] = None,
    sum_fn=None,
) -> tuple:
  """Per-step advantages (and PPO returns) of ``records``.

  Args:
    records: the step records (all rows of the groups being credited).
    rewards: [S] r_t from :func:`step_rewards` (penalty included).
    algo_cfg: ``cfg.algo``. Read: name, normalize_std, gamma, omega,
      anchor_similarity, invalid_action_penalty, and with defaults
      credit_mode ('verl_agent'), gae_gamma (1.0), gae_lambda (1.0),
      gae_whiten (True).
    values: PPO only: per row, the critic's values V_{t,j} before each
      response token (an array; V_{t,0} at the last prompt token), or a
      scalar for every token of the row.
    token_counts: [S] response tokens per row (the tokens a scalar value
      or a trajectory-mode advantage is counted on by PPO's whitening);
      default ``len(record.response_ids)``.
    sum_fn: PPO's whitening sums go through it (``adv_lib.whiten``):
      ``distributed.global_sum`` whitens over every host's rows, as verl
      over its whole batch.

  Returns:
    (advantages, returns float32 [S] for PPO else None). Advantages: float32
    [S], one per row; PPO in 'verl_agent' mode: a list of S float32 arrays,
    one advantage per response token.
  """
  mode = algo_cfg.credit_mode
  if mode not in CREDIT_MODES:
    raise ValueError(f"unknown credit_mode {mode!r}; known: {CREDIT_MODES}")
  rewards = np.asarray(rewards, np.float64)
  step_traj, traj_group = _traj_index(records)
  step_idx = np.array([r.step_idx for r in records])
  penalty = step_penalties(records, algo_cfg.invalid_action_penalty)
  name = algo_cfg.name
  if name == "ppo":
    return _ppo(
        records,
        rewards,
        penalty,
        step_traj,
        step_idx,
        algo_cfg,
        mode,
        values,
        token_counts,
        sum_fn,
    )
  if name not in ("grpo", "gigpo"):
    raise ValueError(f"unknown algorithm {name!r}")
  if mode == "trajectory":
    return (
        _trajectory_credit(
            records, rewards, step_traj, traj_group, step_idx, algo_cfg
        ),
        None,
    )
  scores = adv_lib.episode_row_scores(rewards, penalty, step_traj)
  row_group = traj_group[step_traj]
  if name == "grpo":
    return (
        adv_lib.grpo_advantages(
            scores, row_group, normalize_std=algo_cfg.normalize_std
        ),
        None,
    )
  returns = adv_lib.penalty_on_row_returns(
      rewards, penalty, step_traj, step_idx, gamma=algo_cfg.gamma
  )
  return (
      adv_lib.gigpo_row_advantages(
          scores,
          row_group,
          returns,
          [r.anchor_obs for r in records],
          omega=algo_cfg.omega,
          normalize_std=algo_cfg.normalize_std,
          similarity_threshold=algo_cfg.anchor_similarity,
      ),
      None,
  )


def _trajectory_credit(
    records, rewards, step_traj, traj_group, step_idx, algo_cfg
) -> np.ndarray:
  """GRPO/GiGPO on R(tau) = sum_t r_t, statistics over trajectories."""
  traj_rewards = np.bincount(
      step_traj, weights=rewards, minlength=len(traj_group)
  )
  if algo_cfg.name == "grpo":
    per_traj = adv_lib.grpo_advantages(
        traj_rewards, traj_group, normalize_std=algo_cfg.normalize_std
    )
    return per_traj[step_traj].astype(np.float32)
  return adv_lib.gigpo_advantages(
      traj_rewards,
      traj_group,
      step_traj,
      step_idx,
      rewards,
      [r.anchor_obs for r in records],
      gamma=algo_cfg.gamma,
      omega=algo_cfg.omega,
      normalize_std=algo_cfg.normalize_std,
      similarity_threshold=algo_cfg.anchor_similarity,
  )


def join_ppo_whitening(algo_cfg, sum_fn) -> None:
  """What a process with no rows calls instead of ``compute_advantages``
  under PPO when its peers whiten through ``sum_fn`` (a collective): the
  same two sums, of nothing."""
  if sum_fn is not None and algo_cfg.name == "ppo" and algo_cfg.gae_whiten:
    adv_lib.whiten(np.zeros(0), sum_fn=sum_fn)


def _ppo(
    records,
    rewards,
    penalty,
    step_traj,
    step_idx,
    algo_cfg,
    mode,
    values,
    token_counts,
    sum_fn=None,
):
  """PPO credit; returns are never whitened (the critic's targets).

  verl_agent: A_{t,j} = s_t - V_{t,j} on each response token j, ret_t =
  s_t (verl-agent runs verl's token-level GAE on each row alone;
  ``adv_lib.row_token_gae_advantages``; only gae_gamma = gae_lambda = 1,
  verl's and verl-agent's values, is accepted), whitened over every
  response token (verl's ``masked_whiten``). trajectory: turn-level GAE
  across the episode's steps with V_t = V_{t,0}, delta_t = r_t + gae_gamma
  V_{t+1} - V_t, A_t = delta_t + gae_gamma gae_lambda A_{t+1}, whitened
  with each row counted on its tokens (the critic is still trained on
  every token's value; only V_{t,0} is read here).
  """
  if values is None:
    raise ValueError("PPO advantages need the critic's step values")
  gamma = float(algo_cfg.gae_gamma)
  lam = float(algo_cfg.gae_lambda)
  if len(values) != len(records):
    raise ValueError(f"{len(values)} critic values for {len(records)} rows")
  if token_counts is None:
    token_counts = [len(r.response_ids) for r in records]
  whiten = algo_cfg.gae_whiten
  if mode == "verl_agent":
    if gamma != 1.0 or lam != 1.0:
      raise ValueError(
          "credit_mode='verl_agent' credits each step row as a one-step"
          " episode, where gae_gamma and gae_lambda act along its tokens"
          f" and must be 1 (got {gamma}, {lam}), as verl-agent's; use"
          " credit_mode='trajectory' for GAE across an episode's steps"
      )
    scores = adv_lib.episode_row_scores(rewards, penalty, step_traj)
    token_values = [
        np.full(int(n), v, np.float64)
        if np.ndim(v) == 0
        else np.asarray(v, np.float64)
        for v, n in zip(values, token_counts)
    ]
    adv, returns = adv_lib.row_token_gae_advantages(scores, token_values)
    return (
        adv_lib.whiten_token_rows(adv, sum_fn=sum_fn) if whiten else adv
    ), returns
  first = np.array(
      [np.ravel(v)[0] if np.size(v) else 0.0 for v in values], np.float64
  )  # V(s_t): before the row's first token
  adv, returns = adv_lib.gae_step_advantages(
      rewards, first, step_traj, step_idx, gamma=gamma, lam=lam
  )
  if whiten:
    adv = adv_lib.whiten(adv, token_counts, sum_fn=sum_fn)
  return adv, returns
