"""Policy-gradient losses of RSPO: PPO clip, shifted clip, KL, entropy, value.

Pure jax functions, jittable (string options are static: bind them with
``functools.partial`` or ``static_argnames``). Token-level arrays are
``[B, T]`` and aligned as in :mod:`rspo_jax.types`; ``mask`` is float
``[B, T]``, 1 on the response tokens that count.

Masked tokens change nothing, in value or gradient, whatever they hold
(padding may carry arbitrary log-probs): every log-ratio is zeroed on masked
tokens *before* it is exponentiated, so no inf/nan can leak through
``0 * inf`` into a loss or its gradient.

Objective of agent A (docs/method.md section 2):
  ``J_total = (1 - alpha) * J_on + alpha * J_off``, see :func:`mixed_objective`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rspo_jax.centre_cap import apply_centre_cap, check_centre_cap

AGG_MODES = ("token_mean", "seq_mean_token_mean")
WINDOWS = ("additive", "multiplicative")
KL_KINDS = ("k1", "k2", "k3")
# Log-ratios are clamped before exp (as verl does) so one wild token cannot
# overflow float32.
LOG_RATIO_CLAMP = 20.0
# verl's low_var_kl clamps the k3 estimate itself to [-10, 10] (k3 >= 0, so
# a token's KL term is at most 10, with zero gradient beyond).
K3_CLAMP = 10.0


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Knobs of :func:`mixed_objective`, named as the run config names them:
  ``rspo.{alpha, centre_cap, centre_cap_mode}``, ``rollout.overlap`` and
  the rest ``algo.*``. Built once from the config
  (``build.policy_loss_config``); static (the jitted step closes over it).

  alpha: weight of the off-policy term (0 for B and the baseline).
  clip_eps, clip_eps_high (None = clip_eps), clip_window: eps_low, eps_high
    and the form of :func:`shifted_window`.
  kl_coef, kl_kind: beta and the estimator (:func:`kl_divergence`).
  loss_agg: mode of :func:`aggregate`.
  centre_cap, centre_cap_mode: ``centre_cap.apply_centre_cap`` on replayed
    tokens; cap 0 = off.
  clip_ratio_c: C of :func:`dual_clip` on fresh tokens; 0 = off, else > 1.
  overlap: fresh rows may be one A step stale: their clip is centred on
    pi_old / their behaviour log-probs (False: pi_B := pi_old there).
  """

  alpha: float = 0.0
  clip_eps: float = 0.2
  clip_eps_high: Optional[float] = None
  clip_window: str = "additive"
  kl_coef: float = 0.0
  kl_kind: str = "k3"
  entropy_coef: float = 0.0
  loss_agg: str = "token_mean"
  centre_cap: float = 0.0
  centre_cap_mode: str = "truncate"
  clip_ratio_c: float = 0.0
  overlap: bool = False

  def __post_init__(self):
    check_centre_cap(self.centre_cap, self.centre_cap_mode)
    check_dual_clip(self.clip_ratio_c)


def _masked(x: jax.Array, mask: jax.Array) -> jax.Array:
  """x on counted tokens, 0 elsewhere (value *and* gradient)."""
  return jnp.where(mask > 0, x, jnp.zeros_like(x))


