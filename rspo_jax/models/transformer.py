"""Qwen2 / Llama decoder in Flax NNX, with a KV cache for generation.

    h_0     = E[tokens]
    a_l     = h_{l-1} + Attn(RMSNorm(h_{l-1}))          (GQA, RoPE)
    h_l     = a_l + W_down (silu(W_gate x) * W_up x),   x = RMSNorm(a_l)
    logits  = RMSNorm(h_L) W_out                         (W_out = E^T when tied)

Numerics: weights are stored in ``cfg.param_dtype`` (float32 masters) and
cast to the compute dtype ``cfg.dtype`` at each use; RMSNorm statistics,
attention scores and softmax, and the logits are float32.

LoRA (``cfg.lora_rank > 0``, ``lora.py``): each target projection adds
``(alpha / r) B(A(x))`` to its einsum's output (``Attention._proj`` /
``_out``, ``MLP._mm``); the base weights are ``lora.FrozenParam`` in the
compute dtype, the adapters ``nnx.LoRAParam`` in ``param_dtype``.

Attention (``cfg.attention``, ``attention_implementation``): without a KV
cache or an offset window, a kernel -- ``jax.nn.dot_product_attention``
(cuDNN's fused kernel on GPU, ``cudnn_attention.py``; XLA's on CPU) or
Pallas splash attention on TPU (``splash.py``); on a mesh both fused
kernels run under a fully manual ``jax.shard_map`` -- causal, with
padding given as each row's number of real tokens (real tokens first:
right padding, as in the learner's batches); the KV-cache path (prefill
into a cache, one-token decode) and the response window's last block use
the plain einsum path with an explicit [B, Tq, S] mask, as does
``attention = 'plain'``.

Layers (``cfg.scan_layers``): unrolled, ``layers/<i>/...`` one Block per
layer, or scanned, one Block of [L, ...] variables run as one
``jax.lax.scan`` (XLA compiles one block, not L; under ``cfg.remat`` each
step is rematerialised). Both layouts hold the same values (layer i of the
stack is block i; ``scanned_state`` / ``unrolled_state`` convert) and give
the same outputs and gradients. The KV-cache path runs block by block
either way (a scanned model slices each layer's weights); the rollout
engine holds the unrolled layout (``unrolled``).

Parameters name logical axes only (``sharding.LOGICAL_AXES``); the mesh
mapping is applied by ``sharding.state_shardings``. Activations are
constrained to their logical axes too (the embedding output and each block's
output ``ACTIVATION``, q / k / v, the MLP hidden, the final hidden and the
logits, the KV cache), with ``cfg.rules``, when the inputs lie on a mesh
(``sharding.ActivationSharding``; the identity otherwise): rows stay split
over ('data', 'fsdp') and heads / mlp / vocab over 'tensor' through the
forward and backward, instead of XLA's choice of gathering them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from rspo_jax import sharding as _sharding  # noqa: F401  (sets flax flags)
from rspo_jax.models import cudnn_attention, lora_layers as lora, splash
from rspo_jax.models.config import ModelConfig
from rspo_jax.models.rope import apply_rope, rope_inv_freq
from rspo_jax.models.windows import take_window

_MASK_VALUE = -1e30  # finite, so fully-masked (padding) rows give no NaN
_INIT_STD = 0.02

# Logical axes of activations.
ACTIVATION = ("batch", "length", "embed")  # [B, T, D]
QUERY = ("batch", "length", "heads", "head_dim")  # [B, T, H, Dh]
KEY_VALUE = ("batch", "length", "kv_heads", "head_dim")  # [B, T, Hkv, Dh]
MLP_HIDDEN = ("batch", "length", "mlp")  # [B, T, F]
LOGITS = ("batch", "length", "vocab")  # [B, T, V]
MASK = ("batch", "length", "cache_length")  # [B, T, S]
CACHE = ("batch", "kv_heads", "cache_length", "head_dim")  # [B, Hkv, S, Dh]
NO_SHARDING = _sharding.ActivationSharding()


def attention_implementation(cfg: ModelConfig) -> Optional[str]:
  """The kernel ``cfg.attention`` selects: 'splash' (``splash.py``), a
  ``jax.nn.dot_product_attention`` implementation ('cudnn', 'xla'), or
  None for the plain einsum path.

  'auto': 'splash' on TPU; 'cudnn' on GPU for bfloat16 / float16 compute
  with a head width cuDNN's flash attention takes (a multiple of 8, at most
  128); else 'xla'. ('splash' off TPU runs Pallas's interpreter: for tests.)
  """
  name = cfg.attention
  if name == "plain":
    return None
  if name != "auto":
    return name
  if jax.default_backend() == "tpu":
    return "splash"
  fused = (
      jax.default_backend() == "gpu"
      and cfg.dtype in ("bfloat16", "float16")
      and cfg.head_dim % 8 == 0
      and cfg.head_dim <= 128
  )
  return "cudnn" if fused else "xla"


def kernel_lengths(attention_mask: jax.Array) -> jax.Array:
  """[B] int32: each row's real tokens (``attention_mask`` [B, T], real
  tokens first) as an attention kernel receives them, at least 1.

  At least 1: a padding row (no real token; zero loss mask) given to a
  kernel as length 0 has come back NaN from cuDNN's fused attention before
  9.25 (NVIDIA/cudnn-frontend GitHub issue 943), and NaN activations make
  NaN gradients (0 x NaN). Length 1 attends slot 0: finite, and the row
  counts nothing either way (``bench/device.py --kernel_check`` runs the
  kernel on such a row)."""
  real = attention_mask.astype(jnp.bool_)
  return jnp.maximum(jnp.sum(real, axis=1, dtype=jnp.int32), 1)


class AttentionMask(NamedTuple):
  """Which key slots each query may attend: slot s by query i iff
  ``keys[b, s]`` and ``s <= query_slots[b, i]`` (causal).

  keys:        [B, S] bool, slots holding a real token
  query_slots: [B, Tq] int32, each query's own slot
  lengths:     [B] int32 or None: real tokens per row when they come first
               (right padding, keys = slot < length) and the queries are
               slots 0..T-1 -- then a kernel may serve (causal + lengths);
               at least 1 (a padding row attends its slot 0, see
               ``Transformer.__call__``)
  """

  keys: jax.Array
  query_slots: jax.Array
  lengths: Optional[jax.Array] = None

  def dense(self) -> jax.Array:
    """[B, Tq, S] bool."""
    s = self.keys.shape[1]
    causal = (
        jnp.arange(s, dtype=jnp.int32)[None, None, :]
        <= self.query_slots[:, :, None]
    )
    return causal & self.keys[:, None, :]

  def window(self, starts, size: int) -> "AttentionMask":
    """Queries of slots [starts_b, starts_b + size) only (no kernel)."""
    return AttentionMask(self.keys, take_window(self.query_slots, starts, size))


class KVCache(NamedTuple):
  """Per-layer keys/values of past tokens (keys stored after RoPE).

  k, v:     tuples of L arrays [B, Hkv, S, Dh], one buffer per layer and
            head-major, so decode writes a slot in place and the attention
            dots read the buffer as it lies (no per-step copy of a slice or
            a transpose of the cache)
  key_mask: [B, S] bool, True on slots holding a real token
  index:    int32 scalar, the next write slot (same for every row)
  """

  k: tuple
  v: tuple
  key_mask: jax.Array
  index: jax.Array


def init_cache(
    cfg: ModelConfig, batch: int, max_len: int, dtype=None
) -> KVCache:
  """An empty cache of ``max_len`` slots (no slot attendable yet)."""
  dtype = jnp.dtype(dtype or cfg.dtype)
  shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
  return KVCache(
      k=zeros(),
      v=zeros(),
      key_mask=jnp.zeros((batch, max_len), jnp.bool_),
      index=jnp.zeros((), jnp.int32),
  )


# ----------------------------------------------------------------- layers


def _einsum(shard, subscripts: str, x, var: nnx.Variable, **kw):
  """``einsum(subscripts, x, var)`` in x's dtype, the parameter cast on its
  own shards (FSDP gathers the compute-dtype copy) and its gradient taken
  and reduced over the devices in float32 (``ActivationSharding.einsum``).
  Its output is named ``WEIGHT_DOT`` for the 'dots' remat policy (the dot
  sits inside a custom_vjp there, which a dot-saving policy cannot see).
  """
  names = var.get_metadata().get("out_sharding")
  return jax.ad_checkpoint.checkpoint_name(
      shard.einsum(subscripts, x, var.value, names, **kw), WEIGHT_DOT
  )


def _apply(shard, fn, x, var: nnx.Variable):
  """``fn(x, var)`` (elementwise: a bias, a norm's scale) in x's dtype, the
  parameter's gradient in float32 (``ActivationSharding.apply``)."""
  names = var.get_metadata().get("out_sharding")
  return shard.apply(fn, x, var.value, names)


def _param(rngs, shape, names, dtype, init="normal", kind=nnx.Param):
  """A weight of ``kind`` (a LoRA model's base: ``lora.FrozenParam``)."""
  if init == "normal":
    value = _INIT_STD * jax.random.normal(rngs.params(), shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = jnp.ones(shape, dtype)
  return kind(value, out_sharding=names)


class RMSNorm(nnx.Module):
  """``y = scale * x / sqrt(mean(x^2) + eps)``, computed in float32."""

  def __init__(self, dim: int, eps: float, param_dtype, kind=nnx.Param):
    self.scale = kind(jnp.ones((dim,), param_dtype), out_sharding=("norm",))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    var = jnp.mean(xf * xf, axis=-1, keepdims=True)
    y = (xf * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
    return _apply(NO_SHARDING, jnp.multiply, y, self.scale)  # replicated


class Attention(nnx.Module):
  """Grouped-query attention; each of Hkv key heads serves G = H / Hkv."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, h, kv, dh = (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    )
    pdt, kind = jnp.dtype(lora.base_dtype(cfg)), lora.param_kind(cfg)
    shapes = {
        "q": ((d, h, dh), ("embed", "heads", "head_dim")),
        "k": ((d, kv, dh), ("embed", "kv_heads", "head_dim")),
        "v": ((d, kv, dh), ("embed", "kv_heads", "head_dim")),
        "o": ((h, dh, d), ("heads", "head_dim", "embed")),
    }
    for name, (shape, names) in shapes.items():
      setattr(self, name, _param(rngs, shape, names, pdt, kind=kind))
    if cfg.qkv_bias:
      self.q_bias = _param(
          rngs, (h, dh), ("heads", "head_dim"), pdt, "zeros", kind
      )
      self.k_bias = _param(
          rngs, (kv, dh), ("kv_heads", "head_dim"), pdt, "zeros", kind
      )
      self.v_bias = _param(
          rngs, (kv, dh), ("kv_heads", "head_dim"), pdt, "zeros", kind
      )
    else:
      self.q_bias = self.k_bias = self.v_bias = None
    # LoRA adapters (lora.py): None unless cfg.lora_rank and a target.
    for name, (shape, names) in shapes.items():
      setattr(
          self,
          name + lora.SUFFIX,
          lora.adapter(cfg, name, shape, names, rngs=rngs),
      )
    self.cfg = cfg

  def _proj(self, x, w, b, shard, adapter=None):
    y = _einsum(shard, "btd,dhk->bthk", x, w)
    if adapter is not None:
      y = y + adapter(shard, x)
    if b is not None:
      y = _apply(shard, jnp.add, y, b)
    return y

  def __call__(
      self,
      x,
      positions,
      mask,
      kv_cache=None,
      index=None,
      queries=None,
      shard=NO_SHARDING,
  ):
    """x [B,T,D]; mask an ``AttentionMask`` of Tq queries and S keys.

    Without a cache S = T. With one, ``kv_cache = (K, V)`` are this layer's
    [B,Hkv,S,Dh] buffers: the T new keys/values are written in place at
    slots [index, index + T) and attention reads all S slots. ``queries =
    (x_q [B,Tq,D], positions_q [B,Tq])``: queries from these positions only
    (keys and values still from all of x); default x itself (Tq = T).
    Returns (y [B,Tq,D], updated (K, V) or None).
    """
    x_q, pos_q = (x, positions) if queries is None else queries
    b, t, _ = x_q.shape
    inv_freq = rope_inv_freq(self.cfg)  # numpy: a constant under jit
    q = self._proj(x_q, self.q, self.q_bias, shard, self.q_lora)
    q = apply_rope(q, pos_q, inv_freq)
    k = self._proj(x, self.k, self.k_bias, shard, self.k_lora)
    k = apply_rope(k, positions, inv_freq)
    v = self._proj(x, self.v, self.v_bias, shard, self.v_lora)
    q, k, v = shard(q, QUERY), shard(k, KEY_VALUE), shard(v, KEY_VALUE)
    h, dh = q.shape[2], q.shape[3]
    kv = self.cfg.num_kv_heads
    impl = attention_implementation(self.cfg)
    if kv_cache is None and impl is not None and mask.lengths is not None:
      if impl == "splash":
        out = splash.attention(q, k, v, mask.lengths, shard)
      elif impl == "cudnn":
        out = cudnn_attention.attention(q, k, v, mask.lengths, shard)
      else:
        out = jax.nn.dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            key_value_seq_lengths=mask.lengths,
            implementation=impl,
        )
      out = shard(out.astype(x.dtype), QUERY)
      y = self._out(out, shard)
      return shard(y, ACTIVATION), None
    qg = q.reshape(b, t, kv, h // kv, dh)
    new_cache = None
    if kv_cache is None:
      k_spec = "bskd"
    else:
      k_all, v_all = kv_cache
      at = (0, 0, index, 0)
      put = lambda buf, new: jax.lax.dynamic_update_slice(
          buf, new.transpose(0, 2, 1, 3).astype(buf.dtype), at
      )
      k, v = shard(put(k_all, k), CACHE), shard(put(v_all, v), CACHE)
      new_cache = (k, v)
      k_spec = "bksd"
    scores = jnp.einsum(
        f"btkgd,{k_spec}->bkgts",
        qg,
        k.astype(q.dtype),
        preferred_element_type=jnp.float32,
    ) / math.sqrt(dh)
    dense = shard(mask.dense(), MASK)
    scores = jnp.where(dense[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum(f"bkgts,{k_spec}->btkgd", probs, v.astype(x.dtype))
    out = shard(out.reshape(b, t, h, dh), QUERY)
    y = self._out(out, shard)
    return shard(y, ACTIVATION), new_cache

  def _out(self, out, shard):
    y = _einsum(shard, "bthk,hkd->btd", out, self.o)
    if self.o_lora is not None:
      y = y + self.o_lora(shard, out)
    return y


class MLP(nnx.Module):
  """SwiGLU: ``W_down (silu(x W_gate) * (x W_up))``."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    pdt, kind = jnp.dtype(lora.base_dtype(cfg)), lora.param_kind(cfg)
    shapes = {
        "gate": ((d, f), ("embed", "mlp")),
        "up": ((d, f), ("embed", "mlp")),
        "down": ((f, d), ("mlp", "embed")),
    }
    for name, (shape, names) in shapes.items():
      setattr(self, name, _param(rngs, shape, names, pdt, kind=kind))
    for name, (shape, names) in shapes.items():  # LoRA (lora.py) or None
      setattr(
          self,
          name + lora.SUFFIX,
          lora.adapter(cfg, name, shape, names, rngs=rngs),
      )

  def _mm(self, subscripts, x, name, shard):
    y = _einsum(shard, subscripts, x, getattr(self, name))
    adapter = getattr(self, name + lora.SUFFIX)
    return y if adapter is None else y + adapter(shard, x)

  def __call__(self, x, shard=NO_SHARDING):
    g = shard(self._mm("btd,df->btf", x, "gate", shard), MLP_HIDDEN)
    u = shard(self._mm("btd,df->btf", x, "up", shard), MLP_HIDDEN)
    y = self._mm("btf,fd->btd", jax.nn.silu(g) * u, "down", shard)
    return shard(y, ACTIVATION)


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pdt, kind = jnp.dtype(lora.base_dtype(cfg)), lora.param_kind(cfg)
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, kind)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, kind)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(
      self,
      x,
      positions,
      mask,
      kv_cache=None,
      index=None,
      starts=None,
      window=0,
      shard=NO_SHARDING,
  ):
    """With ``window = R > 0``: the outputs of positions [starts_b, starts_b
    + R) only, [B, R, D] (their queries attend all keys as usual)."""
    h = self.input_norm(x)
    queries = None
    if window:
      take = lambda a: take_window(a, starts, window)
      x, mask = take(x), mask.window(starts, window)
      queries = (take(h), take(positions))
    y, kv = self.attn(h, positions, mask, kv_cache, index, queries, shard)
    x = shard(x + y, ACTIVATION)
    x = x + self.mlp(self.post_attn_norm(x), shard)
    return shard(x, ACTIVATION), kv


# ---------------------------------------------------------- scanned layers
# ``cfg.scan_layers``: ``Transformer.layers`` is one Block whose variables
# hold all L layers on a leading axis, [L, ...], with the logical name None
# there (never split over the mesh); layer i of the stack is block i of the
# unrolled layout, value for value (``stack_layers`` / ``layer_of``).
_LAYER_AXIS = {nnx.PARTITION_NAME: None}


def _stack(xs):
  if all(isinstance(x, np.ndarray) for x in xs):
    return np.stack(xs)  # host arrays stay on the host
  return jnp.stack(xs)


def stack_layers(states) -> nnx.State:
  """L states of one block structure -> one state of [L, ...] values
  (new Variables; their logical names gain the leading None)."""
  stacked = jax.tree.map(lambda *xs: _stack(xs), *states)
  return nnx.spmd.add_axis(stacked, 0, _LAYER_AXIS)


def layer_of(stacked: nnx.State, i) -> nnx.State:
  """Layer ``i`` of a stacked state (new Variables, one layer's names)."""
  one = jax.tree.map(lambda a: a[i], stacked)
  return nnx.spmd.remove_axis(one, 0, _LAYER_AXIS)


def scanned_state(state: nnx.State) -> nnx.State:
  """A Transformer's state (all of it, or a filter such as its params) in
  the unrolled layout (``layers/<i>/...``) -> the scanned one
  (``layers/...`` of [L, ...]); other entries as they are."""
  out, per_layer = [], {}
  for path, var in nnx.to_flat_state(state):
    if path[0] == "layers":
      per_layer.setdefault(path[2:], {})[int(path[1])] = var
    else:
      out.append((path, var))
  for sub, by_layer in per_layer.items():
    stacked = stack_layers([by_layer[i] for i in range(len(by_layer))])
    out.append((("layers",) + sub, stacked))
  return nnx.from_flat_state(out)


def unrolled_state(state: nnx.State) -> nnx.State:
  """Inverse of ``scanned_state``; works on device, host (numpy) and traced
  values."""
  out = []
  for path, var in nnx.to_flat_state(state):
    if path[0] != "layers":
      out.append((path, var))
      continue
    for i in range(int(jnp.shape(var.get_value())[0])):
      out.append((("layers", i) + path[1:], layer_of(var, i)))
  return nnx.from_flat_state(out)


def unrolled(cfg: ModelConfig, params: nnx.State, rest=None):
  """``(cfg', graphdef, params', rest')``: a scanned model's params (and
  other state) in the unrolled layout, with the graphdef and config
  (``scan_layers=False``) of that layout; the identity on an unrolled one.

  The rollout engine runs this layout: its per-layer KV-cache buffers are
  written in place at each decode step, where a scan would carry (copy)
  each layer's cache through the loop; MaxText serves unscanned too.
  """
  rest = nnx.State({}) if rest is None else rest
  if cfg.scan_layers:
    cfg = dataclasses.replace(cfg, scan_layers=False)
    params = unrolled_state(params)
    if "layers" in rest:
      rest = unrolled_state(rest)
  return cfg, graphdef_of(cfg), params, rest


@functools.lru_cache(maxsize=16)
def graphdef_of(cfg: ModelConfig):
  """The graphdef of ``Transformer(cfg)`` split as (params, rest)."""
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return nnx.split(abstract, nnx.Param, ...)[0]


def _run_block(
    block, x, positions, mask, kv_cache, index, starts, window, shard
):
  return block(x, positions, mask, kv_cache, index, starts, window, shard)


# cfg.remat -> the jax.checkpoint policy (None: save nothing but the
# block's input). 'dots' keeps the outputs of the weight matmuls (no batch
# dimension in the dot: q, k, v, o, gate, up, down), so the backward
# recomputes only the norms, RoPE, attention and the activation function.
WEIGHT_DOT = "weight_dot"
REMAT = {
    "full": None,
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(WEIGHT_DOT),
    ),
}
_RUN_BLOCK = {
    name: nnx.remat(_run_block, static_argnums=(7, 8), policy=policy)
    for name, policy in REMAT.items()
}
_RUN_BLOCK["none"] = _run_block


