"""The centre cap of replayed tokens (``rspo.centre_cap``, off by default).

A replayed token's shifted clip is centred on c = pi_old / pi_B, so its
gradient weight at r = c is c * A, unbounded. The cap bounds it: truncate
(weight min(c, cap) * A) or mask (the token contributes nothing).
:func:`rspo_jax.losses.mixed_objective` applies it to replayed rows;
docs/method.md has the derivation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

CENTRE_CAP_MODES = ("truncate", "mask")


def apply_centre_cap(
    objective: jax.Array,
    centre: jax.Array,
    rows: jax.Array,
    cap: float,
    mode: str,
) -> tuple[jax.Array, jax.Array]:
  """The clip objective of ``rows`` times :func:`centre_cap_factor`'s f.

    objective' = f * objective on rows, objective elsewhere
    truncate: f = min(1, cap / c);  mask: f = [c <= cap]

  so a token at r = c has gradient weight min(c, cap) * A, or 0.

  Args:
    objective: [B, T].
    centre: [B, T] c (no gradient).
    rows: [B, 1] bool, the rows capped (replayed rows).
    cap: the cap (> 0).
    mode: one of ``CENTRE_CAP_MODES``.

  Returns:
    objective [B, T] and over [B, T] (1.0 where c > cap, else 0).
  """
  factor, over = centre_cap_factor(centre, cap, mode)
  return jnp.where(rows, objective * factor, objective), over


def centre_cap_factor(
    centre: jax.Array, cap: float, mode: str = "truncate"
) -> tuple[jax.Array, jax.Array]:
  """Stop-gradient factor f that bounds a replayed token's weight c.

  At r = c the shifted clip's gradient is c * A * grad log pi: weighted by
  c = pi_old / pi_B, which is unbounded. With ``cap`` > 0 the token's clip
  objective is multiplied by

    truncate: f = min(1, cap / c)       -> gradient weight min(c, cap) * A
              (truncated importance sampling, V-trace's rho-bar)
    mask:     f = 1 if c <= cap else 0  -> the token contributes nothing
              (AReaL's ``behav_imp_weight_cap``)

  AReaL's decoupled loss (areal/utils/functional.py ``ppo_actor_loss_fn``)
  is w * PPO-clip(pi_theta / pi_prox), w = pi_prox / pi_behav (our c);
  tokens with w > behav_imp_weight_cap get w = 0 (kept: w <= cap, as here)
  and the loss is still divided by the count of the *original* loss mask
  (its later ``apply_rejection_sampling``, action 'mask', keeps that
  denominator on purpose; action 'clamp' is our truncate). So here a
  masked token still counts in its source's normaliser (N_off, R_off) and
  in the (1 - alpha, alpha) decision.

  Args:
    centre: [B, T] c (no gradient).
    cap: the cap (> 0; ``losses.mixed_objective`` skips this when it is 0).
    mode: one of ``CENTRE_CAP_MODES``.

  Returns:
    f [B, T] and over [B, T] (1.0 where c > cap, else 0).
  """
  check_centre_cap(cap, mode)
  centre = jax.lax.stop_gradient(centre)
  over = centre > cap
  if mode == "truncate":
    factor = jnp.where(over, cap / jnp.maximum(centre, cap), 1.0)
  else:
    factor = jnp.where(over, 0.0, 1.0)
  return factor, over.astype(jnp.float32)


def check_centre_cap(cap: float, mode: str) -> None:
  """ValueError for a cap < 0 or a mode not in ``CENTRE_CAP_MODES``."""
  if mode not in CENTRE_CAP_MODES:
    raise ValueError(
        f"centre cap: unknown mode {mode!r};" f" expected {CENTRE_CAP_MODES}"
    )
  if not cap >= 0:
    raise ValueError(f"centre cap: cap {cap!r} must be >= 0 (0 = off)")
