"""The in-process engine's jitted programs: the prefill of a call's
prompts into a KV cache (``_prefill``, ``empty_cache``) and the decode
loop (``_decode``), with the cache's row layout on a mesh
(``_constrain_cache``, ``_take_rows``). ``jax_engine``'s docstring, steps
2 and 3, describes them; ``jax_engine.JaxEngine`` builds their inputs on
the host and calls them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rspo_jax import sharding as shd
from rspo_jax.models import transformer as tfm
from rspo_jax.rollout import sampling

# Logical axes of each layer's KV-cache buffer [B, Hkv, S, Dh].
_CACHE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")


# ------------------------------------------------------- jitted functions
# Module-level and keyed by the (hashable) graphdef, config, mesh and rules,
# so every engine of one model structure -- e.g. each loop's fresh agent B --
# shares the compiled code.

_TRACES = [0]


def trace_count() -> int:
  """How many times the engine's jitted functions were traced (process-wide)."""
  return _TRACES[0]


def _constrain_cache(cache: tfm.KVCache, mesh, rules) -> tfm.KVCache:
  """Rows of the cache over the batch mesh axes (no-op without a mesh)."""
  if mesh is None:
    return cache

  def sharding(logical, shape):
    spec = shd.logical_to_mesh_spec(logical, rules)
    return NamedSharding(mesh, shd.fit_spec_to_shape(mesh, spec, shape))

  kv = sharding(_CACHE_AXES, cache.k[0].shape)
  km = sharding(("batch", "cache_length"), cache.key_mask.shape)
  wsc = jax.lax.with_sharding_constraint
  return tfm.KVCache(
      k=tuple(wsc(x, kv) for x in cache.k),
      v=tuple(wsc(x, kv) for x in cache.v),
      key_mask=wsc(cache.key_mask, km),
      index=cache.index,
  )


def _row_shards(mesh, rules, rows: int) -> int:
  """Shards of ``rows`` rows over the mesh's batch axes (1 when they do not
  divide)."""
  if mesh is None:
    return 1
  spec = shd.logical_to_mesh_spec(("batch",), rules)[0]
  axes = (spec,) if isinstance(spec, str) else tuple(spec or ())
  ways = int(np.prod([mesh.shape[a] for a in axes]))
  return ways if rows % ways == 0 else 1


def _gather_rows(x, row_map, shards: int):
  """``x[row_map]``, ``row_map`` indexing within each of ``shards`` equal
  row blocks of x and of the result (``share_prompts``): a gather local to
  each device."""
  if shards == 1:
    return x[row_map]
  u = x.shape[0] // shards
  blocks = x.reshape((shards, u) + x.shape[1:])
  local = row_map.reshape(shards, -1) - u * jnp.arange(shards)[:, None]
  out = jax.vmap(lambda a, i: a[i])(blocks, local)
  return out.reshape((row_map.shape[0],) + x.shape[1:])


@dataclasses.dataclass(frozen=True)
class _Static:
  """Hashable, compile-time arguments of the jitted functions."""

  graphdef: Any
  cfg: Any
  mesh: Optional[Mesh]
  rules: tuple
  pad_id: int


class _Rows(NamedTuple):
  """Per-row decode inputs, all [B]."""

  last_tok: jax.Array  # last prompt token, fed at step 0
  last_pos: jax.Array  # its position, L_b - 1
  active: jax.Array  # False on dummy rows
  row_ids: jax.Array  # request row index (rng stream)


class _Knobs(NamedTuple):
  """Per-request traced values: changing them never recompiles (the stop
  tables' shapes do; None = no stop strings)."""

  seed: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  max_new: jax.Array
  stop_mask: jax.Array  # bool [V]
  stop_table: Optional[jax.Array] = None  # int32 [n, M + 1, V]
  stop_len: Optional[jax.Array] = None  # int32 [n]


