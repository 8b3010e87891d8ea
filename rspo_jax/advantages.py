"""Advantage estimators: GRPO, GiGPO, turn-level GAE. Numpy in, numpy out.

Host-side and variable-sized (groups and trajectories differ in length), so
plain numpy; results are float32. A learner row is one step of an episode
(see :mod:`rspo_jax.types`); step-level results are broadcast to that step's
response tokens (:func:`broadcast_to_tokens`), PPO's are per token.

Conventions follow verl / verl-agent (``compute_grpo_outcome_advantage``,
``gigpo/core_gigpo.py``, ``masked_whiten``); see docs/credit.md:
  * std is the unbiased sample std (``torch.std``, ddof = 1);
  * normalisation is ``(x - mean) / (std + eps)`` with eps = 1e-6;
  * groups with identical values get 0 (0 / (0 + eps));
  * PPO advantages are whitened over the batch's response tokens
    (:func:`whiten`, eps = 1e-8 on the variance).
One deliberate difference: a group holding a single sample gets advantage 0
here; verl uses mean 0, std 1 for it, which passes the raw reward through.

Row-level functions (:func:`episode_row_scores`,
:func:`penalty_on_row_returns`, :func:`gigpo_row_advantages`,
:func:`row_token_gae_advantages`) implement verl-agent's credit, where
every step row is a sample of its group; the trajectory-level ones
(:func:`gigpo_advantages`, :func:`gae_step_advantages`) the older
per-trajectory credit.
"""

from __future__ import annotations

import difflib
from typing import Optional, Sequence

import numpy as np

EPISODE_STATS = ("trajectories", "steps")


def _as_1d(x, name: str, dtype=None) -> np.ndarray:
  a = np.asarray(x, dtype=dtype)
  if a.ndim != 1:
    raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
  return a


def _check_len(n: int, **arrays) -> None:
  for name, a in arrays.items():
    if len(a) != n:
      raise ValueError(f"{name} has length {len(a)}, expected {n}")


def _group_normalize(
    values: np.ndarray,
    group_index: np.ndarray,
    *,
    normalize_std: bool,
    eps: float,
) -> np.ndarray:
  """(v - mean_g) / (std_g + eps) per group g (ddof = 1); size-1 groups -> 0.

  ``group_index`` holds dense ints 0..G-1.
  """
  out = np.zeros(len(values), np.float64)
  for g in np.unique(group_index):
    idx = np.flatnonzero(group_index == g)
    if len(idx) < 2:
      continue
    v = values[idx]
    centred = v - v.mean()
    out[idx] = centred / (v.std(ddof=1) + eps) if normalize_std else centred
  return out


