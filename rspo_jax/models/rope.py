"""Rotary position embeddings (RoPE) of the Qwen2 / Llama decoder
(``transformer.Attention``), with Hugging Face's frequency scalings."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rspo_jax.models.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies ``theta^(-2i/Dh)``, i < Dh/2, with HF's scalings.

  llama3: wavelengths ``w = 2 pi / f`` longer than ``L / low`` are divided by
  ``factor``, shorter than ``L / high`` kept, and in between interpolated with
  ``s = (L / w - low) / (high - low)``: ``f' = (1 - s) f / factor + s f``
  (``L = original_max_position_embeddings``). linear: ``f / factor``.
  """
  dh = cfg.head_dim
  inv = 1.0 / (
      cfg.rope_theta
      ** (np.arange(0, dh, 2, dtype=np.int64).astype(np.float32) / dh)
  )
  inv = inv.astype(np.float32)
  rs = cfg.rope_scaling
  if rs is None:
    return inv
  rope_type = rs.get("rope_type", rs.get("type"))
  factor = float(rs["factor"])
  if rope_type == "linear":
    return (inv / factor).astype(np.float32)
  low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
  old_len = float(rs["original_max_position_embeddings"])
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > old_len / low, inv / factor, inv)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq) -> jax.Array:
  """Rotates halves: ``x * cos + rotate_half(x) * sin`` (HF convention).

  x [B, T, H, Dh], positions [B, T] int.
  """
  ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  ang = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]  # [B,T,1,Dh]
  cos, sin = jnp.cos(ang).astype(x.dtype), jnp.sin(ang).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos + rotated * sin