@functools.partial(
    jax.jit,
    static_argnames=("cache_len", "static", "chunk"),
    donate_argnames=("cache",),
)
def _prefill(
    params,
    rest,
    tokens,
    positions,
    mask,
    row_map,
    prefix=None,
    cache=None,
    *,
    cache_len,
    static: _Static,
    chunk: int = 0,
):
  """Writes the unique prompts' columns into a fresh cache of ``cache_len``
  slots, then gathers the decode rows: ``cache[b] = cache_u[row_map[b]]``
  (a cache of the unique prompts and one of the decode rows).
  ``row_map`` None: the prompts are the decode rows, written into
  ``cache`` (an empty one, ``empty_cache``; donated, so the result is
  that buffer: one cache in all; None: a fresh one, which XLA:CPU copies
  into the result once more).

  ``chunk = C > 0``: columns [c, c + C) at a time, each attending a cache
  of the c + C slots written so far (causal blocks: about half the
  attention of one pass over all ``cache_len`` slots, and C x slots score
  blocks instead of T x slots).

  ``prefix = (tokens, positions, mask, head_map)``, [Bp, W]: the distinct
  leading W columns (``jax_engine``'s docstring, step 2), prefilled first
  and gathered to the prompts (``cache_u[u] = cache_p[head_map[u]]``); then
  ``tokens`` etc. hold the prompts' columns [W, Pb - 1) only.
  """
  _TRACES[0] += 1
  cfg = static.cfg
  model = nnx.merge(static.graphdef, params, rest)
  shards = _row_shards(
      static.mesh,
      static.rules,
      tokens.shape[0] if row_map is None else row_map.shape[0],
  )
  start = 0
  if cache is None or row_map is not None:
    cache = tfm.init_cache(cfg, tokens.shape[0], cache_len, cfg.dtype)
  if prefix is not None:  # the heads in a cache of W slots, put at [0, W)
    p_tok, p_pos, p_mask, head_map = prefix
    start = p_tok.shape[1]
    heads = tfm.init_cache(cfg, p_tok.shape[0], start, cfg.dtype)
    heads = _take_rows(
        _prefill_columns(model, heads, p_tok, p_pos, p_mask, 0, chunk),
        head_map,
        shards,
    )
    cache = _write_slots(cache, heads, 0, start)
  cache = _prefill_columns(model, cache, tokens, positions, mask, start, chunk)
  if row_map is not None:
    cache = _take_rows(cache, row_map, shards)
  return _constrain_cache(cache, static.mesh, static.rules)


@functools.partial(jax.jit, static_argnames=("rows", "cache_len", "static"))
def empty_cache(*, rows: int, cache_len: int, static: _Static):
  """An empty KV cache of ``rows`` x ``cache_len`` slots, its rows over the
  mesh's batch axes: what ``_prefill`` writes into in place."""
  cfg = static.cfg
  return _constrain_cache(
      tfm.init_cache(cfg, rows, cache_len, cfg.dtype), static.mesh, static.rules
  )


def _prefill_columns(
    model, cache, tokens, positions, mask, start: int, chunk: int
):
  """Writes columns [start, start + width) of the cache from ``tokens``
  [B, width]: one pass over the whole cache (start 0, ``chunk`` 0 or >=
  width) or blocks of ``chunk`` (``width`` when 0) columns, each
  attending the slots written so far (XLA copies the cache once along
  the way: ``plan.prefill_bytes``)."""
  width = tokens.shape[1]
  if not width:
    return cache
  if start == 0 and not 0 < chunk < width:
    return model(tokens, positions, mask, cache=cache, return_logits=False)[2]
  step = chunk or width
  for c0 in range(start, start + width, step):
    c1 = min(start + width, c0 + step)
    part = tfm.KVCache(
        k=tuple(x[:, :, :c1] for x in cache.k),
        v=tuple(x[:, :, :c1] for x in cache.v),
        key_mask=cache.key_mask[:, :c1],
        index=jnp.int32(c0),
    )
    cols = slice(c0 - start, c1 - start)
    _, _, part = model(
        tokens[:, cols],
        positions[:, cols],
        mask[:, cols],
        cache=part,
        return_logits=False,
    )
    cache = _write_slots(cache, part, c0, c1)
  return cache


def _write_slots(cache, part, c0: int, c1: int):
  """``cache`` with ``part``'s slots [c0, c1) written in place of its own,
  its next write slot c1."""
  put = lambda full, new: jax.lax.dynamic_update_slice_in_dim(
      full, new[:, :, c0:c1], c0, axis=2
  )
  return tfm.KVCache(
      k=tuple(map(put, cache.k, part.k)),
      v=tuple(map(put, cache.v, part.v)),
      key_mask=jax.lax.dynamic_update_slice_in_dim(
          cache.key_mask, part.key_mask[:, c0:c1], c0, axis=1
      ),
      index=jnp.int32(c1),
  )


def _take_rows(cache, row_map, shards: int):
  """The cache's rows ``row_map`` (``_gather_rows``, local to each row
  shard)."""
  take = lambda x: _gather_rows(x, row_map, shards)
  return tfm.KVCache(
      k=tuple(take(x) for x in cache.k),
      v=tuple(take(x) for x in cache.v),
      key_mask=take(cache.key_mask),
      index=cache.index,
  )


