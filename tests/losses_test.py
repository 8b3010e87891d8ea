"""Tests of rspo_jax.losses against numbers worked out by hand."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rspo_jax import centre_cap, losses
from rspo_jax import train_step as ts

ATOL = 1e-5


def _row(x):
  return jnp.asarray([x], jnp.float32)


def _ppo_case():
  """Five tokens with chosen ratios r = pi/pi_old and advantages.

  PPO window [0.8, 1.2]:
    r=0.5, A=+1: min(0.5, 0.8)   = 0.5   unclipped
    r=0.9, A=+1: min(0.9, 0.9)   = 0.9   inside
    r=1.5, A=+1: min(1.5, 1.2)   = 1.2   clipped
    r=0.5, A=-1: min(-0.5, -0.8) = -0.8  clipped
    r=1.5, A=-1: min(-1.5, -1.2) = -1.5  unclipped
  """
  r = np.array([0.5, 0.9, 1.5, 0.5, 1.5])
  adv = np.array([1.0, 1.0, 1.0, -1.0, -1.0])
  old = np.array([-1.0, -2.0, -0.5, -1.5, -3.0])
  logp = old + np.log(r)
  expected = np.array([0.5, 0.9, 1.2, -0.8, -1.5])
  return _row(logp), _row(old), _row(adv), expected


# ---------------------------------------------------------------- aggregate


def test_aggregate_modes():
  x = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.asarray([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
  assert np.isclose(losses.aggregate(x, m, "token_mean"), 3.0)  # 9 / 3
  # rows: mean(1, 2) = 1.5 and 6 -> (1.5 + 6) / 2
  assert np.isclose(losses.aggregate(x, m, "seq_mean_token_mean"), 3.75)


def test_aggregate_empty_rows_and_all_empty():
  x = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.asarray([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  assert np.isclose(losses.aggregate(x, m, "token_mean"), 1.5)
  assert np.isclose(losses.aggregate(x, m, "seq_mean_token_mean"), 1.5)
  zero = jnp.zeros_like(x)
  assert losses.aggregate(x, zero, "token_mean") == 0.0
  assert losses.aggregate(x, zero, "seq_mean_token_mean") == 0.0


def test_aggregate_bad_mode():
  x = jnp.ones((1, 2))
  with pytest.raises(ValueError, match="mode"):
    losses.aggregate(x, x, "sum")


# ---------------------------------------------------------- clip objective


@pytest.mark.parametrize("window", ["additive", "multiplicative"])
def test_centre_one_is_ppo(window):
  logp, old, adv, expected = _ppo_case()
  mask = jnp.ones_like(logp)
  obj, diag = losses.shifted_clip_objective(
      logp, old, old, adv, mask, clip_eps=0.2, window=window
  )
  np.testing.assert_allclose(obj[0], expected, atol=ATOL)
  np.testing.assert_allclose(diag["centre"], 1.0, atol=ATOL)
  np.testing.assert_allclose(diag["clipped"][0], [0, 0, 1, 1, 0])
  loss, _ = losses.ppo_clip_loss(logp, old, adv, mask, window=window)
  np.testing.assert_allclose(loss, -expected.mean(), atol=ATOL)


def _window_case(c, ratios, adv):
  behavior = np.full(len(ratios), -2.0)
  old = behavior + np.log(c)
  logp = behavior + np.log(np.asarray(ratios))
  return _row(logp), _row(old), _row(behavior), _row(adv)


def test_additive_vs_multiplicative_windows():
  # c = 2, eps = 0.2: additive [1.8, 2.2], multiplicative [1.6, 2.4].
  ratios = [1.7, 1.9, 2.3, 2.5, 1.7, 1.5]
  adv = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
  logp, old, beh, a = _window_case(2.0, ratios, adv)
  mask = jnp.ones_like(logp)
  add, d_add = losses.shifted_clip_objective(
      logp, old, beh, a, mask, clip_eps=0.2, window="additive"
  )
  mul, d_mul = losses.shifted_clip_objective(
      logp, old, beh, a, mask, clip_eps=0.2, window="multiplicative"
  )
  np.testing.assert_allclose(d_add["centre"][0], 2.0, atol=ATOL)
  np.testing.assert_allclose(d_add["ratio"][0], ratios, atol=ATOL)
  np.testing.assert_allclose(
      add[0], [1.7, 1.9, 2.2, 2.2, -1.8, -1.8], atol=ATOL
  )
  np.testing.assert_allclose(d_add["clipped"][0], [0, 0, 1, 1, 1, 1])
  np.testing.assert_allclose(
      mul[0], [1.7, 1.9, 2.3, 2.4, -1.7, -1.6], atol=ATOL
  )
  np.testing.assert_allclose(d_mul["clipped"][0], [0, 0, 0, 1, 0, 1])


def test_centre_below_one():
  # c = 0.5, eps = 0.2: additive [0.3, 0.7], multiplicative [0.4, 0.6].
  logp, old, beh, a = _window_case(0.5, [0.65, 0.8, 0.35], [1.0, 1.0, -1.0])
  mask = jnp.ones_like(logp)
  add, _ = losses.shifted_clip_objective(logp, old, beh, a, mask)
  mul, _ = losses.shifted_clip_objective(
      logp, old, beh, a, mask, window="multiplicative"
  )
  np.testing.assert_allclose(add[0], [0.65, 0.7, -0.35], atol=ATOL)
  np.testing.assert_allclose(mul[0], [0.6, 0.6, -0.4], atol=ATOL)


def test_asymmetric_eps():
  # PPO, eps_low 0.2, eps_high 0.28: window [0.8, 1.28].
  r = np.array([1.25, 1.3, 0.75])
  old = np.zeros(3)
  adv = _row([1.0, 1.0, -1.0])
  obj, _ = losses.shifted_clip_objective(
      _row(np.log(r)),
      _row(old),
      _row(old),
      adv,
      jnp.ones((1, 3)),
      clip_eps=0.2,
      clip_eps_high=0.28,
  )
  np.testing.assert_allclose(obj[0], [1.25, 1.28, -0.8], atol=ATOL)
  # Shifted, c = 2, eps_low 0.1, eps_high 0.3: window [1.9, 2.3].
  logp, o, beh, a = _window_case(2.0, [2.25, 2.4, 1.85], [1.0, 1.0, -1.0])
  obj, _ = losses.shifted_clip_objective(
      logp, o, beh, a, jnp.ones((1, 3)), clip_eps=0.1, clip_eps_high=0.3
  )
  np.testing.assert_allclose(obj[0], [2.25, 2.3, -1.9], atol=ATOL)


def test_bad_window():
  x = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match="window"):
    losses.shifted_clip_objective(x, x, x, x, x, window="box")


def test_zero_gradient_on_clipped_tokens():
  logp, old, adv, _ = _ppo_case()
  mask = jnp.ones_like(logp)

  def loss_fn(lp):
    return losses.ppo_clip_loss(lp, old, adv, mask)[0]

  g = jax.grad(loss_fn)(logp)
  # d(-mean(r A))/dlogp = -r A / 5 on active tokens, 0 on clipped ones.
  expected = -np.array([0.5, 0.9, 0.0, 0.0, -1.5]) / 5
  np.testing.assert_allclose(g[0], expected, atol=ATOL)


def test_gradient_flows_only_through_logp():
  logp, old, adv, _ = _ppo_case()
  mask = jnp.ones_like(logp)
  f = lambda o, b, a: losses.shifted_clip_loss(logp, o, b, a, mask)[0]
  for g in jax.grad(f, argnums=(0, 1, 2))(old, old, adv):
    np.testing.assert_array_equal(g, 0.0)


def test_clip_frac_and_metrics():
  logp, old, adv, _ = _ppo_case()
  mask = jnp.ones_like(logp)
  _, m = losses.ppo_clip_loss(logp, old, adv, mask)
  assert np.isclose(m["clip_frac"], 2 / 5)
  assert np.isclose(m["ratio_mean"], np.mean([0.5, 0.9, 1.5, 0.5, 1.5]))
  assert np.isclose(m["ratio_max"], 1.5, atol=ATOL)
  assert np.isclose(m["centre_mean"], 1.0)
  # k3 of KL(old || new) from old's samples: r - 1 - log r.
  r = np.array([0.5, 0.9, 1.5, 0.5, 1.5])
  assert np.isclose(m["approx_kl"], np.mean(r - 1 - np.log(r)), atol=ATOL)
  # Dropping the third token (clipped, r = 1.5) from the mask.
  mask2 = jnp.asarray([[1.0, 1.0, 0.0, 1.0, 1.0]])
  _, m2 = losses.ppo_clip_loss(logp, old, adv, mask2)
  assert np.isclose(m2["clip_frac"], 1 / 4)
  assert np.isclose(m2["ratio_mean"], np.mean([0.5, 0.9, 0.5, 1.5]))


def test_approx_kl_is_not_dominated_by_one_fallen_token():
  """approx_kl estimates KL(pi_old || pi_theta) from pi_old's samples:
  one token of 3,000 whose probability fell by e^-13 (d = -13) adds
  (e^-13 - 1 + 13) / 3000 = 0.004, not (e^13 - 13 - 1) / 3000 = 147 as
  the reverse direction's k3 did (the 'spikes' of the earlier studies)."""
  n = 3000
  old = jnp.full((1, n), -1.0)
  logp = old.at[0, 7].set(-14.0)
  adv = jnp.zeros((1, n))
  _, m = losses.ppo_clip_loss(logp, old, adv, jnp.ones((1, n)))
  assert np.isclose(m["approx_kl"], (np.exp(-13.0) - 1 + 13) / n, rtol=1e-4)


