"""The RSPO loop (and the baselines it reduces to).

One loop, repeated until A has taken ``train.total_steps`` steps:

  1. B phase       B := copy(A); k times: B collects fresh groups and learns
                   from the *dense* reward (RSPO_O: the outcome reward).
  2. Swap, store   B plays ``batch_tasks`` more groups; B's learner
                   recomputes log pi_B of their tokens; each trajectory's
                   reward is swapped back to the outcome reward and stored,
                   with log pi_B, in the replay buffer D (array-record
                   shards under ``<workdir>/replay``).
  3. A phase       k times: A collects n_on fresh groups and replays n_off
                   trajectories of D -- alpha is a share of samples,
                   n_off = alpha * batch_tasks * group_size (rounded) --
                   chosen by ``rspo.sampling`` (reward / variance / random),
                   unused ones first, each with its advantage against its
                   whole B group (replay/selection.py, replay/replayed.py);
                   one training step (update.py) on the mixed batch,
                     J = (1 - alpha) J_on + alpha J_off,
                   J_off with the clip window centred on c = pi_old / pi_B.
  4. D is cleared.

Overlap (``rollout.overlap=1``, overlap.py): step t + 1's fresh groups are
played in a background thread on A's weights of step t while step t's
update runs; their clip window is centred on pi_old / pi_behaviour (one
A step stale), never across a B phase.

RSPO_H (``data_source='history'``) skips B and fills D with A's own
trajectories of the previous loop. ``rspo.enabled=False`` is the plain base
algorithm (GRPO / PPO / GiGPO) on outcome rewards; ``rspo.dense_only`` trains
one policy on the dense reward alone (the reward-hacking ablation).

Resumption: a checkpoint is written after B's collection is complete, after
every ``train.checkpoint_every``-th A step and after each loop's (and the
run's) last A step, in the background (checkpoint.py); a run killed
anywhere restarts from the last complete one and redoes the steps after it
(B's phase is redone from A when it was interrupted; B is never
checkpointed). Besides D, the loop keeps A's groups of the loop on disk
(array-record shards): RSPO_H's next D (``<workdir>/replay_next``) and,
with ``rspo.prm_refresh_loops``, the PRM's next training trajectories
(``<workdir>/prm_recent``); those written after the restored checkpoint
are dropped on resume (their steps are redone). What a loop's end changes
on disk (D cleared or, RSPO_H, replaced by ``replay_next``;
``prm_recent`` cleared) waits until the loop's checkpoint is written; a
resume at a loop's start finishes it when it was cut short
(``_after_loop_saved``).

Multi-host (``jax.process_count() = P > 1``; every process runs this loop
in lockstep, the learners' meshes span all hosts):
  * each collection's task list is drawn as with one process (same seed),
    and process ``p`` plays the whole groups ``distributed.host_share``
    gives it, on its own engine (a mesh of its local devices), with
    globally unique group / trajectory ids;
  * an A step's n_on fresh groups are shared out the same way, and so are
    its n_off replayed trajectories: every host ranks the same D with the
    same generator and used set and keeps its share of the selected ones;
  * B's stored groups are written by each host as shards named
    ``p<process index>-...`` in the shared ``<workdir>/replay``; after a
    barrier the leader marks the buffer complete;
  * each host builds its rows into a batch; row count and length are
    agreed (cross-host max, zero padding) and the blocks become global
    arrays (``distributed.host_local_to_global``) for ``Learner.train`` /
    ``Learner.apply``;
  * statistics are summed over hosts; only the leader (process 0) writes
    metrics and shows progress; checkpoints are written by all (orbax);
  * the PRM (``rspo.dense_reward=prm``) is fitted by the leader alone on
    every host's trajectories (the PRM refit's from the shared
    ``prm_recent``, after a barrier) and each host scores its own records
    with that head on its own devices (build.make_prm_refresh).
Decoupled placement is single-process only.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from typing import Callable, Optional

import jax
import numpy as np

from rspo_jax import (checkpoint, decoupled, distributed, faults,
                      host_batches, overlap, preemption, replay, timing,
                      update)
from rspo_jax import train_step as ts
from rspo_jax.checkpoint import RunCheckpointer
from rspo_jax.learner import Learner
from rspo_jax.metrics import MetricsWriter
from rspo_jax.models import lora
from rspo_jax.replay import replayed, selection
from rspo_jax.rollout import collect as collect_lib
from rspo_jax.rollout.collect import CollectConfig, collect
from rspo_jax.rollout.unbarriered import collect_unbarriered
from rspo_jax.rollout.engine import Engine, SamplingParams
from rspo_jax.types import (POLICY_A, POLICY_B, StepRecord,
                            group_trajectories)

log = logging.getLogger(__name__)

DenseFn = Callable[[list[StepRecord]], None]  # fills r.dense_reward in place


@dataclasses.dataclass
class LoopState:
  """Everything besides the learners that a resumed run needs."""

  loop: int = 0
  phase: str = "B"  # "B" (B phase + collection) or "A"
  a_steps: int = 0  # training steps of A taken so far (global)
  collections: int = 0  # collection counter (seeds, traj/group ids)
  env_steps: int = 0  # environment steps so far (all roles)
  bad_steps: int = 0  # consecutive non-finite updates
  # traj_ids of D replayed since the pass over D began (replay.selection)
  replay_used: list = dataclasses.field(default_factory=list)


class RSPOTrainer:
  """Drives the loop for one config. The caller builds the parts."""

  def __init__(
      self,
      cfg,
      *,
      policy: Learner,
      ref_params,
      critic: Optional[Learner],
      engine: Engine,
      venv,
      tokenizer,
      workdir: str,
      sync_engine: Callable[[Engine, Learner, int], None],
      dense_fn: Optional[DenseFn] = None,
      num_train_tasks: int,
      progress: bool = True,
  ):
    self.cfg, self.a, self.critic = cfg, policy, critic
    self.ref_params, self.engine, self.venv = ref_params, engine, venv
    self.tokenizer, self.workdir = tokenizer, workdir
    self.sync_engine, self.dense_fn = sync_engine, dense_fn
    self.num_train_tasks = num_train_tasks
    self.process_index = jax.process_index()
    self.multihost = jax.process_count() > 1
    # policy=None: a collect-only trainer (rows are never batched for A).
    row_ways = policy.row_ways if policy is not None else 1
    self.batches = host_batches.HostBatches(cfg, self.multihost,
                                              row_ways=row_ways)
    # Wall seconds by phase, written as one "time" record per A step.
    self.timer = timing.PhaseTimer(count_compiles=True)
    self.updater = update.StepUpdater(cfg, self.batches, self._host_rng,
                                      self.timer)
    self.leader = self.process_index == 0
    self.progress = progress and self.leader
    self._bar = None  # run()'s progress bar, which B's steps advance too
    if self.multihost and cfg.rollout.placement == "decoupled":
      raise ValueError(
          "rollout.placement='decoupled' runs in one process only; with"
          f" {jax.process_count()} processes use 'colocated'"
      )
    if self.multihost and self.overlap:
      raise ValueError(
          "rollout.overlap=1 runs in one process only; with"
          f" {jax.process_count()} processes use rollout.overlap=0")
    if self.overlap and policy is not None:  # plan.resolve_run checks too
      from rspo_jax import plan  # pylint: disable=g-import-not-at-top
      from rspo_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top

      problem = plan.overlap_problem(cfg, {"mesh": dict(policy.mesh.shape)})
      if problem:
        raise ConfigError(problem)
    # Overlap: A's next collection, running during A's update (overlap.py)
    self.prefetch: Optional[overlap.Prefetch] = None
    self._prefetch_seconds: dict = {}
    self.prm_refresh: Optional[Callable[[list], DenseFn]] = None
    # Decoupled placement: B's own (engine, venv, tokenizer) and its job.
    self.b_rollout = None
    self.b_job: Optional[decoupled.BackgroundCollection] = None
    self.b_dir = os.path.join(workdir, "replay_b")
    self._b_cache: dict = {}  # decoupled: shard path -> records
    self.b_logp_gap: Optional[float] = None  # decoupled: B's largest so far
    # B's first training collection of the loop: (task ids, collection
    # number, its success and dense return, its won episodes per task),
    # for B's lift.
    self.b_first: Optional[tuple] = None
    self._b_tx, self._b_steps = None, {}  # B's own optimizer (make_b)
    self.state = LoopState()
    # One shard-name prefix per host: hosts write D side by side.
    self.shard_prefix = (f"p{self.process_index:05d}" if self.multihost
                         else "shard")
    self.buffer = self._buffer(os.path.join(workdir, "replay"))
    self.history = self._buffer(os.path.join(workdir, "replay_next"))
    # A's trajectories of the loop, the PRM refit's (rspo.prm_refresh_loops)
    self.recent_a = self._buffer(os.path.join(workdir, "prm_recent"))
    self.ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"))
    self.metrics = MetricsWriter(workdir) if self.leader else _NoMetrics()
    # Set by SIGTERM once launch/train.py installs it (preemption.py).
    self.stop = preemption.StopRequest()
    self.collect_cfg = CollectConfig(
        env_name=cfg.env.name,
        max_steps=cfg.env.max_steps,
        history_length=cfg.env.history_length,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        invalid_action_penalty=cfg.algo.invalid_action_penalty,
        split=cfg.env.train_split,
    )
    # rollout.turn_barriers=False (SGLang): each episode on its own.
    self.collect = (collect if cfg.rollout.get("turn_barriers", True)
                    else collect_unbarriered)
    self.sampling = SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop_strings=("</action>",),
    )

  # ------------------------------------------------------------ bookkeeping
  @property
  def k(self) -> int:
    return self.cfg.rspo.k

  @property
  def run_name(self) -> str:
    """What this run trains, for people: 'RSPO+GRPO', 'GiGPO', ..."""
    r, algo = self.cfg.rspo, _ALGO_NAMES.get(self.cfg.algo.name,
                                              self.cfg.algo.name)
    if not r.enabled:
      return algo
    if r.dense_only:
      return f"{algo} on the dense reward"
    variant = {"history": "RSPO_H", "outcome": "RSPO_O"}.get(
        r.data_source, "RSPO")
    return f"{variant}+{algo}"

  @property
  def decoupled(self) -> bool:
    return self.cfg.rollout.placement == "decoupled"

  @property
  def uses_b(self) -> bool:
    r = self.cfg.rspo
    return r.enabled and r.data_source in ("rspo", "outcome")

  @property
  def history_source(self) -> bool:
    """RSPO_H: D is A's own groups of the previous loop."""
    return self.cfg.rspo.enabled and self.cfg.rspo.data_source == "history"

  @property
  def keeps_loop_data(self) -> bool:
    """Something on disk changes at a loop's end (``_after_loop_saved``)."""
    return self.uses_b or self.history_source or self.prm_refresh is not None

  def fingerprint(self) -> dict:
    c = self.cfg
    return {
        "model": c.model.preset,
        "algo": c.algo.name,
        "env": c.env.name,
        "rspo": bool(c.rspo.enabled),
        "n_params": int(sum(x.size for x in jax.tree.leaves(self.a.params))),
    }

  def _states(self) -> dict:
    states = {"policy": self.a.state}
    if self.critic is not None:
      states["critic"] = self.critic.state
    return states

  def save(self) -> None:
    meta = dataclasses.asdict(self.state)
    meta["fingerprint"] = self.fingerprint()
    # Orbax steps must increase: one checkpoint per (A step, phase).
    ckpt_step = self.state.a_steps * 2 + (1 if self.state.phase == "A" else 0)
    self.ckpt.save(ckpt_step, self._states(), meta)

  def try_resume(self) -> bool:
    if self.ckpt.latest_step() is None:
      return False
    states, meta = self.ckpt.restore(
        self._states(), fingerprint=self.fingerprint()
    )
    self.a.state = states["policy"]
    if self.critic is not None:
      self.critic.state = states["critic"]
    meta.pop("fingerprint", None)
    self.state = LoopState(**meta)
    if self.history_source:
      self.history = self._drop_after_checkpoint(self.history)
    if self.prm_refresh is not None:
      self.recent_a = self._drop_after_checkpoint(self.recent_a)
    if self.state.phase == "B":  # a loop's start: its end may be cut short
      self._after_loop_saved()
    stored = self.b_dir if self.decoupled else self.buffer.directory
    if (self.state.phase == "A" and self.uses_b
        and not replay.is_complete(stored)):
      log.warning("replay buffer incomplete at resume: redoing B's phase")
      self.state.phase = "B"
    log.info("resumed from checkpoint: %s", self.state)
    return True

  def _drop_after_checkpoint(self, buffer: replay.ReplayBuffer
                             ) -> replay.ReplayBuffer:
    """``buffer`` (A's groups of the loop: ``history``, ``recent_a``)
    without the shards written after the restored checkpoint (their steps
    are redone). A shard holds groups of one collection, whose trajectory
    ids start at ``collections * 100_000`` (collect_groups)."""
    first_unsaved = (self.state.collections + 1) * 100_000
    if self.leader:
      for path in replay.list_shards(buffer.directory):
        ids = [r.traj_id for r in replay.read_shard(path)]
        if ids and min(ids) >= first_unsaved:
          os.remove(path)
    distributed.barrier("rspo_loop_groups_trimmed")
    return self._buffer(buffer.directory)

  def _rng(self, *keys) -> np.random.Generator:
    return np.random.default_rng([self.cfg.seed, *keys])

  def _host_rng(self, *keys) -> np.random.Generator:
    """Per-host draws (noise, row subsets); with one process ``_rng``."""
    if self.multihost:
      keys = keys + (self.process_index,)
    return self._rng(*keys)

  def _buffer(self, directory: str) -> replay.ReplayBuffer:
    return replay.ReplayBuffer(directory, prefix=self.shard_prefix)

  def _global_mean(self, values) -> float:
    """Mean over every host's values (``_mean`` with one process)."""
    if not self.multihost:
      return _mean(values)
    total, n = distributed.global_sum(
        np.array([np.sum(values), len(values)], np.float64))
    return float(total / n) if n else 0.0

  # ------------------------------------------------------------ collection
  def collect_groups(self, learner: Learner, n_groups: int, tag: str,
                     share: Optional[tuple[int, int]] = None,
                     replay_of: Optional[tuple[list, int]] = None):
    """Fresh on-policy groups from ``learner``'s current weights.

    ``n_groups`` tasks are drawn for the whole job; this process plays the
    groups ``[first, last)`` of them (``share``; default: its
    ``distributed.host_share``). Statistics are those of all hosts, with
    the job's ``task_ids``. ``replay_of = (task_ids, collection)`` plays
    those tasks with the sampling seeds of that earlier collection instead
    of a fresh draw (B's lift: the same tasks and random numbers before
    and after B's steps).
    """
    s = self.state
    s.collections += 1
    with self.timer.phase("weight_sync"):
      self.sync_engine(self.engine, learner, s.collections)
    task_ids, seed_of = self._draw(n_groups, s.collections, replay_of)
    first, last = share or distributed.host_share(len(task_ids))
    records, rounds = self._play(task_ids, first, last, seed_of,
                                 s.collections, tag, self.timer)
    return self._collected(records, rounds, task_ids, tag)

  def _draw(self, n_groups: int, collection: int,
            replay_of: Optional[tuple[list, int]] = None):
    """(task ids, seed number) of collection number ``collection``."""
    if replay_of is not None:
      return np.asarray(replay_of[0]), replay_of[1]
    rng = self._rng(1, collection)
    return (rng.choice(self.num_train_tasks, size=n_groups, replace=False),
            collection)

  def _play(self, task_ids, first: int, last: int, seed_of: int,
            collection: int, tag: str, timer: timing.PhaseTimer):
    """(records, each round's statistics) of this host's groups
    ``[first, last)`` of ``task_ids``; touches no loop state, so it may
    run in another thread (overlap.py) with that thread's ``timer``."""
    g = self.cfg.train.group_size
    seed = self.cfg.seed * 7919 + seed_of
    if self.multihost:  # hosts draw different samples
      seed += 104_729 * self.process_index
    mine = [int(t) for t in task_ids[first:last]]
    # More groups than the environment pool holds (e.g. the PRM's training
    # groups) are played in rounds of as many groups as fit.
    per_round = max(1, self.venv.num_envs // g)
    records, rounds = [], []
    for c, lo in enumerate(range(0, len(mine), per_round)):
      got, stats = self.collect(
          self.engine, self.venv, self.tokenizer, mine[lo:lo + per_round],
          g, self.sampling, self.collect_cfg, policy_tag=tag,
          traj_id_start=collection * 100_000 + (first + lo) * g,
          group_id_start=collection * 1_000 + first + lo,
          seed=seed + 1_000_003 * c, timer=timer,
      )
      records += got
      rounds.append(stats)
    return records, rounds

  def _collected(self, records: list, rounds: list, task_ids, tag: str):
    """A collection's (records without failed episodes, statistics of all
    hosts): failures checked, environment steps counted, dense rewards
    filled where they are used."""
    stats = (collect_lib.combine_rounds(rounds) if rounds
             else collect_lib.empty_stats())
    if self.multihost:
      stats = collect_lib.combine_stats(distributed.allgather_objects(stats))
    collect_lib.check_failures(
        stats, self.cfg.rollout.get("max_failed_episode_frac", 0.5),
        self.cfg.env.name, getattr(self.venv, "first_error", None))
    self.state.env_steps += stats["env_steps"]
    stats["task_ids"] = [int(t) for t in task_ids]
    records = [r for r in records if not r.failed]
    if self.dense_fn is not None and records and (
        tag == POLICY_B or self.cfg.rspo.dense_only):
      self.dense_fn(records)  # e.g. PRM scores replace env progress
    return records, stats

  # ------------------------------------------------------------ overlap
  @property
  def overlap(self) -> bool:
    return bool(self.cfg.rollout.get("overlap", 0))

  def _prefetch_next(self) -> bool:
    """Overlap: whether A's next step may start collecting now, during
    this step's update: a next A step exists and no loop ends between
    (with RSPO, B's phase and D's change come there; the baseline has
    neither)."""
    c, done = self.cfg, self.state.a_steps + 1  # once this step is taken
    if not self.overlap or done >= c.train.total_steps:
      return False
    return done % self.k != 0 or not c.rspo.enabled

  def _start_prefetch(self, n_groups: int) -> None:
    """A's next collection of ``n_groups`` groups on A's weights now, in a
    background thread (overlap.py); with ``rspo.recompute_behavior_logp``
    its behaviour log-probs are recomputed there by A's learner on a
    snapshot of these weights (the update donates the learner's)."""
    collection = self.state.collections + 1  # taken by _take_prefetch
    with self.timer.phase("weight_sync"):
      self.sync_engine(self.engine, self.a, collection)
    task_ids, seed_of = self._draw(n_groups, collection)
    first, last = distributed.host_share(len(task_ids))
    snapshot = self.a.frozen_params() if self.recompute_logp else None

    def play(timer):
      records, rounds = self._play(task_ids, first, last, seed_of,
                                   collection, POLICY_A, timer)
      if snapshot is not None:
        self.updater.recompute_behavior_logp(
            self.a, [r for r in records if not r.failed], timer,
            params=snapshot)
      return records, rounds

    self.prefetch = overlap.Prefetch(
        play, weights_step=self.state.a_steps, collection=collection,
        task_ids=task_ids)

  def _take_prefetch(self, n_groups: int):
    """The prefetched collection (waiting for it): ``collect_groups``'s
    result, and the A steps its weights lag behind A's now."""
    p, self.prefetch = self.prefetch, None
    with self.timer.phase("collect_wait"):
      records, rounds = p.result()
    if (len(p.task_ids) != n_groups
        or p.collection != self.state.collections + 1):
      raise RuntimeError(
          f"the prefetched collection ({len(p.task_ids)} groups, number"
          f" {p.collection}) is not A's next ({n_groups} groups, number"
          f" {self.state.collections + 1})")
    self.state.collections = p.collection
    self._prefetch_seconds = p.seconds()
    return (*self._collected(records, rounds, p.task_ids, POLICY_A),
            self.state.a_steps - p.weights_step)

  # ------------------------------------------------------------ updates
  def update(
      self, learner: Learner, critic: Optional[Learner], on: list,
      off: list, source: str, step_key: int,
      off_adv: Optional[np.ndarray] = None, stale_on: bool = False,
  ) -> dict:
    """One training step of ``learner`` on fresh (``on``) + replayed
    (``off``, advantages ``off_adv`` or None: PPO's GAE at the step)
    records: ``update.StepUpdater.step``, then the non-finite check.

    Multi-host: ``on`` and ``off`` are this host's records (whole fresh
    groups); every host calls this together. ``stale_on``: ``on`` was
    collected by earlier weights (``rollout.overlap``).
    """
    m = self.updater.step(learner, critic, on, off, source, step_key,
                          ref_params=self.ref_params, off_adv=off_adv,
                          dense_noise_sigma=self.dense_noise_sigma,
                          dense_scale=self.cfg.rspo.get("dense_scale", 1.0),
                          stale_on=stale_on, sampled_old=self.sampled_old)
    if "updates" in m:
      self._check_finite(m)
    return m

  @property
  def sampled_old(self) -> bool:
    """Fresh rows take pi_old from their sampling log-probs (update.py):
    the in-process engine, synced to the learner's weights before each
    collection, and ``algo.recompute_old_logprobs`` False. SGLang's
    log-probs come from other kernels on an exported copy: recomputed."""
    return (self.cfg.rollout.engine == "jax"
            and not self.cfg.algo.get("recompute_old_logprobs", False))

  @property
  def dense_noise_sigma(self) -> float:
    """``rspo.dense_noise_sigma`` in the units of the stored dense rewards.
    sigma is given in the PRM's tanh units (the paper's); a PRM's rewards
    are ``r_hat / reward_scale`` (``fn.tanh_unit = 1 / reward_scale``);
    the environments' progress and user functions: sigma as given."""
    return self.cfg.rspo.dense_noise_sigma * getattr(
        self.dense_fn, "tanh_unit", 1.0)

  def _check_finite(self, metrics: dict) -> None:
    if metrics.get("skipped", 0.0) > 0:
      self.state.bad_steps += 1
      log.warning("non-finite update skipped (%d in a row)",
                  self.state.bad_steps)
      if self.state.bad_steps >= self.cfg.train.max_bad_steps:
        raise FloatingPointError(
            f"{self.state.bad_steps} consecutive non-finite updates; the last"
            f" good checkpoint is kept in {self.ckpt.directory}"
        )
    else:
      self.state.bad_steps = 0

  # ------------------------------------------------------------ B phase
  def b_phase(self) -> None:
    """B := copy(A); k steps of B on the dense reward (RSPO_O: the
    outcome reward); then B's stored collection (``store_replay``)."""
    if self.leader:  # multi-host: D (every host's shards) is cleared once
      self.buffer.clear()
    distributed.barrier("rspo_replay_cleared")
    self.state.replay_used = []
    loop = self.state.loop
    b = self.make_b()
    b_critic = self.critic.copy() if self.critic is not None else None
    source = "outcome" if self.cfg.rspo.data_source == "outcome" else "dense"
    for i in range(self.k):
      on, stats = self.collect_groups(b, self.cfg.train.batch_tasks, POLICY_B)
      if i == 0:  # B = A: the start of B's lift
        self.b_first = (stats["task_ids"], self.state.collections,
                        self._play_stats(on),
                        self._wins_by_task(on, stats["task_ids"]))
      m = self.update(b, b_critic, on, [], source, step_key=10**6 + loop * 97
                      + i)
      faults.maybe_fail("b_phase")
      m.update({f"rollout_{k}": v for k, v in stats.items()})
      m["dense_reward_mean"] = self._global_mean(_dense(on))
      m["outcome_reward_mean"] = self._global_mean(
          [r.outcome_reward for r in on])
      m.update(loop=loop, b_step=loop * self.k + i + 1)
      self.metrics.write(self.state.a_steps, "B", m)
      if self._bar is not None:
        self._bar.set_postfix(loop=loop, phase="B", success=(
            f"{m['rollout_success_rate']:.2f}"), refresh=False)
        self._bar.update(1)
      self._stop_if_requested(save=False)  # B is redone from A on resume
    if self.decoupled:
      self._start_b_collection(b)
    else:
      self.store_replay(b)
    del b, b_critic  # B exists only during its phase (and its collection)

  def make_b(self) -> Learner:
    """B := copy(A): A's parameters; A's Adam moments or fresh ones
    (``rspo.copy_optimizer_state``); A's optimizer, or one of B's own
    learning rate / warm-up (``rspo.b_lr``, ``rspo.b_warmup_steps``; 0 =
    A's). B's own optimizer's jitted steps are kept across loops."""
    r, t = self.cfg.rspo, self.cfg.train
    lr = r.get("b_lr", 0.0) or t.lr
    warmup = r.get("b_warmup_steps", 0) or t.warmup_steps
    if lr == t.lr and warmup == t.warmup_steps:
      return self.a.copy(copy_opt_state=r.copy_optimizer_state)
    if self._b_tx is None:
      self._b_tx = ts.make_optimizer(
          lr, grad_clip=t.grad_clip, weight_decay=t.weight_decay,
          warmup_steps=warmup, adapter_lr_multiplier=lora.lr_multiplier(
              self.cfg))  # the LoRA rule, as A's
    b = self.a.copy(copy_opt_state=r.copy_optimizer_state, tx=self._b_tx,
                    steps=self._b_steps)
    return b

  def _play_stats(self, records) -> dict:
    """Success rate (share of trajectories that won) and dense return
    (mean over trajectories of sum_t dense r_t) of a collection, over
    every host's records."""
    won, dense = {}, {}
    for r in records:
      won[r.traj_id] = won.get(r.traj_id, False) or bool(r.won)
      dense[r.traj_id] = dense.get(r.traj_id, 0.0) + float(r.dense_reward)
    return {"success": self._global_mean(list(won.values())),
            "dense_return": self._global_mean(
                [v for v in dense.values() if np.isfinite(v)])}

  def _wins_by_task(self, records, task_ids) -> list:
    """Won episodes of each task in ``task_ids`` (that order), over
    every host's records: B's lift task by task."""
    won = {}
    for r in records:
      won[r.traj_id] = (int(r.task_id),
                        won.get(r.traj_id, (0, False))[1] or bool(r.won))
    at = {int(t): i for i, t in enumerate(task_ids)}
    counts = np.zeros(len(at), np.float64)
    for task, w in won.values():
      if task in at:
        counts[at[task]] += w
    if self.multihost:
      counts = distributed.global_sum(counts)
    return [int(c) for c in counts]

  def _lift(self, stored: dict) -> dict:
    """B's lift over its phase: its stored collection (after k steps)
    against its first training collection (B = A), on the same tasks
    and sampling seeds unless ``rspo.b_lift_tasks='fresh'``."""
    first = self.b_first[2]
    out = {f"b_first_{k}": v for k, v in first.items()}
    out.update({f"b_stored_{k}": v for k, v in stored.items()})
    out.update({f"b_lift_{k}": stored[k] - first[k] for k in stored})
    return out

  # ------------------------------------------------------------ swap, store
  @property
  def recompute_logp(self) -> bool:
    return bool(self.cfg.rspo.get("recompute_behavior_logp", True))

  @property
  def b_lift_replay_of(self) -> Optional[tuple[list, int]]:
    """The tasks and seeds B's stored collection replays: those of its
    first training collection (``rspo.b_lift_tasks='first'``), or None
    (a fresh draw)."""
    if self.b_first is None or self.cfg.rspo.get(
        "b_lift_tasks", "first") != "first":
      return None
    return self.b_first[0], self.b_first[1]

  def store_replay(self, b: Learner) -> None:
    """B plays ``batch_tasks`` groups (the tasks of its first training
    collection: ``b_lift_replay_of``); B's learner recomputes log pi_B of
    their tokens (``rspo.recompute_behavior_logp``); B's lift is logged;
    each trajectory's reward is swapped to the outcome reward; D is
    written and marked complete."""
    stored, stats = self.collect_groups(b, self.cfg.train.batch_tasks,
                                        POLICY_B,
                                        replay_of=self.b_lift_replay_of)
    extra = {}
    if self.b_first is not None:
      extra.update(self._lift(self._play_stats(stored)))
      if self.b_lift_replay_of is not None:  # the same tasks: paired
        extra["b_first_wins_by_task"] = self.b_first[3]
        extra["b_stored_wins_by_task"] = self._wins_by_task(
            stored, self.b_first[0])
    if self.recompute_logp:
      extra["behavior_logp_max_gap"] = self.updater.recompute_behavior_logp(
          b, stored)
    for r in stored:  # the reward swap: outcome reward only, never dense
      r.dense_reward = float("nan")
    self.buffer.add_trajectories(group_trajectories(stored))
    faults.maybe_fail("collect")
    distributed.barrier("rspo_replay_written")  # every host's shards closed
    if self.leader:
      replay.mark_complete(self.buffer.directory)
      bstats = self.buffer.stats()
      if self.multihost:
        bstats["shards_by_host"] = self.buffer.shards_by_prefix()
      self.metrics.write(self.state.a_steps, "B_collect", {
          "loop": self.state.loop,
          **{f"rollout_{k}": v for k, v in stats.items()},
          **{f"buffer_{k}": v for k, v in bstats.items()
             if isinstance(v, (int, float, dict))},
          **extra,
      })

  def _start_b_collection(self, b: Learner) -> None:
    """Decoupled: B's stored groups are played on B's own engine in a
    background thread, their log pi_B recomputed by B's learner there,
    and written group by group to ``replay_b``."""
    engine, venv, tokenizer = self.b_rollout
    s = self.state
    s.collections += 1
    self.sync_engine(engine, b, s.collections)
    tasks, seed_of = self.b_lift_replay_of or (self._rng(
        1, s.collections).choice(self.num_train_tasks,
                                 self.cfg.train.batch_tasks, replace=False),
                                                s.collections)
    groups = decoupled.collect_b_groups(
        engine, venv, tokenizer, [int(t) for t in tasks],
        self.cfg.train.group_size, self.sampling, self.collect_cfg,
        traj_id_start=s.collections * 100_000,
        group_id_start=s.collections * 1_000,
        seed=self.cfg.seed * 7919 + seed_of,
    )
    if self.recompute_logp:
      self.b_logp_gap = 0.0
      groups = self._recomputed(b, groups)
    self.b_job = decoupled.start_collection(groups, self.b_dir)

  def _recomputed(self, b: Learner, groups):
    """``groups`` with log pi_B from B's learner (runs in B's thread)."""
    b_timer = timing.PhaseTimer()  # this thread's own (timing.py)
    for records in groups:
      gap = self.updater.recompute_behavior_logp(b, records, b_timer)
      self.b_logp_gap = max(self.b_logp_gap, gap)
      yield records

  # ------------------------------------------------------------ A phase
  def a_step(self) -> dict:
    """One training step of A on ``n_on`` fresh groups and ``n_off``
    replayed trajectories (``replay_counts``); with ``rollout.overlap``
    the fresh groups were played during the last update (``lag`` 1) and
    the next step's start playing before this update."""
    c = self.cfg
    n_off, n_on = self.replay_counts()
    if self.prefetch is not None:  # overlap: played during the last update
      on, stats, lag = self._take_prefetch(n_on)
    else:
      (on, stats), lag = self.collect_groups(self.a, n_on, POLICY_A), 0
    off, off_adv = self.replayed(n_off)
    history = self.history_source
    if history and self.recompute_logp and not lag:  # RSPO_H: D gets A's
      # learner's log-probs too (prefetched rows have them already)
      self.updater.recompute_behavior_logp(self.a, on)
    source = "dense" if c.rspo.dense_only else "outcome"
    if self._prefetch_next():
      self._start_prefetch(n_on)
    m = self.update(self.a, self.critic, on, off, source,
                    step_key=self.state.a_steps, off_adv=off_adv,
                    stale_on=lag > 0)
    faults.maybe_fail("a_phase")
    if history:
      self.history.add_trajectories(group_trajectories(on))
    if self.prm_refresh is not None:
      self.recent_a.add_trajectories(group_trajectories(on))
    m.update({f"rollout_{k}": v for k, v in stats.items()})
    m["env_steps"] = self.state.env_steps
    # As on B's rows: means over A's fresh step rows (update.py's
    # <source>_reward_mean is the step reward over every trained row).
    m["dense_reward_mean"] = self._global_mean(_dense(on))
    m["outcome_reward_mean"] = self._global_mean(
        [r.outcome_reward for r in on])
    if c.rspo.enabled:
      for k, v in replayed.metrics(np.zeros(5)).items():
        m.setdefault(k, v)  # nothing replayed this step
      m.setdefault("rows_off", 0.0)
    if self.b_logp_gap is not None:
      m["behavior_logp_max_gap"] = self.b_logp_gap  # decoupled: B so far
    if self.overlap:
      m["overlap_policy_lag"] = float(lag)
      m.setdefault("overlap_logp_gap_on", 0.0)
      if lag:
        m.update(self._prefetch_seconds)
    return m

  def replay_counts(self) -> tuple[int, int]:
    """(n_off replayed trajectories, n_on fresh groups) of A's step:
    alpha as a share of samples (``selection.replay_counts``); no replay
    for the baselines and while D is empty (RSPO_H's first loop)."""
    c = self.cfg
    if not c.rspo.enabled or (not (self.decoupled and self.uses_b)
                              and self.buffer.num_trajectories == 0):
      return 0, c.train.batch_tasks
    return selection.replay_counts(c.rspo.alpha, c.train.batch_tasks,
                                   c.train.group_size)

  # ------------------------------------------------------------ replay
  def replayed(self, n_off: int):
    """This host's replayed records of A's step and their advantages
    against their whole group of D (None for PPO: GAE at the step).

    Every host reads the same D and ranks it with the same generator and
    used set (``LoopState.replay_used``): ``n_off`` trajectories, unused
    ones first (replay/selection.py); this host keeps its
    ``distributed.host_share`` of them.
    """
    if not n_off:
      return [], None
    c = self.cfg
    d = self._replay_source(n_off)
    sel = selection.select(d, n_off, c.rspo.sampling,
                           self._rng(4, self.state.a_steps),
                           self.state.replay_used,
                           c.rspo.get("replay_reuse", "wins"))
    if sel.restarted:
      log.info("this step replays trajectories of D again")
    self.state.replay_used = sel.used
    first, last = distributed.host_share(len(sel.trajectories))
    adv = replayed.advantages_in_buffer(
        d, c.algo, invalid_action_penalty=c.algo.invalid_action_penalty)
    return replayed.rows(sel.trajectories[first:last], adv)

  def _replay_source(self, n_off: int) -> list:
    """D's trajectories: the buffer, or (decoupled) the groups B has
    written so far, once enough exist for ``n_off`` unused ones."""
    if not (self.decoupled and self.uses_b):
      return self.buffer.trajectories()
    if self.b_job is not None:
      # A's step at position p of the loop ranks at least (p + 1) / k of
      # B's groups (waiting for only the groups it draws would rank the
      # first ceil(n_off / G) finished groups, whatever their wins).
      used, g = len(self.state.replay_used), self.cfg.train.group_size
      tasks, pos = self.cfg.train.batch_tasks, self.state.a_steps % self.k
      need = min(tasks, max(-(-(used + n_off) // g),
                            -(-tasks * (pos + 1) // self.k)))
      self.b_job.wait_for_groups(need, self.cfg.rollout.decoupled_timeout_s)
    return decoupled.read_trajectories(self.b_dir, self._b_cache)

  def end_loop(self) -> None:
    if self.b_job is not None:  # B's collection must end with its loop
      self.b_job.join(self.cfg.rollout.decoupled_timeout_s)
      self.b_job = None
      if self.b_first is not None:  # dense rewards are swapped out by now
        won = [t.steps[-1].won for t in decoupled.read_trajectories(
            self.b_dir, self._b_cache)]
        lift = _mean(won) - self.b_first[2]["success"]
        self.metrics.write(self.state.a_steps, "B_collect", {
            "loop": self.state.loop, "b_first_success":
            self.b_first[2]["success"], "b_stored_success": _mean(won),
            "b_lift_success": lift})
    self.b_first = None
    s = self.state
    s.loop += 1
    s.phase = "B"
    s.replay_used = []  # D is cleared (RSPO_H: replaced)
    self._b_cache, self.b_logp_gap = {}, None
    every = self.cfg.rspo.prm_refresh_loops
    if self.prm_refresh is not None and every and s.loop % every == 0:
      # Refit the PRM on A's trajectories of the loop (outcome rewards):
      # every host's, written to the shared prm_recent, read by the leader.
      distributed.barrier("rspo_prm_recent")
      self.dense_fn = self.prm_refresh(
          self.recent_a.records() if self.leader else [])

  def _after_loop_saved(self) -> None:
    """A loop's end on disk, once its checkpoint is written (a crash
    before then redoes the loop's last steps with D and the loop's groups
    as they were); done again on a resume at a loop's start: D cleared
    (RSPO_H: replaced by A's groups of the loop that ended), the PRM's
    trajectories cleared."""
    if self.uses_b and self.leader:
      self.buffer.clear()
      decoupled.clear(self.b_dir)
    if self.history_source:
      self._history_becomes_d()
    if self.prm_refresh is not None and self.leader:
      self.recent_a.clear()

  def _history_becomes_d(self) -> None:
    """RSPO_H: ``replay_next``, A's groups of loop L = state.loop - 1, is
    marked complete, given a ``_FROM_LOOP`` file holding L and renamed
    onto D. Idempotent: not redone once D holds L's groups; a move cut
    short is finished (begun: D holds an older loop's, or ``replay_next``
    shards or its marks; a workdir of a version without ``_FROM_LOOP``
    moved before the loop's save)."""
    done, d, h = (str(self.state.loop - 1), self.buffer.directory,
                  self.history.directory)
    distributed.barrier("rspo_history_written")
    # Only the leader reads: it may be removing D while others would read.
    d_from = _read(os.path.join(d, FROM_LOOP)) if self.leader else None
    if self.leader and d_from != done and (
        d_from is not None or replay.is_complete(h) or replay.list_shards(h)):
      _write(os.path.join(h, FROM_LOOP), done)
      replay.mark_complete(h)
      shutil.rmtree(d, ignore_errors=True)
      os.rename(h, d)
    distributed.barrier("rspo_history_moved")
    self.buffer = self._buffer(self.buffer.directory)
    self.history = self._buffer(self.history.directory)

  # ------------------------------------------------------------ main loop
  def run(self, evaluate: Optional[Callable[[Learner, int], dict]] = None):
    c, s = self.cfg, self.state
    total = c.train.total_steps
    b_steps = self.k if self.uses_b and not c.rspo.dense_only else 0
    bar = self._bar = _progress(total, s.a_steps, s.phase, self.k, b_steps,
                                self.progress, self.run_name)
    while s.a_steps < total:
      if s.phase == "B":
        t0, steps0 = time.perf_counter(), s.env_steps
        ran_b = self.uses_b and not c.rspo.dense_only
        if ran_b:
          self.b_phase()
        s.phase = "A"
        with self.timer.phase("checkpoint"):
          self.save()
        if ran_b:
          self.metrics.write(s.a_steps, "B_time", self._timing(t0, steps0))
        self._stop_if_requested(save=False)  # just saved
      t0, steps0 = time.perf_counter(), s.env_steps
      m = self.a_step()
      s.a_steps += 1
      m["step_time_s"] = time.perf_counter() - t0
      m["episodes_per_s"] = m.get("rollout_episodes", 0.0) / m["step_time_s"]
      m.update(loop=s.loop, loop_step=(s.a_steps - 1) % self.k)
      self.metrics.write(s.a_steps, "A", m)
      if (evaluate is not None and c.train.eval_every
          and s.a_steps % c.train.eval_every == 0 and s.a_steps < total):
        with self.timer.phase("evaluation"):
          if self.prefetch is not None:  # it plays on the same engine
            self.prefetch.wait()
          result = evaluate(self.a, s.a_steps)
        self.metrics.write(s.a_steps, "eval", result)
      loop_done = s.a_steps % self.k == 0 or s.a_steps == total
      if loop_done:
        self.end_loop()
      saved = checkpoint.due(s.a_steps, c.train.checkpoint_every, loop_done)
      with self.timer.phase("checkpoint"):
        if saved:
          self.save()
        if loop_done and self.keeps_loop_data:
          self.ckpt.wait()  # the loop's checkpoint on disk before D goes
      self.metrics.write(s.a_steps, "time", self._timing(t0, steps0))
      if loop_done:
        self._after_loop_saved()  # a crash before it: finished on resume
      bar.set_postfix(
          loop=m["loop"], phase="A",
          success=f"{m.get('rollout_success_rate', 0):.2f}",
          loss=f"{m.get('loss', 0):.3f}", refresh=False,
      )
      bar.update(1)
      self._stop_if_requested(save=not saved)
    bar.close()
    self._bar = None
    return s

  def _stop_if_requested(self, save: bool) -> None:
    """On a stop request (SIGTERM, preemption.py): ``save`` the state
    reached first when its checkpoint was not due (between B's steps:
    never, a resume redoes B's phase from A), every write finished, then
    ``Preempted``."""
    if not self.stop.requested():
      return
    if save:
      self.save()
    self.ckpt.wait()
    raise preemption.Preempted(self.state.a_steps)


  def _timing(self, t0: float, env_steps0: int) -> dict:
    """Wall seconds since ``t0`` by phase (``timing.PhaseTimer``: weight
    sync, generation, environment, prompts, logprobs, update, evaluation,
    checkpoint; ``other_s`` the rest), XLA compilations by phase, and
    environment steps/s; then the timer starts afresh."""
    wall = time.perf_counter() - t0
    compiles = self.timer.compiles()
    seconds = self.timer.reset()
    out = {f"{k}_s": v for k, v in seconds.items()}
    out["other_s"] = max(wall - sum(seconds.values()), 0.0)
    out["wall_s"] = wall
    out["env_steps_per_s"] = (self.state.env_steps - env_steps0) / max(
        wall, 1e-9)
    out.update({f"compiles_{k}": float(v) for k, v in compiles.items()})
    return out


FROM_LOOP = "_FROM_LOOP"  # RSPO_H: the loop whose groups D holds
_ALGO_NAMES = {"grpo": "GRPO", "ppo": "PPO", "gigpo": "GiGPO"}


def _read(path: str) -> Optional[str]:
  """The text of ``path``, None when it does not exist."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read()


def _write(path: str, text: str) -> None:
  """``path`` := ``text`` atomically and durably (a temporary, fsynced, then
  a rename): after a power loss the file holds ``text`` or is absent, never
  empty (an empty ``_FROM_LOOP`` would read as a move cut short)."""
  with open(path + ".tmp", "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(path + ".tmp", path)


def _mean(xs) -> float:
  return float(np.mean(xs)) if len(xs) else 0.0


def _dense(records) -> list:
  return [r.dense_reward for r in records if np.isfinite(r.dense_reward)]


class _NoMetrics:
  """The metrics writer of a non-leader host: writes nothing."""

  def write(self, step: int, phase: str, metrics: dict) -> None:
    del step, phase, metrics

  def close(self) -> None:
    pass


def progress_counts(a_total: int, a_done: int, phase: str, k: int,
                    b_steps: int) -> tuple[int, int]:
  """(total, done) of the run's progress bar, counting B's steps beside
  A's: every loop of k A steps (the last may be shorter) has ``b_steps``
  B steps first (k; 0 without B). B's phase of the loop A is in is done
  when ``phase`` is "A"; a resume redoes an unfinished one."""
  loops = -(-a_total // k)
  loops_b_done = -(-a_done // k) + (phase == "A" and a_done % k == 0)
  return (a_total + loops * b_steps,
          a_done + min(loops_b_done, loops) * b_steps)


def _progress(a_total: int, a_done: int, phase: str, k: int, b_steps: int,
              enabled: bool, name: str):
  from tqdm.auto import tqdm

  total, done = progress_counts(a_total, a_done, phase, k, b_steps)
  what = "B and A steps" if b_steps else "A steps"
  return tqdm(total=total, initial=done, desc=f"{name} ({what})",
              disable=not enabled, dynamic_ncols=True)
