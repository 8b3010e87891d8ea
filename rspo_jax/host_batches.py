"""Step records -> the learner's batches, on one process or many.

With one process a batch is the host's rows, padded to
``batching.length_bucket(rows, max(8, train.micro_batch_rows))`` rows and
then to a multiple of D, the devices the learner's batch rows split over
(``Learner.row_ways``; ``batching.records_to_batch``'s ``row_ways``).
With ``P > 1`` processes (every host calls these together, in the same
order):

  * ``build`` pads each host's block to the row count and length every
    host agrees on (a cross-host max of blocks that are each a multiple of
    D / gcd(D, P), so the P blocks together divide over D); a host
    without rows feeds padding;
  * ``to_global`` assembles the blocks into global arrays sharded like the
    learner's batch (``distributed.host_local_to_global``);
  * ``apply`` runs ``learner.apply`` on the global batch and returns this
    host's rows of the result (in any device order of the mesh).

Forward passes by length (one process on CPU, ``apply_group_rows = g``): the
rows with tokens, sorted by real length, go through ``learner.apply`` in
chunks of about g rows, each cut to ``batching.length_bucket`` of its
longest row instead of the batch's length T (right padding: a position's
output depends on the positions before it only), and the results are put
back in place; 0 past each chunk's length and on padding rows. Attention
costs ~rows x T^2: about 2x faster old and reference log-prob passes on the
nano WebShop loop. A chunk is padded to a multiple of
``lcm(8, devices its rows split over)`` rows, not to the training batch's
``micro_batch_rows`` (with ``micro_batch_rows = 32`` a 16-row chunk ran
as 32 rows: the every-row WebShop recipe's log-prob passes took 64.5 s an
A step instead of 33.0, docs/performance.md).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from rspo_jax import batching, distributed
from rspo_jax import train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.types import Batch

_DTYPES = dict(
    tokens=np.int32,
    positions=np.int32,
    attention_mask=np.int32,
    is_offpolicy=bool,
)
CPU_APPLY_GROUP_ROWS = 16


class HostBatches:
  """Builds, globalises and applies batches for one training job."""

  def __init__(
      self, cfg, multihost: bool, apply_group_rows=None, row_ways: int = 1
  ):
    self.multihost = multihost
    self.row_multiple = max(8, cfg.train.micro_batch_rows or 0)
    # Host rows a multiple of this: the P hosts' blocks divide over D ways.
    procs = jax.process_count() if multihost else 1
    self.host_row_ways = row_ways // math.gcd(row_ways, procs)
    self.max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    if apply_group_rows is None:  # see the module docstring
      on_cpu = jax.default_backend() == "cpu"
      apply_group_rows = CPU_APPLY_GROUP_ROWS if on_cpu else 0
    self.apply_group_rows = 0 if multihost else int(apply_group_rows)

  def build(self, records, adv, off_flags) -> Batch:
    """This host's rows -> a batch (multi-host: padded to the agreed
    shape; a host without rows feeds padding only)."""
    batch = None
    if records or not self.multihost:
      batch = batching.records_to_batch(
          records,
          adv,
          is_offpolicy=off_flags,
          row_multiple=self.row_multiple,
          row_ways=self.host_row_ways,
          max_len=self.max_len,
      )
    if not self.multihost:
      return batch
    shape = batch.tokens.shape if batch is not None else (0, 0)
    rows, length = (int(v) for v in distributed.global_max(np.array(shape)))
    if batch is None:
      batch = empty_batch(self.row_multiple, length)
    return distributed.pad_rows_and_length(batch, rows, length)

  def to_global(self, learner: Learner, batch: Batch):
    """What the learner is fed: the host batch itself with one process,
    else the global arrays assembled from every host's block."""
    if not self.multihost:
      return batch
    return distributed.host_local_to_global(
        batch, ts.batch_shardings(learner.mesh, batch, learner.rules)
    )

  def apply(self, learner: Learner, batch: Batch, params=None) -> np.ndarray:
    """``learner.apply`` on the job's batch; this host's rows of it."""
    if self.apply_group_rows and len(batch.tokens) > self.apply_group_rows:
      return self._apply_by_length(learner, batch, params)
    if not self.multihost:
      return learner.apply(batch, params=params)
    out = learner.apply(
        self.to_global(learner, batch), params=params, host_rows=True
    )
    if len(out) != len(batch.tokens):
      raise ValueError(
          f"the mesh {dict(learner.mesh.shape)} does not split the batch rows"
          " over hosts; multi-host runs need hosts along ('data', 'fsdp')"
      )
    return out

  def _apply_by_length(self, learner, batch: Batch, params) -> np.ndarray:
    """``learner.apply`` in length-sorted chunks (module docstring)."""
    rows, width = batch.tokens.shape
    lengths = np.asarray(batch.attention_mask).sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    order = order[lengths[order] > 0]  # padding rows stay 0
    if not len(order):
      return learner.apply(batch, params=params)
    n_chunks = -(-len(order) // self.apply_group_rows)  # order is not empty
    multiple = math.lcm(8, learner.row_ways)
    out = None
    for idx in np.array_split(order, n_chunks):
      t = min(width, batching.length_bucket(max(int(lengths[idx].max()), 1)))
      n = batching.round_up(len(idx), multiple)
      part = Batch(
          *(
              _take(np.asarray(x), idx, n, None if x.ndim == 1 else t)
              for x in batch
          )
      )
      got = learner.apply(part, params=params)
      if out is None:
        out = np.zeros((rows, width), got.dtype)
      out[idx, :t] = got[: len(idx)]
    return out


def _take(x: np.ndarray, idx: np.ndarray, rows: int, width) -> np.ndarray:
  """Rows ``idx`` of x (columns [0, width) when given), zero rows added up
  to ``rows``."""
  part = x[idx] if width is None else x[idx, :width]
  pad = np.zeros((rows - len(idx),) + part.shape[1:], part.dtype)
  return np.concatenate([part, pad])


def empty_batch(rows: int, length: int) -> Batch:
  """A batch of padding only (zero masks) for a host without rows."""
  return Batch(
      **{
          f: np.zeros(
              (rows,) if f == "is_offpolicy" else (rows, length),
              _DTYPES.get(f, np.float32),
          )
          for f in Batch._fields
      }
  )


def value_batch(batch: Batch, returns, values) -> Batch:
  """The critic's batch for ``batch``'s rows: it learns V_{s,j}, the value
  of the state before each response token j (read one position earlier,
  as ``batching.before_response_tokens``), towards the row's return,

    mask[s, p + j - 1] = 1,  returns there = R_s,  old values = V_{s,j},

  as verl's critic regresses every response token's value.

  Args:
    batch: the policy batch (its loss mask gives each row's tokens).
    returns: [S] R_s of the first S rows.
    values: S arrays [n_s] of V_{s,j} at the step's start (or scalars).
  """
  mask = np.zeros_like(batch.loss_mask)
  ret = np.zeros_like(batch.returns)
  old = np.zeros_like(batch.old_values)
  for i, (r, v) in enumerate(zip(returns, values)):
    idx = batching.before_response_positions(batch, i)
    mask[i, idx] = 1.0
    ret[i, idx] = r
    old[i, idx] = v
  return batch._replace(loss_mask=mask, returns=ret, old_values=old)
