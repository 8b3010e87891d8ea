"""Tests of rspo_jax.advantages against numbers worked out by hand."""

import numpy as np
import pytest

from rspo_jax import advantages as adv_lib

RTOL = 1e-5
EPS = 1e-6
S2 = np.sqrt(2.0)


# ---------------------------------------------------------------- GRPO


def test_grpo_two_groups_with_and_without_std():
  r = [1, 2, 3, 4, 5, 6]
  g = [0, 0, 0, 1, 1, 1]
  # Each group: mean in the middle, sample std (ddof 1) of (x-1, x, x+1) = 1.
  a = adv_lib.grpo_advantages(r, g)
  assert a.dtype == np.float32
  np.testing.assert_allclose(
      a, np.array([-1, 0, 1, -1, 0, 1]) / (1 + EPS), rtol=RTOL
  )
  a = adv_lib.grpo_advantages(r, g, normalize_std=False)
  np.testing.assert_allclose(a, [-1, 0, 1, -1, 0, 1], rtol=RTOL)


def test_grpo_one_group_of_six():
  # mean 3.5, sample std sqrt(17.5 / 5) = sqrt(3.5) = 1.870829
  a = adv_lib.grpo_advantages(np.arange(1, 7), ["t"] * 6)
  expected = (np.arange(1, 7) - 3.5) / (np.sqrt(3.5) + EPS)
  np.testing.assert_allclose(a, expected, rtol=RTOL)
  assert np.isclose(a[0], -1.336306, rtol=RTOL)


def test_grpo_singleton_and_constant_groups():
  # 'a' alone -> 0; 'b' = (1, 3): mean 2, std sqrt(2); 'c' all equal -> 0.
  a = adv_lib.grpo_advantages(
      [5.0, 1.0, 3.0, 7.0, 7.0], ["a", "b", "b", "c", "c"]
  )
  np.testing.assert_allclose(
      a, [0.0, -1 / (S2 + EPS), 1 / (S2 + EPS), 0.0, 0.0], rtol=RTOL
  )
  assert adv_lib.grpo_advantages([], []).shape == (0,)


def test_grpo_bad_input():
  with pytest.raises(ValueError, match="group_ids"):
    adv_lib.grpo_advantages([1.0, 2.0], [0])
  with pytest.raises(ValueError, match="rewards"):
    adv_lib.grpo_advantages([[1.0]], [0])


# ---------------------------------------------------------------- GiGPO


def test_discounted_step_returns():
  # gamma 0.95, rewards (0, 0, 10): 9.025, 9.5, 10; steps given out of order.
  r = adv_lib.discounted_step_returns(
      [10.0, 0.0, 0.0, 1.0], [7, 7, 7, 3], [2, 0, 1, 0], gamma=0.95
  )
  np.testing.assert_allclose(r, [10.0, 9.025, 9.5, 1.0], rtol=RTOL)
  with pytest.raises(ValueError, match="duplicates"):
    adv_lib.discounted_step_returns([1.0, 1.0], [0, 0], [0, 0], gamma=1.0)


def _gigpo_case():
  """Two task groups, gamma 0.5, steps listed out of order.

  group g0: traj 0 (R 10): anchors s0 s1,    rewards 0 10  -> R_t 5 10
            traj 1 (R 0):  anchors s0 u0 s1, rewards 0 0 2 -> R_t .5 1 2
  group g1: traj 2 (R 1):  anchors u0 u1,    rewards 0 1   -> R_t .5 1
            traj 3 (R 0):  anchors u0,       rewards 0     -> R_t 0
            traj 4 (R 0):  anchors u0 u9,    rewards 0 0   -> R_t 0 0
  Step groups: g0/s0 {5, .5}, g0/s1 {10, 2}, g0/u0 {1} (size 1: u0 of g1
  is another task group), g1/u0 {.5, 0, 0}, g1/u1 {1}, g1/u9 {0}.
  """
  traj_r = [10.0, 0.0, 1.0, 0.0, 0.0]
  traj_g = ["g0", "g0", "g1", "g1", "g1"]
  # (traj, step_idx, reward, anchor), shuffled.
  steps = [
      (1, 2, 2.0, "s1"),
      (0, 0, 0.0, "s0"),
      (2, 1, 1.0, "u1"),
      (1, 0, 0.0, "s0"),
      (4, 1, 0.0, "u9"),
      (0, 1, 10.0, "s1"),
      (3, 0, 0.0, "u0"),
      (1, 1, 0.0, "u0"),
      (2, 0, 0.0, "u0"),
      (4, 0, 0.0, "u0"),
  ]
  st, si, sr, sa = (list(x) for x in zip(*steps))
  return traj_r, traj_g, st, si, sr, sa


