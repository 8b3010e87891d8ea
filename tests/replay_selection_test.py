"""Tests for rspo_jax.replay.selection / replayed: which trajectories of D a
step of A replays, in which step, with which advantages.

The hand-built D of most tests holds three groups of 8 one-step
trajectories (outcome reward 10 * won):
  group 0  traj  0..7   one win (traj 0), seven failures;
  group 1  traj  8..15  eight wins;
  group 2  traj 16..23  eight failures.
GRPO with std (advantages.py: sample std, ddof = 1, eps = 1e-6):
  group 0: mean 1.25, std sqrt((8.75^2 + 7 * 1.25^2) / 7) = sqrt(12.5),
           win 8.75 / sqrt(12.5) = 2.4748737, fail -1.25 / sqrt(12.5)
           = -0.35355339;
  groups 1, 2: every reward equal -> 0.
"""

import dataclasses
import math

import ml_collections
import numpy as np
import pytest

from rspo_jax import replay
from rspo_jax.replay import replayed
from rspo_jax.replay import selection
from rspo_jax.types import StepRecord
from rspo_jax.types import Trajectory

WIN = 8.75 / math.sqrt(12.5)  # 2.4748737
FAIL = -1.25 / math.sqrt(12.5)  # -0.35355339
ONE_OF_8, ALL_WIN, ALL_FAIL = range(3)


def make_traj(traj_id, group_id, won, n_steps=1, n_tokens=3):
  outcome = 10.0 if won else 0.0
  return Trajectory(
      [
          StepRecord(
              task_id=group_id,
              group_id=group_id,
              traj_id=traj_id,
              step_idx=i,
              prompt_ids=np.arange(4, dtype=np.int32),
              response_ids=np.arange(n_tokens, dtype=np.int32),
              behavior_logp=np.full(n_tokens, -1.0, np.float32),
              env_reward=outcome if i == n_steps - 1 else 0.0,
              outcome_reward=outcome,
              won=won,
              done=i == n_steps - 1,
              anchor_obs=f"task {group_id} step {i}",
          )
          for i in range(n_steps)
      ]
  )


def make_d(n_steps=1):
  """The three groups of the module docstring."""
  wins = {
      ONE_OF_8: [True] + [False] * 7,
      ALL_WIN: [True] * 8,
      ALL_FAIL: [False] * 8,
  }
  return [
      make_traj(8 * g + j, g, w, n_steps)
      for g in range(3)
      for j, w in enumerate(wins[g])
  ]


def ids(trajs):
  return [t.steps[0].traj_id for t in trajs]


def algo(name="grpo", normalize_std=True):
  return ml_collections.ConfigDict(
      dict(
          name=name,
          normalize_std=normalize_std,
          gamma=0.95,
          gae_lambda=1.0,
          omega=1.0,
          anchor_similarity=None,
          credit_mode="verl_agent",
          invalid_action_penalty=-0.1,
      )
  )


def run_steps(d, n, strategy, seed, k=3, used=(), reuse="wins"):
  """k successive steps of one loop: (their selections, the used set)."""
  out, used = [], list(used)
  for step in range(k):
    sel = selection.select(
        d, n, strategy, np.random.default_rng([seed, step]), used, reuse=reuse
    )
    out.append(sel)
    used = sel.used
  return out, used


# -- alpha as a share of samples ----------------------------------------------


@pytest.mark.parametrize(
    "alpha, tasks, group, want",
    [
        (1 / 8, 16, 8, (16, 14)),  # the paper: 14 online + 2 offline groups
        (1 / 8, 128, 1, (16, 112)),  # PPO: 112 online + 16 replayed
        (1 / 4, 4, 4, (4, 3)),  # the CPU recipe
        (1 / 8, 4, 4, (2, 3)),  # half a group: 2 trajectories in one slot
        (1 / 2, 2, 2, (2, 1)),
        (0.0, 16, 8, (0, 16)),
        (1.0, 4, 4, (16, 0)),
        (0.3125, 1, 8, (3, 0)),  # 2.5 rounds half up
    ],
)
def test_replay_counts(alpha, tasks, group, want):
  assert selection.replay_counts(alpha, tasks, group) == want