def test_masked_tokens_change_nothing():
  rng = np.random.default_rng(0)
  shape = (3, 5)
  logp = -rng.uniform(0.1, 3.0, shape)
  old = logp + rng.normal(0, 0.3, shape)
  beh = old + rng.normal(0, 0.3, shape)
  ref = logp + rng.normal(0, 0.3, shape)
  adv = rng.normal(0, 1, shape)
  ent = rng.uniform(0, 2, shape)
  mask = np.ones(shape)
  mask[0, 3:] = 0
  mask[2, :] = 0
  is_off = jnp.asarray([False, True, True])
  kw = dict(alpha=0.25, clip_eps=0.2, kl_coef=0.1, entropy_coef=0.01)

  def run(lp, o, b, r, a, e):
    f = lambda lp_: losses.mixed_objective(
        lp_, o, b, r, a, jnp.asarray(mask), is_off, e, losses.LossConfig(**kw)
    )
    (loss, m), g = jax.value_and_grad(f, has_aux=True)(lp)
    return loss, m, g

  args = [jnp.asarray(x, jnp.float32) for x in (logp, old, beh, ref, adv, ent)]
  base = run(*args)
  junk = [50.0, -1e4, 80.0, -80.0, 1e6, 1e3]
  pert = [
      jnp.asarray(np.where(mask > 0, x, j), jnp.float32)
      for x, j in zip((logp, old, beh, ref, adv, ent), junk)
  ]
  out = run(*pert)
  np.testing.assert_allclose(out[0], base[0], atol=ATOL)
  for k in base[1]:
    np.testing.assert_allclose(out[1][k], base[1][k], atol=ATOL, err_msg=k)
  assert np.all(np.isfinite(out[2]))
  np.testing.assert_allclose(out[2], base[2], atol=ATOL)
  np.testing.assert_array_equal(np.asarray(out[2])[mask == 0], 0.0)
  # Same for the plain shifted-clip loss with the sequence-mean aggregation.
  f = functools.partial(losses.shifted_clip_loss, agg="seq_mean_token_mean")
  l1, _ = f(*args[:3], args[4], jnp.asarray(mask))
  l2, _ = f(*pert[:3], pert[4], jnp.asarray(mask))
  np.testing.assert_allclose(l1, l2, atol=ATOL)