def grpo_advantages(
    rewards,
    group_ids,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
  """Group-relative advantages of GRPO.

    A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps)
    (or R_i - mean without the std divisor, ``normalize_std=False``).

  std is the unbiased sample std (ddof = 1), as ``torch.std`` in verl.
  A group of one sample gets A = 0 (verl would pass its raw reward through).

  Args:
    rewards: [N] outcome rewards.
    group_ids: [N] group keys (ints or strings); equal key = same group.
    normalize_std: divide by the group std.
    eps: added to the std.

  Returns:
    [N] float32 advantages.
  """
  r = _as_1d(rewards, "rewards", np.float64)
  g = _as_1d(group_ids, "group_ids")
  _check_len(len(r), group_ids=g)
  if len(r) == 0:
    return np.zeros(0, np.float32)
  _, gi = np.unique(g, return_inverse=True)
  adv = _group_normalize(r, gi.ravel(), normalize_std=normalize_std, eps=eps)
  return adv.astype(np.float32)


def _traj_order(step_traj: np.ndarray, step_idx: np.ndarray):
  """Yields, per trajectory, the positions of its steps sorted by step_idx."""
  for t in np.unique(step_traj):
    pos = np.flatnonzero(step_traj == t)
    order = np.argsort(step_idx[pos], kind="stable")
    pos = pos[order]
    if len(np.unique(step_idx[pos])) != len(pos):
      raise ValueError(f"step_idx has duplicates within trajectory {t}")
    yield pos


def discounted_step_returns(step_rewards, step_traj, step_idx, *, gamma):
  """R_t = sum_{k >= t} gamma^(k - t) r_k over the steps of each trajectory.

  Steps are ordered by ``step_idx`` within a trajectory (gaps are ignored:
  consecutive recorded steps are one time step apart), as verl-agent's
  ``compute_step_discounted_returns``.

  Args:
    step_rewards: [S] per-step rewards r_t.
    step_traj: [S] trajectory key of each step.
    step_idx: [S] position of the step in its trajectory.
    gamma: discount.

  Returns:
    [S] float32 returns, in the input order.
  """
  r = _as_1d(step_rewards, "step_rewards", np.float64)
  traj = _as_1d(step_traj, "step_traj")
  idx = _as_1d(step_idx, "step_idx")
  _check_len(len(r), step_traj=traj, step_idx=idx)
  out = np.zeros(len(r), np.float64)
  for pos in _traj_order(traj, idx):
    running = 0.0
    for p in pos[::-1]:
      running = r[p] + gamma * running
      out[p] = running
  return out.astype(np.float32)


def step_groups(
    task_group: Sequence,
    anchors: Sequence[str],
    *,
    similarity_threshold: Optional[float] = None,
) -> np.ndarray:
  """Anchor-state groups of GiGPO: dense int id per step.

  Steps are grouped within their task group only. Without a threshold, steps
  with identical anchor text share a group. With one, as verl-agent's
  ``build_step_group(enable_similarity=True)``: steps are visited in input
  order and each joins the first existing cluster whose *first* member's
  text has ``difflib.SequenceMatcher(None, a, b).ratio() >= threshold``,
  else it opens a new cluster (greedy, order dependent).

  Args:
    task_group: [S] task-group key of each step.
    anchors: [S] anchor observation texts.
    similarity_threshold: None (exact match) or a value in (0, 1].

  Returns:
    [S] int64 group ids 0..G-1.
  """
  tg = _as_1d(task_group, "task_group")
  anchors = list(anchors)
  _check_len(len(tg), anchors=anchors)
  if similarity_threshold is not None and not 0.0 < similarity_threshold <= 1:
    raise ValueError(
        "similarity_threshold must be in (0, 1], got"
        f" {similarity_threshold!r}"
    )
  for i, a in enumerate(anchors):
    if not isinstance(a, str):
      raise ValueError(f"anchors[{i}] is {type(a).__name__}, expected str")
  out = np.full(len(tg), -1, np.int64)
  next_id = 0
  for g in np.unique(tg):
    reps: list[tuple[str, int]] = []  # (representative text, group id)
    for p in np.flatnonzero(tg == g):
      a = anchors[p]
      for rep, gid in reps:
        if similarity_threshold is None:
          same = a == rep
        else:
          same = (
              difflib.SequenceMatcher(None, a, rep).ratio()
              >= similarity_threshold
          )
        if same:
          out[p] = gid
          break
      else:
        reps.append((a, next_id))
        out[p] = next_id
        next_id += 1
  return out


def gigpo_advantages(
    traj_rewards,
    traj_group_ids,
    step_traj,
    step_idx,
    step_rewards,
    step_anchor: Sequence[str],
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    normalize_std: bool = True,
    similarity_threshold: Optional[float] = None,
    eps: float = 1e-6,
    episode_stats: str = "trajectories",
) -> np.ndarray:
  """GiGPO step advantages: A = A_E + omega * A_S.

    A_E(tau_i) = (R(tau_i) - mean_{j in g} R(tau_j)) / F
    R_t        = sum_{k >= t} gamma^(k - t) r_k       (within a trajectory)
    A_S(t)     = (R_t - mean_{s in G(t)} R_s) / F
  F = std + eps (ddof = 1) with ``normalize_std``, else 1. g is the task
  group of the trajectory, G(t) the step group: steps of the same task group
  with the same anchor text (or SequenceMatcher ratio >= threshold, see
  :func:`step_groups`). A step group of size 1 gets A_S = 0; a task group
  with one trajectory gets A_E = 0.

  ``episode_stats`` picks the sample behind mean_g/std_g of A_E:
  'trajectories' (default; the formula above, one value per trajectory) or
  'steps' (verl-agent's default ``compute_mean_std_cross_steps=True``: every
  step row counts its trajectory's reward once, so longer trajectories weigh
  more; only the group's step rows count, trajectories without steps don't).

  Args:
    traj_rewards: [N_traj] outcome reward R(tau) per trajectory.
    traj_group_ids: [N_traj] task-group key per trajectory.
    step_traj: [S] index into the trajectory arrays, per step.
    step_idx: [S] position of the step in its trajectory.
    step_rewards: [S] per-step rewards r_t used for R_t.
    step_anchor: [S] anchor observation text per step.
    gamma: step discount.
    omega: weight of the step advantage.
    normalize_std: divide by std + eps (both levels).
    similarity_threshold: None = exact anchor match.
    eps: added to the std.
    episode_stats: 'trajectories' or 'steps'.

  Returns:
    [S] float32 step advantages.
  """
  tr = _as_1d(traj_rewards, "traj_rewards", np.float64)
  tg = _as_1d(traj_group_ids, "traj_group_ids")
  _check_len(len(tr), traj_group_ids=tg)
  st = _as_1d(step_traj, "step_traj")
  if not np.issubdtype(st.dtype, np.integer) and len(st):
    raise ValueError(f"step_traj must hold integer indices, got {st.dtype}")
  st = st.astype(np.int64)
  if len(st) and (st.min() < 0 or st.max() >= len(tr)):
    raise ValueError(
        f"step_traj indices must be in [0, {len(tr)}), got"
        f" [{st.min()}, {st.max()}]"
    )
  si = _as_1d(step_idx, "step_idx")
  sr = _as_1d(step_rewards, "step_rewards", np.float64)
  _check_len(len(st), step_idx=si, step_rewards=sr, step_anchor=step_anchor)
  if episode_stats not in EPISODE_STATS:
    raise ValueError(
        f"episode_stats must be one of {EPISODE_STATS}, got {episode_stats!r}"
    )
  if len(st) == 0:
    return np.zeros(0, np.float32)

  _, tg_dense = np.unique(tg, return_inverse=True)
  tg_dense = tg_dense.ravel()
  if episode_stats == "trajectories":
    a_e = _group_normalize(tr, tg_dense, normalize_std=normalize_std, eps=eps)[
        st
    ]
  else:
    a_e = _group_normalize(
        tr[st], tg_dense[st], normalize_std=normalize_std, eps=eps
    )

  returns = discounted_step_returns(sr, st, si, gamma=gamma).astype(np.float64)
  groups = step_groups(
      tg_dense[st], step_anchor, similarity_threshold=similarity_threshold
  )
  a_s = _group_normalize(returns, groups, normalize_std=normalize_std, eps=eps)
  return (a_e + omega * a_s).astype(np.float32)


def gae_step_advantages(
    step_rewards,
    step_values,
    step_traj,
    step_idx,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
  """Turn-level GAE over the steps of each trajectory (for PPO).

    delta_t = r_t + gamma * V_{t+1} - V_t,   V after the last step = 0
    A_t     = delta_t + gamma * lam * A_{t+1}
    ret_t   = A_t + V_t

  Steps are ordered by ``step_idx`` within each trajectory.

  Args:
    step_rewards: [S] r_t.
    step_values: [S] critic value V_t of the step (its state before acting).
    step_traj: [S] trajectory key per step.
    step_idx: [S] position in the trajectory.
    gamma: discount.
    lam: GAE lambda.

  Returns:
    (advantages [S], returns [S]), float32, in input order.
  """
  r = _as_1d(step_rewards, "step_rewards", np.float64)
  v = _as_1d(step_values, "step_values", np.float64)
  traj = _as_1d(step_traj, "step_traj")
  idx = _as_1d(step_idx, "step_idx")
  _check_len(len(r), step_values=v, step_traj=traj, step_idx=idx)
  adv = np.zeros(len(r), np.float64)
  for pos in _traj_order(traj, idx):
    next_v, next_a = 0.0, 0.0
    for p in pos[::-1]:
      delta = r[p] + gamma * next_v - v[p]
      next_a = delta + gamma * lam * next_a
      adv[p] = next_a
      next_v = v[p]
  return adv.astype(np.float32), (adv + v).astype(np.float32)


# ------------------------------------------------- verl-agent row credit


def _step_arrays(step_rewards, step_penalty, step_traj):
  r = _as_1d(step_rewards, "step_rewards", np.float64)
  p = _as_1d(step_penalty, "step_penalty", np.float64)
  traj = _as_1d(step_traj, "step_traj")
  _check_len(len(r), step_penalty=p, step_traj=traj)
  return r, p, traj


def episode_row_scores(step_rewards, step_penalty, step_traj) -> np.ndarray:
  """verl-agent's score of each step row: the episode reward, plus the
  invalid-action penalty on the offending row only.

    s_t = sum_{k in tau(t)} (r_k - p_k) + p_t

  ``r_k`` is the step reward *including* its penalty ``p_k`` (0 on valid
  steps), so ``sum_k (r_k - p_k)`` is the episode's reward without
  penalties (verl-agent's ``episode_rewards``: the sum of the
  environment's rewards) and the penalty of a step lands on that step's
  row alone (``apply_invalid_action_penalty``).

  Args:
    step_rewards: [S] r_t, penalty included.
    step_penalty: [S] p_t (the penalty if the step was invalid, else 0).
    step_traj: [S] trajectory key of each step.

  Returns:
    [S] float64 row scores.
  """
  r, p, traj = _step_arrays(step_rewards, step_penalty, step_traj)
  if len(r) == 0:
    return np.zeros(0, np.float64)
  _, ti = np.unique(traj, return_inverse=True)
  ti = ti.ravel()
  episode = np.bincount(ti, weights=r - p)
  return episode[ti] + p


def penalty_on_row_returns(
    step_rewards, step_penalty, step_traj, step_idx, *, gamma: float
) -> np.ndarray:
  """GiGPO step returns as verl-agent forms them:

    R_t = sum_{k >= t} gamma^(k - t) (r_k - p_k) + p_t

  verl-agent discounts the environment's rewards
  (``compute_step_discounted_returns``), then subtracts the penalty from
  the offending row's return (``apply_invalid_action_penalty`` on
  ``step_rewards``): a penalty is never discounted into earlier steps.

  Returns:
    [S] float64 returns, in the input order.
  """
  r, p, traj = _step_arrays(step_rewards, step_penalty, step_traj)
  disc = discounted_step_returns(r - p, traj, step_idx, gamma=gamma)
  return disc.astype(np.float64) + p


def gigpo_row_advantages(
    row_scores,
    row_group_ids,
    step_returns,
    step_anchor: Sequence[str],
    *,
    omega: float = 1.0,
    normalize_std: bool = True,
    similarity_threshold: Optional[float] = None,
    eps: float = 1e-6,
) -> np.ndarray:
  """GiGPO with every step row a sample of its task group (verl-agent).

    A_E(t) = (s_t - mean_{u in g(t)} s_u) / F     (over the group's rows)
    A_S(t) = (R_t - mean_{u in G(t)} R_u) / F     (over the step group)
    A      = A_E + omega * A_S

  ``s`` are row scores (:func:`episode_row_scores`), ``R`` step returns
  (:func:`penalty_on_row_returns`); g(t) is the row's task group, G(t) its
  anchor-state group (:func:`step_groups`); F = std + eps (ddof = 1) with
  ``normalize_std``, else 1. Groups of one get 0. This is
  ``episode_norm_reward(compute_mean_std_cross_steps=True)`` plus
  ``step_norm_reward`` of verl-agent's ``gigpo/core_gigpo.py``.

  Args:
    row_scores: [S] s_t.
    row_group_ids: [S] task-group key of each row.
    step_returns: [S] R_t.
    step_anchor: [S] anchor observation text per row.
    omega: weight of the step advantage.
    normalize_std: divide by std + eps (both levels).
    similarity_threshold: None = exact anchor match.
    eps: added to the std.

  Returns:
    [S] float32 advantages.
  """
  s = _as_1d(row_scores, "row_scores", np.float64)
  g = _as_1d(row_group_ids, "row_group_ids")
  ret = _as_1d(step_returns, "step_returns", np.float64)
  _check_len(len(s), row_group_ids=g, step_returns=ret, step_anchor=step_anchor)
  if len(s) == 0:
    return np.zeros(0, np.float32)
  _, gi = np.unique(g, return_inverse=True)
  gi = gi.ravel()
  a_e = _group_normalize(s, gi, normalize_std=normalize_std, eps=eps)
  groups = step_groups(
      gi, step_anchor, similarity_threshold=similarity_threshold
  )
  a_s = _group_normalize(ret, groups, normalize_std=normalize_std, eps=eps)
  return (a_e + omega * a_s).astype(np.float32)


def row_token_gae_advantages(row_rewards, token_values):
  """verl's GAE of each row alone (verl-agent's multi-turn PPO), gamma =
  lambda = 1, the row's reward on its last response token:

    delta_j = r_j + V_{s,j+1} - V_{s,j}   (r_j = r_s on the last token)
    A_{s,j} = sum_{k >= j} delta_k = r_s - V_{s,j},   ret_{s,j} = r_s

  verl-agent hands every step row to verl's ``compute_gae_advantage_return``
  on its own: no value is carried from one step of an episode to the next,
  and the values after the row's last token (padding) cancel in the sum.
  ``V_{s,j}`` is the critic's value of the state before response token j:
  at the last prompt token for j = 0 (verl: ``values[:, -R - 1:-1]``).

  Args:
    row_rewards: [S] r_s (the row score, :func:`episode_row_scores`).
    token_values: S arrays [n_s] of V_{s,j} (a scalar: one value for every
      token of the row).

  Returns:
    (advantages: S float32 arrays shaped as ``token_values[s]``,
     returns [S] float32).
  """
  r = _as_1d(row_rewards, "row_rewards", np.float64)
  if len(token_values) != len(r):
    raise ValueError(f"{len(token_values)} value rows for {len(r)} row rewards")
  adv = [
      (r_s - np.asarray(v, np.float64)).astype(np.float32)
      for r_s, v in zip(r, token_values)
  ]
  return adv, r.astype(np.float32)


def whiten_token_rows(rows, *, sum_fn=None) -> list:
  """verl's ``masked_whiten`` over every token of ``rows`` (S arrays of
  per-token values, each token counted once: :func:`whiten` of their
  concatenation, ``sum_fn`` as there), split back into the rows."""
  sizes = [np.size(x) for x in rows]
  flat = (
      np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in rows])
      if rows
      else np.zeros(0)
  )
  y = whiten(flat, sum_fn=sum_fn)
  return [
      part.reshape(np.shape(x))
      for part, x in zip(np.split(y, np.cumsum(sizes)[:-1]), rows)
  ]


