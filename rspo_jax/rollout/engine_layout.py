"""How the in-process engine lays out a call's prompts, on the host:
shape buckets, calls of at most ``rows_per_call`` rows, prefix sharing
(``share_prompts``) and shared prefix blocks (``prefix_width``), and the
padded token layout (``_layout``). ``jax_engine``'s docstring, steps 0-2,
describes the whole; ``rspo_jax.plan`` reads the buckets and block widths
here to estimate a rollout's memory.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


# 1.5x apart: at most 1.5x padding, ~2.25x less attention than powers of 2.
PROMPT_BUCKETS = (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


# CPU defaults (length_group_rows=None, prefill_chunk=None).
CPU_GROUP_ROWS = 8


CPU_PREFILL_CHUNK = 64


# A prefill is unrolled into at most this many column blocks (compile time).
MAX_PREFILL_BLOCKS = 12


def prefill_block(chunk: int, pb: int) -> int:
  """Prefill block width for prompt bucket ``pb``: ``chunk``, widened so
  there are at most ``MAX_PREFILL_BLOCKS`` blocks; 0 = one pass (as is a
  block of ``pb - 1`` or more columns)."""
  if not chunk:
    return 0
  return max(int(chunk), -(-(pb - 1) // MAX_PREFILL_BLOCKS))


# Shared prefix widths are this (or the prefill block width) times a power
# of 2 (few widths: few compiled shapes).
PREFIX_GRAIN = 64


def rows_per_call(
    buckets: Sequence[int], group_rows: int = 0, max_rows: int = 0
) -> int:
  """Most prompts one prefill / decode call takes (``jax_engine``'s
  docstring, step 0): ``group_rows`` (0: the largest of ``buckets``), at
  most the largest batch bucket, and with ``max_rows`` > 0 at most the
  largest bucket <= ``max_rows`` (the smallest bucket if none is), so a
  call's padded rows stay within the cap."""
  buckets = sorted(int(b) for b in buckets)
  rows = min(group_rows, buckets[-1]) if group_rows else buckets[-1]
  if max_rows:
    rows = min(
        rows, max([b for b in buckets if b <= max_rows], default=buckets[0])
    )
  return rows


def bucket_size(n: int, buckets: Sequence[int], what: str) -> int:
  """Smallest bucket >= n; ValueError naming ``what`` when none fits."""
  for b in sorted(buckets):
    if b >= n:
      return int(b)
  raise ValueError(f"{what} {n} exceeds the largest bucket {max(buckets)}")


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def share_prompts(
    rows,
    bb: int,
    shards: int,
    buckets,
    pad_id: int,
    share: bool = True,
    filler: Optional[Sequence[int]] = None,
):
  """(unique prompts, row_map [bb]): decode row b (of ``bb``; rows past
  ``len(rows)`` are dummies) reads prompt ``row_map[b]``.

  Shard j of ``shards`` holds decode rows [j bb/s, (j + 1) bb/s) and prompts
  [j u, (j + 1) u), u = the batch bucket of the most distinct prompts any
  shard has (its own, deduplicated when ``share``; dummy prompts, one pad
  token or ``filler``, fill each shard's share), so the prefilled cache
  reaches its decode rows without leaving the device (``_gather_rows``).
  """
  per = bb // shards
  parts, maps = [], []
  for j in range(shards):
    block = [list(r) for r in rows[j * per : (j + 1) * per]]
    row_map = list(range(len(block)))
    if share:
      uniq = {}
      row_map = [uniq.setdefault(tuple(r), len(uniq)) for r in block]
      block = [list(r) for r in uniq]
    parts.append(block)
    maps.append(row_map + [0] * (per - len(row_map)))
  u = bucket_size(max(1, max(len(p) for p in parts)), buckets, "batch size")
  unique = []
  dummy = [pad_id] if filler is None else list(filler)
  for p in parts:  # dummy prompts: real tokens, no fully masked row
    unique += p + [dummy] * (u - len(p))
  row_map = [j * u + m for j, mp in enumerate(maps) for m in mp]
  return unique, np.asarray(row_map, np.int32)


def prefix_width(
    unique_rows, min_len: int, shards: int, grain: int, buckets, pb: int
) -> int:
  """The shared prefix width W of a chunk (``jax_engine``'s docstring,
  step 2).

  W runs over ``grain`` times powers of 2 below ``min_len`` (the shortest
  real prompt: each keeps a token after its prefix); per W, shard j's
  distinct W-token prefixes among its real rows (``unique_rows`` in
  ``share_prompts``' shard blocks; dummies, shorter than ``min_len``,
  borrow one) number 1 + #(adjacent pairs of its sorted rows whose common
  prefix is < W), and the prefill costs

    cost(W) = shards * bucket(max_j distinct_j) * W + Bu * (pb - 1 - W)

  columns, against Bu * (pb - 1) without. The cheapest W, 0 if none is
  cheaper.
  """
  top = min(min_len - 1, pb - 1)
  widths = [grain << k for k in range(max(0, top // grain).bit_length())]
  if not widths:
    return 0
  bu = len(unique_rows)
  u = bu // shards
  lcps = []
  for j in range(shards):
    real = sorted(
        r for r in unique_rows[j * u : (j + 1) * u] if len(r) >= min_len
    )
    lcps.append(
        np.asarray(
            [_common_prefix(a, b) for a, b in zip(real, real[1:])], np.int64
        )
    )
  best, best_cost = 0, bu * (pb - 1)
  for w in widths:
    distinct = max(1 + int(np.sum(ls < w)) for ls in lcps)
    cost = shards * bucket_size(distinct, buckets, "batch size") * w + bu * (
        pb - 1 - w
    )
    if cost < best_cost:
      best, best_cost = w, cost
  return best


def _common_prefix(a, b) -> int:
  """Length of the longest common prefix of token lists a and b."""
  n = min(len(a), len(b))
  same = np.asarray(a[:n]) == np.asarray(b[:n])
  return n if same.all() else int(np.argmin(same))


def _prefix_rows(unique_rows, shards: int, head: int):
  """Each unique prompt's first ``head`` tokens; a dummy (not longer
  than ``head``) takes its shard's first prompt's (or, in a shard of
  dummies only, prompt 0's), so it adds no distinct prefix."""
  u = len(unique_rows) // shards
  out = []
  for j in range(shards):
    block = unique_rows[j * u : (j + 1) * u]
    fill = block[0] if len(block[0]) > head else unique_rows[0]
    out += [list(r[:head] if len(r) > head else fill[:head]) for r in block]
  return out


def _layout(rows, width: int, pad_id: int, head: int = 0):
  """(tokens, positions, mask) [len(rows), width]: each row's first
  ``head`` tokens at columns [0, head), the rest right-aligned, the gap
  masked (``head`` 0: left padding); rows not longer than ``head``
  (dummies) right-aligned whole. Positions count 0, 1, ... from each row's
  first real token."""
  n = len(rows)
  tokens = np.full((n, width), pad_id, np.int32)
  positions = np.zeros((n, width), np.int32)
  mask = np.zeros((n, width), np.bool_)
  for b, r in enumerate(rows):
    h = head if len(r) > head else 0
    tokens[b, :h] = r[:h]
    positions[b, :h] = np.arange(h)
    mask[b, :h] = True
    tail = width - (len(r) - h)
    tokens[b, tail:] = r[h:]
    positions[b, tail:] = np.arange(h, len(r))
    mask[b, tail:] = True
  return tokens, positions, mask
