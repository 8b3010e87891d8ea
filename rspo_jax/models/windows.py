"""Response windows: a static span of R positions per row.

The loss of an RL or SFT row only counts its response tokens, a short span
at the end of a long prompt. Computing the LM head and the log-softmax on a
static window of R positions per row instead of all T (TRL's
``logits_to_keep``) saves (T - R) / T of that work, forward and backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def window_starts(loss_mask: jax.Array, window: int) -> jax.Array:
  """[B] int32 first position of each row's window of ``window`` tokens.

    s_b = clip(first t with loss_mask[b, t] > 0, 1, T - window)

  Every counted token of row b lies in [s_b, s_b + window) when its counted
  span (first to last counted token) is at most ``window`` long. s_b >= 1
  because token 0 has no predicting position; rows without counted tokens
  get s_b = 1.
  """
  t = loss_mask.shape[1]
  if not 0 < window < t:
    raise ValueError(f"window_starts: window {window} outside (0, {t})")
  first = jnp.argmax(loss_mask > 0, axis=1).astype(jnp.int32)
  return jnp.clip(first, 1, t - window)


def take_window(x: jax.Array, starts: jax.Array, window: int) -> jax.Array:
  """``y[b, i] = x[b, starts[b] + i]``, i < window; x [B, T, ...]."""
  take = lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, window, axis=0)
  return jax.vmap(take)(x, starts)


def put_window(y: jax.Array, starts: jax.Array, length: int) -> jax.Array:
  """Inverse of ``take_window`` on [B, R]: [B, length] with ``y[b]`` at
  [starts[b], starts[b] + R) and 0 elsewhere."""
  zeros = jnp.zeros((length,) + y.shape[2:], y.dtype)
  put = lambda row, s: jax.lax.dynamic_update_slice_in_dim(zeros, row, s, 0)
  return jax.vmap(put)(y, starts)