# ------------------------------------------------------- KL, entropy, value


def test_kl_estimators():
  logp = jnp.asarray([[0.0, -1.0]])
  ref = jnp.asarray([[-1.0, 0.0]])  # d = logp - ref = [1, -1]
  np.testing.assert_allclose(losses.kl_divergence(logp, ref, "k1"), [[1, -1]])
  np.testing.assert_allclose(
      losses.kl_divergence(logp, ref, "k2"), [[0.5, 0.5]]
  )
  # k3 = exp(-d) + d - 1: e^-1 + 0 = 0.367879, e - 2 = 0.718282.
  np.testing.assert_allclose(
      losses.kl_divergence(logp, ref, "k3"), [[0.367879, 0.718282]], atol=ATOL
  )
  # verl's low_var_kl clamps k3 at 10: d = -3 gives e^3 - 4 = 16.09 -> 10,
  # d = -2.5 gives e^2.5 - 3.5 = 8.682 (kept), d = -30 -> 10 (no overflow).
  d = jnp.asarray([[-3.0, -2.5, -30.0]])
  k3 = losses.kl_divergence(d, jnp.zeros_like(d), "k3")
  np.testing.assert_allclose(k3, [[10.0, np.exp(2.5) - 3.5, 10.0]], rtol=1e-6)
  # ... and a clamped token has no gradient: dk3/dd = 1 - e^-d elsewhere.
  g = jax.grad(
      lambda x: losses.kl_divergence(x, jnp.zeros_like(x), "k3").sum()
  )(d)
  np.testing.assert_allclose(g, [[0.0, 1.0 - np.exp(2.5), 0.0]], rtol=1e-5)
  with pytest.raises(ValueError, match="kind"):
    losses.kl_divergence(logp, ref, "k4")


def test_entropy_from_logits():
  v = 7
  h = losses.entropy_from_logits(jnp.zeros((2, 3, v)))
  assert h.shape == (2, 3) and h.dtype == jnp.float32
  np.testing.assert_allclose(h, np.log(v), atol=ATOL)
  # p = (1/2, 1/4, 1/4): H = 1.5 log 2; a -inf logit adds nothing;
  # a constant shift and bf16 input are handled.
  logits = jnp.log(jnp.asarray([[[0.5, 0.25, 0.25, 0.0]]])) + 1000.0
  h = losses.entropy_from_logits(logits)
  np.testing.assert_allclose(h, [[1.5 * np.log(2)]], atol=1e-4)
  h16 = losses.entropy_from_logits(jnp.zeros((1, 1, 4), jnp.bfloat16))
  np.testing.assert_allclose(h16, [[np.log(4)]], atol=ATOL)


def test_value_loss_clipping():
  # (v, v_old, R), eps 0.2:
  #   (1.5, 1, 2): v_clip 1.2; max(0.25, 0.64) = 0.64   clipped
  #   (1.1, 1, 2): v_clip 1.1; 0.81
  #   (0.5, 1, 0): v_clip 0.8; max(0.25, 0.64) = 0.64   clipped
  #   (0.9, 1, 0): v_clip 0.9; 0.81
  v = _row([1.5, 1.1, 0.5, 0.9])
  v_old = jnp.ones((1, 4))
  ret = _row([2.0, 2.0, 0.0, 0.0])
  mask = jnp.ones((1, 4))
  loss, m = losses.value_loss(v, v_old, ret, mask, clip_eps=0.2)
  assert np.isclose(loss, (0.64 + 0.81 + 0.64 + 0.81) / 4)
  assert np.isclose(m["vf_clip_frac"], 0.5)
  g = jax.grad(
      lambda x: losses.value_loss(x, v_old, ret, mask, clip_eps=0.2)[0]
  )(v)
  # d/dv (v - R)^2 / 4 = 2 (v - R) / 4 on unclipped tokens, 0 on clipped.
  np.testing.assert_allclose(g[0], [0.0, -1.8 / 4, 0.0, 1.8 / 4], atol=ATOL)


# ---------------------------------------------------------- mixed objective


def _mixed_case():
  """Rows 0-1 on-policy (PPO), row 2 off-policy (c = 2, window [1.8, 2.2]).

  row 0: r = [1.0, 1.5], A = [1, 1]           -> [1.0, 1.2]   (2nd clipped)
  row 1: r = [0.5, -],   A = [-1, -], mask 1 0 -> [-0.8]        (clipped)
  row 2: r = [2.1, 2.5], A = [1, 1]           -> [2.1, 2.2]   (2nd clipped)
  J_on (token mean) = 1.4 / 3, J_off = 2.15. k1 KL to ref chosen as
  [[0.1, 0.2], [0.3, -], [0.4, 0.6]]: KL_on = 0.2, KL_off = 0.5.
  Entropy [[1, 2], [3, 100], [4, 5]] -> token mean over the mask 3.
  """
  base = -1.0
  old = np.full((3, 2), base)
  beh = old.copy()
  beh[0] = base - 5.0  # junk on an on-policy row: must be ignored
  beh[2] = base - np.log(2.0)
  r = np.array([[1.0, 1.5], [0.5, 1.0], [2.1, 2.5]]) / np.array(
      [[1.0], [1.0], [2.0]]
  )  # ratios to pi_old; r to pi_B on row 2 is twice this
  logp = old + np.log(r)
  kl = np.array([[0.1, 0.2], [0.3, 0.0], [0.4, 0.6]])
  ref = logp - kl
  adv = np.array([[1.0, 1.0], [-1.0, 7.0], [1.0, 1.0]])
  mask = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
  ent = np.array([[1.0, 2.0], [3.0, 100.0], [4.0, 5.0]])
  arrs = [jnp.asarray(x, jnp.float32) for x in (logp, old, beh, ref, adv)]
  return arrs, jnp.asarray(mask), jnp.asarray(ent, jnp.float32)


