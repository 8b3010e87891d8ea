"""A trainable role -- policy A, policy B, a critic -- as one object.

Holds the module's graphdef, its sharded ``TrainState`` and the jitted
functions built from it; the RSPO loop talks only to this. ``copy()`` makes
B from A: new buffers with the same shardings (so B is sharded like A), the
optimizer state copied or fresh by choice.

A policy learner runs its last block and LM head only on the batch's
response window (``train_step.response_window``): ``apply`` returns
log-probs on each row's window and 0 outside it, where the loss mask is 0.
One jitted function per (window, micro-batch count) bucket. ``apply``
runs in chunks of at most ``micro_batch_rows`` rows (``apply_chunks``)
inside one jitted function, on one host's batch or on global multi-host
arrays alike.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from rspo_jax import distributed
from rspo_jax import sharding as shd
from rspo_jax import train_step as ts
from rspo_jax.types import Batch

_INPUTS = ("tokens", "positions", "attention_mask")


def _row_ways(mesh: Mesh, rules) -> int:
  """D: the devices a batch's rows split over (``'batch'``'s mesh axes)."""
  spec = shd.logical_to_mesh_spec(("batch",), rules)[0]
  names = (spec,) if isinstance(spec, str) else tuple(spec or ())
  return math.prod(mesh.shape[a] for a in names)


def apply_chunks(rows: int, max_rows: int, ways: int) -> int:
  """n, the forward calls of a batch of ``rows`` rows split over ``ways``
  devices, each call on about rows / n rows (a strided split, ``chunked``):

    w      = ways when it divides rows, else 1
    cap    = max(w, floor(max_rows / w) w)   (whole rows a device)
    fewest = ceil(rows / cap)
    n = min {n <= 2 fewest : n | rows / w, rows / n <= max_rows}
    else n = fewest, the rows padded (``chunked``: calls of
        ``chunk_rows`` <= cap rows)

  n dividing each device's rows keeps every call's rows on the devices
  that hold them (no data moves, no padding); a call holds at least one row
  a device, so at most max(max_rows, ways) rows. A divisor is taken only
  when it makes at most twice the fewest calls: 643 rows (a prime) in calls
  of <= 32 are 21 padded calls, not 643 calls of one row each (on this
  CPU the two cost about the same: an every-row WebShop step's log-prob
  passes took 48-55 s with 643 one-row calls and 58 s with 24 calls of 27;
  on an accelerator a one-row call leaves the device idle). The padded
  calls' rows are whole rows a device, so ``cap`` is max_rows rounded down
  to them: 148 rows over 4 devices (37 each) in calls of <= 30 are 6 calls
  of 28, not 5 of 32. ``max_rows`` 0 or >= rows: 1.
  """
  if not max_rows or rows <= max_rows:
    return 1
  w = ways if ways and rows % ways == 0 else 1
  fewest = -(-rows // max(w, max_rows // w * w))
  local = rows // w
  for n in range(1, min(local, 2 * fewest) + 1):
    if local % n == 0 and rows // n <= max_rows:
      return n
  return fewest


def chunk_rows(rows: int, n_chunks: int, ways: int) -> int:
  """Rows of each of ``chunked``'s calls: ceil(rows / n), rounded up to
  whole rows a device when the batch splits over its ``ways`` devices; when
  n x that exceeds rows, the batch is padded at its end with zero rows
  (their outputs dropped). ``apply_chunks``'s divisors need no padding."""
  per = -(-rows // n_chunks)
  if rows % ways == 0 and per % ways:
    per = -(-per // ways) * ways
  return per


def chunked(fn, n_chunks: int, mesh: Mesh, param_shardings, rules):
  """``fn(params, *arrays) -> [B, T]`` run as ``n_chunks`` calls inside one
  jitted function (``lax.map``: one chunk's activations live at a time):

    rows padded with zero rows to n_chunks x ``chunk_rows`` (when n_chunks
    does not divide B), then
    chunk i = rows {j * n_chunks + i}  (``train_step.split_micro``),
    out[j * n_chunks + i] = fn(params, *chunk i)[j],  out[:B] returned

  Row-wise ``fn`` (each row's output depends on that row only): equal to
  one call on all rows."""
  bs = shd.batch_sharding(mesh, rules, 2)
  ways = _row_ways(mesh, rules)
  # A train_step function's frozen state stays an argument (not a constant
  # of this program): ``train_step._frozen_arg``.
  inner = getattr(fn, "jitted", None)
  frozen = getattr(fn, "frozen", None)
  if inner is None:
    inner = lambda *args: fn(*args[:-1])

  def run(params, arrays, frozen):
    rows = arrays[0].shape[0]
    pad = n_chunks * chunk_rows(rows, n_chunks, ways) - rows
    if pad:
      arrays = tuple(
          jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in arrays
      )
    micro = ts.split_micro(arrays, n_chunks, pad=False)
    outs = jax.lax.map(lambda xs: inner(params, *xs, frozen), micro)
    outs = jnp.moveaxis(outs, 0, 1)  # [B' / n, n, T]
    return outs.reshape((-1,) + outs.shape[2:])[:rows]

  jitted = jax.jit(
      run, in_shardings=(param_shardings, bs, None), out_shardings=bs
  )
  call = lambda params, *arrays: jitted(params, tuple(arrays), frozen)
  call.lower = lambda params, *arrays: jitted.lower(
      params, tuple(arrays), frozen
  )
  return call


class Learner:
  """One trainable module: ``train(batch)`` and ``apply(batch)``.

  ``apply`` is log-probs [B, T] for a policy (``kind='policy'``) or values
  [B, T] for a critic (``kind='value'``).
  """

  def __init__(
      self,
      module: nnx.Module,
      tx: optax.GradientTransformation,
      loss_fn: ts.LossFn,
      *,
      mesh: Mesh,
      rules,
      kind: str = "policy",
      micro_batch_rows: int = 0,
      _state: Optional[ts.TrainState] = None,
      _compiled: Optional[tuple] = None,
  ):
    if kind not in ("policy", "value"):
      raise ValueError(f"unknown learner kind {kind!r}")
    self.kind, self.tx, self.loss_fn = kind, tx, loss_fn
    self.mesh, self.rules = mesh, rules
    self.micro_batch_rows = micro_batch_rows  # 0: the whole batch at once
    self.graphdef, params, self.frozen = ts.split_trainable(module)
    if _state is None:
      self.state, self.state_sh = ts.create_train_state(params, tx, mesh, rules)
    else:
      self.state = _state
      self.state_sh = jax.tree.map(lambda x: x.sharding, _state)
    # A windowed ``SummedLoss`` gets the response window.
    self._windowed = kind == "policy" and ts.accepts_window(loss_fn)
    self._copy_params = None  # frozen_params' jitted copy, made once
    if _compiled is not None:  # a copy shares its source's jitted functions
      self._applies, self._steps = _compiled
      return
    self._applies = {}  # one jitted forward per (window, chunks)
    self._steps = {}  # one jitted step per (micro-batch count, window)

  # ------------------------------------------------------------------ API
  @property
  def params(self):
    return self.state.params

  @property
  def step(self) -> int:
    return int(self.state.step)

  @property
  def row_ways(self) -> int:
    """The devices a batch's rows split over (its row count's divisor)."""
    return _row_ways(self.mesh, self.rules)

  def module(self) -> nnx.Module:
    return nnx.merge(self.graphdef, self.state.params, self.frozen)

  def _window(self, batch: Batch) -> int:
    return ts.response_window(batch.loss_mask) if self._windowed else 0

  def _apply_fn(self, window: int, n_chunks: int):
    key = (window, n_chunks)
    if key not in self._applies:
      kw = dict(
          mesh=self.mesh, param_shardings=self.state_sh.params, rules=self.rules
      )
      if self.kind == "policy":
        fn = ts.make_logprob_fn(self.graphdef, self.frozen, window=window, **kw)
      else:
        fn = ts.make_apply_fn(self.graphdef, self.frozen, **kw)
      if n_chunks > 1:
        fn = chunked(fn, n_chunks, self.mesh, self.state_sh.params, self.rules)
      self._applies[key] = fn
    return self._applies[key]

  def apply_chunks(self, rows: int) -> int:
    """Calls of the forward one ``apply`` of ``rows`` rows makes
    (``apply_chunks``, module function)."""
    return apply_chunks(rows, self.micro_batch_rows, self.row_ways)

  def apply(
      self, batch: Batch, params=None, *, host_rows: bool = False
  ) -> np.ndarray:
    """Forward in chunks of at most ``micro_batch_rows`` rows (all at once
    if 0; ``apply_chunks``), on this host's rows or on global arrays
    assembled from every host's (``distributed.host_local_to_global``).

    Policy: log-probs [B, T] (0 outside the response window, see the module
    docstring); value: values [B, T]. Every host gets all B rows, or with
    ``host_rows`` only the rows it fed, in the order it fed them
    (``distributed.host_local_rows``; no all-gather).
    """
    params = self.state.params if params is None else params
    keys = _INPUTS + (("loss_mask",) if self.kind == "policy" else ())
    arrays = [getattr(batch, k) for k in keys]
    n_chunks = self.apply_chunks(len(arrays[0]))
    out = self._apply_fn(self._window(batch), n_chunks)(params, *arrays)
    if host_rows:
      return distributed.host_local_rows(out)
    return distributed.global_to_host(out)

  def n_micro(self, rows: int) -> int:
    """Micro-batches of at most ``micro_batch_rows`` rows: ceil(rows / m)
    (the step pads the last rows with zero-mask rows), 1 when m = 0 or
    m >= rows. A loss not summed over micro-batches (no whole-batch totals,
    ``train_step.summed_over_micro_batches``) keeps equal micro-batches:
    rows / m when m divides rows, else 1."""
    m = self.micro_batch_rows
    if not m or rows <= m:
      return 1
    if ts.batch_totals_of(self.loss_fn) is not None:
      return -(-rows // m)
    return rows // m if rows % m == 0 else 1

  def train(self, batch: Batch, rng: jax.Array) -> dict:
    n_micro = self.n_micro(len(batch.tokens))
    window = self._window(batch)
    key = (n_micro, window)
    if key not in self._steps:
      self._steps[key] = ts.make_train_step(
          self.graphdef,
          self.frozen,
          self.loss_fn,
          self.tx,
          mesh=self.mesh,
          state_shardings=self.state_sh,
          batch_sharding_tree=ts.batch_shardings(self.mesh, batch, self.rules),
          n_micro=n_micro,
          window=window,
      )
    self.state, metrics = self._steps[key](self.state, batch, rng)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  def copy(
      self,
      *,
      copy_opt_state: bool = True,
      tx: Optional[optax.GradientTransformation] = None,
      steps: Optional[dict] = None,
  ) -> "Learner":
    """A new learner with copied parameters (same shardings); the optimizer
    state is copied or freshly initialised. ``tx``: the copy's own
    optimizer (its state must have this one's structure, e.g. AdamW at
    another learning rate); its jitted steps go into ``steps`` (pass the
    same dict to every copy with that ``tx`` to compile them once). The
    forward passes are always shared."""
    copy = lambda t: jax.tree.map(jnp.copy, t)
    own_tx = tx is not None and tx is not self.tx
    tx = tx if own_tx else self.tx
    params = jax.jit(copy, out_shardings=self.state_sh.params)(
        self.state.params
    )
    if copy_opt_state:
      if own_tx and (
          jax.tree.structure(jax.eval_shape(tx.init, params))
          != jax.tree.structure(self.state.opt_state)
      ):
        raise ValueError(
            "the copy's optimizer keeps a state of another shape than this"
            " learner's, so it cannot copy this one's (rspo.b_warmup_steps"
            " with rspo.copy_optimizer_state: drop one of them)"
        )
      opt = jax.jit(copy, out_shardings=self.state_sh.opt_state)(
          self.state.opt_state
      )
      step = self.state.step + 0
    else:
      opt_sh = self.state_sh.opt_state
      if own_tx:  # e.g. a warm-up schedule adds a state of its own
        opt_sh = ts.opt_state_shardings(
            tx, params, self.state_sh.params, self.mesh
        )
      opt = jax.jit(tx.init, out_shardings=opt_sh)(params)
      step = jnp.zeros_like(self.state.step)
    state = ts.TrainState(step=step, params=params, opt_state=opt)
    return Learner(
        self.module_like(),
        tx,
        self.loss_fn,
        mesh=self.mesh,
        rules=self.rules,
        kind=self.kind,
        micro_batch_rows=self.micro_batch_rows,
        _state=state,
        # B reuses A's jits (its own steps with its own optimizer)
        _compiled=(
            self._applies,
            ({} if steps is None else steps) if own_tx else self._steps,
        ),
    )

  def module_like(self) -> nnx.Module:
    """The module structure (parameters are those of this learner)."""
    return nnx.merge(self.graphdef, self.state.params, self.frozen)

  def frozen_params(self):
    """A copy of the current parameters that later training cannot touch
    (training donates its buffers), e.g. for pi_ref or, every A step
    under ``rollout.overlap``, the weights its next collection plays."""
    if self._copy_params is None:
      self._copy_params = jax.jit(
          lambda t: jax.tree.map(jnp.copy, t),
          out_shardings=self.state_sh.params,
      )
    return self._copy_params(self.state.params)