def test_replay_counts_bad_arguments():
  with pytest.raises(ValueError, match="alpha"):
    selection.replay_counts(1.5, 16, 8)
  with pytest.raises(ValueError, match="group_size=0"):
    selection.replay_counts(0.5, 16, 0)


# -- reward-based --------------------------------------------------------------


def test_reward_takes_wins_first_then_unused_in_later_steps():
  """reuse='pass' (the earlier rule): one pass over D, unused first."""
  d = make_d()
  winners = {0} | set(range(8, 16))
  step_of_lone_win = set()
  for seed in range(30):
    (s1, s2, s3), used = run_steps(d, 6, "reward", seed, reuse="pass")
    assert set(ids(s1.trajectories)) < winners  # 6 of the 9 wins
    # Step 2: the 3 wins left, then 3 failures (ties at random).
    assert set(ids(s2.trajectories[:3])) == winners - set(ids(s1.trajectories))
    assert not winners & set(ids(s2.trajectories[3:]))
    drawn = ids(s1.trajectories) + ids(s2.trajectories) + ids(s3.trajectories)
    assert len(drawn) == len(set(drawn)) == 18  # nothing twice in a loop
    assert not any(s.restarted for s in (s1, s2, s3))
    assert used == sorted(drawn)
    step_of_lone_win.add(1 if 0 in ids(s1.trajectories) else 2)
  assert step_of_lone_win == {1, 2}  # the tie among wins is random


def test_reward_ranks_by_outcome_after_wins():
  # Rewards of failures differ (invalid-action penalties): higher first.
  d = [make_traj(0, 0, False), make_traj(1, 0, True), make_traj(2, 1, False)]
  d[0].steps[0].outcome_reward = -0.1
  d[2].steps[0].outcome_reward = -0.3
  for seed in range(5):
    sel = selection.select(d, 3, "reward", np.random.default_rng(seed))
    assert ids(sel.trajectories) == [1, 0, 2]


def test_reward_replays_wins_in_every_step_of_a_loop():
  """reuse='wins': unused wins, then replayed wins, then the rest. D has
  9 wins of 24; steps of 6: 6 unused wins; 3 unused wins and the 3
  best-ranked replayed ones; 6 replayed wins -- never a failure while D
  holds wins, nothing twice in one step."""
  d = make_d()
  winners = {0} | set(range(8, 16))
  for seed in range(10):
    (s1, s2, s3), used = run_steps(d, 6, "reward", seed)
    first, second, third = (ids(s.trajectories) for s in (s1, s2, s3))
    assert set(first) < winners and not s1.restarted
    assert set(second[:3]) == winners - set(first)  # unused wins first
    assert set(second[3:]) <= set(first) and s2.restarted
    assert set(third) <= winners and len(set(third)) == 6
    assert used == sorted(winners)
  # More than D's wins: the wins, then failures by outcome.
  (s1,), _ = run_steps(d, 12, "reward", 0, k=1)
  assert set(ids(s1.trajectories)[:9]) == winners
  assert not winners & set(ids(s1.trajectories)[9:])
  with pytest.raises(ValueError, match="reuse"):
    selection.select(d, 1, "reward", np.random.default_rng(0), reuse="all")


def test_variance_and_random_keep_one_pass_under_reuse_wins():
  d = make_d()
  for strategy in ("variance", "random"):
    a, _ = run_steps(d, 10, strategy, 3)
    b, _ = run_steps(d, 10, strategy, 3, reuse="pass")
    assert [ids(s.trajectories) for s in a] == [ids(s.trajectories) for s in b]


def test_a_new_pass_starts_when_d_is_used_up():
  d = make_d()
  (s1, s2, s3), used = run_steps(d, 10, "reward", seed=0, reuse="pass")
  first = ids(s1.trajectories) + ids(s2.trajectories)
  assert not s1.restarted and not s2.restarted and s3.restarted
  left = sorted(set(range(24)) - set(first))
  assert len(left) == 4 and sorted(ids(s3.trajectories)[:4]) == left
  refill = ids(s3.trajectories)[4:]  # the best 6 of D besides those 4
  assert len(refill) == 6 and set(refill) <= {0} | set(range(8, 16))
  assert used == sorted(refill)  # the new pass holds only what it drew