def _by_key(case, values):
  _, _, st, si, _, _ = case
  return {(t, i): v for t, i, v in zip(st, si, values)}


def test_gigpo_without_std_by_hand():
  case = _gigpo_case()
  a = adv_lib.gigpo_advantages(*case, gamma=0.5, normalize_std=False)
  # A_E: g0 (10, 0) -> +-5; g1 (1, 0, 0) -> 2/3, -1/3, -1/3.
  # A_S: s0 5 vs .5 -> +-2.25; s1 10 vs 2 -> +-4; g1/u0 (.5, 0, 0) -> 1/3,
  #      -1/6, -1/6; size-1 groups -> 0.
  expected = {
      (0, 0): 5 + 2.25,
      (0, 1): 5 + 4,
      (1, 0): -5 - 2.25,
      (1, 1): -5 + 0,
      (1, 2): -5 - 4,
      (2, 0): 2 / 3 + 1 / 3,
      (2, 1): 2 / 3 + 0,
      (3, 0): -1 / 3 - 1 / 6,
      (4, 0): -1 / 3 - 1 / 6,
      (4, 1): -1 / 3 + 0,
  }
  got = _by_key(case, a)
  for k, v in expected.items():
    assert np.isclose(got[k], v, rtol=RTOL), (k, got[k], v)
  # omega scales the step part only.
  a = adv_lib.gigpo_advantages(*case, gamma=0.5, normalize_std=False, omega=0.5)
  got = _by_key(case, a)
  assert np.isclose(got[(0, 1)], 5 + 2, rtol=RTOL)
  assert np.isclose(got[(1, 1)], -5, rtol=RTOL)


def test_gigpo_with_std_by_hand():
  case = _gigpo_case()
  a = adv_lib.gigpo_advantages(*case, gamma=0.5)
  # Any 2-member group normalises to +-(d / (sqrt(2) d)) = +-1/sqrt(2).
  # g1 episodes (1, 0, 0): dev (2/3, -1/3, -1/3), std sqrt(1/3).
  # g1/u0 (.5, 0, 0): dev (1/3, -1/6, -1/6), std sqrt(1/12).
  h = 1 / S2
  big, small = (2 / 3) / np.sqrt(1 / 3), (1 / 3) / np.sqrt(1 / 3)
  expected = {
      (0, 0): 2 * h,
      (0, 1): 2 * h,
      (1, 0): -2 * h,
      (1, 1): -h,
      (1, 2): -2 * h,
      (2, 0): 2 * big,
      (2, 1): big,
      (3, 0): -2 * small,
      (4, 0): -2 * small,
      (4, 1): -small,
  }
  got = _by_key(case, a)
  for k, v in expected.items():
    assert np.isclose(got[k], v, rtol=1e-4), (k, got[k], v)
  assert np.isclose(big, 1.154701) and np.isclose(small, 0.577350)


def test_gigpo_episode_stats_over_steps():
  # verl-agent's default: g0 rows carry rewards (10, 10, 0, 0, 0): mean 4,
  # sample std sqrt((2*36 + 3*16) / 4) = sqrt(30).
  case = _gigpo_case()
  a = adv_lib.gigpo_advantages(
      *case, gamma=0.5, normalize_std=False, omega=0.0, episode_stats="steps"
  )
  got = _by_key(case, a)
  assert np.isclose(got[(0, 0)], 6.0) and np.isclose(got[(1, 2)], -4.0)
  # g1 rows (1, 1, 0, 0, 0): mean 0.4.
  assert np.isclose(got[(2, 1)], 0.6) and np.isclose(got[(3, 0)], -0.4)
  a = adv_lib.gigpo_advantages(
      *case, gamma=0.5, omega=0.0, episode_stats="steps"
  )
  got = _by_key(case, a)
  assert np.isclose(got[(0, 0)], 6 / np.sqrt(30), rtol=1e-4)
  with pytest.raises(ValueError, match="episode_stats"):
    adv_lib.gigpo_advantages(*case, episode_stats="tokens")


