"""cuDNN's fused attention on CPU: its kernels replaced, its partitioning not.

``install()`` registers a CPU lowering for the two primitives that become
cuDNN's custom calls (``dot_product_attention_fwd`` / ``_bwd`` in
``jax._src.cudnn.fused_attention_stablehlo``) and answers its cuDNN version
check where no cuDNN is installed, so
``jax.nn.dot_product_attention(..., implementation='cudnn')`` traces,
partitions and compiles on CPU devices. Everything above the kernel is
jax's own code: the custom_vjp, the ``custom_partitioning`` of both
primitives and their partition callbacks, which is where a multi-device
program fails (``tests/cudnn_compile_test.py``,
``bench/sharding_check.py --cudnn``).

The stub kernels compute what cuDNN computes (BTNH layout, BTNH output):

    out[b, t, n] = sum_s p[b, n, t, s] v[b, s, n // G]
    p[b, n, t, :] = softmax_s(scale q[b, t, n] . k[b, s, n // G] | mask)
    stat[b, n, t] = logsumexp_s(scale q[b, t, n] . k[b, s, n // G] | mask)

the mask causal (s <= t) and / or padding (s < kv_seqlen[b], t <
q_seqlen[b]; a padded query's output is 0) as ``mask_type`` says; the
backward is the vjp of that forward (it ignores the saved statistics). So
a stubbed model also runs on CPU, with the values of XLA's attention.
Bias, dropout, packed rows and paged caches are not stubbed (the model uses
none): a call with one raises.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo as fa
from jax._src.interpreters import mlir

STUB_CUDNN_VERSION = 91000  # what ``check_cudnn_version`` answers: 9.10
# Kernel lowerings so far, forward and backward: a partitioned program
# lowers its kernels from the partition callbacks, so a count that grows
# shows cuDNN's partitioning ran (not an XLA fallback).
lowered = {"fwd": 0, "bwd": 0}


def _masked_scores(query, key, q_seqlen, kv_seqlen, scale, mask_type):
  """[B, N, T, S] float32 scores, -inf where masked; [B, T] real queries."""
  b, t, n, _ = query.shape
  s, kv = key.shape[1], key.shape[2]
  qg = query.reshape(b, t, kv, n // kv, -1).astype(jnp.float32)
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, key.astype(jnp.float32))
  scores = (scores * scale).reshape(b, n, t, s)
  keep = jnp.ones((b, t, s), jnp.bool_)
  real_q = jnp.ones((b, t), jnp.bool_)
  if mask_type in (fa.MaskType.CAUSAL, fa.MaskType.PADDING_CAUSAL):
    keep &= jnp.arange(s)[None, None, :] <= jnp.arange(t)[None, :, None]
  if fa.has_padding(mask_type):
    keep &= jnp.arange(s)[None, None, :] < kv_seqlen[:, None, None]
    real_q = jnp.arange(t)[None, :] < q_seqlen[:, None]
  keep &= real_q[:, :, None]
  return jnp.where(keep[:, None], scores, -jnp.inf), real_q


def _reference(query, key, value, q_seqlen, kv_seqlen, *, scale, mask_type):
  """(out [B, T, N, Hv] in query's dtype, stat [B, N, T] float32)."""
  b, t, n, _ = query.shape
  kv = key.shape[2]
  scores, real_q = _masked_scores(
      query, key, q_seqlen, kv_seqlen, scale, mask_type
  )
  stat = jax.nn.logsumexp(scores, axis=-1)
  safe = jnp.where(jnp.isfinite(stat), stat, 0.0)
  probs = jnp.exp(scores - safe[..., None])  # 0 on a fully masked row
  pg = probs.reshape(b, kv, n // kv, t, -1)
  out = jnp.einsum("bkgts,bskd->btkgd", pg, value.astype(jnp.float32))
  out = out.reshape(b, t, n, -1) * real_q[:, :, None, None]
  return out.astype(query.dtype), stat


def _check_supported(
    variadic_args, dropout_rate, layout, q_offsets, page_table_k
):
  has_bias, _ = variadic_args
  if (
      has_bias
      or dropout_rate > 0
      or layout != fa.AttentionLayout.BTNH.value
      or fa.get_max_seg_per_batch(q_offsets) > 1
      or fa.check_is_paged_attention(page_table_k)
  ):
    raise NotImplementedError(
        "cudnn_stub: only BTNH attention without bias, dropout, packing or"
        " paging is stubbed"
    )


def _fwd(
    query,
    key,
    value,
    bias,
    q_seqlen,
    kv_seqlen,
    q_offsets,
    kv_offsets,
    page_table_k,
    page_table_v,
    *,
    scale,
    seed,
    dropout_rate,
    variadic_args,
    mask_type,
    layout,
    sliding_window_length,
    is_training,
):
  del bias, kv_offsets, page_table_v, seed, sliding_window_length
  lowered["fwd"] += 1
  _check_supported(variadic_args, dropout_rate, layout, q_offsets, page_table_k)
  out, stat = _reference(
      query, key, value, q_seqlen, kv_seqlen, scale=scale, mask_type=mask_type
  )
  return [out, stat] if is_training else [out]


def _bwd(
    query,
    key,
    value,
    bias,
    q_seqlen,
    kv_seqlen,
    q_offsets,
    kv_offsets,
    page_table_k,
    page_table_v,
    activation,
    fwd_output,
    grad_output,
    *,
    scale,
    seed,
    dropout_rate,
    variadic_args,
    mask_type,
    layout,
    sliding_window_length,
):
  del bias, kv_offsets, page_table_v, activation, fwd_output, seed
  del sliding_window_length
  lowered["bwd"] += 1
  _check_supported(variadic_args, dropout_rate, layout, q_offsets, page_table_k)
  forward = lambda q, k, v: _reference(
      q, k, v, q_seqlen, kv_seqlen, scale=scale, mask_type=mask_type
  )[0]
  _, vjp = jax.vjp(forward, query, key, value)
  return list(vjp(grad_output.astype(query.dtype)))


_installed = False


def install() -> None:
  """Makes cuDNN's fused attention compile (and run) on CPU; idempotent.
  Lowerings for the 'cpu' platform only: a GPU keeps the real kernels."""
  global _installed
  if _installed:
    return
  try:
    fa.check_cudnn_version()
  except RuntimeError:  # "cuDNN is not detected": no CUDA libraries
    fa.check_cudnn_version = lambda: STUB_CUDNN_VERSION
  mlir.register_lowering(
      fa._dot_product_attention_fwd_p,
      mlir.lower_fun(_fwd, multiple_results=True),
      platform="cpu",
  )
  mlir.register_lowering(
      fa._dot_product_attention_bwd_p,
      mlir.lower_fun(_bwd, multiple_results=True),
      platform="cpu",
  )
  _installed = True