def _masked_log_ratio(a: jax.Array, b: jax.Array, mask: jax.Array):
  """clip(a - b, -20, 20) on counted tokens, 0 on masked ones."""
  d = _masked(a, mask) - _masked(b, mask)
  return jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def aggregate(
    x: jax.Array,
    mask: jax.Array,
    mode: str,
    total: Optional[jax.Array] = None,
) -> jax.Array:
  """Reduces a per-token quantity to a scalar.

  token_mean:          sum_bt x*m / max(N, 1),   N = sum_bt m
  seq_mean_token_mean: sum over rows b with sum_t m > 0 of
                       (sum_t x*m / sum_t m) / max(N, 1),
                       N = number of such rows
  Rows with an empty mask contribute nothing; an all-empty mask gives 0.
  ``total`` replaces N (see :func:`normaliser`): with the whole update's N,
  the values of the micro-batches of one update sum to the update's value.

  Args:
    x: [B, T] values.
    mask: [B, T] float weights (1 = counted).
    mode: one of ``AGG_MODES``.
    total: the normaliser N; None = this batch's own.

  Returns:
    A float32 scalar.
  """
  chex.assert_rank([x, mask], 2)
  chex.assert_equal_shape([x, mask])
  _check_mode(mode)
  mask = mask.astype(jnp.float32)
  xm = _masked(x.astype(jnp.float32), mask) * mask
  if total is None:
    total = normaliser(mask, mode)
  if mode == "token_mean":
    return jnp.sum(xm) / jnp.maximum(total, 1.0)
  row_n = jnp.sum(mask, axis=-1)
  row_mean = jnp.sum(xm, axis=-1) / jnp.maximum(row_n, 1.0)
  has = (row_n > 0).astype(jnp.float32)
  return jnp.sum(row_mean * has) / jnp.maximum(total, 1.0)


def _check_mode(mode: str) -> None:
  if mode not in AGG_MODES:
    raise ValueError(f"aggregate: unknown mode {mode!r}; expected {AGG_MODES}")


def normaliser(mask: jax.Array, mode: str) -> jax.Array:
  """N of :func:`aggregate`: sum_bt m (token_mean), or the number of rows
  with sum_t m > 0 (seq_mean_token_mean)."""
  _check_mode(mode)
  mask = mask.astype(jnp.float32)
  if mode == "token_mean":
    return jnp.sum(mask)
  return jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))


def mask_totals(mask: jax.Array) -> dict[str, jax.Array]:
  """Whole-batch normalisers of a single-source loss:
  n_tokens = sum_bt m, n_rows = number of rows with a counted token."""
  return {
      "n_tokens": normaliser(mask, "token_mean"),
      "n_rows": normaliser(mask, "seq_mean_token_mean"),
  }


def _total(totals: dict, mode: str, suffix: str = "") -> jax.Array:
  key = "n_tokens" if mode == "token_mean" else "n_rows"
  return totals[key + suffix]


def _token_max(x: jax.Array, mask: jax.Array) -> jax.Array:
  """max of x over counted tokens; 0 when none are counted."""
  big_neg = jnp.finfo(jnp.float32).min
  m = jnp.max(jnp.where(mask > 0, x, big_neg))
  return jnp.where(jnp.sum(mask) > 0, m, 0.0)