def test_gigpo_single_trajectory_group_is_zero():
  # One trajectory alone in its group: A_E = 0; its steps have distinct
  # anchors, so A_S = 0 too.
  a = adv_lib.gigpo_advantages(
      [3.0], [0], [0, 0], [0, 1], [1.0, 2.0], ["x", "y"]
  )
  np.testing.assert_array_equal(a, [0.0, 0.0])


def test_step_groups_similarity():
  # ratio(A, B) = 0.9, ratio(A, C) = 0.8, ratio(B, C) = 0.9.
  anchors = ["abcdefghij", "abcdefghiX", "abcdefghXY", "abcdefghij"]
  g = adv_lib.step_groups([0, 0, 0, 1], anchors)
  assert list(g) == [0, 1, 2, 3]
  # Greedy against each cluster's first member: C does not join {A, B}.
  g = adv_lib.step_groups([0, 0, 0, 1], anchors, similarity_threshold=0.9)
  assert g[0] == g[1] and g[2] != g[0] and g[3] not in (g[0], g[2])
  g = adv_lib.step_groups([0, 0, 0, 0], anchors, similarity_threshold=0.8)
  assert len(set(g)) == 1
  with pytest.raises(ValueError, match="similarity_threshold"):
    adv_lib.step_groups([0], ["a"], similarity_threshold=1.5)


def test_gigpo_similarity_threshold():
  # Two one-step trajectories of one group; R = (1, 0); no std.
  # Separate step groups: A = A_E = +-0.5. Merged: A_S = +-0.5 as well.
  args = (
      [1.0, 0.0],
      [0, 0],
      [0, 1],
      [0, 0],
      [1.0, 0.0],
      ["the cat sat on the mat", "the cat sat on the hat"],
  )
  a = adv_lib.gigpo_advantages(*args, normalize_std=False)
  np.testing.assert_allclose(a, [0.5, -0.5], rtol=RTOL)
  a = adv_lib.gigpo_advantages(
      *args, normalize_std=False, similarity_threshold=0.95
  )
  np.testing.assert_allclose(a, [1.0, -1.0], rtol=RTOL)


def test_gigpo_bad_input():
  with pytest.raises(ValueError, match="step_traj"):
    adv_lib.gigpo_advantages([1.0], [0], [1], [0], [0.0], ["a"])
  with pytest.raises(ValueError, match="step_anchor"):
    adv_lib.gigpo_advantages([1.0], [0], [0], [0], [0.0], ["a", "b"])


# ---------------------------------------------------------------- GAE


def test_gae_by_hand():
  # Trajectory 5: r (1, 0, 2), V (.5, 1, 1.5), gamma .9, lam .8:
  #   t2: delta = 2 - 1.5 = .5                  A = .5
  #   t1: delta = 0 + .9*1.5 - 1 = .35          A = .35 + .72*.5 = .71
  #   t0: delta = 1 + .9*1 - .5 = 1.4           A = 1.4 + .72*.71 = 1.9112
  # Trajectory 9: one step, r 3, V 1 -> A = 2. Rows interleaved, unsorted.
  rewards = [2.0, 3.0, 1.0, 0.0]
  values = [1.5, 1.0, 0.5, 1.0]
  traj = [5, 9, 5, 5]
  idx = [2, 0, 0, 1]
  a, ret = adv_lib.gae_step_advantages(
      rewards, values, traj, idx, gamma=0.9, lam=0.8
  )
  np.testing.assert_allclose(a, [0.5, 2.0, 1.9112, 0.71], rtol=RTOL)
  np.testing.assert_allclose(ret, [2.0, 3.0, 2.4112, 1.71], rtol=RTOL)
  # gamma = lam = 1: A_t = sum_{k>=t} r_k - V_t, returns = reward-to-go.
  a, ret = adv_lib.gae_step_advantages(rewards, values, traj, idx)
  np.testing.assert_allclose(a, [0.5, 2.0, 2.5, 1.0], rtol=RTOL)
  np.testing.assert_allclose(ret, [2.0, 3.0, 3.0, 2.0], rtol=RTOL)