def _mixed(arrs, mask, is_off, ent, **kw):
  kw = dict(
      dict(
          alpha=0.25, clip_eps=0.2, kl_coef=0.1, kl_kind="k1", entropy_coef=0.01
      ),
      **kw,
  )
  return losses.mixed_objective(
      *arrs, mask, jnp.asarray(is_off), ent, losses.LossConfig(**kw)
  )


def test_mixed_objective_weights():
  arrs, mask, ent = _mixed_case()
  is_off = [False, False, True]
  loss, m = _mixed(arrs, mask, is_off, ent, kl_coef=0.0)
  j = 0.75 * (1.4 / 3) + 0.25 * 2.15
  assert np.isclose(loss, -j - 0.01 * 3.0, atol=ATOL)
  loss, m = _mixed(arrs, mask, is_off, ent)
  # J_on = 1.4/3 - 0.1 * 0.2, J_off = 2.15 - 0.1 * 0.5 = 2.1
  j = 0.75 * (1.4 / 3 - 0.02) + 0.25 * 2.1
  assert np.isclose(loss, -j - 0.03, atol=ATOL)
  assert np.isclose(m["loss"], loss)
  expected = {
      "pg_loss_on": -1.4 / 3,
      "pg_loss_off": -2.15,
      "clip_frac_on": 2 / 3,
      "clip_frac_off": 0.5,
      "kl_on": 0.2,
      "kl_off": 0.5,
      "ratio_mean_on": 1.0,
      "ratio_mean_off": 2.3,
      "n_tokens_on": 3,
      "n_tokens_off": 2,
      "w_on": 0.75,
      "w_off": 0.25,
      "entropy": 3.0,
  }
  for k, v in expected.items():
    assert np.isclose(m[k], v, atol=ATOL), (k, m[k], v)


def test_mixed_objective_kl_diagnostics_by_source_and_tail():
  """approx_kl: k3 of KL(pi_old || pi) over fresh tokens (r to pi_old
  1.0, 1.5, 0.5), approx_kl_off over replayed ones (1.05, 1.25);
  log_ratio_fall_max / _rise_max: the most a counted token fell (0.5:
  log 2) or rose (1.5) from pi_old, whatever its source."""
  arrs, mask, ent = _mixed_case()
  _, m = _mixed(arrs, mask, [False, False, True], ent)
  k3 = lambda r: np.mean([x - 1 - np.log(x) for x in r])
  assert np.isclose(m["approx_kl"], k3([1.0, 1.5, 0.5]), atol=ATOL)
  assert np.isclose(m["approx_kl_off"], k3([1.05, 1.25]), atol=ATOL)
  assert np.isclose(m["log_ratio_fall_max"], np.log(2.0), atol=ATOL)
  assert np.isclose(m["log_ratio_rise_max"], np.log(1.5), atol=ATOL)


def test_mixed_objective_one_source():
  arrs, mask, ent = _mixed_case()
  # Only on-policy rows 0-1: w_on = 1.
  on = [a[:2] for a in arrs]
  loss, m = _mixed(on, mask[:2], [False, False], ent[:2])
  assert np.isclose(loss, -(1.4 / 3 - 0.02) - 0.01 * 2.0, atol=ATOL)
  assert m["w_on"] == 1.0 and m["w_off"] == 0.0 and m["n_tokens_off"] == 0
  assert m["pg_loss_off"] == 0.0
  # Only the off-policy row 2: w_off = 1.
  off = [a[2:] for a in arrs]
  loss, m = _mixed(off, mask[2:], [True], ent[2:])
  assert np.isclose(loss, -2.1 - 0.01 * 4.5, atol=ATOL)
  assert m["w_on"] == 0.0 and m["w_off"] == 1.0
  # An off-policy row with an empty mask counts as no off-policy data.
  mask0 = mask.at[2].set(0.0)
  loss, m = _mixed(arrs, mask0, [False, False, True], ent)
  assert np.isclose(loss, -(1.4 / 3 - 0.02) - 0.01 * 2.0, atol=ATOL)
  # No entropy: the term is dropped.
  loss, m = _mixed(arrs, mask, [False, False, True], None)
  assert np.isclose(loss, -(0.75 * (1.4 / 3 - 0.02) + 0.25 * 2.1), atol=ATOL)
  assert m["entropy"] == 0.0


def test_mixed_objective_seq_mean():
  arrs, mask, ent = _mixed_case()
  # Row means: on (1.0 + 1.2) / 2 = 1.1 and -0.8 -> J_on = 0.15; J_off 2.15.
  loss, _ = _mixed(
      arrs,
      mask,
      [False, False, True],
      None,
      kl_coef=0.0,
      loss_agg="seq_mean_token_mean",
  )
  assert np.isclose(loss, -(0.75 * 0.15 + 0.25 * 2.15), atol=ATOL)


def _dual_case():
  """Row 0 fresh, r = pi / pi_old and A per token; row 1 replayed with
  c = pi_old / pi_B = 4, r = pi / pi_B = 4 (at its centre), A = -1.

    fresh r=4,   A=-1: PPO min(-4, -1.2) = -4;  dual clip C=3: -3 (no grad)
    fresh r=2.5, A=-1: -2.5 (r <= C: unchanged)
    fresh r=4,   A=+1: min(4, 1.2) = 1.2 (PPO clip; dual acts on A < 0 only)
    replayed r=c=4, A=-1: window [3.8, 4.2]: -4 (J_off has no dual clip)
  """
  old = np.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
  r = np.array([[4.0, 2.5, 4.0], [4.0, 4.0, 4.0]])
  beh = old - np.log([[1.0], [4.0]])  # fresh rows: behaviour is pi_old
  logp = beh + np.log(r)
  adv = np.array([[-1.0, -1.0, 1.0], [-1.0, -1.0, -1.0]])
  mask = np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
  arrs = [jnp.asarray(x, jnp.float32) for x in (logp, old, beh, logp, adv)]
  return arrs, jnp.asarray(mask)


