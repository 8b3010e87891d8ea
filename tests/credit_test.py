"""Tests of rspo_jax.credit: verl-agent's credit (default) and the earlier
per-trajectory credit, against numbers worked out by hand."""

import ml_collections
import numpy as np
import pytest

from rspo_jax import credit
from rspo_jax.types import StepRecord

RTOL = 1e-5
EPS = 1e-6
P = -0.1  # invalid-action penalty


def _rec(
    traj,
    group,
    step,
    env,
    invalid=False,
    anchor="",
    n_resp=1,
    dense=float("nan"),
):
  """A step record as collect.py fills it: env_reward = the environment's
  reward plus the penalty when the reply was invalid."""
  return StepRecord(
      task_id=group,
      group_id=group,
      traj_id=traj,
      step_idx=step,
      prompt_ids=np.zeros(3, np.int32),
      response_ids=np.ones(n_resp, np.int32),
      behavior_logp=np.zeros(n_resp, np.float32),
      env_reward=env + (P if invalid else 0.0),
      invalid=invalid,
      anchor_obs=anchor,
      dense_reward=dense,
  )


def _records():
  """Two groups; rows listed out of order.

  g0: traj 0 (won at step 2, step 1 invalid), anchors s0 s1 s2,
        env rewards (0, 0, 10) -> r = (0, -0.1, 10);
      traj 1 (lost, step 0 invalid), anchors s0 s1,
        env rewards (0, 0) -> r = (-0.1, 0).
  g1: traj 2 (won at step 1, step 0 invalid), anchors u0 u1,
        r = (-0.1, 10);
      traj 3 (won at step 0), anchor u0, r = (10).
  """
  return [
      _rec(1, 0, 1, 0.0, anchor="s1"),
      _rec(0, 0, 0, 0.0, anchor="s0"),
      _rec(2, 1, 1, 10.0, anchor="u1"),
      _rec(0, 0, 2, 10.0, anchor="s2"),
      _rec(1, 0, 0, 0.0, invalid=True, anchor="s0"),
      _rec(3, 1, 0, 10.0, anchor="u0"),
      _rec(0, 0, 1, 0.0, invalid=True, anchor="s1"),
      _rec(2, 1, 0, 0.0, invalid=True, anchor="u0"),
  ]


def _cfg(name, **kw):
  c = ml_collections.ConfigDict(
      dict(
          name=name,
          normalize_std=True,
          gamma=0.5,
          omega=1.0,
          anchor_similarity=None,
          invalid_action_penalty=P,
          credit_mode="verl_agent",
          gae_gamma=1.0,
          gae_lambda=1.0,
          gae_whiten=True,
      )
  )
  c.update(kw)
  return c


def _by_key(records, values):
  return {(r.traj_id, r.step_idx): float(v) for r, v in zip(records, values)}


def _advantages(name, records=None, **kw):
  records = records if records is not None else _records()
  rewards = credit.step_rewards(records, "outcome", invalid_action_penalty=P)
  adv, ret = credit.compute_advantages(records, rewards, _cfg(name, **kw))
  assert adv.dtype == np.float32 and ret is None
  return _by_key(records, adv)


def _check(got, expected, rtol=RTOL):
  assert set(got) == set(expected)
  for k, v in expected.items():
    assert np.isclose(got[k], v, rtol=rtol, atol=1e-6), (k, got[k], v)


# --------------------------------------------------------- verl-agent


def test_step_rewards_carry_the_penalty_on_its_step():
  recs = _records()
  r = _by_key(recs, credit.step_rewards(recs, "outcome"))
  assert r[(0, 1)] == pytest.approx(-0.1) and r[(0, 2)] == 10.0
  assert r[(0, 0)] == 0.0 and r[(1, 0)] == pytest.approx(-0.1)