class _State(NamedTuple):
  """The decode loop's carry; rows [B], outputs [B, slots]."""

  i: jax.Array  # steps taken (the next output column)
  cache: tfm.KVCache
  tok: jax.Array  # token fed at step i
  pos: jax.Array  # its position
  done: jax.Array
  length: jax.Array
  stopped: jax.Array
  out_tok: jax.Array
  out_lp: jax.Array
  matched: jax.Array  # [B, n] stop-string automaton states
  row_keys: jax.Array  # per-row rng keys


def _start_state(cache, rows: _Rows, knobs: _Knobs, slots: int, pad):
  batch = rows.last_tok.shape[0]
  n_strings = 0 if knobs.stop_table is None else knobs.stop_table.shape[0]
  return _State(
      i=jnp.int32(0),
      cache=cache,
      tok=rows.last_tok.astype(jnp.int32),
      pos=rows.last_pos.astype(jnp.int32),
      done=~rows.active,
      length=jnp.zeros((batch,), jnp.int32),
      stopped=jnp.zeros((batch,), jnp.bool_),
      out_tok=jnp.full((batch, slots), pad, jnp.int32),
      out_lp=jnp.zeros((batch, slots), jnp.float32),
      matched=jnp.zeros((batch, n_strings), jnp.int32),
      row_keys=jax.vmap(jax.random.fold_in, (None, 0))(
          jax.random.key(knobs.seed), rows.row_ids
      ),
  )


def _run(params, rest, state: _State, knobs: _Knobs, static):
  """Decode steps until every row is done or ``max_new`` steps were taken
  (``jax_engine``'s docstring, step 3)."""
  batch = state.tok.shape[0]
  pad = jnp.int32(static.pad_id)
  strings = knobs.stop_table is not None

  def cond(st: _State):
    return (st.i < knobs.max_new) & ~jnp.all(st.done)

  def body(st: _State):
    i = st.i
    model = nnx.merge(static.graphdef, params, rest)
    logits, _, cache = model(
        st.tok[:, None],
        st.pos[:, None],
        jnp.ones((batch, 1), jnp.bool_),
        cache=st.cache,
    )
    cache = _constrain_cache(cache, static.mesh, static.rules)
    logits = logits[:, 0]
    keys = jax.vmap(jax.random.fold_in, (0, None))(st.row_keys, i)
    tok = sampling.sample_token(logits, keys, knobs.temperature, knobs.top_p)
    lp = sampling.token_logprob(logits, tok)
    live = ~st.done
    tok = jnp.where(live, tok, pad)
    hit = live & knobs.stop_mask[tok]
    matched = st.matched
    if strings:
      matched, in_text = sampling.advance_stop_states(
          knobs.stop_table, knobs.stop_len, matched, tok
      )
      hit = hit | (live & in_text)
    return _State(
        i=i + 1,
        cache=cache,
        tok=tok,
        pos=st.pos + 1,
        done=st.done | hit,
        length=st.length + live.astype(jnp.int32),
        stopped=st.stopped | hit,
        out_tok=st.out_tok.at[:, i].set(tok),
        out_lp=st.out_lp.at[:, i].set(jnp.where(live, lp, 0.0)),
        matched=matched,
        row_keys=st.row_keys,
    )

  return jax.lax.while_loop(cond, body, state)


@functools.partial(
    jax.jit, static_argnames=("slots", "static"), donate_argnums=(2,)
)
def _decode(
    params, rest, cache, rows: _Rows, knobs: _Knobs, *, slots, static: _Static
):
  """The whole decode loop (``jax_engine``'s docstring, step 3).

  Returns (tokens, logprobs [B, slots], lengths [B], stopped [B], cache,
  steps taken).
  """
  _TRACES[0] += 1
  state = _start_state(cache, rows, knobs, slots, jnp.int32(static.pad_id))
  st = _run(params, rest, state, knobs, static)
  return st.out_tok, st.out_lp, st.length, st.stopped, st.cache, st.i


def _with_activation_rules(graphdef, params, rest, rules):
  """``graphdef`` with its model's activation rules (``cfg.rules``) set to
  ``rules``. The engine's weights lie whole on every row shard
  (``sharding.inference_rules``), so its activations must not be split
  like the learner's: with 'embed' on 'fsdp' the embedding lookup gathers
  every row's token id and exchanges the vectors all-to-all at each decode
  step, and the tied LM head re-gathers the table each call. A module
  without a ``cfg`` keeps its graphdef."""
  model = nnx.merge(graphdef, params, rest)
  cfg = getattr(model, "cfg", None)
  if not dataclasses.is_dataclass(cfg) or not hasattr(cfg, "rules"):
    return graphdef
  model.cfg = dataclasses.replace(cfg, logical_axis_rules=tuple(rules))
  return nnx.split(model, nnx.Param, ...)[0]
