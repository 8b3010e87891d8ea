"""Jitted, sharded train steps: one generic factory, one loss per role.

Every role (policy A or B, PPO critic, PRM head, SFT warm start) is an NNX
module split into ``graphdef`` (static) and ``params`` (an ``nnx.State``).
A step is the pure function

    step(state: TrainState, batch, rng) -> (TrainState, metrics)

jitted with ``in_shardings``/``out_shardings`` over the mesh and the state
donated. Non-finite loss or gradients skip the update (state unchanged,
``metrics['skipped'] = 1``); the caller counts consecutive skips.

Micro-batching: the batch's rows are padded with all-zero rows (zero loss
mask) to a multiple of ``n_micro`` and split strided, micro-batch i = rows
i, i + n, i + 2n, ... (so the row axis sharded over devices stays spread
over them), and scanned (``lax.scan``). A loss marked with
``summed_over_micro_batches`` (every loss below) is normalised by whole-batch
totals -- token and row counts of the full, global batch, computed once in
the step before the scan -- and its micro-batch values are *summed*: the
update's loss, gradient and metrics are those of the whole batch, whatever
``n_micro``, the row order or the padding. Any other loss is averaged over
micro-batches (its mean of micro-batch losses). A summed loss on a mesh
with a 'data' axis runs its loop per data shard, on the shard's own rows,
and reduces the gradient over 'data' once after it (``_data_local``).

Response window: policy losses and log-prob passes only need log pi at the
tokens a row's ``loss_mask`` counts, the response at the end of the row. With
``window = R > 0`` (a static size, ``response_window(loss_mask)``) the last
block's queries and MLP, the final norm, the LM head, the log-softmax and the
entropy run on R positions per row, ``[s_b, s_b + R)``
(``windows.window_starts``), instead of all T; per-token outputs are 0
outside the window. Values on the counted tokens, the loss and its gradient
are those of the full computation. A policy loss marked ``windowed`` gets
``window=R`` from the Learner.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rspo_jax import batching
from rspo_jax import losses
from rspo_jax import sharding as shd
from rspo_jax.models import lora
from rspo_jax.models import transformer as tfm
from rspo_jax.models import windows

# loss_fn(model, batch, rng[, window=R][, totals=T]) -> (loss, metrics)
LossFn = Callable[..., tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class SummedLoss:
  """A loss whose micro-batch values sum to the batch's.

  ``batch_totals(batch) -> {name: scalar}`` gives the whole batch's
  normalisers (token counts ...); the step calls it once on the full batch
  and passes the result as ``fn(..., totals=...)`` to every micro-batch.
  ``fn`` then returns the micro-batch's contribution (a sum over its rows
  divided by the totals); with ``totals=None`` it takes the batch's own,
  i.e. returns the batch's loss. The step reports the totals among the
  metrics. ``windowed``: ``fn`` takes ``window=R`` (module docstring).
  Called like ``fn``; any other callable is a plain (averaged) loss.
  """

  fn: LossFn
  batch_totals: Callable[[Any], dict]
  windowed: bool = False

  def __call__(self, model, batch, rng, **kw):
    return self.fn(model, batch, rng, **kw)


def summed_over_micro_batches(
    batch_totals: Callable[[Any], dict], *, windowed: bool = False
):
  """Decorator: ``fn`` -> ``SummedLoss(fn, batch_totals, windowed)``."""
  return lambda fn: SummedLoss(fn, batch_totals, windowed)


def batch_totals_of(loss_fn: LossFn) -> Optional[Callable[[Any], dict]]:
  """The ``batch_totals`` function of a summed loss, else None."""
  return loss_fn.batch_totals if isinstance(loss_fn, SummedLoss) else None


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any  # nnx.State of the trainable variables
  opt_state: Any


# Knobs of the mixed RSPO objective, named as the config names them.
PolicyLossConfig = losses.LossConfig


MAX_SUFFIX = "_max"


def is_max_metric(name: str) -> bool:
  """A metric named ``*_max`` is a maximum over tokens: micro-batches and
  a step's updates combine it by max, every other metric by sum / mean."""
  return name.endswith(MAX_SUFFIX)