def test_grpo_rows_score_episode_reward_plus_own_penalty():
  # Row scores s_t = (episode reward without penalties) + own penalty:
  # g0 rows: traj 0 (10, 9.9, 10), traj 1 (-0.1, 0): 5 rows, mean 5.96,
  #   deviations (4.04, 3.94, 4.04, -6.06, -5.96),
  #   sum of squares 120.412, sample variance 30.103.
  # g1 rows: traj 2 (9.9, 10), traj 3 (10): mean 9.9667,
  #   deviations (-1/15, 1/30, 1/30), sample std 1 / sqrt(300).
  got = _advantages("grpo", normalize_std=False)
  _check(
      got,
      {
          (0, 0): 4.04,
          (0, 1): 3.94,
          (0, 2): 4.04,
          (1, 0): -6.06,
          (1, 1): -5.96,
          (2, 0): -1 / 15,
          (2, 1): 1 / 30,
          (3, 0): 1 / 30,
      },
  )
  got = _advantages("grpo")
  sd0, s3 = np.sqrt(30.103) + EPS, np.sqrt(3.0)
  _check(
      got,
      {
          (0, 0): 4.04 / sd0,
          (0, 1): 3.94 / sd0,
          (0, 2): 4.04 / sd0,
          (1, 0): -6.06 / sd0,
          (1, 1): -5.96 / sd0,
          (2, 0): -2 / s3,
          (2, 1): 1 / s3,
          (3, 0): 1 / s3,
      },
      rtol=1e-4,
  )
  assert np.isclose(got[(0, 0)], 0.736338, rtol=1e-4)


def test_gigpo_penalty_on_row_not_discounted_back():
  # A_E: the row deviations of the GRPO test (no std).
  # Step returns, gamma 0.5, R_t = disc(env rewards)_t + p_t:
  #   traj 0: env (0, 0, 10) -> (2.5, 5, 10) + (0, -.1, 0) = (2.5, 4.9, 10)
  #   traj 1: (0, 0) + (-.1, 0) = (-.1, 0)
  #   traj 2: env (0, 10) -> (5, 10) + (-.1, 0) = (4.9, 10); traj 3: 10.
  # Step groups: s0 {2.5, -.1} -> +-1.3; s1 {4.9, 0} -> +-2.45; s2 {10},
  #   u1 {10} -> 0; u0 {4.9, 10} -> -+2.55.
  got = _advantages("gigpo", normalize_std=False)
  _check(
      got,
      {
          (0, 0): 4.04 + 1.3,
          (0, 1): 3.94 + 2.45,
          (0, 2): 4.04,
          (1, 0): -6.06 - 1.3,
          (1, 1): -5.96 - 2.45,
          (2, 0): -1 / 15 - 2.55,
          (2, 1): 1 / 30,
          (3, 0): 1 / 30 + 2.55,
      },
  )
  # omega scales the step part only.
  got = _advantages("gigpo", normalize_std=False, omega=0.0)
  assert np.isclose(got[(0, 1)], 3.94) and np.isclose(got[(3, 0)], 1 / 30)


def test_dense_source_same_convention():
  # PRM rewards (0.2, -0.5, 0.9), step 1 invalid: r = (0.2, -0.6, 0.9);
  # R_hat = 0.6, row scores (0.6, 0.5, 0.6). A one-step second trajectory
  # with r_hat 0.1 makes the group: rows (0.6, 0.5, 0.6, 0.1), mean 0.45.
  recs = [
      _rec(0, 0, i, 0.0, invalid=(i == 1), dense=d)
      for i, d in enumerate([0.2, -0.5, 0.9])
  ]
  recs.append(_rec(1, 0, 0, 0.0, dense=0.1))
  rewards = credit.step_rewards(recs, "dense", invalid_action_penalty=P)
  np.testing.assert_allclose(rewards, [0.2, -0.6, 0.9, 0.1], rtol=RTOL)
  adv, _ = credit.compute_advantages(
      recs, rewards, _cfg("grpo", normalize_std=False)
  )
  np.testing.assert_allclose(adv, [0.15, 0.05, 0.15, -0.35], rtol=RTOL)


