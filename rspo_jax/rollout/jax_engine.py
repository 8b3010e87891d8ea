"""In-process JAX generation engine: bucketed prefill + one jitted decode loop.

A call ``generate(prompts, params)`` splits the prompts into chunks and runs,
per chunk:

  0. Chunking. With ``length_group_rows = g > 0`` (the default on CPU) the
     prompts are sorted by length and cut into ceil(n / g) chunks of equal
     size (+-1), so each chunk pads to its own, tighter, prompt bucket
     (prefill costs ~ rows x Pb^2 in attention, decode ~ rows x (Pb + Nb)
     per token); otherwise the same with g = the largest batch bucket, in
     order. ``max_rows = m > 0`` caps g at the largest batch bucket <= m
     (``rows_per_call``): a call's KV cache and prefill scores scale with
     its rows, so m bounds the rollout's memory (``plan.engine_shapes``;
     the chunks run one after another, each decode loop over its rows).
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
     ``Bb`` decode rows -- only when that halves the prefill (``2 Bu <=
     Bb``); otherwise the prompts are prefilled straight into the decode
     rows' cache (an empty one the call donates to the prefill, which XLA
     writes in place), which the decode loop then continues in: one cache
     in one pass, 1.5 with the gather (the distinct prompts' is at most
     half the rows), 2 in column blocks (XLA copies the cache being
     written; ``plan.prefill_bytes``).
     With ``prefill_chunk = C > 0`` (the default on CPU) the columns go
     in causal blocks of C, each attending only the slots written so far:
     ~half the attention, and score blocks small enough to stay in cache
     (2-2.5x faster prefill on CPU).
     Shared prefix blocks (``shared_prefix_prefill``): prompts that differ
     but begin alike (a group's instruction and task at later turns) have
     their first ``W`` tokens laid out at columns [0, W) and the rest
     right-aligned to ``Pb`` (the gap between is masked), so the ``Bp``
     distinct W-token prefixes are prefilled once, gathered to the ``Bu``
     prompts, and only columns [W, Pb - 1) are prefilled per prompt.
     ``W`` (the block width, or ``PREFIX_GRAIN`` in one pass, times a
     power of 2, below every prompt's length) minimises the prefilled columns
     ``Bp W + Bu (Pb - 1 - W)``; ``W = 0`` is the plain left-padded
     layout. A token's key and value depend on its position and the tokens
     before it, not on its column, so this changes sums by rounding only.
  3. Decode (jitted, one ``lax.while_loop``). Step ``i`` feeds each row's
     previous token (the last prompt token at ``i = 0``) at position
     ``L_b - 1 + i`` (``L_b`` = real prompt length: positions start at 0 on
     the first real token), samples token ``i`` from the logits with key
     ``fold_in(fold_in(key(seed), row), i)``, and records it with its
     temperature-1 log-prob ``log softmax(logits)[token]``. A row is done
     after a stop id or once its text contains a stop string (a token-level
     automaton per string, ``sampling.stop_string_tables``); the loop ends
     when every row is done or after ``max_new_tokens`` steps.

Rows depend only on their own prompt, seed and row index (its position in
``prompts``), not on the batch they were bucketed with, so results with and
without prefix sharing or length grouping (and on one device or a mesh)
agree. A row stopped by a stop string ends at the token whose decoded
prefix first contains it; the engine checks this with ``decode_fn`` (if a
tokenizer's texts do not concatenate, it falls back, once and for all, to
decoding to a stop id or the limit and cutting on the host).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rspo_jax import sharding as shd
from rspo_jax.rollout import sampling
from rspo_jax.rollout.engine import Engine, GenerationResult, SamplingParams

# The prompt layout and the jitted programs live beside this module; their
# names are read here (by the engine, and by hlo.py, launch/ and the tests
# as ``jax_engine.<name>``; tests patch ``_prefill``, ``_decode`` and
# ``PREFIX_GRAIN`` here).
from rspo_jax.rollout.engine_layout import (  # noqa: F401
    BATCH_BUCKETS,
    CPU_GROUP_ROWS,
    CPU_PREFILL_CHUNK,
    MAX_PREFILL_BLOCKS,
    PREFIX_GRAIN,
    PROMPT_BUCKETS,
    _layout,
    _prefix_rows,
    bucket_size,
    prefill_block,
    prefix_width,
    round_up,
    rows_per_call,
    share_prompts,
)
from rspo_jax.rollout.engine_programs import (  # noqa: F401
    _CACHE_AXES,
    _constrain_cache,
    _decode,
    _gather_rows,
    _Knobs,
    _prefill,
    _row_shards,
    _Rows,
    _Static,
    _with_activation_rules,
    empty_cache,
    trace_count,
)

log = logging.getLogger(__name__)


class JaxEngine(Engine):
  """Batched KV-cache generation with an NNX ``Transformer``.

  Args:
    model: an NNX Transformer, or ``(graphdef, params[, rest])`` as returned
      by ``nnx.split`` (``params`` is what ``update_weights`` replaces).
    cfg: the model's ``ModelConfig``.
    mesh: optional ('data', 'fsdp', 'tensor') mesh; rows are split over
      ('data', 'fsdp'), params over 'tensor' only
      (``sharding.inference_rules``: each row shard holds whole weights, so
      decode gathers none), and the model's activations follow the same
      rules (``_with_activation_rules``: no per-token collective on a mesh
      without a 'tensor' axis but the loop condition's). None = one device.
    rules: logical axis rules.
    pad_id: token used for padding and for dummy rows.
    eos_ids: stop ids applied to every request (plus the request's own).
    batch_buckets, prompt_buckets: allowed padded shapes.
    new_token_multiple: ``max_new_tokens`` is rounded up to a multiple.
    decode_fn: ids -> text, needed for ``SamplingParams.stop_strings``.
    token_texts: the text of each token id (default: ``decode_fn([id])``),
      for the in-loop stop-string automaton.
    prefix_sharing: prefill identical prompts once.
    shared_prefix_prefill: prefill the leading blocks that different
      prompts share once (module docstring, step 2). Off by default: on
      WebShop's prompts (a group shares ~120 tokens) it saved 4-8 % of the
      prefilled columns and no measurable time (docs/performance.md).
    length_group_rows: rows per length-sorted chunk (0: chunks of the
      largest batch bucket, in order); None: ``CPU_GROUP_ROWS`` when the
      engine runs on CPU, else 0.
    prefill_chunk: prefill this many prompt columns at a time (causal
      blocks, see ``_prefill``; 0: all at once); None:
      ``CPU_PREFILL_CHUNK`` on CPU, else 0.
    max_rows: at most this many rows (rounded down to a batch bucket) a
      prefill and decode call (module docstring, step 0); 0: no cap (the
      largest batch bucket).
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
      token_texts: Optional[Sequence[str]] = None,
      prefix_sharing: bool = True,
      shared_prefix_prefill: bool = False,
      length_group_rows: Optional[int] = None,
      prefill_chunk: Optional[int] = None,
      max_rows: int = 0,
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
    self._eos_ids = _checked_ids(
        tuple(int(i) for i in eos_ids), "eos_ids", cfg.vocab_size
    )
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
    self._token_texts = None if token_texts is None else list(token_texts)
    self._stop_tables: dict = {}
    self._stop_in_loop = True  # False once a tokenizer broke the automaton
    self._prefix_sharing = bool(prefix_sharing)
    self._shared_prefix = bool(shared_prefix_prefill)
    self._columns_prefilled = [0, 0]  # done, and without shared prefixes
    devices = mesh.devices.flat if mesh is not None else jax.devices()[:1]
    on_cpu = all(d.platform == "cpu" for d in devices)
    if length_group_rows is None:
      length_group_rows = CPU_GROUP_ROWS if on_cpu else 0
    if prefill_chunk is None:
      prefill_chunk = CPU_PREFILL_CHUNK if on_cpu else 0
    for name, v in (
        ("length_group_rows", length_group_rows),
        ("prefill_chunk", prefill_chunk),
        ("max_rows", max_rows),
    ):
      if v < 0:
        raise ValueError(f"{name} must be >= 0: {v}")
    self._group_rows = int(length_group_rows)
    self._max_rows = int(max_rows)
    self._prefill_chunk = int(prefill_chunk)
    self._np_rng = np.random.default_rng(seed)
    self._shape_keys: set = set()
    self._decode_steps = 0
    self._graphdef, self._params, self._rest = _split(model)
    self._param_sh = self._rest_sh = None
    if mesh is not None:
      weights = shd.inference_rules(rules)  # whole on each row shard
      self._graphdef = _with_activation_rules(
          self._graphdef, self._params, self._rest, weights
      )
      self._param_sh = shd.state_shardings(mesh, self._params, weights)
      self._rest_sh = shd.state_shardings(mesh, self._rest, weights)
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
  def param_shardings(self):
    """The weights' NamedShardings (an nnx.State like the params; None
    without a mesh): whole over ('data', 'fsdp'), split over 'tensor'."""
    return self._param_sh

  @property
  def num_compilations(self) -> int:
    """Distinct (function, shape bucket) pairs this engine has run.

    Each is traced at most once per process: the jitted functions are shared
    by all engines of the same model structure (see ``trace_count``).
    """
    return len(self._shape_keys)

  @property
  def prefill_columns(self) -> tuple[int, int]:
    """(prompt columns prefilled so far, columns the same prefills would
    have taken without shared prefix blocks), rows x columns summed over
    chunks (identical prompts counted once in both)."""
    return tuple(self._columns_prefilled)

  @property
  def decode_steps(self) -> int:
    """Decode-loop steps run so far (every chunk's loop; a loop ends when
    its rows are all done)."""
    return self._decode_steps

  def update_weights(self, params_or_path, version: int) -> None:
    """Replaces the weights: an nnx.State of params, a Transformer, a
    ``(graphdef, params[, rest])`` tuple, or a HF safetensors directory.

    The engine's old weights are freed before the new ones are placed, so
    a sync holds the engine's weights and its new copy, not also the old
    one. The engine keeps its own copy of arrays it is given (the trainer
    donates its param buffers to each train step, which would delete them
    under the engine); arrays its dtype cast made are its own already.

    Raises ValueError when the new params differ in structure or shapes
    (the old weights are kept then).
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
      _, params, _ = _split(params_or_path)
    _check_same_shapes(self._params, params)
    dtypes = jax.tree.map(lambda old: old.dtype, self._params)
    # The engine's are the only references: dropping them frees the old
    # weights now. (Not ``Array.delete()``: a copy placed from one device
    # onto a replicated mesh sharding may share that device's buffer with
    # the caller's array.)
    self._params = None
    # Keep the engine's dtypes (e.g. float32 trainer params -> bf16 engine).
    if self._param_sh is None:
      self._params = jax.tree.map(
          lambda new, dtype: _own_copy(new, dtype, None), params, dtypes
      )
    else:
      self._params = jax.tree.map(_own_copy, params, dtypes, self._param_sh)
    self._version = int(version)

  def _place(self, tree, shardings):
    """Own copies of the arrays, with the engine's shardings: the trainer
    donates its param buffers to each train step, which would delete ours."""
    return jax.device_put(tree, shardings, may_alias=False)

  # --------------------------------------------------------------- generate

  def generate(
      self, prompts: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[GenerationResult]:
    """One result per prompt, in order (see the module docstring)."""
    if self._params is None:
      raise RuntimeError(
          "the engine has no weights: an update_weights call failed after"
          " freeing the old ones; call update_weights again"
      )
    self._check_params(params)
    rows = [
        _checked_prompt(p, i, self._cfg.vocab_size, self._prompt_buckets[-1])
        for i, p in enumerate(prompts)
    ]
    if not rows:
      return []
    if params.max_new_tokens == 0:  # nothing to generate (SGLang's answer)
      empty = lambda: GenerationResult(
          np.zeros(0, np.int32), np.zeros(0, np.float32), "length"
      )
      return [empty() for _ in rows]
    seed = params.seed
    if seed is None:
      seed = int(self._np_rng.integers(0, 2**31 - 1))
    stop_ids = self._eos_ids + _checked_ids(
        tuple(int(i) for i in params.stop_token_ids),
        "stop_token_ids",
        self._cfg.vocab_size,
    )
    stop_mask = np.zeros((self._cfg.vocab_size,), np.bool_)
    stop_mask[list(stop_ids)] = True
    stops = self._stop_automaton(params.stop_strings)
    results = self._generate_rows(rows, seed, stop_mask, stops, params)
    done = set()  # rows the automaton stopped at the right token
    if stops is not None:
      done = stopped_by_string(
          results, stop_mask, params.stop_strings, self._decode_fn
      )
      if done is None:
        log.warning(
            "token texts do not concatenate to decode_fn's text:"
            " stop strings are cut on the host from now on"
        )
        self._stop_in_loop = False
        results = self._generate_rows(rows, seed, stop_mask, None, params)
        done = set()
    if params.stop_strings:
      results = [
          r if i in done else self._cut_at_stop_string(r, params.stop_strings)
          for i, r in enumerate(results)
      ]
    return results

  def _generate_rows(self, rows, seed, stop_mask, stops, params):
    """Results of every row, chunk by chunk (module docstring, step 0)."""
    n = len(rows)
    chunk = rows_per_call(self._batch_buckets, self._group_rows, self._max_rows)
    if self._group_rows:
      order = sorted(range(n), key=lambda i: (len(rows[i]), rows[i]))
    else:
      order = list(range(n))
    # Equal chunks (n = 123, g = 8: 16 chunks of 7-8 rows, one batch
    # bucket), not 15 of 8 and one of 3 (a bucket, and a compile, more).
    results = [None] * n
    for idx in np.array_split(np.asarray(order), -(-n // chunk)):
      idx = idx.tolist()
      out = self._generate_chunk(
          [rows[i] for i in idx], idx, seed, stop_mask, stops, params
      )
      for i, r in zip(idx, out):
        results[i] = r
    return results

  def _generate_chunk(self, rows, ids, seed, stop_mask, stops, params):
    """``rows`` are the prompts of request rows ``ids`` (their rng
    streams)."""
    n = len(rows)
    bb = bucket_size(n, self._batch_buckets, "batch size")
    pb = bucket_size(
        max(len(r) for r in rows), self._prompt_buckets, "prompt length"
    )
    nb = round_up(params.max_new_tokens, self._new_multiple)
    shards = _row_shards(self._mesh, self._rules, bb)
    unique_rows, row_map = share_prompts(
        rows,
        bb,
        shards,
        self._batch_buckets,
        self._pad_id,
        self._prefix_sharing,
    )
    if 2 * len(unique_rows) > bb:  # no gather: the decode rows' cache only
      unique_rows = [list(r) for r in rows] + [[self._pad_id]] * (bb - n)
      row_map = None
    bu = len(unique_rows)
    chunk = self._chunk_for(pb)
    head = 0
    if self._shared_prefix:
      head = prefix_width(
          unique_rows,
          min(len(r) for r in rows),
          shards,
          chunk or PREFIX_GRAIN,
          self._batch_buckets,
          pb,
      )
    tokens, positions, mask = _layout(unique_rows, pb, self._pad_id, head)
    prefix, bp = None, 0
    if head:
      heads, head_map = share_prompts(
          _prefix_rows(unique_rows, shards, head),
          bu,
          shards,
          self._batch_buckets,
          self._pad_id,
          filler=unique_rows[0][:head],
      )
      bp = len(heads)
      p_tok, p_pos, p_mask = _layout(heads, head, self._pad_id)
      prefix = (
          self._put_rows(p_tok),
          self._put_rows(p_pos),
          self._put_rows(p_mask),
          jnp.asarray(head_map),
      )
    self._columns_prefilled[0] += bp * head + bu * (pb - 1 - head)
    self._columns_prefilled[1] += bu * (pb - 1)
    lengths = np.asarray([len(r) for r in rows] + [1] * (bb - n), np.int32)
    last_tok = tokens[:, -1] if row_map is None else tokens[row_map, -1]
    active = np.arange(bb) < n
    # Dummy rows take ids past the request's rows (their draws are unused).
    row_ids = np.concatenate(
        [
            np.asarray(ids, np.int32),
            np.arange(bb - n, dtype=np.int32) + max(ids) + 1,
        ]
    )

    put = self._put_rows
    stop_shape = None if stops is None else stops[0].shape[:2]
    self._shape_keys.update(
        (
            ("prefill", bu, bb, pb, nb, chunk, bp, head, row_map is None),
            ("decode", bb, pb, nb, stop_shape),
        )
    )
    cache = _prefill(
        self._params,
        self._rest,
        put(tokens[:, head:-1]),
        put(positions[:, head:-1]),
        put(mask[:, head:-1]),
        None if row_map is None else jnp.asarray(row_map),
        prefix,
        None
        if row_map is not None
        else empty_cache(rows=bb, cache_len=pb + nb, static=self._static),
        cache_len=pb + nb,
        static=self._static,
        chunk=chunk,
    )
    decode_rows = _Rows(
        last_tok=put(last_tok),
        last_pos=put(lengths - 1),
        active=put(active),
        row_ids=put(row_ids),
    )
    knobs = _knobs(seed, params, stop_mask, stops)
    # The spent cache comes back only so the donated input can alias it.
    out = _decode(
        self._params,
        self._rest,
        cache,
        decode_rows,
        knobs,
        slots=nb,
        static=self._static,
    )
    out_tok, out_lp, out_len, stopped, steps = jax.device_get(out[:4] + out[5:])
    self._decode_steps += int(steps)
    return _results(out_tok, out_lp, out_len, stopped, n)

  def _chunk_for(self, pb: int) -> int:
    return prefill_block(self._prefill_chunk, pb)

  def _put_rows(self, x: np.ndarray):
    if self._mesh is None:
      return jnp.asarray(x)
    spec = shd.logical_to_mesh_spec(
        ("batch",) + (None,) * (x.ndim - 1), self._rules
    )
    spec = shd.fit_spec_to_shape(self._mesh, spec, x.shape)
    return jax.device_put(x, NamedSharding(self._mesh, spec))

  # ---------------------------------------------------------------- helpers

  def _stop_automaton(self, stop_strings):
    """(table, lengths) of ``sampling.stop_string_tables`` for these stop
    strings (cached), or None: no stop strings, or in-loop matching off."""
    if not stop_strings or not self._stop_in_loop:
      return None
    key = tuple(stop_strings)
    if key not in self._stop_tables:
      if self._token_texts is None:
        self._token_texts = [
            self._decode_fn([i]) for i in range(self._cfg.vocab_size)
        ]
      self._stop_tables[key] = sampling.stop_string_tables(
          self._token_texts, key
      )
    return self._stop_tables[key]

  def _cut_at_stop_string(
      self, res: GenerationResult, stops
  ) -> GenerationResult:
    """``cut_at_stop_string`` with this engine's ``decode_fn``."""
    return cut_at_stop_string(res, stops, self._decode_fn)

  def _check_params(self, p: SamplingParams) -> None:
    # max_new_tokens, temperature and top_p: SamplingParams.__post_init__.
    if p.stop_strings and self._decode_fn is None:
      raise ValueError(
          f"SamplingParams.stop_strings {p.stop_strings!r} need a decode_fn"
          " given to JaxEngine"
      )


# ------------------------------------------------------------ one chunk


def _knobs(seed: int, params: SamplingParams, stop_mask, stops) -> _Knobs:
  """The decode loop's sampling knobs of one chunk, on device."""
  return _Knobs(
      seed=jnp.uint32(seed % 2**32),
      temperature=jnp.float32(params.temperature),
      top_p=jnp.float32(params.top_p),
      max_new=jnp.int32(params.max_new_tokens),
      stop_mask=jnp.asarray(stop_mask),
      stop_table=None if stops is None else jnp.asarray(stops[0]),
      stop_len=None if stops is None else jnp.asarray(stops[1]),
  )


def _results(out_tok, out_lp, out_len, stopped, n: int) -> list:
  """The first ``n`` rows of a decode's outputs as GenerationResults."""
  return [
      GenerationResult(
          token_ids=np.asarray(out_tok[b, : out_len[b]], np.int32),
          logprobs=np.asarray(out_lp[b, : out_len[b]], np.float32),
          finish_reason="stop" if stopped[b] else "length",
      )
      for b in range(n)
  ]


def _checked_prompt(
    prompt, i: int, vocab_size: int, max_tokens: int
) -> list[int]:
  """Prompt ``i``'s token ids as a list; ValueError unless it is a
  non-empty run of ids in [0, vocab_size), at most ``max_tokens`` long."""
  ids = np.asarray(prompt).reshape(-1)
  if ids.size == 0:
    raise ValueError(f"prompt {i} is empty")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"prompt {i} holds non-integer ids ({ids.dtype})")
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
  if ids.size > max_tokens:
    raise ValueError(
        f"prompt {i} has {ids.size} tokens, more than the largest prompt"
        f" bucket {max_tokens}"
    )
  return ids.astype(np.int32).tolist()


def _checked_ids(ids: tuple, what: str, vocab_size: int) -> tuple:
  """``ids``; ValueError naming ``what`` unless all lie in the vocab."""
  bad = [i for i in ids if not 0 <= i < vocab_size]
  if bad:
    raise ValueError(f"{what} {bad} outside vocab [0, {vocab_size})")
  return ids


# ------------------------------------------------------------ stop strings


def stopped_by_string(results, stop_mask, stops, decode_fn):
  """Indices of the rows the automaton stopped (finish 'stop', last token
  no stop id), each checked to hold a stop string in its text (``decode_fn``
  of its ids) and none without its last token; None if a row fails the
  check."""
  done = set()
  for i, r in enumerate(results):
    ids = r.token_ids.tolist()
    if r.finish_reason != "stop" or not ids or stop_mask[ids[-1]]:
      continue
    if not any(s in decode_fn(ids) for s in stops) or any(
        s in decode_fn(ids[:-1]) for s in stops
    ):
      return None
    done.add(i)
  return done


def cut_at_stop_string(
    res: GenerationResult, stops, decode_fn
) -> GenerationResult:
  """Cuts after the first token whose decoded prefix contains a stop string.

  Binary search over prefix lengths (containment only grows with the
  prefix), so O(log n) calls of ``decode_fn`` per row.
  """
  ids = res.token_ids.tolist()

  def hit(k):
    text = decode_fn(ids[:k])
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


# ----------------------------------------------------------------- weights


def _own_copy(new, dtype, sharding):
  """``new`` as ``dtype`` on ``sharding`` (None: the default device) in an
  array no one else holds: copied unless the cast made a new one."""
  cast = new.astype(dtype)
  return jax.device_put(cast, sharding, may_alias=cast is not new)


def _split(model):
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


def _snapshot(state):
  """Same arrays (immutable) in new Variable objects."""
  return jax.tree.map(lambda x: x, state)


def _check_same_shapes(old, new) -> None:
  """Raises ValueError unless ``new`` has ``old``'s parameter names and
  shapes. (jax's key paths, not ``nnx.to_flat_state``: its flat states
  form reference cycles that keep the old weights alive until a garbage
  collection, where ``update_weights`` frees them at once.)"""
  old_flat, new_flat = _shapes_by_name(old), _shapes_by_name(new)
  if set(old_flat) != set(new_flat):
    missing = sorted(set(old_flat) ^ set(new_flat), key=str)[:3]
    raise ValueError(f"update_weights: parameter names differ, e.g. {missing}")
  for name, shape in old_flat.items():
    if new_flat[name] != shape:
      raise ValueError(
          f"update_weights: parameter {name} has shape {new_flat[name]},"
          f" expected {shape}"
      )


def _shapes_by_name(state) -> dict:
  """{'layers/0/attn/q': shape, ...} of an nnx.State's arrays."""

  def name(path):
    keys = [
        getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
        for k in path
    ]
    return "/".join(str(k) for k in keys if k != "value")

  return {
      name(path): tuple(jnp.shape(x))
      for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
  }