def test_more_than_d_holds_returns_each_trajectory_once():
  d = make_d()[:8]
  sel = selection.select(d, 20, "reward", np.random.default_rng(0))
  assert sorted(ids(sel.trajectories)) == list(range(8))
  assert ids(sel.trajectories)[0] == 0 and not sel.restarted
  again = selection.select(d, 20, "reward", np.random.default_rng(1), sel.used)
  assert again.restarted and sorted(ids(again.trajectories)) == list(range(8))
  assert selection.select([], 4, "reward", np.random.default_rng(0)) == (
      selection.Selection([], [], False)
  )


def test_selection_ignores_input_order_and_stale_used_ids():
  d = make_d()
  shuffled = [d[i] for i in np.random.default_rng(5).permutation(len(d))]
  for strategy in selection.STRATEGIES:
    a = selection.select(d, 9, strategy, np.random.default_rng(3), [99, 1])
    b = selection.select(
        shuffled, 9, strategy, np.random.default_rng(3), [1, 99]
    )
    assert ids(a.trajectories) == ids(b.trajectories)
    assert 1 not in ids(a.trajectories) and 99 not in a.used


# -- variance-based, random ----------------------------------------------


def test_variance_takes_the_mixed_group_whole_then_tied_groups_whole():
  # Population variances: group 0 100 * 1/8 * 7/8 = 10.94; groups 1, 2: 0.
  d = make_d()
  orders, second = set(), set()
  for seed in range(30):
    (s1, s2, s3), _ = run_steps(d, 8, "variance", seed)
    assert sorted(ids(s1.trajectories)) == list(range(8))
    g2 = {t.group_id for t in s2.trajectories}
    g3 = {t.group_id for t in s3.trajectories}
    assert len(g2) == len(g3) == 1 and g2 | g3 == {ALL_WIN, ALL_FAIL}
    orders.add(tuple(ids(s1.trajectories)))
    second |= g2
  assert len(orders) > 20  # random order within the group
  assert second == {ALL_WIN, ALL_FAIL}  # tied groups in random order


def test_random_is_uniform_without_replacement():
  d = make_d()
  firsts = set()
  for seed in range(30):
    (s1, s2, s3), used = run_steps(d, 8, "random", seed)
    drawn = ids(s1.trajectories) + ids(s2.trajectories) + ids(s3.trajectories)
    assert sorted(drawn) == list(range(24)) and used == list(range(24))
    firsts.add(drawn[0])
  assert len(firsts) > 10
  with pytest.raises(ValueError, match="'best'"):
    selection.select(d, 1, "best", np.random.default_rng(0))


def test_buffer_sample_trajectories_uses_the_selection(tmp_path):
  buf = replay.ReplayBuffer(str(tmp_path))
  buf.add_trajectories(make_d())
  got = buf.sample_trajectories(9, "reward", np.random.default_rng(0))
  assert set(ids(got)) == {0} | set(range(8, 16))
  rest = buf.sample_trajectories(
      9, "reward", np.random.default_rng(0), used=ids(got), reuse="pass"
  )
  assert not set(ids(rest)) & set(ids(got))
  again = buf.sample_trajectories(
      9, "reward", np.random.default_rng(0), used=ids(got)
  )
  assert set(ids(again)) == set(ids(got))  # the wins again


# -- advantages against the whole original group ------------------------------


def test_replayed_rows_keep_their_whole_group_advantage():
  d = make_d()
  adv = replayed.advantages_in_buffer(d, algo(), invalid_action_penalty=-0.1)
  want = [WIN] + [FAIL] * 7 + [0.0] * 16
  np.testing.assert_allclose(
      [adv[i][0] for i in range(24)], want, rtol=1e-5, atol=1e-6
  )
  # Step 1 of reward-based replay takes wins only; the lone win carries
  # its large advantage even without its group mates beside it.
  for seed in range(10):
    sel = selection.select(d, 9, "reward", np.random.default_rng(seed))
    records, a = replayed.rows(sel.trajectories, adv)
    assert [r.traj_id for r in records] == ids(sel.trajectories)
    np.testing.assert_allclose(
        a, [WIN if r.traj_id == 0 else 0.0 for r in records], rtol=1e-5
    )
    # Tokens: 3 per row, 27 in all, 3 of them (the lone win) non-zero.
    m = replayed.metrics(replayed.metric_sums(records, a))
    assert m["replay_nonzero_adv_frac"] == pytest.approx(1 / 9)
    assert m["replay_adv_mean"] == pytest.approx(WIN / 9, rel=1e-5)
    assert m["replay_success_frac"] == 1.0
    assert m["replay_trajectories"] == 9