def test_broadcast_to_tokens():
  out = adv_lib.broadcast_to_tokens([2.0, -1.0], [[0, 1, 1], [0, 0, 1]])
  assert out.dtype == np.float32
  np.testing.assert_array_equal(out, [[0, 2, 2], [0, 0, -1]])
  with pytest.raises(ValueError, match="loss_mask"):
    adv_lib.broadcast_to_tokens([1.0], [[1, 1], [1, 1]])


# ------------------------------------------------- verl-agent row credit


def test_episode_row_scores():
  # traj 4: r (0, -.1, 10), p (0, -.1, 0) -> episode 10, rows (10, 9.9, 10);
  # traj 2: r (-.1, -.1), both invalid -> episode 0, rows (-.1, -.1).
  s = adv_lib.episode_row_scores(
      [0.0, -0.1, -0.1, 10.0, -0.1],
      [0.0, -0.1, -0.1, 0.0, -0.1],
      [4, 4, 2, 4, 2],
  )
  np.testing.assert_allclose(s, [10.0, 9.9, -0.1, 10.0, -0.1], rtol=RTOL)
  assert adv_lib.episode_row_scores([], [], []).shape == (0,)
  with pytest.raises(ValueError, match="step_penalty"):
    adv_lib.episode_row_scores([1.0], [0.0, 0.0], [0])


def test_penalty_on_row_returns():
  # gamma .5, r (0, -.1, 10), p (0, -.1, 0): env rewards (0, 0, 10) ->
  # (2.5, 5, 10), plus p -> (2.5, 4.9, 10); steps given out of order.
  ret = adv_lib.penalty_on_row_returns(
      [10.0, 0.0, -0.1], [0.0, 0.0, -0.1], [1, 1, 1], [2, 0, 1], gamma=0.5
  )
  np.testing.assert_allclose(ret, [10.0, 2.5, 4.9], rtol=RTOL)


def test_gigpo_row_advantages_by_hand():
  # One task group, rows scores (10, 9.9, 0): mean 6.633.., deviations
  # (3.3667, 3.2667, -6.6333); returns (2, 4, 1) with anchors (a, b, a):
  # group a {2, 1} -> +-.5, group b {4} -> 0.
  a = adv_lib.gigpo_row_advantages(
      [10.0, 9.9, 0.0],
      [7, 7, 7],
      [2.0, 4.0, 1.0],
      ["a", "b", "a"],
      normalize_std=False,
  )
  m = 19.9 / 3
  np.testing.assert_allclose(a, [10 - m + 0.5, 9.9 - m, -m - 0.5], rtol=RTOL)
  # omega = 2, with std: step group a normalises to +-1/sqrt(2).
  a = adv_lib.gigpo_row_advantages(
      [1.0, 1.0, 1.0], [7, 7, 7], [2.0, 4.0, 1.0], ["a", "b", "a"], omega=2.0
  )
  np.testing.assert_allclose(a, [2 / S2, 0.0, -2 / S2], rtol=1e-4)


def _verl_gae(token_rewards, values, gamma=1.0, lam=1.0):
  """verl-agent's compute_gae_advantage_return, without whitening, on one
  row's response window (values after the row's end included)."""
  adv, last = np.zeros(len(values)), 0.0
  for t in reversed(range(len(values))):
    nxt = values[t + 1] if t < len(values) - 1 else 0.0
    last = token_rewards[t] + gamma * nxt - values[t] + gamma * lam * last
    adv[t] = last
  return adv, adv + np.asarray(values)


def test_row_token_gae_advantages_equal_verl_gae():
  a, ret = adv_lib.row_token_gae_advantages(
      [10.0, 9.9], [np.array([4.0, 5.0, 7.5]), 6.0]
  )
  np.testing.assert_allclose(a[0], [6.0, 5.0, 2.5], rtol=RTOL)
  np.testing.assert_allclose(a[1], 3.9, rtol=RTOL)
  np.testing.assert_allclose(ret, [10.0, 9.9], rtol=RTOL)
  assert a[0].dtype == ret.dtype == np.float32
  # verl's loop over a window of 5 positions, the 3 response tokens first
  # (reward on the last), two padded positions after it with arbitrary
  # values: the same advantages and returns on the response tokens.
  v = np.array([4.0, 5.0, 7.5, 3.0, -2.0])
  adv, returns = _verl_gae([0.0, 0.0, 10.0, 0.0, 0.0], v)
  np.testing.assert_allclose(adv[:3], a[0], rtol=RTOL)
  np.testing.assert_allclose(returns[:3], 10.0, rtol=RTOL)


