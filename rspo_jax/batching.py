"""Step records -> padded learner batches (numpy, host side).

Shapes are bucketed so the jitted steps compile once per bucket, not per
batch: the length axis rounds up to ``length_bucket(longest)`` (64 * {1, 1.5,
2, 3, 4, ...}) and the row axis likewise from ``row_multiple``
(padding rows carry a zero loss mask, so they change nothing).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from rspo_jax.types import Batch, StepRecord


def round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def length_bucket(n: int, minimum: int = 64) -> int:
  """Smallest of minimum * {1, 1.5, 2, 3, 4, 6, 8, ...} >= n: few distinct
  shapes (so the jitted steps compile a handful of times) and at most 1.5x
  padding."""
  t = minimum
  while True:
    if t >= n:
      return t
    if t * 3 // 2 >= n and (t * 3 // 2) % 8 == 0:
      return t * 3 // 2
    t *= 2


def records_to_batch(
    records: Sequence[StepRecord],
    step_advantages: Sequence[float],
    *,
    is_offpolicy: Optional[Sequence[bool]] = None,
    length_multiple: int = 64,
    row_multiple: int = 8,
    row_ways: int = 1,
    max_len: Optional[int] = None,
) -> Batch:
  """One row per step record: prompt then response tokens, right-padded.

  Rows: ``round_up(length_bucket(n, row_multiple), row_ways)``; ``row_ways``
  is the devices a batch's rows split over (a sharded input's rows must
  divide evenly: a bucket of 8 or 24 rows does not split over 6 or 16).

  A step's advantage is broadcast to every response token of the row (a
  scalar) or laid on its tokens (an array of one per response token, as
  PPO's). ``behavior_logp`` holds the records' stored behaviour log-probs;
  ``old_logp``/``ref_logp``, ``returns`` and ``old_values`` are zeros until
  the learner fills them (``host_batches.value_batch``: the critic's).
  Rows longer than ``max_len`` keep their response and lose the oldest prompt
  tokens (the count of such rows is not hidden: see ``count_truncated``).
  """
  n = len(records)
  if n == 0:
    raise ValueError("records_to_batch: no records")
  if len(step_advantages) != n:
    raise ValueError(f"{len(step_advantages)} advantages for {n} step records")
  lengths = [len(r.prompt_ids) + len(r.response_ids) for r in records]
  longest = max(lengths)
  if max_len is not None:
    longest = min(longest, max_len)
  t = length_bucket(longest, length_multiple)
  if max_len is not None:
    t = min(t, max_len)
  b = round_up(length_bucket(n, row_multiple), row_ways)
  tokens = np.zeros((b, t), np.int32)
  attn = np.zeros((b, t), np.int32)
  loss_mask = np.zeros((b, t), np.float32)
  adv = np.zeros((b, t), np.float32)
  beh = np.zeros((b, t), np.float32)
  off = np.zeros((b,), bool)
  for i, r in enumerate(records):
    resp = np.asarray(r.response_ids, np.int32)[: t - 1]
    prompt = np.asarray(r.prompt_ids, np.int32)
    keep = t - len(resp)
    prompt = prompt[-keep:] if len(prompt) > keep else prompt
    row = np.concatenate([prompt, resp])
    p, L = len(prompt), len(row)
    tokens[i, :L] = row
    attn[i, :L] = 1
    loss_mask[i, p:L] = 1.0
    adv[i, p:L] = step_advantages[i]
    beh[i, p:L] = np.asarray(r.behavior_logp, np.float32)[: len(resp)]
    if is_offpolicy is not None:
      off[i] = bool(is_offpolicy[i])
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  return Batch(
      tokens=tokens,
      positions=positions,
      attention_mask=attn,
      loss_mask=loss_mask,
      advantages=adv,
      old_logp=np.zeros_like(beh),
      ref_logp=np.zeros_like(beh),
      behavior_logp=beh,
      returns=np.zeros_like(beh),
      old_values=np.zeros_like(beh),
      is_offpolicy=off,
  )


def count_truncated(records: Sequence[StepRecord], max_len: int) -> int:
  return sum(len(r.prompt_ids) + len(r.response_ids) > max_len for r in records)


def before_response_positions(batch: Batch, row: int) -> np.ndarray:
  """The positions one before each response token of ``row``: ``p - 1 ..
  q - 2`` for its loss-mask span ``[p, q)``, where a critic's value of the
  state each token is sampled from sits (verl's ``values[:, -R - 1:-1]``).
  A row without a response: none."""
  idx = np.flatnonzero(np.asarray(batch.loss_mask[row]) > 0)
  if len(idx) and idx[0] == 0:
    raise ValueError(f"row {row} has no prompt token before its response")
  return idx - 1


def before_response_tokens(batch: Batch, x, rows: int) -> list:
  """Per row (the first ``rows``), ``x`` [B, T] at its
  ``before_response_positions``: a critic's values of the states the
  row's tokens are sampled from."""
  x = np.asarray(x)
  return [x[i, before_response_positions(batch, i)] for i in range(rows)]


def last_token_index(batch: Batch) -> np.ndarray:
  """[B] index of each row's last real token."""
  return np.maximum(np.asarray(batch.attention_mask).sum(axis=1) - 1, 0)
