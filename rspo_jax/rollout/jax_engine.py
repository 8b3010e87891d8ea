"""In-process JAX generation engine: bucketed prefill + one jitted decode loop.

A call ``generate(prompts, params)`` runs, per chunk of at most the largest
batch bucket:

  1. Bucketing. Prompts are left-padded to the prompt bucket ``Pb`` (smallest
     ``prompt_buckets`` entry >= the longest prompt), rows to the batch bucket
     ``Bb`` (extra rows are dummies, done from the start), and
     ``max_new_tokens`` is rounded up to a multiple of ``new_token_multiple``
     (``Nb``). All array shapes depend on (Bb, Pb, Nb) only, so steady-state
     calls never recompile; temperature, top_p, seed, the stop ids and the
     exact ``max_new_tokens`` are traced values.
  2. Prefill (jitted). Identical prompts are prefilled once (prefix sharing):
     the ``Bu`` unique prompts' first ``Pb - 1`` columns are written to a KV
     cache of ``S = Pb + Nb`` slots, whose rows are then gathered to the
     ``Bb`` decode rows.
  3. Decode (jitted, one ``lax.while_loop``). Step ``i`` feeds each row's
     previous token (the last prompt token at ``i = 0``) at position
     ``L_b - 1 + i`` (``L_b`` = real prompt length: positions start at 0 on
     the first real token), samples token ``i`` from the logits with key
     ``fold_in(fold_in(key(seed), row), i)``, and records it with its
     temperature-1 log-prob ``log softmax(logits)[token]``. A row is done
     after a stop id; the loop ends when every row is done or after
     ``max_new_tokens`` steps.

Rows depend only on their own prompt, seed and row index, not on the batch
they were bucketed with, so results with and without prefix sharing (and on
one device or a mesh) agree. Stop strings are applied on the host afterwards
through ``decode_fn``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rspo_jax import sharding as shd
from rspo_jax.models import transformer as tfm
from rspo_jax.rollout import sampling
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROMPT_BUCKETS = (128, 256, 512, 1024, 2048, 4096)

# Logical axes of each layer's KV-cache buffer [B, Hkv, S, Dh].
_CACHE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")


def bucket_size(n: int, buckets: Sequence[int], what: str) -> int:
  """Smallest bucket >= n; ValueError naming ``what`` when none fits."""
  for b in sorted(buckets):
    if b >= n:
      return int(b)
  raise ValueError(f"{what} {n} exceeds the largest bucket {max(buckets)}")


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class JaxEngine(Engine):
  """Batched KV-cache generation with an NNX ``Transformer``.

  Args:
    model: an NNX Transformer, or ``(graphdef, params[, rest])`` as returned
      by ``nnx.split`` (``params`` is what ``update_weights`` replaces).
    cfg: the model's ``ModelConfig``.
    mesh: optional ('data', 'fsdp', 'tensor') mesh; rows are split over
      ('data', 'fsdp'), params placed by their logical names. None = one
      device.
    rules: logical axis rules.
    pad_id: token used for padding and for dummy rows.
    eos_ids: stop ids applied to every request (plus the request's own).
    batch_buckets, prompt_buckets: allowed padded shapes.
    new_token_multiple: ``max_new_tokens`` is rounded up to a multiple.
    decode_fn: ids -> text, needed for ``SamplingParams.stop_strings``.
    prefix_sharing: prefill identical prompts once.
    seed: seeds the draws of requests whose ``seed`` is None.
    version: initial weight version.
  """

  def __init__(
      self,
      model: Any,
      cfg,
      *,
      mesh: Optional[Mesh] = None,
      rules=shd.DEFAULT_RULES,
      pad_id: int,
      eos_ids: Sequence[int],
      batch_buckets: Sequence[int] = BATCH_BUCKETS,
      prompt_buckets: Sequence[int] = PROMPT_BUCKETS,
      new_token_multiple: int = 16,
      decode_fn: Optional[Callable[[Sequence[int]], str]] = None,
      prefix_sharing: bool = True,
      seed: int = 0,
      version: int = 0,
  ):
    self._cfg = cfg
    self._mesh = mesh
    # Hashable: the rules are a static argument of the jitted functions.
    self._rules = tuple(
        (n, tuple(t) if isinstance(t, list) else t) for n, t in rules
    )
    if not 0 <= int(pad_id) < cfg.vocab_size:
      raise ValueError(f"pad_id {pad_id} outside vocab [0, {cfg.vocab_size})")
    self._pad_id = int(pad_id)
    self._eos_ids = self._check_ids(tuple(int(i) for i in eos_ids), "eos_ids")
    for name, b in (
        ("batch_buckets", batch_buckets),
        ("prompt_buckets", prompt_buckets),
    ):
      if not b or min(b) < 1:
        raise ValueError(f"{name} must be non-empty positive sizes, got {b}")
    self._batch_buckets = tuple(sorted(int(b) for b in batch_buckets))
    self._prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
    if new_token_multiple < 1:
      raise ValueError(f"new_token_multiple must be >= 1: {new_token_multiple}")
    self._new_multiple = int(new_token_multiple)
    self._decode_fn = decode_fn
    self._prefix_sharing = bool(prefix_sharing)
    self._np_rng = np.random.default_rng(seed)
    self._shape_keys: set = set()
    self._graphdef, self._params, self._rest = self._split(model)
    self._param_sh = self._rest_sh = None
    if mesh is not None:
      self._param_sh = shd.state_shardings(mesh, self._params, rules)
      self._rest_sh = shd.state_shardings(mesh, self._rest, rules)
    self._params = self._place(self._params, self._param_sh)
    self._rest = self._place(self._rest, self._rest_sh)
    self._version = int(version)
    self._static = _Static(
        graphdef=self._graphdef,
        cfg=cfg,
        mesh=mesh,
        rules=self._rules,
        pad_id=self._pad_id,
    )

  # ---------------------------------------------------------------- weights

  @property
  def weight_version(self) -> int:
    return self._version

  @property
  def num_compilations(self) -> int:
    """Distinct (function, shape bucket) pairs this engine has run.

    Each is traced at most once per process: the jitted functions are shared
    by all engines of the same model structure (see ``trace_count``).
    """
    return len(self._shape_keys)

  def update_weights(self, params_or_path, version: int) -> None:
    """Replaces the weights: an nnx.State of params, a Transformer, a
    ``(graphdef, params[, rest])`` tuple, or a HF safetensors directory.

    Raises ValueError when the new params differ in structure or shapes.
    """
    if isinstance(params_or_path, (str, os.PathLike)):
      from rspo_jax.models import hf_io  # pylint: disable=g-import-not-at-top

      _, model = hf_io.load_hf_model(
          os.fspath(params_or_path), mesh=self._mesh, rules=self._rules
      )
      params_or_path = model
    if isinstance(params_or_path, nnx.State):
      params = _snapshot(params_or_path)
    else:
      _, params, _ = self._split(params_or_path)
    _check_same_shapes(self._params, params)
    # Keep the engine's dtypes (e.g. float32 trainer params -> bf16 engine).
    params = jax.tree.map(
        lambda new, old: new.astype(old.dtype), params, self._params
    )
    self._params = self._place(params, self._param_sh)
    self._version = int(version)

  def _split(self, model):
    """(graphdef, params, rest) in fresh Variables: the engine keeps a
    snapshot, unaffected by later in-place updates of the caller's model."""
    if isinstance(model, nnx.Module):
      graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    elif isinstance(model, tuple) and len(model) in (2, 3):
      graphdef, params = model[0], model[1]
      rest = model[2] if len(model) == 3 else nnx.State({})
    else:
      raise ValueError(
          "model must be an nnx.Module or a (graphdef, params[, rest]) tuple,"
          f" got {type(model).__name__}"
      )
    return graphdef, _snapshot(params), _snapshot(rest)

  def _place(self, tree, shardings):
    """Own copies of the arrays, with the engine's shardings: the trainer
    donates its param buffers to each train step, which would delete ours."""
    return jax.device_put(tree, shardings, may_alias=False)

  # --------------------------------------------------------------- generate

  def generate(
      self, prompts: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[GenerationResult]:
    """One result per prompt, in order (see the module docstring)."""
    self._check_params(params)
    rows = [self._check_prompt(p, i) for i, p in enumerate(prompts)]
    if not rows:
      return []
    if params.max_new_tokens == 0:  # nothing to generate (SGLang's answer)
      empty = lambda: GenerationResult(
          np.zeros(0, np.int32), np.zeros(0, np.float32), "length")
      return [empty() for _ in rows]
    seed = params.seed
    if seed is None:
      seed = int(self._np_rng.integers(0, 2**31 - 1))
    stop_ids = self._eos_ids + self._check_ids(
        tuple(int(i) for i in params.stop_token_ids), "stop_token_ids"
    )
    stop_mask = np.zeros((self._cfg.vocab_size,), np.bool_)
    stop_mask[list(stop_ids)] = True
    chunk = self._batch_buckets[-1]
    results = []
    for start in range(0, len(rows), chunk):
      results += self._generate_chunk(
          rows[start : start + chunk], start, seed, stop_mask, params
      )
    if params.stop_strings:
      results = [
          self._cut_at_stop_string(r, params.stop_strings) for r in results
      ]
    return results

  def _generate_chunk(self, rows, offset, seed, stop_mask, params):
    n = len(rows)
    bb = bucket_size(n, self._batch_buckets, "batch size")
    pb = bucket_size(
        max(len(r) for r in rows), self._prompt_buckets, "prompt length"
    )
    nb = round_up(params.max_new_tokens, self._new_multiple)
    if self._prefix_sharing:
      uniq, row_map = {}, []
      for r in rows:
        row_map.append(uniq.setdefault(tuple(r), len(uniq)))
      unique_rows = [list(u) for u in uniq]
    else:
      unique_rows, row_map = rows, list(range(n))
    bu = bucket_size(len(unique_rows), self._batch_buckets, "batch size")
    # Dummy rows: one real token, so no attention row is fully masked.
    unique_rows = unique_rows + [[self._pad_id]] * (bu - len(unique_rows))
    tokens, positions, mask = _left_pad(unique_rows, pb, self._pad_id)
    row_map = np.asarray(row_map + [0] * (bb - n), np.int32)
    lengths = np.asarray([len(r) for r in rows] + [1] * (bb - n), np.int32)
    last_tok = tokens[row_map, -1]
    active = np.arange(bb) < n
    row_ids = np.arange(offset, offset + bb, dtype=np.int32)

    put = self._put_rows
    self._shape_keys.update(
        (("prefill", bu, bb, pb, nb), ("decode", bb, pb, nb))
    )
    cache = _prefill(
        self._params,
        self._rest,
        put(tokens[:, :-1]),
        put(positions[:, :-1]),
        put(mask[:, :-1]),
        jnp.asarray(row_map),
        cache_len=pb + nb,
        static=self._static,
    )
    decode_rows = _Rows(
        last_tok=put(last_tok),
        last_pos=put(lengths - 1),
        active=put(active),
        row_ids=put(row_ids),
    )
    knobs = _Knobs(
        seed=jnp.uint32(seed % 2**32),
        temperature=jnp.float32(params.temperature),
        top_p=jnp.float32(params.top_p),
        max_new=jnp.int32(params.max_new_tokens),
        stop_mask=jnp.asarray(stop_mask),
    )
    # The spent cache comes back only so the donated input can alias it.
    out_tok, out_lp, out_len, stopped, _ = _decode(
        self._params,
        self._rest,
        cache,
        decode_rows,
        knobs,
        slots=nb,
        static=self._static,
    )
    out_tok, out_lp, out_len, stopped = jax.device_get(
        (out_tok, out_lp, out_len, stopped)
    )
    return [
        GenerationResult(
            token_ids=np.asarray(out_tok[b, : out_len[b]], np.int32),
            logprobs=np.asarray(out_lp[b, : out_len[b]], np.float32),
            finish_reason="stop" if stopped[b] else "length",
        )
        for b in range(n)
    ]

  def _put_rows(self, x: np.ndarray):
    if self._mesh is None:
      return jnp.asarray(x)
    spec = shd.logical_to_mesh_spec(
        ("batch",) + (None,) * (x.ndim - 1), self._rules
    )
    spec = shd.fit_spec_to_shape(self._mesh, spec, x.shape)
    return jax.device_put(x, NamedSharding(self._mesh, spec))

  # ---------------------------------------------------------------- helpers

  def _cut_at_stop_string(
      self, res: GenerationResult, stops
  ) -> GenerationResult:
    """Cuts after the first token whose decoded prefix contains a stop string.

    Binary search over prefix lengths (containment only grows with the
    prefix), so O(log n) calls of ``decode_fn`` per row.
    """
    ids = res.token_ids.tolist()

    def hit(k):
      text = self._decode_fn(ids[:k])
      return any(s in text for s in stops)

    if not ids or not hit(len(ids)):
      return res
    lo, hi = 1, len(ids)  # smallest k with hit(k) lies in [lo, hi]
    while lo < hi:
      mid = (lo + hi) // 2
      if hit(mid):
        hi = mid
      else:
        lo = mid + 1
    return GenerationResult(
        token_ids=res.token_ids[:lo],
        logprobs=res.logprobs[:lo],
        finish_reason="stop",
    )

  def _check_params(self, p: SamplingParams) -> None:
    # max_new_tokens, temperature and top_p: SamplingParams.__post_init__.
    if p.stop_strings and self._decode_fn is None:
      raise ValueError(
          f"SamplingParams.stop_strings {p.stop_strings!r} need a decode_fn"
          " given to JaxEngine"
      )

  def _check_prompt(self, prompt, i: int) -> list[int]:
    ids = np.asarray(prompt).reshape(-1)
    if ids.size == 0:
      raise ValueError(f"prompt {i} is empty")
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"prompt {i} holds non-integer ids ({ids.dtype})")
    if ids.min() < 0 or ids.max() >= self._cfg.vocab_size:
      raise ValueError(
          f"prompt {i} has token ids outside [0, {self._cfg.vocab_size})"
      )
    if ids.size > self._prompt_buckets[-1]:
      raise ValueError(
          f"prompt {i} has {ids.size} tokens, more than the largest prompt"
          f" bucket {self._prompt_buckets[-1]}"
      )
    return ids.astype(np.int32).tolist()

  def _check_ids(self, ids: tuple, what: str) -> tuple:
    bad = [i for i in ids if not 0 <= i < self._cfg.vocab_size]
    if bad:
      raise ValueError(
          f"{what} {bad} outside vocab [0, {self._cfg.vocab_size})"
      )
    return ids


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
  """Per-request traced values: changing them never recompiles."""

  seed: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  max_new: jax.Array
  stop_mask: jax.Array  # bool [V]


@functools.partial(jax.jit, static_argnames=("cache_len", "static"))
def _prefill(
    params,
    rest,
    tokens,
    positions,
    mask,
    row_map,
    *,
    cache_len,
    static: _Static,
):
  """Writes the unique prompts' columns into a fresh cache of ``cache_len``
  slots, then gathers the decode rows: ``cache[b] = cache_u[row_map[b]]``."""
  _TRACES[0] += 1
  cfg = static.cfg
  cache = tfm.init_cache(cfg, tokens.shape[0], cache_len, cfg.dtype)
  if tokens.shape[1]:
    model = nnx.merge(static.graphdef, params, rest)
    _, _, cache = model(
        tokens, positions, mask, cache=cache, return_logits=False
    )
  cache = tfm.KVCache(
      k=tuple(x[row_map] for x in cache.k),
      v=tuple(x[row_map] for x in cache.v),
      key_mask=cache.key_mask[row_map],
      index=cache.index,
  )
  return _constrain_cache(cache, static.mesh, static.rules)


@functools.partial(
    jax.jit, static_argnames=("slots", "static"), donate_argnums=(2,)
)
def _decode(
    params, rest, cache, rows: _Rows, knobs: _Knobs, *, slots, static: _Static
):
  """The decode loop (module docstring, step 3).

  Returns (tokens, logprobs [B, slots], lengths [B], stopped [B], cache).
  """
  _TRACES[0] += 1
  batch = rows.last_tok.shape[0]
  row_keys = jax.vmap(jax.random.fold_in, (None, 0))(
      jax.random.key(knobs.seed), rows.row_ids
  )
  pad = jnp.int32(static.pad_id)

  def cond(state):
    i, done = state[0], state[4]
    return (i < knobs.max_new) & ~jnp.all(done)

  def body(state):
    i, cache, tok_in, pos, done, length, stopped, out_tok, out_lp = state
    model = nnx.merge(static.graphdef, params, rest)
    logits, _, cache = model(
        tok_in[:, None],
        pos[:, None],
        jnp.ones((batch, 1), jnp.bool_),
        cache=cache,
    )
    cache = _constrain_cache(cache, static.mesh, static.rules)
    logits = logits[:, 0]
    keys = jax.vmap(jax.random.fold_in, (0, None))(row_keys, i)
    tok = sampling.sample_token(logits, keys, knobs.temperature, knobs.top_p)
    lp = sampling.token_logprob(logits, tok)
    live = ~done
    tok = jnp.where(live, tok, pad)
    out_tok = out_tok.at[:, i].set(tok)
    out_lp = out_lp.at[:, i].set(jnp.where(live, lp, 0.0))
    hit = live & knobs.stop_mask[tok]
    length = length + live.astype(jnp.int32)
    return (
        i + 1,
        cache,
        tok,
        pos + 1,
        done | hit,
        length,
        stopped | hit,
        out_tok,
        out_lp,
    )

  state = (
      jnp.int32(0),
      cache,
      rows.last_tok.astype(jnp.int32),
      rows.last_pos.astype(jnp.int32),
      ~rows.active,
      jnp.zeros((batch,), jnp.int32),
      jnp.zeros((batch,), jnp.bool_),
      jnp.full((batch, slots), pad, jnp.int32),
      jnp.zeros((batch, slots), jnp.float32),
  )
  i, cache, _, _, _, length, stopped, out_tok, out_lp = jax.lax.while_loop(
      cond, body, state
  )
  return out_tok, out_lp, length, stopped, cache


def _left_pad(rows, width: int, pad_id: int):
  """(tokens, positions, mask) [len(rows), width], rows right-aligned;
  positions count 0, 1, ... from each row's first real token."""
  n = len(rows)
  tokens = np.full((n, width), pad_id, np.int32)
  positions = np.zeros((n, width), np.int32)
  mask = np.zeros((n, width), np.bool_)
  for b, r in enumerate(rows):
    tokens[b, width - len(r) :] = r
    positions[b, width - len(r) :] = np.arange(len(r))
    mask[b, width - len(r) :] = True
  return tokens, positions, mask


def _snapshot(state):
  """Same arrays (immutable) in new Variable objects."""
  return jax.tree.map(lambda x: x, state)


def _check_same_shapes(old, new) -> None:
  old_flat = dict(nnx.to_flat_state(old))
  new_flat = dict(nnx.to_flat_state(new))
  if set(old_flat) != set(new_flat):
    missing = sorted(set(old_flat) ^ set(new_flat), key=str)[:3]
    raise ValueError(f"update_weights: parameter names differ, e.g. {missing}")
  for path, var in old_flat.items():
    a, b = jnp.shape(var.get_value()), jnp.shape(new_flat[path].get_value())
    if a != b:
      raise ValueError(
          f"update_weights: parameter {'/'.join(map(str, path))} has shape"
          f" {b}, expected {a}"
      )