def test_dense_noise_is_added_in_the_prm_units_before_the_penalty():
  """``rspo.dense_noise_sigma``: r_t = r_hat_t + N(0, sigma^2) + p_t, the
  noise in the units of the PRM's tanh outputs (the paper's), drawn from
  the given generator; the penalty is not noised and the outcome reward
  never is."""
  dense = [0.2, -0.5, 0.9, 0.1]
  recs = [
      _rec(0, 0, i, 10.0 * (i == 3), invalid=(i == 1), dense=d)
      for i, d in enumerate(dense)
  ]
  noisy = credit.step_rewards(
      recs,
      "dense",
      invalid_action_penalty=P,
      noise_sigma=0.3,
      rng=np.random.default_rng(7),
  )
  draws = np.random.default_rng(7).normal(0.0, 0.3, 4)
  np.testing.assert_allclose(
      noisy, np.array(dense) + draws + [0, P, 0, 0], rtol=RTOL
  )
  # The noise's spread is sigma, whatever the rewards' scale.
  many = [_rec(0, 0, i, 0.0, dense=0.5) for i in range(20000)]
  r = credit.step_rewards(
      many, "dense", noise_sigma=0.25, rng=np.random.default_rng(0)
  )
  assert abs(np.std(r) - 0.25) < 0.01 and abs(np.mean(r) - 0.5) < 0.01
  outcome = credit.step_rewards(
      recs,
      "outcome",
      invalid_action_penalty=P,
      noise_sigma=0.3,
      rng=np.random.default_rng(7),
  )
  np.testing.assert_allclose(outcome, [0, P, 0, 10.0], rtol=RTOL)


def test_trainer_gives_the_noise_in_the_dense_rewards_units():
  """sigma = 0.3 tanh units: a PRM storing r_hat / 0.1 (its ``tanh_unit``
  10) gets noise of std 3 on its stored rewards; a dense function without
  ``tanh_unit`` (environment progress, user functions) gets 0.3."""
  from types import SimpleNamespace

  from rspo_jax.rspo import RSPOTrainer

  cfg = ml_collections.ConfigDict({"rspo": {"dense_noise_sigma": 0.3}})
  prm_fn = lambda records: None
  prm_fn.tanh_unit = 10.0
  sigma = RSPOTrainer.dense_noise_sigma.fget
  assert sigma(SimpleNamespace(cfg=cfg, dense_fn=prm_fn)) == pytest.approx(3)
  assert sigma(SimpleNamespace(cfg=cfg, dense_fn=None)) == pytest.approx(0.3)


# --------------------------------------------------------- trajectory


def test_trajectory_mode_keeps_the_earlier_credit():
  # R(tau) = sum_t r_t: g0 (9.9, -0.1) -> +-5 (std sqrt(50)); g1 (9.9, 10)
  # -> -+0.05 (std 0.05 sqrt(2)): every step of a trajectory alike.
  got = _advantages("grpo", normalize_std=False, credit_mode="trajectory")
  _check(
      got,
      {
          (0, 0): 5,
          (0, 1): 5,
          (0, 2): 5,
          (1, 0): -5,
          (1, 1): -5,
          (2, 0): -0.05,
          (2, 1): -0.05,
          (3, 0): 0.05,
      },
  )
  got = _advantages("grpo", credit_mode="trajectory")
  h = 1 / np.sqrt(2)
  assert np.isclose(got[(0, 1)], h, rtol=1e-4)
  assert np.isclose(got[(2, 1)], -h, rtol=1e-3)
  # GiGPO: R_t = disc(r)_t with the penalty discounted back (gamma .5):
  #   traj 0 (2.45, 4.9, 10), traj 1 (-.1, 0), traj 2 (4.9, 10), traj 3 10.
  #   s0 {2.45, -.1} -> +-1.275; s1 +-2.45; u0 -+2.55.
  got = _advantages("gigpo", normalize_std=False, credit_mode="trajectory")
  _check(
      got,
      {
          (0, 0): 6.275,
          (0, 1): 7.45,
          (0, 2): 5,
          (1, 0): -6.275,
          (1, 1): -7.45,
          (2, 0): -2.6,
          (2, 1): -0.05,
          (3, 0): 2.6,
      },
  )