def test_mixed_objective_dual_clip_holds_fresh_negative_tokens_at_c():
  arrs, mask = _dual_case()
  is_off = [False, True]
  # J_on = (-3 - 2.5 + 1.2) / 3, J_off = -4; loss = -(0.75 J_on + 0.25 J_off)
  loss, m = _mixed(arrs, mask, is_off, None, kl_coef=0.0, clip_ratio_c=3.0)
  assert np.isclose(loss, 0.75 * 4.3 / 3 + 0.25 * 4.0, atol=ATOL)
  assert np.isclose(m["clip_frac_on_dual"], 1 / 3, atol=ATOL)
  # Off: plain PPO on fresh tokens, J_on = (-4 - 2.5 + 1.2) / 3.
  off, m0 = _mixed(arrs, mask, is_off, None, kl_coef=0.0)
  assert np.isclose(off, 0.75 * 5.3 / 3 + 0.25 * 4.0, atol=ATOL)
  assert "clip_frac_on_dual" not in m0
  # Gradient w.r.t. log pi: d(-w J)/dlogp = -w / N * r A on active tokens.
  grad = lambda **kw: jax.grad(
      lambda lp: _mixed([lp] + arrs[1:], mask, is_off, None, kl_coef=0.0, **kw)[
          0
      ]
  )(arrs[0])
  g = grad(clip_ratio_c=3.0)
  np.testing.assert_allclose(
      g, [[0.0, 0.25 * 2.5, 0.0], [0.25 * 4.0, 0.0, 0.0]], atol=ATOL
  )
  np.testing.assert_allclose(
      grad()[0], [0.25 * 4.0, 0.25 * 2.5, 0.0], atol=ATOL
  )
  with pytest.raises(ValueError, match="dual clip"):
    _mixed(arrs, mask, is_off, None, clip_ratio_c=1.0)


def test_dual_clip_on_a_stale_fresh_row_acts_on_its_ratio_to_pi_old():
  """One fresh row sampled by an older policy (rollout.overlap), c =
  pi_old / pi_behaviour = 2, A = -1, r = pi / pi_behaviour:

    r = 7: r / c = 3.5 > C = 3: held at C * c * A = -6 (no gradient)
    r = 5: r / c = 2.5 <= C: c * min(2.5 A, 1.2 A) = -5, gradient r A

  (a dual clip on r itself would hold r = 5 at -3)."""
  old = np.array([[-1.0, -1.0]])
  beh = old - np.log(2.0)
  logp = beh + np.log([[7.0, 5.0]])
  adv = -np.ones((1, 2))
  arrs = [jnp.asarray(x, jnp.float32) for x in (logp, old, beh, logp, adv)]
  mask = jnp.ones((1, 2))
  kw = dict(kl_coef=0.0, entropy_coef=0.0, clip_ratio_c=3.0, overlap=True)
  loss, m = _mixed(arrs, mask, [False], None, **kw)
  assert np.isclose(loss, (6.0 + 5.0) / 2, atol=ATOL)
  assert np.isclose(m["clip_frac_on_dual"], 0.5, atol=ATOL)
  g = jax.grad(
      lambda lp: _mixed([lp] + arrs[1:], mask, [False], None, **kw)[0]
  )(arrs[0])
  np.testing.assert_allclose(g, [[0.0, 5.0 / 2]], atol=ATOL)


def test_mixed_objective_equals_ppo_when_all_on_policy():
  arrs, mask, _ = _mixed_case()
  logp, old, _, ref, adv = arrs
  loss, _ = _mixed(arrs, mask, [False] * 3, None, kl_coef=0.0)
  ppo, _ = losses.ppo_clip_loss(logp, old, adv, mask)
  assert np.isclose(loss, ppo, atol=ATOL)


# -------------------------------------------------------------------- jit


def test_jit_matches_eager():
  arrs, mask, ent = _mixed_case()
  is_off = jnp.asarray([False, False, True])
  kw = dict(
      alpha=0.25,
      clip_eps=0.2,
      clip_window="multiplicative",
      kl_coef=0.1,
      entropy_coef=0.01,
      loss_agg="seq_mean_token_mean",
  )
  f = functools.partial(losses.mixed_objective, cfg=losses.LossConfig(**kw))
  eager, m_e = f(*arrs, mask, is_off, ent)
  jitted, m_j = jax.jit(f)(*arrs, mask, is_off, ent)
  assert np.isclose(eager, jitted, atol=ATOL)
  for k in m_e:
    assert np.isclose(m_e[k], m_j[k], atol=ATOL), k
  logp, old, beh, _, adv = arrs
  g = functools.partial(losses.shifted_clip_loss, clip_eps_high=0.28)
  assert np.isclose(
      jax.jit(g)(logp, old, beh, adv, mask)[0],
      g(logp, old, beh, adv, mask)[0],
      atol=ATOL,
  )
  v = jax.jit(losses.value_loss)(adv, old, logp, mask)[0]
  assert np.isclose(v, losses.value_loss(adv, old, logp, mask)[0], atol=ATOL)


# ------------------------------------------ whole-batch totals, micro-batches


