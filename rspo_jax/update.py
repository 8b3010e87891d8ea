"""One training step of a policy (A or B): credit, rows, optimizer updates.

``StepUpdater.step(learner, critic, on, off, source, step_key, ...)``:

  1. credit   r_t of ``source`` on every row; advantages of the fresh rows
              against their groups (GRPO / GiGPO) or by GAE with the
              critic's values before each response token (PPO, one
              advantage per token, replayed rows included); replayed rows
              of GRPO / GiGPO keep the advantages they were given
              (``off_adv``: against their whole B group, replay/replayed.py);
  2. rows     DAPO's dynamic sampling (``train.drop_zero_advantage_rows``)
              and the CPU row cap (``train.max_train_rows``);
  3. updates  pi_old and pi_ref of every row once, from the parameters at
              the step's start (pi_old of fresh rows: their sampling
              log-probs when ``sampled_old``, below); the rows shuffled
              once, stratified by
              source, into mini-batches (``train.updates_per_step`` of
              them, or ceil(n / m) of about m = ``train.mini_batch_rows``
              rows, verl's ``ppo_mini_batch_size``, or one of every row);
              then
              E = ``train.ppo_epochs`` passes over them, one optimizer
              update per mini-batch. Replayed rows keep their stored
              log pi_B as behaviour log-probs: their clip window is centred
              on c = pi_old / pi_B; fresh rows have behaviour = pi_old,
              or (``stale_on``: collected by the weights before the last
              update, ``rollout.overlap``) their recorded log-probs, so
              their window is centred on pi_old / pi_behaviour.
  Metrics: B's distance from A on the replayed tokens at the step's start
  (``replay_divergence``: with g = log pi_B - log pi_old per token,
  ``replay_logp_b_minus_old`` its mean, ``_max`` its max, ``_median`` its
  median, ``replay_kl_b_old_k3`` the mean of c - 1 - log c, c = pi_old /
  pi_B = exp(-g), an estimate of KL(pi_B || pi_old) a token from B's
  samples; ``replay_log_c_big_frac``: share with |log c| > 0.2), the
  share of fresh rows with a non-zero advantage and their mean
  |advantage| (before dropping or capping: the signal the groups carry),
  each learner metric's mean over the step's updates, and
  ``last_<k>`` for the clip fractions (``clip_frac*``) of the last update,
  where the window has had the most updates to bind; with ``stale_on``,
  ``overlap_logp_gap_on``: mean |log pi_old - log pi_behaviour| on the
  fresh tokens at the step's start (how stale they are).

pi_old of fresh rows from sampling (``sampled_old``; the trainer passes
it for the in-process engine, ``algo.recompute_old_logprobs=False``, rows
not stale): their behaviour log-probs are pi_old's own -- the engine
sampled them with the learner's weights of the step's start (synced just
before the collection) and records log softmax(logits)[token] of the
temperature-1 distribution in float32 (``sampling.token_logprob``,
whatever ``rollout.temperature``), the distribution pi_old is -- so the
learner's pi_old pass runs only on the rows that need it (AReaL's
``recompute_logprob=False``):

  recomputed = replayed rows (their pi_old is A's over B's tokens)
               + rows cut to the learner's length (``max_len``: the engine
                 saw the prompt the learner loses)
               + rows whose log-probs do not cover their response
  fresh rest: old_logp = behavior_logp on the response tokens

The two differ by the engine's numerics only (its KV-cache attention and
the learner's path; the same weights in the same dtype,
``inference_dtype``). Logged: ``old_logp_recomputed_frac``, the share of
rows whose pi_old the learner computed.

``recompute_behavior_logp(learner, records)``: log pi of every record's
response tokens by ``learner`` (B's learner after its collection) replaces
the engine's, so c carries no engine/learner numeric gap; returns the
largest |engine - learner| gap.

Multi-host: every host calls these together with its own records (whole
fresh groups; its share of the replayed trajectories); row and update
counts are agreed with cross-host sums and maxima.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import jax
import numpy as np

from rspo_jax import batching, credit, distributed, host_batches, timing
from rspo_jax import train_step as ts
from rspo_jax.learner import Learner
from rspo_jax.losses import LOG_RATIO_CLAMP
from rspo_jax.replay import replayed

LOGP_CHUNK_ROWS = 256  # rows per host and forward in recompute_behavior_logp


@dataclasses.dataclass
class Rows:
  """The rows of one step, with their credit."""

  records: list
  off: np.ndarray  # bool: replayed
  adv: np.ndarray  # per row (PPO: the mean of its tokens')
  returns: Optional[np.ndarray]  # PPO value targets, per row
  values: Optional[list] = None  # PPO: per row, V before each token
  token_adv: Optional[list] = None  # PPO: per row, one per response token

  def subset(self, keep: np.ndarray) -> "Rows":
    take = lambda a: None if a is None else a[keep]
    pick = lambda a: None if a is None else [a[i] for i in keep]
    return Rows(
        [self.records[i] for i in keep],
        self.off[keep],
        self.adv[keep],
        take(self.returns),
        pick(self.values),
        pick(self.token_adv),
    )

  def abs_adv(self) -> np.ndarray:
    """|A| of each row (PPO: the mean of its tokens' |A|)."""
    if self.token_adv is None:
      return np.abs(self.adv)
    return np.array(
        [np.abs(a).mean() if a.size else 0.0 for a in self.token_adv],
        np.float32,
    )

  def adv_of(self, idx: np.ndarray):
    """What a batch of rows ``idx`` carries on its tokens."""
    if self.token_adv is None:
      return self.adv[idx]
    return [self.token_adv[i] for i in idx]


# |log c| = |log pi_old - log pi_B| above which a replayed token counts as
# far from B in replay_log_c_big_frac (c outside [0.82, 1.22]).
LOG_C_BIG = 0.2


def _stale_gap_sums(batch) -> np.ndarray:
  """[fresh response tokens, sum of |log pi_old - log pi_behaviour| over
  them] of a batch with pi_old filled in."""
  mask = (np.asarray(batch.loss_mask) > 0) & ~np.asarray(
      batch.is_offpolicy, bool
  )[:, None]
  gap = np.abs(np.asarray(batch.old_logp) - np.asarray(batch.behavior_logp))
  return np.array([mask.sum(), gap[mask].sum()], np.float64)


def _behavior_gaps(batch) -> np.ndarray:
  """log pi_B - log pi_old on the replayed response tokens of a batch with
  pi_old filled in (float64, row-major): how far B's tokens are from A at
  the step's start (c = pi_old / pi_B is the centre of their clip
  window)."""
  mask = (np.asarray(batch.loss_mask) > 0) & np.asarray(
      batch.is_offpolicy, bool
  )[:, None]
  gap = np.asarray(batch.behavior_logp, np.float64) - np.asarray(
      batch.old_logp, np.float64
  )
  return gap[mask]


def replay_divergence(gaps: np.ndarray) -> dict:
  """B's distance from A over replayed tokens, g = log pi_B - log pi_old:

    replay_logp_b_minus_old          mean_t g_t   (k1 of KL(pi_B || pi_old))
    replay_logp_b_minus_old_max      max_t g_t
    replay_logp_b_minus_old_median   median_t g_t
    replay_kl_b_old_k3               mean_t (c_t - 1 - log c_t),
                                     c_t = exp(-g_t), g clamped to +-20
    replay_log_c_big_frac            share of tokens with |g_t| > LOG_C_BIG

  The tokens are pi_B's samples, so k1 and k3 are unbiased estimates of
  KL(pi_B || pi_old) per token; k3 is never negative. {} without tokens.
  The _max is a maximum over tokens, not a mean (train_step.is_max_metric
  names such metrics; this one is computed once a step, on the host)."""
  g = np.asarray(gaps, np.float64).ravel()
  if not g.size:
    return {}
  log_c = -np.clip(g, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return {
      "replay_logp_b_minus_old": float(g.mean()),
      "replay_logp_b_minus_old_max": float(g.max()),
      "replay_logp_b_minus_old_median": float(np.median(g)),
      "replay_kl_b_old_k3": float(np.mean(np.exp(log_c) - 1.0 - log_c)),
      "replay_log_c_big_frac": float(np.mean(np.abs(g) > LOG_C_BIG)),
  }


# |advantage| above which a fresh row counts as carrying signal in the
# metric adv_nonzero_frac_on (a tied group's rows are 0 up to rounding).
ADV_EPS = 1e-6


class StepUpdater:
  """The update machinery of one run (module docstring)."""

  def __init__(
      self,
      cfg,
      batches: host_batches.HostBatches,
      host_rng: Callable[..., np.random.Generator],
      timer: Optional[timing.PhaseTimer] = None,
  ):
    self.cfg, self.batches, self.host_rng = cfg, batches, host_rng
    self.multihost = batches.multihost
    # Forward passes book to "logprobs", optimizer updates to "update".
    self.timer = timer or timing.PhaseTimer()

  @property
  def epochs(self) -> int:
    e = int(self.cfg.train.ppo_epochs)
    if e < 1:
      raise ValueError(f"train.ppo_epochs={e} must be >= 1")
    return e

  def _sum(self, x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return distributed.global_sum(x) if self.multihost else x

  def _per_host(self, rows: int) -> int:
    """A job-wide row count as this host's share: ceil(rows / P)."""
    return -(-rows // jax.process_count()) if self.multihost else rows

  # ------------------------------------------------------------ the step
  def step(
      self,
      learner: Learner,
      critic: Optional[Learner],
      on: list,
      off: list,
      source: str,
      step_key: int,
      *,
      ref_params,
      off_adv: Optional[np.ndarray] = None,
      dense_noise_sigma: float = 0.0,
      dense_scale: float = 1.0,
      stale_on: bool = False,
      sampled_old: bool = False,
  ) -> dict:
    """One training step on fresh (``on``) + replayed (``off``) records;
    ``dense_noise_sigma``: the std of the Gaussian noise on dense rewards,
    in their stored units (``RSPOTrainer.dense_noise_sigma``);
    ``dense_scale``: their multiplier (``credit.step_rewards``);
    ``stale_on``: the fresh records' ``behavior_logp`` are those of an
    earlier policy than the learner's (module docstring, 3.);
    ``sampled_old``: they are the learner's own, pi_old (module
    docstring; ignored with ``stale_on``)."""
    n_on, n_off = (int(x) for x in self._sum([len(on), len(off)]))
    if not n_on + n_off:
      return {"skipped_empty": 1.0}
    rewards, rows = self.credit(
        on,
        off,
        source,
        critic,
        step_key,
        off_adv,
        dense_noise_sigma,
        dense_scale,
    )
    metrics = {}
    if n_off:
      offs = rows.off
      metrics.update(
          replayed.metrics(
              self._sum(
                  replayed.metric_sums(
                      [r for r, o in zip(rows.records, offs) if o],
                      rows.adv[offs],
                  )
              )
          )
      )
    fresh = rows.abs_adv()[~rows.off]  # how much signal the groups carry
    sums = self._sum([np.sum(fresh > ADV_EPS), np.sum(fresh), len(fresh)])
    metrics["adv_nonzero_frac_on"] = float(sums[0] / max(sums[2], 1))
    metrics["adv_abs_mean_on"] = float(sums[1] / max(sums[2], 1))
    keep = self.rows_to_train(rows.adv, step_key)
    reward_sums = self._sum([np.sum(rewards), len(rewards)])
    reward_mean = reward_sums[0] / max(reward_sums[1], 1)
    if keep is None:  # every group tied: nothing to learn from
      return {
          **metrics,
          "skipped_no_signal": 1.0,
          "rows_on": 0.0,
          "rows_off": 0.0,
          f"{source}_reward_mean": float(reward_mean),
      }
    if len(keep) < len(rows.records):
      rows = rows.subset(keep)
    metrics.update(
        self.train_rows(
            learner,
            critic,
            rows,
            step_key,
            ref_params,
            stale_on=stale_on,
            sampled_old=sampled_old and not stale_on,
        )
    )
    counts = self._sum(
        [metrics.pop("tokens"), (~rows.off).sum(), rows.off.sum()]
    )
    metrics.update(
        {
            "train_tokens_per_s": float(counts[0])
            / max(metrics["train_time_s"], 1e-9),
            "rows_on": float(counts[1]),
            "rows_off": float(counts[2]),
            f"{source}_reward_mean": float(reward_mean),
        }
    )
    return metrics

  def credit(
      self,
      on: list,
      off: list,
      source: str,
      critic: Optional[Learner],
      step_key: int,
      off_adv: Optional[np.ndarray],
      dense_noise_sigma: float = 0.0,
      dense_scale: float = 1.0,
  ) -> tuple[np.ndarray, Rows]:
    """(step rewards of ``source``, the step's rows with their credit)."""
    records = on + off
    is_off = np.array([False] * len(on) + [True] * len(off), bool)
    values = None
    if critic is not None:  # V before each response token (the first at
      # the last prompt token); every host applies the critic, even one
      # with no records.
      if off_adv is not None:
        raise ValueError("PPO's replayed rows get GAE at the step: no off_adv")
      vb = self.batches.build(records, np.zeros(len(records)), is_off)
      with self.timer.phase("logprobs"):
        values = batching.before_response_tokens(
            vb, self.batches.apply(critic, vb), len(records)
        )
    empty = np.zeros(0, np.float32)
    # PPO whitens over every host's rows (verl: the whole batch).
    sum_fn = self._sum if self.multihost else None
    if not records:  # multi-host: this host's share was empty
      credit.join_ppo_whitening(self.cfg.algo, sum_fn)
      return empty, Rows(
          [],
          is_off,
          empty,
          None if critic is None else empty,
          values,
          None if critic is None else [],
      )
    rewards = credit.step_rewards(
        records,
        source,
        invalid_action_penalty=self.cfg.algo.invalid_action_penalty,
        noise_sigma=dense_noise_sigma if source == "dense" else 0.0,
        rng=self.host_rng(3, step_key),
        dense_scale=dense_scale,
    )
    adv, returns, token_adv = _advantages(
        on, off, rewards, off_adv, self.cfg.algo, values, sum_fn
    )
    return rewards, Rows(records, is_off, adv, returns, values, token_adv)

  def rows_to_train(
      self, adv: np.ndarray, step_key: int
  ) -> Optional[np.ndarray]:
    """Indices of the rows that enter the update; None when
    ``train.drop_zero_advantage_rows`` (DAPO's dynamic sampling, per row)
    leaves none on any host. ``train.max_train_rows`` keeps a random
    subset (CPU budget; multi-host: ``ceil(max_train_rows / P)`` per
    host)."""
    keep = np.arange(len(adv))
    if self.cfg.train.drop_zero_advantage_rows:
      keep = np.flatnonzero(adv != 0)
      if not int(self._sum(len(keep))):
        return None
    max_rows = self._per_host(self.cfg.train.max_train_rows)
    if max_rows and len(keep) > max_rows:
      keep = np.sort(
          keep[
              self.host_rng(2, step_key).choice(
                  len(keep), max_rows, replace=False
              )
          ]
      )
    return keep

  # ------------------------------------------------------------ updates
  def mini_batches(
      self, off: np.ndarray, step_key: int
  ) -> list[list[np.ndarray]]:
    """Row indices of each optimizer update, epoch by epoch; ``off``: the
    rows' replayed flags.

    Updates per epoch: n = ``train.updates_per_step`` when > 0 (at most
    one per row); else ceil(rows / m) with m = ``train.mini_batch_rows``
    (per host) when 0 < m < rows; else one update of every row. The rows
    are shuffled into them once per step and every epoch passes over the
    same mini-batches in the same order (verl's dp_actor.update_policy).
    Stratified: the shuffled rows, replayed ones first, are dealt round
    the n updates like cards (update u gets positions u, u + n, ...), so
    each update holds floor or ceil of (replayed rows / n) replayed rows:
    its replayed share is the step's and its (1 - alpha, alpha) weights
    fall on a fair sample of each source. Update sizes are those of
    np.array_split(rows, n). Multi-host: every host makes the same number of
    updates (the largest any host needs; a host out of rows feeds
    padding).
    """
    off = np.asarray(off, bool)
    n_rows = len(off)
    t = self.cfg.train
    fixed = int(t.updates_per_step or 0)
    m = self._per_host(t.mini_batch_rows)
    if fixed:
      n_updates = min(fixed, n_rows)
    elif m and n_rows > m:
      n_updates = -(-n_rows // m)
    else:
      n_updates = 1 if n_rows else 0
    if not self.multihost:
      n_updates = max(n_updates, 1)
    else:
      n_updates = int(distributed.global_max(np.array([n_updates]))[0])
    if n_updates <= 1:
      chunks = [np.arange(n_rows)]
    else:
      order = self.host_rng(4, step_key).permutation(n_rows)
      deck = np.concatenate([order[off[order]], order[~off[order]]])
      chunks = [np.sort(deck[u::n_updates]) for u in range(n_updates)]
    return [chunks] * self.epochs  # verl: the same mini-batches each epoch

  def _build(self, rows: Rows, idx: np.ndarray):
    return self.batches.build(
        [rows.records[i] for i in idx], rows.adv_of(idx), rows.off[idx]
    )

  def _with_pi(self, batch, idx: np.ndarray, pi: dict, stale_on: bool = False):
    """``batch`` with pi_old / pi_ref of its rows from ``pi`` (row index ->
    log-probs on the row's tokens); behaviour = pi_old on fresh rows
    unless ``stale_on`` (then their recorded log-probs)."""
    old = np.zeros_like(batch.loss_mask)
    ref = np.zeros_like(batch.loss_mask)
    for j, i in enumerate(idx):
      o, r = pi[i]
      old[j, : len(o)], ref[j, : len(r)] = o, r
    behavior = batch.behavior_logp
    if not stale_on:
      behavior = np.where(batch.is_offpolicy[:, None], behavior, old)
    return batch._replace(old_logp=old, ref_logp=ref, behavior_logp=behavior)

  def needs_old_pass(self, rows: Rows) -> np.ndarray:
    """bool per row: pi_old comes from the learner's pass, not from the
    row's sampling log-probs (module docstring: replayed, cut to the
    learner's length, or log-probs short of the response)."""
    return np.array(
        [
            bool(off)
            or len(r.prompt_ids) + len(r.response_ids) > self.max_len
            or len(r.behavior_logp) < len(r.response_ids)
            for r, off in zip(rows.records, rows.off)
        ],
        bool,
    )

  @property
  def max_len(self) -> int:
    return self.batches.max_len

  def _old_logp(
      self,
      learner: Learner,
      rows: Rows,
      idx: np.ndarray,
      batch,
      recompute: Optional[np.ndarray],
      any_recompute: bool,
  ):
    """pi_old [B, T] of ``batch`` (rows ``idx``): the learner's pass over
    every row (``recompute`` None), else the sampling log-probs on the
    response tokens and the pass over the rows ``recompute`` marks only
    (multi-host: every host runs it, padding where it has none, when any
    host has such rows in the step: ``any_recompute``)."""
    if recompute is None:
      return self.batches.apply(learner, batch)
    old = np.where(
        np.asarray(batch.loss_mask) > 0, np.asarray(batch.behavior_logp), 0.0
    ).astype(np.float32)
    sub = np.flatnonzero(recompute[idx])
    if not len(sub) and not (self.multihost and any_recompute):
      return old
    part = self.batches.build(
        [rows.records[idx[j]] for j in sub],
        rows.adv_of(idx[sub]),
        rows.off[idx[sub]],
    )
    got = self.batches.apply(learner, part)
    t = min(got.shape[1], old.shape[1])
    old[sub, :t] = got[: len(sub), :t]
    return old

  def train_rows(
      self,
      learner: Learner,
      critic: Optional[Learner],
      rows: Rows,
      step_key: int,
      ref_params,
      stale_on: bool = False,
      sampled_old: bool = False,
  ) -> dict:
    """The optimizer updates of one step (module docstring, 3.). Returns
    the metrics' means over updates, ``last_clip_frac*``, ``updates``,
    ``train_time_s`` and the ``tokens`` trained on."""
    epochs = self.mini_batches(rows.off, step_key)
    recompute, any_recompute = None, True
    if sampled_old and not stale_on:
      recompute = self.needs_old_pass(rows)
      counts = self._sum([recompute.sum(), len(recompute)])
      any_recompute = bool(counts[0])
      recomputed_frac = float(counts[0] / max(counts[1], 1))
    else:
      recomputed_frac = 1.0
    pi, first = {}, []
    for idx in epochs[0]:  # pi_old, pi_ref: all before the first update
      batch = self._build(rows, idx)
      with self.timer.phase("logprobs"):
        old = self._old_logp(
            learner, rows, idx, batch, recompute, any_recompute
        )
        ref = self.batches.apply(learner, batch, params=ref_params)
      lengths = np.asarray(batch.attention_mask).sum(1)
      for j, i in enumerate(idx):
        pi[i] = (old[j, : lengths[j]], ref[j, : lengths[j]])
      first.append(self._with_pi(batch, idx, pi, stale_on))
    gaps = np.concatenate([_behavior_gaps(b) for b in first] or [[]])
    if self.multihost:  # the median needs every host's tokens
      gaps = np.concatenate(
          [
              np.asarray(g, np.float64)
              for g in distributed.allgather_objects(gaps.tolist())
          ]
      )
    stale = (
        self._sum(sum(_stale_gap_sums(b) for b in first)) if stale_on else None
    )
    t0, per_update, tokens = time.perf_counter(), [], 0
    key = jax.random.key(self.cfg.seed + step_key)
    updates = [(e, idx) for e, ep in enumerate(epochs) for idx in ep]
    for u, (e, idx) in enumerate(updates):
      batch = (
          first[u]
          if e == 0
          else self._with_pi(self._build(rows, idx), idx, pi, stale_on)
      )
      with self.timer.phase("update"):
        m = learner.train(
            self.batches.to_global(learner, batch),
            jax.random.fold_in(key, u) if u else key,
        )
        if critic is not None:
          vbatch = host_batches.value_batch(
              batch, rows.returns[idx], [rows.values[i] for i in idx]
          )
          m.update(
              {
                  f"critic_{k}": v
                  for k, v in critic.train(
                      self.batches.to_global(critic, vbatch),
                      jax.random.key(step_key),
                  ).items()
              }
          )
      per_update.append(m)
      tokens += int(np.asarray(batch.attention_mask).sum())
    metrics = {
        k: float(
            (np.max if ts.is_max_metric(k) else np.mean)(
                [m[k] for m in per_update]
            )
        )
        for k in per_update[0]
    }
    metrics.update(
        {
            f"last_{k}": v
            for k, v in per_update[-1].items()
            if k.startswith("clip_frac")
        }
    )
    metrics.update(
        train_time_s=time.perf_counter() - t0,
        tokens=tokens,
        updates=float(len(updates)),
        epochs=float(len(epochs)),
        old_logp_recomputed_frac=recomputed_frac,
    )
    metrics.update(replay_divergence(gaps))
    if stale is not None:
      metrics["overlap_logp_gap_on"] = float(stale[1] / max(stale[0], 1))
    return metrics

  # ------------------------------------------------------------ pi_B
  def recompute_behavior_logp(
      self,
      learner: Learner,
      records: list,
      timer: Optional[timing.PhaseTimer] = None,
      params=None,
  ) -> float:
    """Writes ``learner``'s log pi of each record's response tokens into
    ``record.behavior_logp`` (tokens beyond the learner's row length keep
    the engine's); returns max |engine - learner| over them (all hosts).
    ``timer``: where the passes' seconds go (another thread: its own);
    ``params``: other weights than the learner's (e.g. a snapshot taken
    before its last update, ``rollout.overlap``)."""
    timer = timer or self.timer
    n_chunks = -(-len(records) // LOGP_CHUNK_ROWS)
    if self.multihost:
      n_chunks = int(distributed.global_max(np.array([n_chunks]))[0])
    gap = 0.0
    if not n_chunks:
      return gap
    for idx in np.array_split(np.arange(len(records)), n_chunks):
      recs = [records[i] for i in idx]
      batch = self.batches.build(
          recs, np.zeros(len(recs)), np.zeros(len(recs), bool)
      )
      with timer.phase("logprobs"):
        logp = self.batches.apply(learner, batch, params=params)
      for j, r in enumerate(recs):
        new = logp[j, np.asarray(batch.loss_mask[j]) > 0].astype(np.float32)
        engine = np.asarray(r.behavior_logp, np.float32)
        if len(new):
          gap = max(gap, float(np.abs(engine[: len(new)] - new).max()))
        r.behavior_logp = np.concatenate([new, engine[len(new) :]])
    if self.multihost:
      gap = float(distributed.global_max(np.array([gap]))[0])
    return gap


def _advantages(
    on: list,
    off: list,
    rewards: np.ndarray,
    off_adv: Optional[np.ndarray],
    algo,
    values,
    sum_fn,
):
  """(advantage per row, PPO's returns, PPO's advantage per token or None)
  of the step's rows ``on + off``: one credit over all rows, or (``off_adv``
  given) the fresh rows' credit followed by ``off_adv``."""
  records = on + off
  empty = np.zeros(0, np.float32)
  if off_adv is None:  # fresh rows only, or PPO: one credit over all rows
    adv, returns = credit.compute_advantages(
        records, rewards, algo, values=values, sum_fn=sum_fn
    )
  else:
    if len(off_adv) != len(off):
      raise ValueError(f"{len(off_adv)} advantages for {len(off)} rows")
    adv, returns = (
        credit.compute_advantages(on, rewards[: len(on)], algo)
        if on
        else (empty, None)
    )
    adv = np.concatenate([adv, off_adv]).astype(np.float32)
  token_adv = None
  if isinstance(adv, list):  # PPO: one advantage per response token
    token_adv = adv
    adv = np.array([a.mean() if a.size else 0.0 for a in adv], np.float32)
  return np.asarray(adv), returns, token_adv