def shifted_clip_objective(
    logp: jax.Array,
    old_logp: jax.Array,
    behavior_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: Optional[float] = None,
    window: str = "additive",
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-token generalized (shifted) clipped surrogate of RSPO.

    r = pi_theta / pi_B       = exp(logp - behavior_logp)
    c = pi_theta_old / pi_B   = exp(old_logp - behavior_logp)   (no gradient)
    [lo, hi] = shifted_window(c, eps_low, eps_high, window)
    objective = ppo_clip(r, A, lo, hi) = min(r * A, clip(r, lo, hi) * A)

  eps_low = clip_eps, eps_high = clip_eps_high or clip_eps. When
  behavior_logp == old_logp, c = 1: the objective equals PPO exactly.
  Log-ratios are clamped to [-20, 20] before exp. Only ``logp`` carries
  gradient; all other inputs are stop-gradient.

  Args:
    logp: [B, T] log pi_theta of the taken tokens.
    old_logp: [B, T] log pi_theta_old (policy at the start of the update).
    behavior_logp: [B, T] log pi_B of the policy that sampled the tokens.
    advantages: [B, T].
    mask: [B, T] float, 1 on counted tokens.
    clip_eps: eps_low.
    clip_eps_high: eps_high (None = clip_eps), for asymmetric windows.
    window: 'additive' (default) or 'multiplicative'.

  Returns:
    objective [B, T] (0 on masked tokens) and per-token diagnostics:
    ratio (r), centre (c), lower, upper, clipped (1.0 where the clipped
    branch is active and differs, else 0), and its two sides: clipped_low
    (r < lower, A < 0) and clipped_high (r > upper, A > 0).
  """
  chex.assert_rank([logp, old_logp, behavior_logp, advantages, mask], 2)
  chex.assert_equal_shape([logp, old_logp, behavior_logp, advantages, mask])
  if window not in WINDOWS:
    raise ValueError(
        f"shifted_clip_objective: unknown window {window!r}; expected {WINDOWS}"
    )
  eps_low = clip_eps
  eps_high = clip_eps if clip_eps_high is None else clip_eps_high
  logp = logp.astype(jnp.float32)
  old_logp = jax.lax.stop_gradient(old_logp.astype(jnp.float32))
  behavior_logp = jax.lax.stop_gradient(behavior_logp.astype(jnp.float32))
  adv = jax.lax.stop_gradient(_masked(advantages.astype(jnp.float32), mask))

  ratio = jnp.exp(_masked_log_ratio(logp, behavior_logp, mask))
  centre = jnp.exp(_masked_log_ratio(old_logp, behavior_logp, mask))
  lower, upper = shifted_window(centre, eps_low, eps_high, window)
  objective, is_clipped = ppo_clip(ratio, adv, lower, upper)
  objective = _masked(objective, mask)
  diag = {
      "ratio": ratio,
      "centre": centre,
      "lower": lower,
      "upper": upper,
      "clipped": _masked(is_clipped.astype(jnp.float32), mask),
      "clipped_low": _masked(
          (is_clipped & (ratio < lower)).astype(jnp.float32), mask
      ),
      "clipped_high": _masked(
          (is_clipped & (ratio > upper)).astype(jnp.float32), mask
      ),
  }
  return objective, diag


def ppo_clip(
    ratio: jax.Array, advantages: jax.Array, lower, upper
) -> tuple[jax.Array, jax.Array]:
  """PPO's clipped surrogate on the window [lower, upper], per token.

    objective = min(r * A, clip(r, lower, upper) * A)

  taken with ``where``, not ``minimum``: where the clipped branch is the
  smaller one and differs, the objective is the constant bound times A and
  its gradient is exactly 0; elsewhere it is exactly r * A's. PPO's window
  is [1 - eps_low, 1 + eps_high]; RSPO's is :func:`shifted_window`.

  Args:
    ratio: [B, T] r (carries gradient).
    advantages: [B, T] A (no gradient).
    lower: [B, T] (or scalar) lower bound of the window.
    upper: [B, T] (or scalar) upper bound.

  Returns:
    objective [B, T] and is_clipped [B, T] bool (the clipped branch is
    active and differs).
  """
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, lower, upper) * advantages
  is_clipped = clipped < unclipped
  return jnp.where(is_clipped, clipped, unclipped), is_clipped


def shifted_window(
    centre: jax.Array,
    eps_low: float,
    eps_high: float,
    window: str = "additive",
) -> tuple[jax.Array, jax.Array]:
  """RSPO's clip window [lower, upper] around c = pi_old / pi_B:

    additive:       [c - eps_low,       c + eps_high]        (paper)
    multiplicative: [c * (1 - eps_low), c * (1 + eps_high)]  (AReaL)

  At c = 1 (tokens sampled by pi_old) both are PPO's [1 - eps_low,
  1 + eps_high]."""
  if window == "additive":
    return centre - eps_low, centre + eps_high
  return centre * (1.0 - eps_low), centre * (1.0 + eps_high)


def dual_clip(
    objective: jax.Array,
    ratio: jax.Array,
    centre: jax.Array,
    advantages: jax.Array,
    c: float,
    mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """verl's dual clip (``clip_ratio_c``, Ye et al. 2020) of a clip objective.

    held      = mask * [A < 0 and r > C * c]
    objective = C * c * A where held, else objective   (zero gradient there)

  With c = 1 this is max(min(r A, clip(r) A), C A) where A < 0, verl's
  ``compute_policy_loss``: a token with A < 0 whose ratio grew past C gets
  a constant objective. On a fresh row one A step stale (c = pi_old /
  pi_behaviour) it is c * max(PPO(r / c), C A), AReaL's decoupled loss:
  r / c = pi_theta / pi_old, so the rule acts on the ratio to pi_old.

  Args:
    objective: [B, T] clip objective.
    ratio: [B, T] r = pi_theta / pi_B.
    centre: [B, T] c (no gradient).
    advantages: [B, T] A (no gradient).
    c: C (> 1).
    mask: [B, T] float, the tokens it may hold.

  Returns:
    objective [B, T] and held [B, T] float (1.0 where held at C * c * A).
  """
  held = _masked(
      ((advantages < 0) & (ratio > c * centre)).astype(jnp.float32), mask
  )
  return jnp.where(held > 0, c * centre * advantages, objective), held


def check_dual_clip(c: float) -> None:
  """ValueError unless the dual clip's C is 0 (off) or > 1 (verl asserts
  clip_ratio_c > 1: at C <= 1 it would hold tokens inside PPO's window)."""
  if not (c == 0 or c > 1):
    raise ValueError(f"dual clip: C = {c!r} must be 0 (off) or > 1")


