"""cuDNN's fused attention (``jax.nn.dot_product_attention``) on a mesh.

    out[b, i, h] = sum_s p[b, h, i, s] v[b, s, h // G]
    p[b, h, i, :] = softmax_s(q[b, i, h] . k[b, s, h // G] / sqrt(Dh)
                              | s <= i and s < lengths[b])

(G = H / Hkv.) On a mesh the call runs under a fully manual
``jax.shard_map``, as splash attention does (``splash.py``): rows split
over the 'batch' axes, heads over the 'heads' axes, each device calling the
kernel on its own block. cuDNN's own partitioning (``custom_partitioning``
in jax's ``fused_attention_stablehlo``) never runs then. Left to it, two
layouts failed to compile (jax 0.10.2; `bench/sharding_check.py --cudnn`
checks them on CPU): inside the train step's data-local
micro-batch loop (manual over 'data' only) its partition callback met an
unnamed sharding (``'GSPMDSharding' object has no attribute 'spec'``), and
with more devices on 'tensor' than kv heads it needs q, k and v split
alike. Here a kv head is repeated r times, r the least divisor of G that
makes Hkv r divide over the 'heads' axes (``splash.kv_repeats``: 2 kv heads
on a tensor axis of 4, r = 2); where none does (Hkv = 4, G = 7 on 8), the
heads stay whole on every device of that axis (each computes them all).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rspo_jax import sharding
from rspo_jax.models.splash import kv_repeats


def _kernel(q, k, v, lengths, implementation):
  return jax.nn.dot_product_attention(
      q,
      k,
      v,
      is_causal=True,
      key_value_seq_lengths=lengths,
      implementation=implementation,
  )


def attention(q, k, v, lengths, shard, implementation: str = "cudnn"):
  """Causal attention of right-padded rows by ``jax.nn.
  dot_product_attention(implementation=...)``.

  q [B, T, H, Dh], k / v [B, T, Hkv, Dh], lengths [B] int32 (real tokens
  per row, at least 1); ``shard`` an ``sharding.ActivationSharding`` (its
  mesh None: one device, the kernel called as it is). Returns [B, T, H, Dh]
  in q's dtype.
  """
  local = functools.partial(_kernel, implementation=implementation)
  mesh = shard.mesh
  if mesh is None:
    return local(q, k, v, lengths)
  h, kv = q.shape[2], k.shape[2]
  heads = shard.axes("heads")
  ways = int(np.prod([mesh.shape[a] for a in heads])) if heads else 1
  r = kv_repeats(kv, h // kv, ways)
  if r is None:  # heads cannot split over the mesh: whole on each device
    r, heads = 1, ()
  k = jnp.repeat(k, r, axis=2)
  v = jnp.repeat(v, r, axis=2)
  rows = shard.axes("batch") or None
  fit = lambda spec, x: sharding.fit_spec_to_shape(mesh, spec, x.shape)
  q_spec = fit(P(rows, None, heads or None, None), q)
  kv_spec = fit(P(rows, None, heads or None, None), k)
  lengths_spec = fit(P(rows), lengths)
  local = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(q_spec, kv_spec, kv_spec, lengths_spec),
      out_specs=q_spec,
      check_vma=False,
  )
  return local(q, k, v, lengths)