def test_unknown_credit_mode():
  with pytest.raises(ValueError, match="credit_mode"):
    _advantages("grpo", credit_mode="tokens")


# --------------------------------------------------------------- PPO


def _ppo_episode():
  """One 3-step episode: env rewards (0, 0, 10), step 1 invalid, so
  r = (0, -0.1, 10); critic values V = (4, 6, 8); 2, 1, 1 response tokens.
  """
  recs = [
      _rec(0, 0, i, e, invalid=(i == 1), n_resp=n)
      for i, (e, n) in enumerate([(0.0, 2), (0.0, 1), (10.0, 1)])
  ]
  return recs, np.array([4.0, 6.0, 8.0])


def _ppo(values=None, token_counts=None, **kw):
  recs, v = _ppo_episode()
  rewards = credit.step_rewards(recs, "outcome", invalid_action_penalty=P)
  return credit.compute_advantages(
      recs,
      rewards,
      _cfg("ppo", **kw),
      v if values is None else values,
      token_counts=token_counts,
  )


def _tokens(rows):
  return [np.asarray(r).tolist() for r in rows]


def test_ppo_verl_agent_token_credit_by_hand():
  """verl's GAE on each row alone (gamma = lambda = 1): A_{t,j} = s_t -
  V_{t,j} on every response token, returns s_t; whitened over tokens."""
  # Row scores s = (10, 9.9, 10). Per-token values: row 0 (4, 5) on its 2
  # tokens, rows 1 and 2 (6), (8): A = (6, 5), (3.9), (2).
  values = [np.array([4.0, 5.0]), np.array([6.0]), np.array([8.0])]
  adv, ret = _ppo(values=values, gae_whiten=False)
  np.testing.assert_allclose(
      np.concatenate(adv), [6.0, 5.0, 3.9, 2.0], rtol=RTOL
  )
  assert [a.shape for a in adv] == [(2,), (1,), (1,)]
  np.testing.assert_allclose(ret, [10.0, 9.9, 10.0], rtol=RTOL)
  # Whitened over the tokens (6, 5, 3.9, 2): mean 4.225; squared
  # deviations 1.775^2 + 0.775^2 + 0.325^2 + 2.225^2 = 8.8075, / 3.
  adv, ret = _ppo(values=values)
  sd = np.sqrt(8.8075 / 3)
  np.testing.assert_allclose(
      np.concatenate(adv),
      np.array([1.775, 0.775, -0.325, -2.225]) / sd,
      rtol=RTOL,
  )
  np.testing.assert_allclose(ret, [10.0, 9.9, 10.0], rtol=RTOL)


def test_ppo_verl_agent_scalar_values_count_on_every_token():
  # One value a row, V = (4, 6, 8), on its 2, 1, 1 tokens: token
  # advantages (6, 6), (3.9), (2); mean 4.475; squared deviations
  # 2 * 1.525^2 + 0.575^2 + 2.475^2 = 11.1075, / 3 = 3.7025.
  adv, ret = _ppo()
  sd = np.sqrt(3.7025)
  np.testing.assert_allclose(
      np.concatenate(adv),
      np.array([1.525, 1.525, -0.575, -2.475]) / sd,
      rtol=RTOL,
  )
  np.testing.assert_allclose(
      np.concatenate(adv), [0.792542, 0.792542, -0.298827, -1.286257], rtol=RTOL
  )
  np.testing.assert_allclose(ret, [10.0, 9.9, 10.0], rtol=RTOL)
  # Explicit counts (0, 1, 1): statistics over (3.9, 2) alone, mean 2.95,
  # sample std 0.95 sqrt(2); the row without tokens has no advantage.
  adv, _ = _ppo(token_counts=[0, 1, 1])
  s2 = np.sqrt(2.0)
  assert adv[0].size == 0
  np.testing.assert_allclose(
      np.concatenate(adv[1:]), [1 / s2, -1 / s2], rtol=RTOL
  )