def test_whiten_token_rows_is_masked_whiten_over_tokens():
  rows = [
      np.array([6.0, 5.0]),
      np.array([3.9]),
      np.array([], np.float64),
      np.array([2.0]),
  ]
  got = adv_lib.whiten_token_rows(rows)
  flat = np.array([6.0, 5.0, 3.9, 2.0])
  want = (flat - flat.mean()) / np.sqrt(flat.var(ddof=1) + 1e-8)
  np.testing.assert_allclose(np.concatenate(got), want, rtol=RTOL)
  assert [g.shape for g in got] == [(2,), (1,), (0,), (1,)]


def _hosts_whiten(parts, fn):
  """``fn(part, sum_fn)`` on one thread per part, ``sum_fn`` an all-reduce
  between the threads (as ``distributed.global_sum`` between processes);
  the results in part order."""
  import threading

  n = len(parts)
  slots, out = [None] * n, [None] * n
  barrier = threading.Barrier(n)

  def host(i):
    def sum_fn(x):
      slots[i] = np.asarray(x)
      barrier.wait()
      total = sum(slots)
      barrier.wait()  # every host has read this round's slots
      return total

    out[i] = fn(parts[i], sum_fn)

  threads = [threading.Thread(target=host, args=(i,)) for i in range(n)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return out


def test_whitening_over_hosts_equals_the_whole_batch():
  """Each host whitens its own rows with the statistics of all hosts'
  rows (verl whitens the whole batch); a host with no rows joins."""
  rows = [np.array([6.0, 5.0]), np.array([3.9]), np.array([2.0, -1.0, 0.0])]
  whole = adv_lib.whiten_token_rows(rows)
  parts = [rows[:2], [], rows[2:]]
  got = _hosts_whiten(
      parts, lambda p, f: adv_lib.whiten_token_rows(p, sum_fn=f)
  )
  np.testing.assert_allclose(
      np.concatenate([np.concatenate(g) for g in got if g]),
      np.concatenate(whole),
      rtol=RTOL,
  )
  x, n = np.array([2.0, -1.0, 0.5, 4.0]), np.array([3, 1, 2, 0])
  got = _hosts_whiten(
      [(x[:1], n[:1]), (x[1:], n[1:])],
      lambda p, f: adv_lib.whiten(*p, sum_fn=f),
  )
  np.testing.assert_allclose(
      np.concatenate(got), adv_lib.whiten(x, n), rtol=RTOL
  )
  # Per host alone (no sum_fn) the first host's one row would be ~0.
  assert abs(adv_lib.whiten(x[:1], n[:1])[0]) < 1e-3 < abs(got[0][0])


def test_whiten_equals_token_level_masked_whiten():
  # Rows (1, 3) with 1 and 3 tokens: tokens (1, 3, 3, 3), mean 2.5,
  # biased variance 3/4, unbiased 1 -> (-1.5, 0.5).
  np.testing.assert_allclose(
      adv_lib.whiten([1.0, 3.0], [1, 3]), [-1.5, 0.5], rtol=RTOL
  )
  # The same on an [S, T] token array with a loss mask, as verl does it.
  x, n = np.array([2.0, -1.0, 0.5]), np.array([3, 1, 2])
  mask = (np.arange(4)[None, :] < n[:, None]).astype(np.float64)
  tok = x[:, None] * mask
  total = mask.sum()
  mean = tok.sum() / total
  var = (((tok - mean) * mask) ** 2).sum() / total * total / (total - 1)
  np.testing.assert_allclose(
      adv_lib.whiten(x, n), (x - mean) / np.sqrt(var), rtol=RTOL
  )
  # Without counts every row counts once; N < 2 gives zeros.
  np.testing.assert_allclose(
      adv_lib.whiten([1.0, 3.0]), [-1 / S2, 1 / S2], rtol=RTOL
  )
  np.testing.assert_array_equal(adv_lib.whiten([5.0], [1]), [0.0])
  np.testing.assert_array_equal(adv_lib.whiten([5.0, 2.0], [1, 0]), [0.0, 0.0])
  with pytest.raises(ValueError, match="token_counts"):
    adv_lib.whiten([1.0, 2.0], [1, -1])