def _random_mixed_batch(seed=0, rows=10, length=6):
  """Rows 0-5 fresh, 6-9 replayed; rows 3 and 8 all padding (zero mask)."""
  rng = np.random.default_rng(seed)
  shape = (rows, length)
  old = -rng.uniform(0.5, 3.0, shape)
  logp = old + rng.normal(0, 0.3, shape)
  beh = old - rng.normal(0, 0.3, shape)
  ref = logp + rng.normal(0, 0.2, shape)
  adv = rng.normal(0, 1, shape)
  ent = rng.uniform(0, 2, shape)
  mask = (rng.uniform(size=shape) < 0.7).astype(np.float32)
  mask[[3, 8]] = 0.0
  is_off = np.arange(rows) >= 6
  arrs = [jnp.asarray(x, jnp.float32) for x in (logp, old, beh, ref, adv)]
  return (
      arrs,
      jnp.asarray(mask),
      jnp.asarray(is_off),
      jnp.asarray(ent, jnp.float32),
  )


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_contributions_sum_to_the_batch(agg):
  """With the whole batch's totals, the values of any partition of the rows
  (here: contiguous chunks, one all-replayed, one all-padding) sum to the
  batch's loss, gradient and metrics (the ``*_max`` metrics: their max)."""
  arrs, mask, is_off, ent = _random_mixed_batch()
  kw = dict(
      alpha=0.25, clip_eps=0.2, kl_coef=0.1, entropy_coef=0.01, loss_agg=agg
  )

  def run(lp, rows, totals=None):
    others = [a[rows] for a in arrs[1:]]
    return losses.mixed_objective(
        lp[rows],
        *others,
        mask[rows],
        is_off[rows],
        ent[rows],
        losses.LossConfig(**kw),
        totals,
    )

  logp = arrs[0]
  everything = np.arange(10)
  (loss, metrics), grad = jax.value_and_grad(
      lambda lp: run(lp, everything), has_aux=True
  )(logp)
  totals = losses.mixed_totals(mask, is_off, alpha=0.25)
  parts = [
      np.array([0, 1, 2]),
      np.array([3]),
      np.array([4, 5, 6]),
      np.array([7, 8, 9]),
  ]  # [3] pads only; [7, 8, 9] replayed only
  loss_sum, grad_sum = 0.0, jnp.zeros_like(logp)
  metric_sum = {}
  for rows in parts:
    (l, m), g = jax.value_and_grad(
        lambda lp, rows=rows: run(lp, rows, totals), has_aux=True
    )(logp)
    loss_sum += l
    grad_sum += g
    for k, v in m.items():  # *_max metrics combine by max
      combine = jnp.maximum if ts.is_max_metric(k) else jnp.add
      metric_sum[k] = combine(metric_sum.get(k, 0.0), v)
  np.testing.assert_allclose(loss_sum, loss, atol=1e-6)
  np.testing.assert_allclose(grad_sum, grad, atol=1e-7)
  for k, v in metric_sum.items():
    np.testing.assert_allclose(v, metrics[k], atol=1e-6, err_msg=k)
  # The contributions carry no totals; the batch's own call does.
  assert set(metrics) - set(metric_sum) == set(totals)
  np.testing.assert_allclose(metrics["n_tokens_on"], mask[:6].sum())
  np.testing.assert_allclose(metrics["n_rows_off"], 3)  # row 8 is padding