def test_ppo_verl_agent_rejects_discounting():
  with pytest.raises(ValueError, match="gae_gamma"):
    _ppo(gae_gamma=0.95)
  with pytest.raises(ValueError, match="gae_lambda"):
    _ppo(gae_lambda=0.9)
  with pytest.raises(ValueError, match="critic"):
    credit.compute_advantages(_ppo_episode()[0], np.zeros(3), _cfg("ppo"))


def test_ppo_trajectory_mode_gae_across_steps_by_hand():
  # gae_gamma = gae_lambda = 1 (default): A_t = sum_{k>=t} r_k - V_t
  #   = (9.9 - 4, 9.9 - 6, 10 - 8) = (5.9, 3.9, 2); returns (9.9, 9.9, 10).
  adv, ret = _ppo(credit_mode="trajectory", gae_whiten=False)
  np.testing.assert_allclose(adv, [5.9, 3.9, 2.0], rtol=RTOL)
  np.testing.assert_allclose(ret, [9.9, 9.9, 10.0], rtol=RTOL)
  # The earlier PPO credit: gamma 0.95, lambda 1, no whitening.
  #   t2: delta = 10 - 8 = 2,                 A = 2
  #   t1: delta = -.1 + .95 * 8 - 6 = 1.5,    A = 1.5 + .95 * 2 = 3.4
  #   t0: delta = 0 + .95 * 6 - 4 = 1.7,      A = 1.7 + .95 * 3.4 = 4.93
  adv, ret = _ppo(credit_mode="trajectory", gae_gamma=0.95, gae_whiten=False)
  np.testing.assert_allclose(adv, [4.93, 3.4, 2.0], rtol=RTOL)
  np.testing.assert_allclose(ret, [8.93, 9.4, 10.0], rtol=RTOL)
  # gamma .9, lambda .5: t2 A = 2; t1 delta = -.1 + 7.2 - 6 = 1.1,
  #   A = 1.1 + .45 * 2 = 2.0; t0 delta = 5.4 - 4 = 1.4, A = 1.4 + .9 = 2.3.
  adv, _ = _ppo(
      credit_mode="trajectory", gae_gamma=0.9, gae_lambda=0.5, gae_whiten=False
  )
  np.testing.assert_allclose(adv, [2.3, 2.0, 2.0], rtol=RTOL)
  # Per-token critic values: the step's value is the first token's.
  adv, _ = _ppo(
      values=[np.array([4.0, 99.0]), np.array([6.0]), np.array([8.0])],
      credit_mode="trajectory",
      gae_whiten=False,
  )
  np.testing.assert_allclose(adv, [5.9, 3.9, 2.0], rtol=RTOL)


def test_a_host_without_rows_joins_ppos_whitening_sums():
  """Multi-host PPO whitens through a collective sum: a host whose share
  of the step was empty makes the same two calls (of zeros) as one with
  rows, so its peers do not wait; nothing without a sum_fn, for GRPO or
  with whitening off."""
  calls = []

  def sum_fn(x):
    calls.append(np.asarray(x).tolist())
    return x

  credit.join_ppo_whitening(_cfg("ppo"), sum_fn)
  assert calls == [[0.0, 0.0], [0.0]]
  recs = _records()
  credit.compute_advantages(
      recs,
      np.zeros(len(recs)),
      _cfg("ppo"),
      values=[0.0] * len(recs),
      sum_fn=sum_fn,
  )
  assert len(calls) == 4  # a host with rows: the same two sums
  for cfg, fn in (
      (_cfg("ppo"), None),
      (_cfg("grpo"), sum_fn),
      (_cfg("ppo", gae_whiten=False), sum_fn),
  ):
    credit.join_ppo_whitening(cfg, fn)
  assert len(calls) == 4