def combine_micro(acc, out):
  """(loss, metrics, grads) of two micro-batches: sums, except the
  ``*_max`` metrics (their max)."""
  (loss_a, met_a, g_a), (loss_o, met_o, g_o) = acc, out
  met = {
      k: (jnp.maximum if is_max_metric(k) else jnp.add)(v, met_o[k])
      for k, v in met_a.items()
  }
  return loss_a + loss_o, met, jax.tree.map(jnp.add, g_a, g_o)


def make_optimizer(
    lr: float,
    *,
    grad_clip: float = 1.0,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    adapter_lr_multiplier: float = 1.0,
) -> optax.GradientTransformation:
  """AdamW after global-norm clipping; optional linear warm-up. LoRA
  adapters (``nnx.LoRAParam``) train at lr x ``adapter_lr_multiplier``
  (``lora.lr_multiplier``), every other parameter at lr."""
  schedule = (
      optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else lr
  )
  parts = [optax.adamw(schedule, weight_decay=weight_decay)]
  if grad_clip and grad_clip > 0:
    parts.insert(0, optax.clip_by_global_norm(grad_clip))
  tx = optax.chain(*parts)
  if adapter_lr_multiplier != 1.0:
    tx = scale_adapter_updates(tx, adapter_lr_multiplier)
  return tx


