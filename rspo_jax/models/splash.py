"""Pallas splash attention (TPU) for causal, right-padded rows.

    out[b, i, h] = sum_s p[b, h, i, s] v[b, s, h // G]
    p[b, h, i, :] = softmax_s(q[b, i, h] . k[b, s, h // G] / sqrt(Dh)
                              | s <= i and s < lengths[b])

(G = H / Hkv query heads per key/value head; real tokens first.) The
kernel (``jax.experimental.pallas.ops.tpu.splash_attention``) never holds
the [T, S] scores: it walks [block, block] tiles, skips those above the
diagonal (``CausalMask``) and masks the rest with segment ids -- queries
all in segment 1, keys in segment 1 below the row's length and 0 after,
so a pad query attends its row's real tokens, as the plain path's mask
does. It runs one row and one key/value head at a time in MQA mode (the
G query heads of one kv head against its single k, v; vmapped over rows
and kv heads), so k and v are never repeated to H heads.

The sequence is padded to a multiple of 128 (the kernel's tile) and split
into blocks of the largest of ``BLOCKS`` that divides it, at most
``MAX_BLOCK``. On a mesh the call runs under ``jax.shard_map``: rows split
over the 'batch' axes, kv heads over the 'heads' axes (a kv head is
repeated r times, r the least divisor of G that makes Hkv r divide over
them, e.g. 2 kv heads on a tensor axis of 4: r = 2; none: heads
replicated), sequence whole on each device.

Off TPU the kernel runs in Pallas's interpreter (``interpret_mode``):
exact, and slow (a loop over tiles), for tests on CPU; 'auto' never picks
splash there.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as sa
from jax.sharding import PartitionSpec as P

from rspo_jax import sharding

TILE = 128  # the kernel's minimum block; sequences are padded to it
BLOCKS = (512, 256, 128)  # block sizes tried, largest first
MAX_BLOCK = 512  # the largest block used (tests lower it to get more tiles)


def interpret_mode() -> bool:
  """Whether the kernel runs in Pallas's interpreter: off TPU."""
  return jax.default_backend() != "tpu"


def block_size(length: int) -> int:
  """The largest of ``BLOCKS`` (at most ``MAX_BLOCK``) dividing ``length``
  (a multiple of ``TILE``)."""
  return next(b for b in BLOCKS if b <= MAX_BLOCK and length % b == 0)


def padded_length(length: int) -> int:
  """``length`` rounded up to a multiple of ``TILE``."""
  return -(-length // TILE) * TILE


@functools.lru_cache(maxsize=32)
def _kernel(length: int, group: int, block: int, interpret: bool):
  """The MQA kernel of ``group`` query heads over ``length`` tokens (its
  block-sparsity tables built as concrete arrays, even inside a trace, so
  the cached kernel serves every program)."""
  mask = sa.MultiHeadMask([sa.CausalMask((length, length))] * group)
  sizes = sa.BlockSizes(
      block_q=block,
      block_kv=block,
      block_kv_compute=block,
      block_q_dkv=block,
      block_kv_dkv=block,
      block_kv_dkv_compute=block,
      block_q_dq=block,
      block_kv_dq=block,
  )
  with jax.ensure_compile_time_eval():
    return sa.make_splash_mqa(
        mask,
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )


def kv_repeats(num_kv_heads: int, group: int, ways: int) -> Optional[int]:
  """The least r dividing ``group`` with ``num_kv_heads * r`` divisible by
  ``ways`` (the size of the mesh axes heads split over); None if none."""
  for r in range(1, group + 1):
    if group % r == 0 and (num_kv_heads * r) % ways == 0:
      return r
  return None


def attention(q, k, v, lengths, shard):
  """Causal attention of right-padded rows by the splash kernel.

  q [B, T, H, Dh], k / v [B, T, Hkv, Dh], lengths [B] int (real tokens per
  row); ``shard`` an ``sharding.ActivationSharding`` (its mesh None: one
  device). Returns [B, T, H, Dh] in q's dtype.
  """
  b, t, h, dh = q.shape
  kv = k.shape[2]
  group = h // kv
  mesh = shard.mesh
  heads = shard.axes("heads") if mesh is not None else ()
  ways = int(np.prod([mesh.shape[a] for a in heads])) if heads else 1
  r = kv_repeats(kv, group, ways)
  if r is None:  # heads cannot split over the mesh: replicated
    r, heads = 1, ()
  tp = padded_length(t)
  kernel = _kernel(tp, group // r, block_size(tp), interpret_mode())
  pad = lambda x: jnp.pad(x, [(0, 0), (0, tp - t)] + [(0, 0)] * (x.ndim - 2))
  q = pad(q * jnp.asarray(1 / math.sqrt(dh), q.dtype))
  q = q.reshape(b, tp, kv * r, group // r, dh)
  k = pad(jnp.repeat(k.astype(q.dtype), r, axis=2))
  v = pad(jnp.repeat(v.astype(q.dtype), r, axis=2))
  key_ids = (
      jnp.arange(tp, dtype=jnp.int32)[None, :]
      < lengths.astype(jnp.int32)[:, None]
  ).astype(jnp.int32)
  local = functools.partial(_local_attention, kernel)
  if mesh is not None:
    rows = shard.axes("batch")
    fit = lambda spec, x: sharding.fit_spec_to_shape(mesh, spec, x.shape)
    hd = heads or None
    q_spec = fit(P(rows, None, hd, None, None), q)
    kv_spec = fit(P(rows, None, hd, None), k)
    ids_spec = fit(P(rows, None), key_ids)
    local = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(q_spec, kv_spec, kv_spec, ids_spec),
        out_specs=q_spec,
        check_vma=False,
    )
  out = local(q, k, v, key_ids)
  return out.reshape(b, tp, h, dh)[:, :t]


def _local_attention(kernel, q, k, v, key_ids):
  """One device's rows and kv heads: q [b, T, Hkv', g, Dh], k / v [b, T,
  Hkv', Dh], key_ids [b, T] -> [b, T, Hkv', g, Dh]."""
  query_ids = jnp.ones_like(key_ids[0])

  def one_row(q, k, v, ids):  # q [Hkv', g, T, Dh], k / v [Hkv', T, Dh]
    segments = sa.SegmentIds(q=query_ids, kv=ids)
    one_head = lambda q, k, v: kernel(q, k, v, segment_ids=segments)
    return jax.vmap(one_head)(q, k, v)

  out = jax.vmap(one_row)(
      q.transpose(0, 2, 3, 1, 4),
      k.transpose(0, 2, 1, 3),
      v.transpose(0, 2, 1, 3),
      key_ids,
  )
  return out.transpose(0, 3, 1, 2, 4)