def test_replayed_to_fresh_gradient_ratio_by_hand():
  """d loss / d logp on an unclipped token (r = 1, pi_B = pi_old) is
  -w_src * A / N_src: replayed / fresh = alpha / (1 - alpha) * N_on / N_off,
  whichever micro-batches the rows are split into."""
  rows, length, alpha = 16, 4, 0.25
  mask = np.zeros((rows, length), np.float32)
  mask[:12, :3] = 1.0  # fresh rows 0-11: 36 tokens
  mask[12:14, :] = 1.0  # replayed rows 12-13: 8 tokens; 14-15 padding
  is_off = jnp.asarray(np.arange(rows) >= 12)
  old = jnp.full((rows, length), -1.0)
  adv = jnp.ones((rows, length))
  kw = dict(alpha=alpha, clip_eps=0.2, kl_coef=0.0, entropy_coef=0.0)
  totals = losses.mixed_totals(jnp.asarray(mask), is_off, alpha=alpha)

  def grad(n_micro):
    def loss(lp):
      total = 0.0
      for i in range(n_micro):  # contiguous: the last chunks are replayed
        r = slice(i * rows // n_micro, (i + 1) * rows // n_micro)
        total += losses.mixed_objective(
            lp[r],
            old[r],
            old[r],
            old[r],
            adv[r],
            jnp.asarray(mask[r]),
            is_off[r],
            None,
            losses.LossConfig(**kw),
            totals,
        )[0]
      return total

    return np.asarray(jax.grad(loss)(old))

  for n_micro in (1, 2, 4, 8):
    g = grad(n_micro)
    np.testing.assert_allclose(g[0, 0], -(1 - alpha) / 36, rtol=1e-6)
    np.testing.assert_allclose(g[12, 0], -alpha / 8, rtol=1e-6)
    np.testing.assert_allclose(
        g[12, 0] / g[0, 0], alpha / (1 - alpha) * 36 / 8, rtol=1e-6
    )
    np.testing.assert_array_equal(g[mask == 0], 0.0)


def test_clip_sides_by_hand():
  """_case of test_additive_vs_multiplicative_windows, c = 2, window
  [1.8, 2.2]: r = 2.3, 2.5 with A > 0 clip high; r = 1.7, 1.5 with A < 0
  clip low; r = 1.7, 1.9 with A > 0 do not clip."""
  ratios = [1.7, 1.9, 2.3, 2.5, 1.7, 1.5]
  adv = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
  logp, old, beh, a = _window_case(2.0, ratios, adv)
  mask = jnp.ones_like(logp)
  _, diag = losses.shifted_clip_objective(logp, old, beh, a, mask)
  np.testing.assert_array_equal(diag["clipped_high"][0], [0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(diag["clipped_low"][0], [0, 0, 0, 0, 1, 1])
  _, m = losses.shifted_clip_loss(logp, old, beh, a, mask)
  assert np.isclose(m["clip_frac_high"], 2 / 6)
  assert np.isclose(m["clip_frac_low"], 2 / 6)
  # The same row replayed after _mixed_case's on-policy rows 0-1 (their
  # 2 tokens padded to 6 with masked zeros): r = 1.5, A > 0 clips high,
  # r = 0.5, A < 0 low, of 3 counted tokens.
  arrs, mask3, _ = _mixed_case()
  pad = lambda x: jnp.pad(x[:2], ((0, 0), (0, 4)))
  on = [pad(x) for x in arrs] + [pad(mask3)]
  off = [logp, old, beh, logp, a, mask]  # ref = logp
  both = [jnp.concatenate([x, y], 0) for x, y in zip(on, off)]
  _, m = losses.mixed_objective(
      *both,
      jnp.asarray([False, False, True]),
      None,
      losses.LossConfig(
          alpha=0.25, clip_eps=0.2, kl_coef=0.0, entropy_coef=0.0
      ),
  )
  expected = {
      "clip_frac_on_high": 1 / 3,
      "clip_frac_on_low": 1 / 3,
      "clip_frac_off_high": 2 / 6,
      "clip_frac_off_low": 2 / 6,
      "clip_frac_on": 2 / 3,
      "clip_frac_off": 4 / 6,
  }
  for k, v in expected.items():
    assert np.isclose(m[k], v, atol=ATOL), (k, m[k], v)


def test_value_loss_micro_batches_sum_to_the_batch():
  rng = np.random.default_rng(3)
  v, v_old, ret = (
      jnp.asarray(rng.normal(size=(6, 4)), jnp.float32) for _ in range(3)
  )
  mask = jnp.asarray(rng.uniform(size=(6, 4)) < 0.6, jnp.float32)
  totals = losses.mask_totals(mask)
  parts = (np.array([0, 5]), np.array([1, 2, 3]), np.array([4]))
  for agg in losses.AGG_MODES:

    def f(x, rows, t=None, agg=agg):
      return losses.value_loss(
          x[rows], v_old[rows], ret[rows], mask[rows], agg=agg, totals=t
      )

    (loss, m), g = jax.value_and_grad(f, has_aux=True)(v, np.arange(6))
    outs = [jax.value_and_grad(f, has_aux=True)(v, r, totals) for r in parts]
    np.testing.assert_allclose(sum(o[0][0] for o in outs), loss, atol=1e-6)
    np.testing.assert_allclose(sum(o[1] for o in outs), g, atol=1e-7)
    for k in m:
      np.testing.assert_allclose(
          sum(o[0][1][k] for o in outs), m[k], atol=1e-6, err_msg=k
      )


# ------------------------------------------------------------- centre cap


def _cap_case():
  """Row 0 fresh (junk pi_B, ignored: c = 1), row 1 replayed with
  c = pi_old / pi_B = [5, 0.5] and r = c (the first update); A = [3, 3]
  on row 0, [2, -1] on row 1."""
  old = np.array([[-1.0, -2.0], [-1.0, -2.0]])
  beh = old - np.log([[9.0, 9.0], [5.0, 0.5]])
  arrs = [jnp.asarray(x, jnp.float32) for x in (old, old, beh, old)]
  adv = jnp.asarray([[3.0, 3.0], [2.0, -1.0]])
  return arrs[:3], arrs[3], adv, jnp.ones((2, 2)), jnp.asarray([False, True])


def _cap_run(cap, mode="truncate", alpha=0.25):
  (logp, old, beh), ref, adv, mask, is_off = _cap_case()
  f = lambda lp: losses.mixed_objective(
      lp,
      old,
      beh,
      ref,
      adv,
      mask,
      is_off,
      None,
      losses.LossConfig(
          alpha=alpha,
          clip_eps=0.2,
          kl_coef=0.0,
          entropy_coef=0.0,
          centre_cap=cap,
          centre_cap_mode=mode,
      ),
  )
  (loss, m), g = jax.value_and_grad(f, has_aux=True)(logp)
  return loss, m, np.asarray(g)


def test_centre_cap_factor_by_hand():
  """c = 5, cap = 2: truncate f = 2/5 (weight min(c, cap) = 2), mask f = 0;
  c = 0.5 and c = 2 (not above the cap) f = 1."""
  c = jnp.asarray([[5.0, 0.5, 2.0]])
  f, over = centre_cap.centre_cap_factor(c, 2.0, "truncate")
  np.testing.assert_allclose(f[0], [0.4, 1.0, 1.0], rtol=1e-6)
  np.testing.assert_array_equal(over[0], [1.0, 0.0, 0.0])
  f, over = centre_cap.centre_cap_factor(c, 2.0, "mask")
  np.testing.assert_array_equal(f[0], [0.0, 1.0, 1.0])
  np.testing.assert_array_equal(over[0], [1.0, 0.0, 0.0])


def test_centre_cap_truncate_gradient_weight_is_cap_times_a():
  """d (f * objective) / d logp at r = c = 5, cap 2 is 2 * A, by autodiff
  and by a central difference; uncapped it is c * A = 5 * A."""
  a = 2.0
  beh = _row([-2.0])
  old = beh + np.log(5.0)
  adv, mask = _row([a]), jnp.ones((1, 1))

  def capped(lp, cap):
    obj, diag = losses.shifted_clip_objective(lp, old, beh, adv, mask)
    if cap:
      obj = obj * centre_cap.centre_cap_factor(diag["centre"], cap)[0]
    return jnp.sum(obj)

  assert np.isclose(jax.grad(capped)(old, 2.0)[0, 0], 2.0 * a, rtol=1e-5)
  assert np.isclose(jax.grad(capped)(old, 0.0)[0, 0], 5.0 * a, rtol=1e-5)
  h = 1e-2  # r = 5 exp(+-h) stays inside the window [4.8, 5.2]
  fd = (capped(old + h, 2.0) - capped(old - h, 2.0)) / (2 * h)
  assert np.isclose(fd, 2.0 * a, rtol=1e-3)


def test_centre_cap_in_mixed_objective_by_hand():
  """N_on = N_off = 2, w = (0.75, 0.25); d loss / d logp of a token at r = c
  with unclipped branch is -w * weight * A / N. Uncapped: row 1 weights
  c = 5 and 0.5. cap 2, truncate: 2 and 0.5. mask: 0 and 0.5, N_off still 2
  (AReaL divides by the original loss-mask count). Row 0 (fresh) and the
  c = 0.5 token are untouched; centre_cap_frac_off = 1/2."""
  _, m0, g0 = _cap_run(0.0)
  assert "centre_cap_frac_off" not in m0
  want_on = -0.75 * 1.0 * 3.0 / 2  # c = 1 on the fresh row
  np.testing.assert_allclose(g0[0], [want_on, want_on], rtol=1e-6)
  np.testing.assert_allclose(
      g0[1], [-0.25 * 5 * 2 / 2, -0.25 * 0.5 * -1 / 2], rtol=1e-6
  )
  for mode, weight in (("truncate", 2.0), ("mask", 0.0)):
    loss, m, g = _cap_run(2.0, mode)
    np.testing.assert_array_equal(g[0], g0[0])  # fresh row untouched
    assert g[1, 1] == g0[1, 1]  # c = 0.5 untouched
    np.testing.assert_allclose(
        g[1, 0], -0.25 * weight * 2.0 / 2, atol=1e-7, err_msg=mode
    )
    j_off = (weight * 2.0 + 0.5 * -1.0) / 2  # / N_off = 2 in both modes
    assert np.isclose(m["pg_loss_off"], -j_off, atol=ATOL), mode
    assert np.isclose(loss, -(0.75 * 3.0 + 0.25 * j_off), atol=ATOL), mode
    assert m["centre_cap_frac_off"] == 0.5
    assert m["n_tokens_off"] == 2 and m["w_off"] == 0.25


def test_centre_cap_never_touches_fresh_rows():
  """Fresh rows have c = 1 by construction; even a cap below 1 (refused by
  the config, allowed here) leaves them alone: only replayed rows are
  capped, and only replayed tokens are counted by centre_cap_frac_off."""
  _, _, g0 = _cap_run(0.0)
  for mode in centre_cap.CENTRE_CAP_MODES:
    _, m, g = _cap_run(0.25, mode)
    np.testing.assert_array_equal(g[0], g0[0])
    assert m["centre_cap_frac_off"] == 1.0  # both replayed tokens: c > 0.25


def test_centre_cap_zero_is_todays_loss_exactly():
  arrs, mask, is_off, ent = _random_mixed_batch(seed=5)
  kw = dict(alpha=0.25, clip_eps=0.2, kl_coef=0.1, entropy_coef=0.01)

  def run(**cap):
    f = lambda lp: losses.mixed_objective(
        lp, *arrs[1:], mask, is_off, ent, losses.LossConfig(**kw, **cap)
    )
    return jax.value_and_grad(f, has_aux=True)(arrs[0])

  (l0, m0), g0 = run()
  for mode in centre_cap.CENTRE_CAP_MODES:
    (l1, m1), g1 = run(centre_cap=0.0, centre_cap_mode=mode)
    assert l1 == l0 and set(m1) == set(m0)
    np.testing.assert_array_equal(g1, g0)
    for k in m0:
      np.testing.assert_array_equal(m1[k], m0[k], err_msg=k)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_centre_cap_micro_batches_sum_to_the_batch(mode):
  """With the cap on (binding on some replayed tokens), micro-batch
  contributions still sum to the batch's loss, gradient and metrics."""
  arrs, mask, is_off, ent = _random_mixed_batch(seed=1)
  kw = dict(
      alpha=0.25,
      clip_eps=0.2,
      kl_coef=0.1,
      entropy_coef=0.01,
      centre_cap=1.2,
      centre_cap_mode=mode,
  )

  def run(lp, rows, totals=None):
    others = [a[rows] for a in arrs[1:]]
    return losses.mixed_objective(
        lp[rows],
        *others,
        mask[rows],
        is_off[rows],
        ent[rows],
        losses.LossConfig(**kw),
        totals,
    )

  vg = lambda rows, t=None: jax.value_and_grad(
      lambda lp: run(lp, rows, t), has_aux=True
  )(arrs[0])
  (loss, metrics), grad = vg(np.arange(10))
  assert 0 < metrics["centre_cap_frac_off"] < 1  # the cap binds on some
  totals = losses.mixed_totals(mask, is_off, alpha=0.25)
  outs = [
      vg(rows, totals)
      for rows in (
          np.array([0, 1, 2, 3]),
          np.array([4, 5, 6]),
          np.array([7, 8, 9]),
      )
  ]
  np.testing.assert_allclose(sum(o[0][0] for o in outs), loss, atol=1e-6)
  np.testing.assert_allclose(sum(o[1] for o in outs), grad, atol=1e-7)
  for k in outs[0][0][1]:  # *_max metrics combine by max
    combine = np.max if ts.is_max_metric(k) else np.sum
    np.testing.assert_allclose(
        combine([o[0][1][k] for o in outs]), metrics[k], atol=1e-6, err_msg=k
    )


def test_centre_cap_bad_values():
  x = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match="must be >= 0"):
    losses.mixed_objective(
        x,
        x,
        x,
        x,
        x,
        x,
        jnp.zeros(1, bool),
        None,
        losses.LossConfig(
            alpha=0.25,
            clip_eps=0.2,
            kl_coef=0.0,
            entropy_coef=0.0,
            centre_cap=-1.0,
        ),
    )
  with pytest.raises(ValueError, match="unknown mode 'clamp'"):
    centre_cap.centre_cap_factor(x, 2.0, "clamp")