def test_advantage_without_std_on_every_step_of_the_trajectory():
  # Two steps per trajectory: A = R - mean_g R on both steps of each.
  d = make_d(n_steps=2)
  adv = replayed.advantages_in_buffer(
      d, algo(normalize_std=False), invalid_action_penalty=-0.1
  )
  np.testing.assert_allclose(adv[0], [8.75, 8.75], rtol=1e-6)
  np.testing.assert_allclose(adv[3], [-1.25, -1.25], rtol=1e-6)
  np.testing.assert_allclose(adv[9], [0.0, 0.0])
  np.testing.assert_allclose(adv[20], [0.0, 0.0])
  records, a = replayed.rows([d[3], d[0]], adv)
  assert [(r.traj_id, r.step_idx) for r in records] == [
      (3, 0),
      (3, 1),
      (0, 0),
      (0, 1),
  ]
  np.testing.assert_allclose(a, [-1.25, -1.25, 8.75, 8.75], rtol=1e-6)
  m = replayed.metrics(replayed.metric_sums(records, a))
  assert m["replay_nonzero_adv_frac"] == 1.0
  assert m["replay_adv_mean"] == pytest.approx((8.75 - 1.25) / 2)
  assert m["replay_success_frac"] == 0.5 and m["replay_trajectories"] == 2


def test_gigpo_replayed_advantage_includes_the_step_group():
  # One step per trajectory, one anchor per group: the step group is the
  # task group and R_t = R, so A = A_E + A_S = 2 A_E.
  d = make_d()
  adv = replayed.advantages_in_buffer(
      d, algo("gigpo"), invalid_action_penalty=-0.1
  )
  np.testing.assert_allclose(
      [adv[0][0], adv[1][0], adv[8][0], adv[16][0]],
      [2 * WIN, 2 * FAIL, 0.0, 0.0],
      rtol=1e-5,
  )


def test_ppo_replayed_rows_get_gae_at_the_step():
  d = make_d()
  assert (
      replayed.advantages_in_buffer(d, algo("ppo"), invalid_action_penalty=-0.1)
      is None
  )
  records, a = replayed.rows(d[:2], None)
  assert a is None and len(records) == 2
  m = replayed.metrics(replayed.metric_sums(records, None))
  assert m["replay_nonzero_adv_frac"] == 0.0 and m["replay_trajectories"] == 2


# -- resume --------------------------------------------------------------


def test_used_set_survives_a_checkpoint_and_resume(tmp_path):
  """LoopState.replay_used is written in the checkpoint's meta and a
  resumed loop keeps drawing unused trajectories."""
  import jax.numpy as jnp  # noqa: PLC0415

  from rspo_jax.checkpoint import RunCheckpointer  # noqa: PLC0415
  from rspo_jax.rspo import LoopState  # noqa: PLC0415

  d = make_d()
  (s1,), used = run_steps(d, 6, "reward", seed=0, k=1)
  state = LoopState(loop=0, phase="A", a_steps=1, replay_used=used)
  ck = RunCheckpointer(str(tmp_path / "ckpt"))
  ck.save(3, {"policy": {"w": jnp.ones(2)}}, dataclasses.asdict(state))
  ck.close()
  ck = RunCheckpointer(str(tmp_path / "ckpt"))
  _, meta = ck.restore({"policy": {"w": jnp.ones(2)}})
  ck.close()
  resumed = LoopState(**meta)
  assert resumed == state and resumed.replay_used == sorted(
      ids(s1.trajectories)
  )
  s2 = selection.select(
      d,
      6,
      "reward",
      np.random.default_rng([0, 1]),
      resumed.replay_used,
      reuse="pass",
  )
  uninterrupted = selection.select(
      d, 6, "reward", np.random.default_rng([0, 1]), used, reuse="pass"
  )
  assert ids(s2.trajectories) == ids(uninterrupted.trajectories)
  assert not set(ids(s2.trajectories)) & set(ids(s1.trajectories))
  assert (
      LoopState(
          **{k: v for k, v in meta.items() if k != "replay_used"}
      ).replay_used
      == []
  )