def whiten(
    values, token_counts=None, *, eps: float = 1e-8, sum_fn=None
) -> np.ndarray:
  """verl's ``masked_whiten`` of per-row values broadcast to their tokens.

    N    = sum_s n_s
    mean = sum_s n_s x_s / (N + 1e-8)
    var  = sum_s n_s (x_s - mean)^2 / (N + 1e-8) * N / (N - 1)
    y_s  = (x_s - mean) / sqrt(var + eps)

  Row s counts as its ``n_s`` response tokens, so the result equals
  whitening the [S, T] token array over the loss mask (the mean and
  unbiased variance of ``masked_whiten``). ``token_counts=None`` counts
  every row once. N < 2 gives zeros (verl raises).

  Args:
    values: [S] per-row values x_s.
    token_counts: [S] response tokens per row n_s (>= 0), or None.
    eps: added to the variance.
    sum_fn: the sums over s go through it (array -> array): with
      ``distributed.global_sum`` every process whitens its rows with the
      statistics of all processes' rows, verl's whole-batch whitening
      (every process calls it, twice, even with no rows; its sums travel
      in float32 with JAX's default x64 off); None: this call's rows
      only.

  Returns:
    [S] float32.
  """
  x = _as_1d(values, "values", np.float64)
  n = (
      np.ones(len(x))
      if token_counts is None
      else _as_1d(token_counts, "token_counts", np.float64)
  )
  _check_len(len(x), token_counts=n)
  if (n < 0).any():
    raise ValueError("token_counts must be >= 0")
  sums = (
      (lambda v: v)
      if sum_fn is None
      else (lambda v: np.asarray(sum_fn(v), np.float64))
  )
  total, weighted = sums(np.array([n.sum(), (n * x).sum()]))
  mean = weighted / (total + 1e-8)
  squares = sums(np.array([(n * (x - mean) ** 2).sum()]))[0]
  if total < 2:
    return np.zeros(len(x), np.float32)
  var = squares / (total + 1e-8) * total / (total - 1)
  return ((x - mean) / np.sqrt(var + eps)).astype(np.float32)


def broadcast_to_tokens(step_values, loss_mask) -> np.ndarray:
  """x[s, t] = step_values[s] * loss_mask[s, t]: a step's value on its tokens.

  Args:
    step_values: [S] per-step values (advantages, returns).
    loss_mask: [S, T] 1 on the step's response tokens.

  Returns:
    [S, T] float32.
  """
  v = _as_1d(step_values, "step_values", np.float32)
  m = np.asarray(loss_mask, np.float32)
  if m.ndim != 2 or m.shape[0] != v.shape[0]:
    raise ValueError(
        f"loss_mask must be [{v.shape[0]}, T], got shape {m.shape}"
    )
  return v[:, None] * m