def kl_divergence(
    logp: jax.Array, ref_logp: jax.Array, kind: str = "k3"
) -> jax.Array:
  """Per-token estimator of KL(pi_theta || pi_ref) on sampled tokens.

    d  = logp - ref_logp
    k1 = d
    k2 = 0.5 * d^2
    k3 = min(exp(-d) - (-d) - 1, 10)   (Schulman's low-variance estimator,
                                         >= 0; verl's ``low_var_kl``)
  For k3 the log-ratio is clamped to [-20, 20] before exp and the estimate
  to at most 10, as verl's ``kl_penalty`` does (core_algos.py): a token
  whose k3 exceeds 10 (d < -2.65 or d > ~12) adds a constant 10 with zero
  gradient. k1 and k2 use d as is.

  Args:
    logp: [B, T] log pi_theta.
    ref_logp: [B, T] log pi_ref.
    kind: 'k1', 'k2' or 'k3'.

  Returns:
    [B, T] float32.
  """
  chex.assert_rank([logp, ref_logp], 2)
  chex.assert_equal_shape([logp, ref_logp])
  d = logp.astype(jnp.float32) - ref_logp.astype(jnp.float32)
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * jnp.square(d)
  if kind == "k3":
    return jnp.minimum(_k3(d), K3_CLAMP)
  raise ValueError(f"kl_divergence: unknown kind {kind!r}; expected {KL_KINDS}")


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Per-token entropy H = -sum_v p_v log p_v, p = softmax(logits), in fp32.

  Uses log_softmax; vocabulary entries with p = 0 (logit -inf) add 0.

  Args:
    logits: [B, T, V].

  Returns:
    [B, T] float32.
  """
  chex.assert_rank(logits, 3)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  p = jnp.exp(logp)
  plogp = jnp.where(p > 0, p * logp, 0.0)
  return -jnp.sum(plogp, axis=-1)


def shifted_clip_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    behavior_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: Optional[float] = None,
    window: str = "additive",
    agg: str = "token_mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """loss = -aggregate(shifted_clip_objective(...), mask, agg).

  Metrics (token means over counted tokens, whatever ``agg`` is):
    pg_loss:     the loss itself.
    clip_frac:   fraction of tokens where the clipped branch is active and
                 differs (those tokens get zero gradient); clip_frac_low
                 and clip_frac_high split it by side (r < lower, A < 0;
                 r > upper, A > 0).
    approx_kl:   k3 estimate of KL(pi_old || pi_theta) from pi_old's
                 samples: r - 1 - log r, r = exp(logp - old_logp) (tokens
                 sampled from pi_B != pi_old make it a movement measure).
    ratio_mean:  mean of r = pi_theta / pi_B;  ratio_max: its max.
    centre_mean: mean of c = pi_old / pi_B (1 for on-policy tokens).

  See :func:`shifted_clip_objective` for the arguments.
  """
  obj, diag = shifted_clip_objective(
      logp,
      old_logp,
      behavior_logp,
      advantages,
      mask,
      clip_eps=clip_eps,
      clip_eps_high=clip_eps_high,
      window=window,
  )
  loss = -aggregate(obj, mask, agg)
  metrics = _policy_metrics(logp, old_logp, diag, mask)
  metrics["pg_loss"] = loss
  return loss, metrics


def _k3(d: jax.Array) -> jax.Array:
  """exp(-d) + d - 1 with d clamped to [-20, 20]; d = log pi - log pi_ref."""
  neg = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.exp(neg) - neg - 1.0


def _approx_kl(logp, old_logp, mask, total=None) -> jax.Array:
  """Token mean of r - 1 - log r, r = pi_theta / pi_old = exp(d),
  d = logp - old: Schulman's k3 estimate of KL(pi_old || pi_theta) when
  the tokens are pi_old's samples, as fresh tokens are (verl logs the k1
  mean of -d, ``ppo_kl``, of the same KL). ``mixed_objective`` logs it over
  fresh tokens (approx_kl) and, apart, over replayed ones (approx_kl_off:
  pi_B's samples, so a diagnostic of movement, not a KL estimate). Not
  clamped at 10.

  Not exp(-d) + d - 1 (the KL penalty's direction, ``_k3``): under pi_old's
  samples its mean is E_old[pi_old / pi_theta] - 1 - KL, heavy-tailed (one
  token whose probability fell by e^-13 adds e^13 to the sum; here 12);
  log_ratio_fall_max shows such a fall itself."""
  d = _masked_log_ratio(logp, old_logp, mask)
  k3 = jnp.exp(d) - 1.0 - d
  return aggregate(jax.lax.stop_gradient(k3), mask, "token_mean", total)


def _log_ratio_extremes(logp, old_logp, mask) -> dict[str, jax.Array]:
  """How far the most-moved counted tokens moved from pi_old, in nats:
  log_ratio_fall_max = max(0, max_t (old_t - logp_t)), log_ratio_rise_max
  = max(0, max_t (logp_t - old_t)) (d clamped at 20). ``*_max`` metrics
  combine by max over micro-batches and a step's updates
  (train_step.is_max_metric): the tail a token mean hides."""
  d = jax.lax.stop_gradient(_masked_log_ratio(logp, old_logp, mask))
  return {
      "log_ratio_fall_max": jnp.maximum(_token_max(-d, mask), 0.0),
      "log_ratio_rise_max": jnp.maximum(_token_max(d, mask), 0.0),
  }


def _policy_metrics(logp, old_logp, diag, mask) -> dict[str, jax.Array]:
  mask = mask.astype(jnp.float32)
  return {
      "clip_frac": aggregate(diag["clipped"], mask, "token_mean"),
      "clip_frac_low": aggregate(diag["clipped_low"], mask, "token_mean"),
      "clip_frac_high": aggregate(diag["clipped_high"], mask, "token_mean"),
      "approx_kl": _approx_kl(logp, old_logp, mask),
      "ratio_mean": aggregate(diag["ratio"], mask, "token_mean"),
      "ratio_max": _token_max(diag["ratio"], mask),
      "centre_mean": aggregate(diag["centre"], mask, "token_mean"),
  }


def ppo_clip_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    **kw,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO's clipped loss: :func:`shifted_clip_loss` with pi_B = pi_old.

  Per token and over the batch:

    r = pi_theta / pi_old,
    loss = -agg(min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)).
  """
  return shifted_clip_loss(logp, old_logp, old_logp, advantages, mask, **kw)


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.5,
    agg: str = "token_mean",
    totals: Optional[dict] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO's clipped value loss.

    v_clip = clip(v, v_old - eps, v_old + eps)
    loss   = agg(max((v - R)^2, (v_clip - R)^2))

  as verl-agent's ``compute_value_loss`` (no 1/2 factor; later verl
  versions added one).

  Args:
    values: [B, T] critic values v (carry gradient).
    old_values: [B, T] values at collection time v_old.
    returns: [B, T] targets R.
    mask: [B, T] float.
    clip_eps: half-width of the value window.
    agg: aggregation mode.
    totals: ``mask_totals`` of the whole update when this is one of its
      micro-batches: loss and metrics are then this micro-batch's
      contributions (they sum to the update's values). None: this batch's.

  Returns:
    loss and metrics: vf_loss, vf_clip_frac (tokens where the clipped term
    is the larger one), value_mean, return_mean.
  """
  chex.assert_rank([values, old_values, returns, mask], 2)
  chex.assert_equal_shape([values, old_values, returns, mask])
  if totals is None:
    totals = mask_totals(mask)
  n_tok = totals["n_tokens"]
  v = _masked(values.astype(jnp.float32), mask)
  v_old = jax.lax.stop_gradient(_masked(old_values.astype(jnp.float32), mask))
  ret = jax.lax.stop_gradient(_masked(returns.astype(jnp.float32), mask))
  v_clip = jnp.clip(v, v_old - clip_eps, v_old + clip_eps)
  l_unclipped = jnp.square(v - ret)
  l_clipped = jnp.square(v_clip - ret)
  per_token = jnp.maximum(l_unclipped, l_clipped)
  loss = aggregate(per_token, mask, agg, _total(totals, agg))
  metrics = {
      "vf_loss": loss,
      "vf_clip_frac": aggregate(
          (l_clipped > l_unclipped).astype(jnp.float32),
          mask,
          "token_mean",
          n_tok,
      ),
      "value_mean": aggregate(v, mask, "token_mean", n_tok),
      "return_mean": aggregate(ret, mask, "token_mean", n_tok),
  }
  return loss, metrics


def mixed_totals(
    loss_mask: jax.Array, is_offpolicy: jax.Array, *, alpha: float
) -> dict[str, jax.Array]:
  """Whole-update quantities of :func:`mixed_objective`, from the full batch.

    n_tokens_src = sum of the loss mask over src's rows     (src = on, off)
    n_rows_src   = number of src's rows with a counted token
    (w_on, w_off) = (1 - alpha, alpha) if both n_tokens > 0,
                    (1, 0) or (0, 1) if only one is,  (0, 0) if neither.

  Inside a jitted step over a global (sharded) batch these sums run over
  every device and host.
  """
  mask = loss_mask.astype(jnp.float32)
  off_rows = is_offpolicy.astype(bool)[:, None]
  mask_on = jnp.where(off_rows, 0.0, mask)
  mask_off = jnp.where(off_rows, mask, 0.0)
  totals = {}
  for src, m in (("on", mask_on), ("off", mask_off)):
    for key, value in mask_totals(m).items():
      totals[f"{key}_{src}"] = value
  has_on = totals["n_tokens_on"] > 0
  has_off = totals["n_tokens_off"] > 0
  both = has_on & has_off
  totals["w_on"] = jnp.where(both, 1.0 - alpha, jnp.where(has_on, 1.0, 0.0))
  totals["w_off"] = jnp.where(both, alpha, jnp.where(has_off, 1.0, 0.0))
  return totals


def _sources(loss_mask: jax.Array, is_offpolicy: jax.Array):
  """mask (float), replayed rows [B, 1] bool, and the masks of the fresh
  (on) and replayed (off) rows."""
  mask = loss_mask.astype(jnp.float32)
  off_rows = is_offpolicy.astype(bool)[:, None]
  return (
      mask,
      off_rows,
      jnp.where(off_rows, 0.0, mask),
      jnp.where(off_rows, mask, 0.0),
  )


def _clip_objective(
    logp, old_logp, behavior_logp, advantages, mask, off_rows, cfg: LossConfig
):
  """The clip objective of :func:`mixed_objective`, per token.

    fresh rows:    PPO clip, pi_B := pi_old (``cfg.overlap``: their own
                   behaviour log-probs, the shifted clip), then the dual
                   clip (``cfg.clip_ratio_c`` > 0)
    replayed rows: shifted clip around c = pi_old / pi_B, then the centre
                   cap (``cfg.centre_cap`` > 0)

  Returns:
    objective [B, T], the shifted clip's diagnostics, and held: {metric
    name: (source, [B, T] indicator)} of the dual clip and the cap.
  """
  mask_on = jnp.where(off_rows, 0.0, mask)
  behavior = (
      behavior_logp
      if cfg.overlap
      else jnp.where(off_rows, behavior_logp, old_logp)
  )
  obj, diag = shifted_clip_objective(
      logp,
      old_logp,
      behavior,
      advantages,
      mask,
      clip_eps=cfg.clip_eps,
      clip_eps_high=cfg.clip_eps_high,
      window=cfg.clip_window,
  )
  held = {}
  if cfg.centre_cap:
    obj, over = apply_centre_cap(
        obj, diag["centre"], off_rows, cfg.centre_cap, cfg.centre_cap_mode
    )
    held["centre_cap_frac_off"] = (
        "off",
        _masked(over, jnp.where(off_rows, mask, 0.0)),
    )
  if cfg.clip_ratio_c:
    obj, dual = dual_clip(
        obj,
        diag["ratio"],
        jax.lax.stop_gradient(diag["centre"]),
        jax.lax.stop_gradient(advantages.astype(jnp.float32)),
        cfg.clip_ratio_c,
        mask_on,
    )
    held = {"clip_frac_on_dual": ("on", dual), **held}
  return obj, diag, held


def _check_mixed_inputs(arrays, is_offpolicy, entropy) -> None:
  chex.assert_rank(arrays, 2)
  chex.assert_equal_shape(arrays)
  chex.assert_rank(is_offpolicy, 1)
  chex.assert_axis_dimension(is_offpolicy, 0, arrays[0].shape[0])
  if entropy is not None:
    chex.assert_equal_shape([entropy, arrays[0]])


def mixed_objective(
    logp: jax.Array,
    old_logp: jax.Array,
    behavior_logp: jax.Array,
    ref_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    is_offpolicy: jax.Array,
    entropy: Optional[jax.Array],
    cfg: LossConfig,
    totals: Optional[dict] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """RSPO's loss for agent A over a batch mixing on- and off-policy rows.

    f       = clip objective - kl_coef * KL(pi_theta || pi_ref)   per token
    J_src   = sum_{src tokens} f / N_src                 (token_mean)
              sum_{src rows} mean_t f / R_src            (seq_mean_token_mean)
    J_total = w_on * J_on + w_off * J_off
    loss    = -J_total - entropy_coef * H,   H normalised by N_on + N_off
                                             (or R_on + R_off) alike

  The clip objective: fresh (on-policy) rows take pi_B := pi_old, so
  :func:`shifted_clip_objective` is PPO's clip there (with ``cfg.overlap``
  they keep ``behavior_logp``: c = pi_old / pi_behaviour, AReaL's decoupled
  PPO); replayed rows the shifted clip around c = pi_old / pi_B. Then
  ``centre_cap.apply_centre_cap`` on replayed rows (``cfg.centre_cap`` > 0; the
  paper has none) and :func:`dual_clip` on fresh tokens
  (``cfg.clip_ratio_c`` > 0; replayed ones keep the paper's J_off).

  N_src, R_src (counted tokens, rows with a counted token) and the weights
  come from ``totals`` (:func:`mixed_totals`; None: this batch's own).
  Given a whole update's totals, the call on one micro-batch returns its
  *contribution*: summed over any partition of the update's rows (padding
  rows of zero mask included), loss, gradient and metrics are the
  update's.

  Args:
    logp, old_logp, behavior_logp, ref_logp, advantages: [B, T].
    loss_mask: [B, T] float, 1 on counted response tokens.
    is_offpolicy: [B] bool, row sampled from the replay buffer.
    entropy: [B, T] per-token policy entropy, or None (no entropy term).
    cfg: the knobs (:class:`LossConfig`).
    totals: the whole update's :func:`mixed_totals`, or None.

  Returns:
    loss (scalar) and metrics, each a token mean over the counted tokens of
    its source normalised by the totals: loss, entropy, pg_loss_on/off (-J
    of the clip objective alone), clip_frac_{on,off}{,_low,_high} (clipped
    branch active; r < lower, A < 0; r > upper, A > 0), kl_on/off,
    ratio_mean_on/off, approx_kl(_off) (:func:`_approx_kl` over fresh /
    replayed tokens), log_ratio_{fall,rise}_max (:func:`_log_ratio_extremes`);
    clip_frac_on_dual (fresh tokens held by the dual clip, verl's
    pg_clipfrac_lower) and centre_cap_frac_off (replayed tokens with
    c > cap) when those are on; with ``totals=None`` also this batch's
    totals (n_tokens_on/off, n_rows_on/off, w_on/off).
  """
  _check_mixed_inputs(
      [logp, old_logp, behavior_logp, ref_logp, advantages, loss_mask],
      is_offpolicy,
      entropy,
  )
  own_totals = totals is None
  if own_totals:
    totals = mixed_totals(loss_mask, is_offpolicy, alpha=cfg.alpha)
  mask, off_rows, mask_on, mask_off = _sources(loss_mask, is_offpolicy)
  obj, diag, held = _clip_objective(
      logp, old_logp, behavior_logp, advantages, mask, off_rows, cfg
  )
  kl = kl_divergence(_masked(logp, mask), _masked(ref_logp, mask), cfg.kl_kind)
  per_token = obj - cfg.kl_coef * kl

  agg = cfg.loss_agg
  masks = {"on": mask_on, "off": mask_off}
  norm = {src: _total(totals, agg, f"_{src}") for src in masks}
  j_on = aggregate(per_token, mask_on, agg, norm["on"])
  j_off = aggregate(per_token, mask_off, agg, norm["off"])
  j_total = totals["w_on"] * j_on + totals["w_off"] * j_off
  if entropy is None:
    ent = jnp.zeros((), jnp.float32)
  else:
    ent = aggregate(entropy, mask, agg, norm["on"] + norm["off"])
  loss = -j_total - cfg.entropy_coef * ent

  metrics = {"loss": loss, "entropy": ent}
  metrics.update(_source_metrics(obj, kl, diag, held, masks, norm, totals, agg))
  metrics["approx_kl"] = _approx_kl(
      logp, old_logp, mask_on, totals["n_tokens_on"]
  )
  metrics["approx_kl_off"] = _approx_kl(
      logp, old_logp, mask_off, totals["n_tokens_off"]
  )
  metrics.update(_log_ratio_extremes(logp, old_logp, mask))
  if own_totals:
    metrics.update(totals)
  return loss, metrics


def _source_metrics(obj, kl, diag, held, masks, norm, totals, agg):
  """Per-source metrics of :func:`mixed_objective`: pg_loss (``agg``, by
  ``norm``), token means of the clip diagnostics, KL and ratio, and the
  shares ``held`` ({name: (source, [B, T] indicator)}), each over its
  source's counted tokens."""
  token_means = (
      ("clip_frac_{}", diag["clipped"]),
      ("clip_frac_{}_low", diag["clipped_low"]),
      ("clip_frac_{}_high", diag["clipped_high"]),
      ("kl_{}", kl),
      ("ratio_mean_{}", diag["ratio"]),
  )
  n = {src: totals[f"n_tokens_{src}"] for src in masks}
  metrics = {}
  for src, m in masks.items():
    metrics[f"pg_loss_{src}"] = -aggregate(obj, m, agg, norm[src])
    for name, x in token_means:
      metrics[name.format(src)] = aggregate(x, m, "token_mean", n[src])
  for name, (src, x) in held.items():
    metrics[name] = aggregate(x, masks[src], "token_mean", n[src])
  return metrics