def scale_adapter_updates(
    tx: optax.GradientTransformation, multiplier: float
) -> optax.GradientTransformation:
  """``tx`` with its updates of ``nnx.LoRAParam`` leaves times
  ``multiplier``. For AdamW, whose update is

      u = -lr (m_hat / (sqrt(v_hat) + eps) + wd p),

  that is AdamW at lr x multiplier on the adapters (the schedule's
  warm-up and the decoupled weight decay scale with it); the gradient
  clipping before it sees the raw gradients. The optimizer state is
  ``tx``'s own, so checkpoints and B's copies keep their structure."""

  def update(updates, state, params=None):
    updates, state = tx.update(updates, state, params)
    scaled = jax.tree.map(
        lambda u: (
            jax.tree.map(lambda x: x * multiplier, u)
            if isinstance(u, nnx.LoRAParam)
            else u
        ),
        updates,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    return scaled, state

  return optax.GradientTransformation(tx.init, update)


# --------------------------------------------------------------------------
# State creation and shardings
# --------------------------------------------------------------------------


def split_trainable(module: nnx.Module, wrt=lora.TRAINABLE):
  """(graphdef, trainable params, everything else) of an NNX module: every
  ``nnx.Param`` but a LoRA model's frozen base (``lora.FrozenParam``, which
  goes with the rest)."""
  return nnx.split(module, wrt, ...)


def _frozen_arg(fn, frozen):
  """``fn(*args, frozen)`` (jitted) called as ``fn(*args)``, ``.lower``
  too: the frozen state is an argument of the program (sharded as its
  arrays lie), not a constant baked into it -- a LoRA model's base
  weights, the whole model in size."""
  call = lambda *args: fn(*args, frozen)
  call.lower = lambda *args: fn.lower(*args, frozen)
  call.jitted, call.frozen = fn, frozen
  return call


def _on_mesh(mesh: Mesh, tree, shardings=None):
  """Any leaf without a NamedSharding (e.g. optax's scalar count) is
  replicated on the mesh."""

  def fix(x, s=None):
    if s is None or not isinstance(s, NamedSharding):
      s = shd.replicated(mesh)
    return s

  if shardings is None:
    return jax.tree.map(lambda x: fix(x, getattr(x, "sharding", None)), tree)
  return jax.tree.map(fix, tree, shardings)


def create_train_state(
    params, tx: optax.GradientTransformation, mesh: Mesh, rules
) -> tuple[TrainState, Any]:
  """Places ``params`` with their logical shardings and builds the optimizer
  state sharded like them. Returns (state, state_shardings)."""
  param_sh = shd.state_shardings(mesh, params, rules)
  params = jax.device_put(params, param_sh)
  opt_sh = opt_state_shardings(tx, params, param_sh, mesh)
  opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
  state = TrainState(
      step=jax.device_put(jnp.zeros((), jnp.int32), shd.replicated(mesh)),
      params=params,
      opt_state=opt_state,
  )
  state_sh = TrainState(
      step=shd.replicated(mesh), params=param_sh, opt_state=opt_sh
  )
  return state, state_sh


def opt_state_shardings(
    tx: optax.GradientTransformation, params, param_sh, mesh: Mesh
):
  """Shardings of ``tx``'s state for ``params``: moments mirror the
  params' shardings (``param_sh``); scalars are replicated."""
  abstract_opt = jax.eval_shape(tx.init, params)
  opt_sh = optax.tree_map_params(
      tx,
      lambda _, s: s,
      abstract_opt,
      param_sh,
      transform_non_params=lambda _: shd.replicated(mesh),
  )
  return _on_mesh(mesh, opt_sh, opt_sh)


def batch_shardings(mesh: Mesh, batch, rules):
  """Leading axis on ('data', 'fsdp'), the rest replicated."""
  return jax.tree.map(
      lambda x: shd.batch_sharding(mesh, rules, max(jnp.ndim(x), 1))
      if jnp.ndim(x) >= 2
      else shd.named_sharding(mesh, ("batch",), rules),
      batch,
  )


# --------------------------------------------------------------------------
# The generic step
# --------------------------------------------------------------------------


def split_micro(batch, n_micro: int, *, pad: bool = True):
  """Leaves [B, ...] -> [n_micro, ceil(B / n_micro), ...], strided:

    micro[i, j] = row j * n_micro + i

  the rows padded at the end with zeros (a zero loss mask: rows that count
  nothing) up to a multiple of ``n_micro`` when ``pad``, else B must divide.
  """

  def one(x):
    rows = x.shape[0]
    extra = -rows % n_micro
    if extra and not pad:
      raise ValueError(
          f"batch of {rows} rows does not split into {n_micro}" " micro-batches"
      )
    if extra:
      x = jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1))
    x = x.reshape(((rows + extra) // n_micro, n_micro) + x.shape[1:])
    return jnp.moveaxis(x, 1, 0)

  return jax.tree.map(one, batch)


def _data_local(micro_batches, mesh: Mesh, batch_sharding_tree):
  """``micro_batches(params, frozen, batch, rng, totals)`` run by each
  'data' shard on its own rows (``jax.shard_map``, manual over 'data'
  only: 'fsdp' and 'tensor' stay with the partitioner), its gradients
  accumulated there, then reduced once:

    grads = psum_data(sum_i grads(micro-batch i of the shard's rows))

  Partitioned as one program, the gradient's partial sum over the rows
  was all-reduced over ('data', 'fsdp') inside the loop, once per
  micro-batch and tensor -- across nodes on a (nodes, gpus, 1) mesh.
  Here only the 'fsdp' part is (within a node); the 'data' all-reduce is
  one per tensor per update, in float32. Loss and metrics are sums over
  rows, normalised by the whole batch's totals (computed before, on every
  device), so they add up over shards as over micro-batches: psum (pmax
  for ``*_max``). Each shard draws its own randomness (its index folded
  into ``rng``).

  Unchecked (``check_vma=False``): the body's values are per-shard values
  without replication types, so the gradient of the (replicated) params
  stays the shard's own until the psum -- typed, autodiff would psum it at
  every micro-batch -- and the splash kernel's own nested shard_map and
  the model's custom VJPs need no type casts.
  """
  P = jax.sharding.PartitionSpec
  rows = jax.tree.map(lambda _: P("data"), batch_sharding_tree)

  def local(params, frozen, batch, rng, totals):
    rng = jax.random.fold_in(rng, jax.lax.axis_index("data"))
    loss, metrics, grads = micro_batches(params, frozen, batch, rng, totals)
    reduce = lambda k: jax.lax.pmax if is_max_metric(k) else jax.lax.psum
    metrics = {k: reduce(k)(v, "data") for k, v in metrics.items()}
    return (jax.lax.psum(loss, "data"), metrics, jax.lax.psum(grads, "data"))

  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(P(), P(), rows, P(), P()),
      out_specs=P(),
      axis_names={"data"},
      check_vma=False,
  )


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def make_train_step(
    graphdef,
    frozen,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    *,
    mesh: Mesh,
    state_shardings: TrainState,
    batch_sharding_tree,
    n_micro: int = 1,
    donate: bool = True,
    window: int = 0,
):
  """Returns jitted ``step(state, batch, rng) -> (state, metrics)``.

  ``frozen`` is the non-trainable part of the module state (e.g. RNG
  counters, a LoRA model's frozen base): an argument of the jitted program
  placed as its arrays lie (``_frozen_arg``), never differentiated.
  ``window > 0`` is passed to ``loss_fn`` as ``window=`` (module docstring).
  A summed loss in several micro-batches on a mesh with a 'data' axis runs
  its loop data-locally (``_data_local``).
  """
  kw = {"window": window} if window else {}
  totals_fn = batch_totals_of(loss_fn)

  def grads_of(params, frozen, batch, rng, totals):
    extra = {} if totals is None else {"totals": totals}

    def f(p):
      model = nnx.merge(graphdef, p, frozen)
      return loss_fn(model, batch, rng, **kw, **extra)

    (loss, metrics), grads = jax.value_and_grad(f, has_aux=True)(params)
    return loss, metrics, grads

  def micro_batches(params, frozen, batch, rng, totals):
    """(loss, metrics, grads) of ``batch`` in ``n_micro`` micro-batches."""
    if n_micro == 1:
      return grads_of(params, frozen, batch, rng, totals)
    micro = split_micro(batch, n_micro, pad=totals is not None)

    def body(acc, xs):
      mb, i = xs
      out = grads_of(params, frozen, mb, jax.random.fold_in(rng, i), totals)
      return combine_micro(acc, out), None

    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(
        jnp.zeros_like,
        jax.eval_shape(grads_of, params, frozen, first, rng, totals),
    )
    (loss, metrics, grads), _ = jax.lax.scan(
        body, zeros, (micro, jnp.arange(n_micro))
    )
    if totals is None:  # a loss without totals: mean of micro-batches
      loss, grads = jax.tree.map(lambda x: x / n_micro, (loss, grads))
      metrics = {
          k: v if is_max_metric(k) else v / n_micro for k, v in metrics.items()
      }
    return loss, metrics, grads

  data_local = (
      totals_fn is not None and n_micro > 1 and mesh.shape.get("data", 1) > 1
  )
  if data_local:
    micro_batches = _data_local(micro_batches, mesh, batch_sharding_tree)

  def step(state: TrainState, batch, rng, frozen):
    rng = jax.random.fold_in(rng, state.step)
    # Whole-batch normalisers: sums over the global batch (every device).
    totals = None if totals_fn is None else totals_fn(batch)
    loss, metrics, grads = micro_batches(
        state.params, frozen, batch, rng, totals
    )
    metrics = dict(metrics)
    if totals is not None:
      metrics.update(totals)
    finite = jnp.logical_and(jnp.isfinite(loss), _all_finite(grads))
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(
        lambda n, o: jnp.where(finite, n, o), new, old
    )
    new_state = TrainState(
        step=state.step + finite.astype(jnp.int32),
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
    )
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.global_norm(grads)
    metrics["skipped"] = 1.0 - finite.astype(jnp.float32)
    return new_state, metrics

  return _frozen_arg(
      jax.jit(
          step,
          in_shardings=(
              state_shardings,
              batch_sharding_tree,
              shd.replicated(mesh),
              None,
          ),  # frozen: as its arrays lie
          out_shardings=(state_shardings, shd.replicated(mesh)),
          donate_argnums=(0,) if donate else (),
      ),
      frozen,
  )


# --------------------------------------------------------------------------
# Losses of each role
# --------------------------------------------------------------------------


def accepts_window(loss_fn: LossFn) -> bool:
  """Whether ``loss_fn`` takes the ``window`` keyword (a windowed
  ``SummedLoss``)."""
  return isinstance(loss_fn, SummedLoss) and loss_fn.windowed


def _max_span(mask, xp):
  """max over rows of (last - first counted position + 1); 0 if none."""
  t = mask.shape[1]
  idx = xp.arange(t)
  first = xp.min(xp.where(mask, idx, t), axis=1)
  last = xp.max(xp.where(mask, idx, -1), axis=1)
  return xp.max(xp.where(mask.any(axis=1), last - first + 1, 0))


_global_max_span = jax.jit(lambda m: _max_span(m > 0, jnp))


def response_window(loss_mask, minimum: int = 16) -> int:
  """Static window size R for ``loss_mask`` [B, T].

    span_b = last - first counted position of row b, + 1
    R      = length_bucket(max_b span_b, minimum)   (16, 24, 32, 48, 64 ...)

  0 (no window: compute every position) when R >= T - 1 or nothing counts.
  Bucketing keeps the number of compiled shapes small. Host numpy for local
  arrays; a multi-host global array is reduced on the devices, so every
  process gets the same R (the same compiled program).
  """
  t = loss_mask.shape[1]
  if isinstance(loss_mask, jax.Array) and not loss_mask.is_fully_addressable:
    span = int(_global_max_span(loss_mask))
  else:
    span = int(_max_span(np.asarray(loss_mask) > 0, np))
  if span <= 0:
    return 0
  r = batching.length_bucket(span, minimum)
  return r if r < t - 1 else 0


def policy_forward(
    model,
    tokens,
    positions,
    attention_mask,
    loss_mask,
    *,
    window: int = 0,
    entropy: bool = False,
    by_gather: bool = False,
):
  """(logp [B, T], entropy [B, T] or None) of the tokens under ``model``.

    logp[b, t]    = log pi(tokens[b, t] | tokens[b, :t])
    entropy[b, t] = H(pi(. | tokens[b, :t]))     (0 at t = 0)

  ``window = 0``: every position (``logp[:, 0] = 0``). ``window = R``: the
  last block, LM head and log-softmax on rows' windows ``[s_b, s_b + R)``
  only (module docstring); hidden state ``t - 1`` predicts token ``t``; 0
  outside. ``by_gather``: forward-only (``tfm.target_logprobs``).
  """
  if not window:
    logits, _, _ = model(tokens, positions, attention_mask)
    ent = None
    if entropy:  # aligned like logp: H of the distribution that drew token t
      ent = losses.entropy_from_logits(logits[:, :-1])
      ent = jnp.concatenate([jnp.zeros_like(ent[:, :1]), ent], axis=1)
    return tfm.token_logprobs(logits, tokens, by_gather=by_gather), ent
  t = tokens.shape[1]
  starts = windows.window_starts(loss_mask, window)
  _, hidden, _ = model(  # hidden [B, R, D] of positions starts - 1 + i
      tokens,
      positions,
      attention_mask,
      return_logits=False,
      window=(starts - 1, window),
  )
  logits = model.logits(hidden)
  logp = tfm.target_logprobs(
      logits, windows.take_window(tokens, starts, window), by_gather=by_gather
  )
  ent = None
  if entropy:
    ent = windows.put_window(losses.entropy_from_logits(logits), starts, t)
  return windows.put_window(logp, starts, t), ent


def _batch_logp(model, batch, window, entropy=False):
  return policy_forward(
      model,
      batch.tokens,
      batch.positions,
      batch.attention_mask,
      batch.loss_mask,
      window=window,
      entropy=entropy,
  )


def make_policy_loss(cfg: PolicyLossConfig) -> LossFn:
  """The mixed RSPO objective on a ``types.Batch`` (see losses.py), summed
  over micro-batches with whole-batch totals (``losses.mixed_totals``)."""

  def batch_totals(batch):
    return losses.mixed_totals(
        batch.loss_mask, batch.is_offpolicy, alpha=cfg.alpha
    )

  @summed_over_micro_batches(batch_totals, windowed=True)
  def loss_fn(model, batch, rng, window: int = 0, totals=None):
    del rng
    logp, entropy = _batch_logp(
        model, batch, window, entropy=bool(cfg.entropy_coef)
    )
    return losses.mixed_objective(
        logp,
        batch.old_logp,
        batch.behavior_logp,
        batch.ref_logp,
        batch.advantages,
        batch.loss_mask,
        batch.is_offpolicy,
        entropy,
        cfg,
        totals,
    )

  return loss_fn


def _mean_nll(logp, mask, total=None):
  """-sum(logp * mask) / max(N, 1), N = sum(mask) unless given."""
  return -losses.aggregate(logp, mask, "token_mean", total)


def _prompt_mask(batch):
  """Real tokens outside the loss mask, less each row's first token."""
  mask = jnp.asarray(batch.attention_mask, jnp.float32)
  mask = mask * (1.0 - jnp.asarray(batch.loss_mask, jnp.float32))
  return mask.at[:, 0].set(0.0)


def _sft_totals(batch):
  return {"n_tokens": jnp.sum(jnp.asarray(batch.loss_mask, jnp.float32))}


@summed_over_micro_batches(_sft_totals, windowed=True)
def sft_loss(model, batch, rng, window: int = 0, totals=None):
  """Behaviour cloning: -mean log pi(response tokens), the mean over the
  whole batch's response tokens (``totals['n_tokens']``)."""
  del rng
  logp, _ = _batch_logp(model, batch, window)
  total = None if totals is None else totals["n_tokens"]
  nll = _mean_nll(logp, batch.loss_mask, total)
  return nll, {"nll": nll}


def _sft_prompt_totals(batch):
  return dict(_sft_totals(batch), n_prompt_tokens=jnp.sum(_prompt_mask(batch)))


def make_sft_loss(prompt_weight: float = 0.0) -> LossFn:
  """Behaviour cloning, optionally with a language-model term on prompts:

      loss = nll_response + prompt_weight * nll_prompt,
      nll_x = -mean_{t in x} log pi(token_t | tokens_<t),

  prompt positions being the real tokens outside the loss mask except each
  row's first (nothing predicts it); means over the whole batch's tokens.
  The prompt term (pretraining-style) teaches a from-scratch policy to read
  its context -- WebShop prompts repeat titles, option values and product
  ids between the page and the action list -- far sooner than the few
  response tokens alone.
  ``prompt_weight=0`` is ``sft_loss`` (windowed to the responses).
  """
  if prompt_weight < 0:
    raise ValueError(f"prompt_weight must be >= 0, got {prompt_weight}")
  if prompt_weight == 0:
    return sft_loss

  @summed_over_micro_batches(_sft_prompt_totals)
  def loss_fn(model, batch, rng, totals=None):
    del rng
    if totals is None:
      totals = _sft_prompt_totals(batch)
    logp, _ = _batch_logp(model, batch, 0)
    nll = _mean_nll(logp, batch.loss_mask, totals["n_tokens"])
    prompt_nll = _mean_nll(logp, _prompt_mask(batch), totals["n_prompt_tokens"])
    loss = nll + prompt_weight * prompt_nll
    return loss, {"nll": nll, "prompt_nll": prompt_nll}

  return loss_fn


def make_value_loss(clip_eps: float, agg: str = "token_mean") -> LossFn:
  """PPO critic: clipped value regression on response tokens, normalised
  by the whole batch's counts (``losses.mask_totals``)."""

  @summed_over_micro_batches(lambda batch: losses.mask_totals(batch.loss_mask))
  def loss_fn(model, batch, rng, totals=None):
    del rng
    values = model(batch.tokens, batch.positions, batch.attention_mask)
    return losses.value_loss(
        values,
        batch.old_values,
        batch.returns,
        batch.loss_mask,
        clip_eps=clip_eps,
        agg=agg,
        totals=totals,
    )

  return loss_fn


# --------------------------------------------------------------------------
# Jitted inference helpers (pi_old, pi_ref log-probs; critic values)
# --------------------------------------------------------------------------


def make_logprob_fn(
    graphdef, frozen, *, mesh: Mesh, param_shardings, rules, window: int = 0
):
  """Jitted ``(params, tokens, positions, attention_mask, loss_mask) ->
  logp [B,T]``; with ``window > 0`` only on each row's response window
  (0 elsewhere, see ``policy_forward``)."""
  bs = shd.batch_sharding(mesh, rules, 2)

  def fn(params, tokens, positions, attention_mask, loss_mask, frozen):
    model = nnx.merge(graphdef, params, frozen)
    logp, _ = policy_forward(  # forward only: pick by gather
        model,
        tokens,
        positions,
        attention_mask,
        loss_mask,
        window=window,
        by_gather=True,
    )
    return logp

  return _frozen_arg(
      jax.jit(
          fn,
          in_shardings=(param_shardings, bs, bs, bs, bs, None),
          out_shardings=bs,
      ),
      frozen,
  )


def make_apply_fn(graphdef, frozen, *, mesh: Mesh, param_shardings, rules):
  """Jitted ``(params, tokens, positions, attention_mask) -> model output``
  for value / reward heads that return [B, T]."""
  bs = shd.batch_sharding(mesh, rules, 2)

  def fn(params, tokens, positions, attention_mask, frozen):
    model = nnx.merge(graphdef, params, frozen)
    return model(tokens, positions, attention_mask)

  return _frozen_arg(
      jax.jit(
          fn, in_shardings=(param_shardings, bs, bs, bs, None), out_shardings=bs
      ),
      frozen,
  )