class Transformer(nnx.Module):
  """Decoder-only LM. See the module docstring for the equations."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    lora.check(cfg)
    pdt, kind = jnp.dtype(lora.base_dtype(cfg)), lora.param_kind(cfg)
    self.embedding = _param(
        rngs,
        (cfg.vocab_size, cfg.hidden_size),
        ("vocab", "embed"),
        pdt,
        kind=kind,
    )
    blocks = [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)]
    if cfg.scan_layers:  # one Block of [L, ...] variables, same values
      self.layers = nnx.merge(
          nnx.graphdef(blocks[0]), stack_layers([nnx.state(b) for b in blocks])
      )
    else:
      self.layers = nnx.List(blocks)
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, kind)
    if cfg.tie_word_embeddings:
      self.lm_head = None
    else:
      self.lm_head = _param(
          rngs,
          (cfg.hidden_size, cfg.vocab_size),
          ("embed", "vocab"),
          pdt,
          kind=kind,
      )

  def __call__(
      self,
      tokens: jax.Array,
      positions: jax.Array,
      attention_mask: jax.Array,
      *,
      cache: Optional[KVCache] = None,
      return_logits: bool = True,
      window: Optional[tuple[jax.Array, int]] = None,
  ):
    """Returns (logits [B,T,V] f32 or None, hidden [B,T,D], new cache or None).

    Without a cache, query t attends keys s <= t with attention_mask[s] = 1.
    With one, the T tokens are written at slots [index, index + T) and query
    i attends slots j <= index + i whose key_mask is set.

    ``window = (starts [B], R)`` (no cache): logits and hidden of positions
    [starts_b, starts_b + R) only, [B, R, ...]. Only the last block's
    queries, MLP and the final norm are restricted to the window (earlier
    blocks feed the last one's keys and values at every position); the
    values equal the full computation's at those positions. Scanned
    layers: the window is taken after the last block (which runs at every
    position: 1/L more block work), the final norm and logits as above.
    """
    if window is not None and cache is not None:
      raise ValueError("Transformer: window and cache cannot be combined")
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    t = tokens.shape[1]
    shard = self._activation_sharding(tokens)
    x = shard(self._embed(tokens, shard).astype(dtype), ACTIVATION)
    real = attention_mask.astype(jnp.bool_)
    b = tokens.shape[0]
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if cache is None:
      index = None
      lengths = None
      if attention_implementation(cfg) is not None:
        lengths = kernel_lengths(real)
      mask = AttentionMask(real, slots, lengths)
    else:
      index = cache.index
      key_mask = jax.lax.dynamic_update_slice(cache.key_mask, real, (0, index))
      key_mask = shard(key_mask, ("batch", "cache_length"))
      mask = AttentionMask(key_mask, index + slots)
    starts, r = window if window is not None else (None, 0)
    new_k, new_v = [], []
    if cfg.scan_layers and cache is None:
      x = self._scan_blocks(x, positions, mask, shard)
      if r:  # the window after the last block (same values at its rows)
        x = shard(take_window(x, starts, r), ACTIVATION)
    else:
      run = _RUN_BLOCK[cfg.remat]
      last = cfg.num_layers - 1
      for i in range(cfg.num_layers):
        kv = None if cache is None else (cache.k[i], cache.v[i])
        w = (starts, r) if i == last else (None, 0)
        x, kv = run(self.block(i), x, positions, mask, kv, index, *w, shard)
        if kv is not None:
          new_k.append(kv[0])
          new_v.append(kv[1])
    hidden = shard(self.final_norm(x), ACTIVATION)
    new_cache = None
    if cache is not None:
      new_cache = KVCache(
          k=tuple(new_k),
          v=tuple(new_v),
          key_mask=key_mask,
          index=(index + t).astype(jnp.int32),
      )
    logits = self.logits(hidden) if return_logits else None
    return logits, hidden, new_cache

  def block(self, i: int) -> Block:
    """Block ``i``; of a scanned model, a Block of its slice [i] (a copy of
    that layer's weights, with one layer's logical names)."""
    if not self.cfg.scan_layers:
      return self.layers[i]
    graphdef, stacked = nnx.split(self.layers)
    return nnx.merge(graphdef, layer_of(stacked, i))

  def _scan_blocks(self, x, positions, mask, shard) -> jax.Array:
    """``x`` through the L blocks as one ``jax.lax.scan`` over the stacked
    variables (each step's body one block; under ``cfg.remat`` the body is
    rematerialised, so a step keeps only its input, as unrolled)."""
    graphdef, stacked = nnx.split(self.layers)

    def body(h, layer):
      block = nnx.merge(graphdef, nnx.spmd.remove_axis(layer, 0, _LAYER_AXIS))
      return block(h, positions, mask, shard=shard)[0], None

    if self.cfg.remat != "none":
      body = jax.checkpoint(
          body, prevent_cse=False, policy=REMAT[self.cfg.remat]
      )
    return jax.lax.scan(body, x, stacked)[0]

  def _embed(self, tokens, shard) -> jax.Array:
    """``E[tokens]`` in the parameter dtype (its gradient is summed over
    repeated tokens in float32 for float32 masters).

    A table split over 'vocab' only (the rollout engine's, or a learner's
    without FSDP on 'embed') is looked up where it lies
    (``_vocab_parallel_take``: one all-reduce of the [B, T, D] rows, no
    gather of the table). Otherwise the table is gathered over 'tensor'
    only and keeps its FSDP split of the width; the rows are looked up
    split over the batch axes other than the width's (('data',) by
    default), each device its slice of the width, and one all-to-all over
    the width's axes hands every device its own rows' whole vectors (and
    back in the backward): no gather of the table nor of activations.
    """
    width = shard.axes("embed")
    rows = tuple(a for a in shard.axes("batch") if a not in width) or None
    table = self.embedding.value
    vocab = ()
    if shard.mesh is not None and not width:
      vocab = shard.spec(("vocab", "embed"), table.shape)[0]
      vocab = (vocab,) if isinstance(vocab, str) else tuple(vocab or ())
    if np.prod([shard.mesh.shape[a] for a in vocab]) > 1:
      return _vocab_parallel_take(table, tokens, shard, vocab, rows)
    table = shard.put(table, P(None, width or None))
    x = jnp.take(table, shard.put(tokens, P(rows, None)), axis=0)
    return shard.put(x, P(rows, None, width or None))

  def _activation_sharding(self, *arrays) -> _sharding.ActivationSharding:
    """Constraints on the mesh of ``arrays`` or of the params, if any."""
    return _sharding.ActivationSharding.of(
        self.cfg.rules, *arrays, self.embedding.value
    )

  def logits(self, hidden: jax.Array) -> jax.Array:
    """``hidden W_out`` in float32 accumulation, [B,T,V]."""
    shard = self._activation_sharding(hidden)
    if self.lm_head is None:
      logits = _einsum(
          shard, "btd,vd->btv", hidden, self.embedding, out_dtype=jnp.float32
      )
    else:
      logits = _einsum(
          shard, "btd,dv->btv", hidden, self.lm_head, out_dtype=jnp.float32
      )
    return shard(logits, LOGITS)


def _vocab_parallel_take(table, tokens, shard, vocab, rows) -> jax.Array:
  """``table[tokens]`` with the table's rows split n ways over the mesh axes
  ``vocab`` (Megatron's vocabulary-parallel embedding): shard j holds rows
  [j V / n, (j + 1) V / n) and looks up the tokens it owns,

    x = sum_j [tokens // (V / n) = j] * table_j[tokens mod (V / n)],

  the sum over j being one all-reduce of [B, T, D] over ``vocab``. Every
  term but one is an exact zero, so x equals the gathered lookup bit for
  bit; the table is never gathered (1 GiB for a 152 k x 3,584 bf16 table)."""
  n = int(np.prod([shard.mesh.shape[a] for a in vocab]))
  v, d = table.shape
  per = v // n
  blocks = shard.put(table.reshape(n, per, d), P(vocab, None, None))
  local = shard.put(tokens % per, P(rows, None))
  x = jax.vmap(lambda block: jnp.take(block, local, axis=0))(blocks)
  x = shard.put(x, P(vocab, rows, None, None))  # [n, B, T, D]: each its own
  shard_of = jnp.arange(n, dtype=tokens.dtype)[:, None, None]
  own = (tokens // per)[None] == shard_of
  x = jnp.where(own[..., None], x, jnp.zeros((), x.dtype)).sum(0)
  return shard.put(x, P(rows, None, None))


def target_logprobs(
    logits: jax.Array, targets: jax.Array, *, by_gather: bool = False
) -> jax.Array:
  """``logp[..., i] = logits[..., i, y_i] - logsumexp(logits[..., i, :])``

  (``y = targets``), without materialising a full log-softmax. Two ways to
  pick ``logits[..., y_i]``, each the cheaper where it is used (CPU buffer
  assignment, [8, 384, 32768] bf16 logits: 0.40 GB for one f32 copy):

  - masked sum over the vocabulary (default; exact: one term is not
    zero): for differentiated passes. Its gradient needs one f32 copy of
    the logits (gather: two, through the scatter-add), and a gather
    crashed XLA's SPMD partitioner inside the train step's data-local loop
    on a mesh with both 'fsdp' and 'tensor' (jax 0.10.2).
  - ``by_gather`` (``take_along_axis``): for forward-only passes (pi_old,
    pi_ref); one f32 copy, where the masked sum holds two.

  logits [..., V], targets [...] int. Returns [...] f32.
  """
  lg = logits.astype(jnp.float32)
  if by_gather:
    picked = jnp.take_along_axis(
        lg, targets[..., None].astype(jnp.int32), axis=-1
    )[..., 0]
  else:
    vocab = jnp.arange(lg.shape[-1], dtype=jnp.int32)
    hit = targets[..., None].astype(jnp.int32) == vocab
    picked = jnp.sum(jnp.where(hit, lg, 0.0), axis=-1)
  return picked - jax.nn.logsumexp(lg, axis=-1)


def token_logprobs(
    logits: jax.Array, tokens: jax.Array, *, by_gather: bool = False
) -> jax.Array:
  """``logp[:, t] = logits[:, t-1, tokens[:, t]] - logsumexp(logits[:, t-1])``.

  ``logp[:, 0] = 0`` (nothing predicts the first token). Returns [B,T] f32.
  """
  lp = target_logprobs(logits[:, :-1], tokens[:, 1:], by_gather=by_gather)
  return jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """0, 1, ... over real tokens (left or right padding); pads get 0."""
  m = attention_mask.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0) * m
