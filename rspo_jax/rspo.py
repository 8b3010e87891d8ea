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

The pieces live beside this module in rspo_jax/loop/ (its docstring lists
them and says how they run across hosts): the main loop (loop/driver.py),
B's phase (loop/b_phase.py), resumption (loop/state.py), fresh
collections (loop/collection.py), the sources of D -- B's stored
collection (loop/b_store.py), decoupled B (loop/decoupled_b.py), A's
history (loop/history.py) --, A's replayed rows (loop/replay_rows.py),
overlap (loop/prefetch.py), the PRM refit (loop/prm_refresh.py), progress
and timing (loop/progress.py) and every random stream (loop/seeds.py).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Optional

import jax
import numpy as np

from rspo_jax import (
    distributed,
    faults,
    host_batches,
    preemption,
    replay,
    timing,
    update,
)
from rspo_jax.checkpoint import RunCheckpointer
from rspo_jax.learner import Learner
from rspo_jax.loop import b_phase as b_phase_lib
from rspo_jax.loop import b_store, collection, driver
from rspo_jax.loop import prefetch as prefetch_lib
from rspo_jax.loop import progress as progress_lib
from rspo_jax.loop import replay_rows, seeds
from rspo_jax.loop import state as state_lib
from rspo_jax.loop.collection import Collector, DenseFn
from rspo_jax.loop.decoupled_b import DecoupledB, check_one_process
from rspo_jax.loop.history import FROM_LOOP, History
from rspo_jax.loop.prefetch import NextCollection
from rspo_jax.loop.prm_refresh import PrmRefresh
from rspo_jax.loop.progress import progress_counts
from rspo_jax.loop.state import LoopState
from rspo_jax.metrics import MetricsWriter
from rspo_jax.rollout.engine import Engine
from rspo_jax.types import POLICY_A

# LoopState, progress_counts, FROM_LOOP and DenseFn keep their old home.
__all__ = [
    "RSPOTrainer",
    "LoopState",
    "DenseFn",
    "FROM_LOOP",
    "progress_counts",
]

log = logging.getLogger(__name__)


def _owned_by(piece: str, name: str, doc: str) -> property:
  """A trainer attribute that lives on its piece ``piece`` as ``name``."""
  return property(
      lambda self: getattr(getattr(self, piece), name),
      lambda self, v: setattr(getattr(self, piece), name, v),
      doc=doc,
  )


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
    self.leader = self.process_index == 0
    self.progress = progress and self.leader
    self._bar = None  # run()'s progress bar, which B's steps advance too
    check_one_process(cfg, self.multihost)
    prefetch_lib.check_overlap(cfg, self.multihost, policy)
    # policy=None: a collect-only trainer (rows are never batched for A).
    row_ways = policy.row_ways if policy is not None else 1
    self.batches = host_batches.HostBatches(
        cfg, self.multihost, row_ways=row_ways
    )
    # Wall seconds by phase, written as one "time" record per A step.
    self.timer = timing.PhaseTimer(count_compiles=True)
    # Per-host draws (noise, row subsets): seeds.host_rng.
    host = self.process_index if self.multihost else None
    self.updater = update.StepUpdater(
        cfg,
        self.batches,
        functools.partial(seeds.host_rng, cfg.seed, host),
        self.timer,
    )
    self.collector = Collector(
        cfg,
        engine=engine,
        venv=venv,
        tokenizer=tokenizer,
        num_train_tasks=num_train_tasks,
        process_index=host,
    )
    self.next_a = NextCollection(cfg, self.collector, self.updater, self.timer)
    self.decoupled_b = DecoupledB(cfg, workdir, self.collector, self.updater)
    # B's first training collection of the loop (B = A), for B's lift.
    self.b_first: Optional[b_store.FirstCollection] = None
    self._b_tx, self._b_steps = None, {}  # B's own optimizer (make_b)
    self.state = LoopState()
    # One shard-name prefix per host: hosts write D side by side.
    self.shard_prefix = (
        f"p{self.process_index:05d}" if self.multihost else "shard"
    )
    self.buffer = replay.ReplayBuffer(
        os.path.join(workdir, "replay"), prefix=self.shard_prefix
    )  # D
    self.history = History(workdir, self.shard_prefix, self.leader)
    self.prm = PrmRefresh(cfg, workdir, self.shard_prefix, self.leader)
    self.ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"))
    self.metrics = (
        MetricsWriter(workdir) if self.leader else progress_lib.NoMetrics()
    )
    # Set by SIGTERM once launch/train.py installs it (preemption.py).
    self.stop = preemption.StopRequest()

  # ------------------------------------------------------------ what runs
  @property
  def k(self) -> int:
    return self.cfg.rspo.k

  @property
  def run_name(self) -> str:
    """What this run trains, for people: 'RSPO+GRPO', 'GiGPO', ..."""
    return progress_lib.run_name(self.cfg)

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
    return self.uses_b or self.history_source or self.prm.enabled

  # The pieces' parts that build.py and tests set or read on the trainer.
  prefetch = _owned_by(
      "next_a", "pending", "Overlap: A's next collection, during A's update."
  )
  b_rollout = _owned_by(
      "decoupled_b", "rollout", "Decoupled: B's own (engine, venv, tokenizer)."
  )
  b_job = _owned_by(
      "decoupled_b", "job", "Decoupled: B's running stored collection."
  )
  prm_refresh = _owned_by(
      "prm", "refit", "The PRM refit: records -> a dense reward fn."
  )
  collect = _owned_by(
      "collector",
      "collect",
      "rollout/collect.py's or" " unbarriered.py's collection function.",
  )

  # ------------------------------------------------------------ resume
  def fingerprint(self) -> dict:
    return state_lib.fingerprint(self.cfg, self.a.params)

  def _states(self) -> dict:
    states = {"policy": self.a.state}
    if self.critic is not None:
      states["critic"] = self.critic.state
    return states

  def save(self) -> None:
    state_lib.save(self.ckpt, self.state, self._states(), self.fingerprint())

  def try_resume(self) -> bool:
    """The latest checkpoint restored (False: none); the loop's groups on
    disk trimmed to it, a loop's end cut short finished, B's phase redone
    when its stored collection is incomplete."""
    if self.ckpt.latest_step() is None:
      return False
    states, self.state = state_lib.restore(
        self.ckpt, self._states(), self.fingerprint()
    )
    self.a.state = states["policy"]
    if self.critic is not None:
      self.critic.state = states["critic"]
    if self.history_source:
      self.history.drop_unsaved(self.state.collections)
    if self.prm.enabled:
      self.prm.drop_unsaved(self.state.collections)
    if self.state.phase == "B":  # a loop's start: its end may be cut short
      self._after_loop_saved()
    stored = (
        self.decoupled_b.directory if self.decoupled else self.buffer.directory
    )
    if (
        self.state.phase == "A"
        and self.uses_b
        and not replay.is_complete(stored)
    ):
      log.warning("replay buffer incomplete at resume: redoing B's phase")
      self.state.phase = "B"
    log.info("resumed from checkpoint: %s", self.state)
    return True

  # ------------------------------------------------------------ collection
  def collect_groups(
      self,
      learner: Learner,
      n_groups: int,
      tag: str,
      share: Optional[tuple[int, int]] = None,
      replay_of: Optional[tuple[list, int]] = None,
  ):
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
    self._sync(learner, s.collections)
    task_ids, seed_of = self.collector.draw(n_groups, s.collections, replay_of)
    first, last = share or distributed.host_share(len(task_ids))
    records, rounds = self._play(
        task_ids, first, last, seed_of, s.collections, tag, self.timer
    )
    return self._collected(records, rounds, task_ids, tag)

  def _sync(self, learner: Learner, collection: int) -> None:
    with self.timer.phase("weight_sync"):
      self.sync_engine(self.engine, learner, collection)

  def _play(self, *args):
    """``Collector.play`` (tests replace it here)."""
    return self.collector.play(*args)

  def _collected(self, records: list, rounds: list, task_ids, tag: str):
    return self.collector.finish(
        records, rounds, task_ids, tag, self.state, self.dense_fn
    )

  def _start_prefetch(self, n_groups: int) -> None:
    """Overlap: A's next collection starts on A's weights now."""
    self.next_a.start(
        self.a, n_groups, self.state, sync=self._sync, play=self._play
    )

  def _take_prefetch(self, n_groups: int):
    """The prefetched collection: ``collect_groups``'s result, and the A
    steps its weights lag behind A's now."""
    records, rounds, task_ids, lag = self.next_a.take(n_groups, self.state)
    return (*self._collected(records, rounds, task_ids, POLICY_A), lag)

  # ------------------------------------------------------------ updates
  def update(
      self,
      learner: Learner,
      critic: Optional[Learner],
      on: list,
      off: list,
      source: str,
      step_key: int,
      off_adv: Optional[np.ndarray] = None,
      stale_on: bool = False,
  ) -> dict:
    """One training step of ``learner`` on fresh (``on``) + replayed
    (``off``, advantages ``off_adv`` or None: PPO's GAE at the step)
    records: ``update.StepUpdater.step``, then the non-finite check.

    Multi-host: ``on`` and ``off`` are this host's records (whole fresh
    groups); every host calls this together. ``stale_on``: ``on`` was
    collected by earlier weights (``rollout.overlap``).
    """
    m = self.updater.step(
        learner,
        critic,
        on,
        off,
        source,
        step_key,
        ref_params=self.ref_params,
        off_adv=off_adv,
        dense_noise_sigma=self.dense_noise_sigma,
        dense_scale=self.cfg.rspo.dense_scale,
        stale_on=stale_on,
        sampled_old=collection.sampled_old(self.cfg),
    )
    if "updates" in m:  # the non-finite check (loop/state.py)
      state_lib.count_non_finite(
          self.state, m, self.cfg.train.max_bad_steps, self.ckpt.directory
      )
    return m

  @property
  def dense_noise_sigma(self) -> float:
    """``rspo.dense_noise_sigma`` in the units of the stored dense rewards.
    sigma is given in the PRM's tanh units (the paper's); a PRM's rewards
    are ``r_hat / reward_scale`` (``fn.tanh_unit = 1 / reward_scale``);
    the environments' progress and user functions: sigma as given."""
    return self.cfg.rspo.dense_noise_sigma * getattr(
        self.dense_fn, "tanh_unit", 1.0
    )

  # ------------------------------------------------------------ B phase
  def b_phase(self) -> None:
    """B's phase (loop/b_phase.py)."""
    b_phase_lib.run(self)

  def make_b(self) -> Learner:
    """B := copy(A) (loop/b_phase.py)."""
    return b_phase_lib.make_b(self)

  def store_replay(self, b: Learner) -> None:
    """Swap and store: B's stored collection into D (loop/b_store.py)."""
    b_store.store(
        self.cfg,
        b,
        self.b_first,
        collect_groups=self.collect_groups,
        updater=self.updater,
        buffer=self.buffer,
        metrics=self.metrics,
        state=self.state,
        leader=self.leader,
        multihost=self.multihost,
    )

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
    if history and c.rspo.recompute_behavior_logp and not lag:  # RSPO_H:
      # D gets A's learner's log-probs too (prefetched rows have them)
      self.updater.recompute_behavior_logp(self.a, on)
    source = "dense" if c.rspo.dense_only else "outcome"
    if self.next_a.due(self.state.a_steps, self.k):
      self._start_prefetch(n_on)
    m = self.update(
        self.a,
        self.critic,
        on,
        off,
        source,
        step_key=seeds.a_step_key(self.state.a_steps),
        off_adv=off_adv,
        stale_on=lag > 0,
    )
    faults.maybe_fail("a_phase")
    if history:
      self.history.add(on)
    if self.prm.enabled:
      self.prm.add(on)
    return progress_lib.a_step_report(
        m,
        c,
        stats,
        on,
        env_steps=self.state.env_steps,
        multihost=self.multihost,
        b_logp_gap=self.decoupled_b.logp_gap,
        lag=lag,
        overlap_seconds=self.next_a.seconds,
    )

  def replay_counts(self) -> tuple[int, int]:
    """(n_off replayed trajectories, n_on fresh groups) of A's step
    (``replay_rows.counts``); D is empty in RSPO_H's first loop."""
    c = self.cfg
    d_empty = (
        c.rspo.enabled
        and not (self.decoupled and self.uses_b)
        and self.buffer.num_trajectories == 0
    )
    return replay_rows.counts(c, d_empty)

  def replayed(self, n_off: int):
    """This host's replayed records of A's step and their advantages
    against their whole group of D (``replay_rows.draw``)."""
    if not n_off:
      return [], None
    return replay_rows.draw(
        self.cfg, self._replay_source(n_off), n_off, self.state
    )

  def _replay_source(self, n_off: int) -> list:
    """D's trajectories: the buffer, or (decoupled) the groups B has
    written so far, once enough exist for ``n_off`` unused ones."""
    if not (self.decoupled and self.uses_b):
      return self.buffer.trajectories()
    return self.decoupled_b.trajectories(
        n_off, len(self.state.replay_used), self.state.a_steps, self.k
    )

  # ------------------------------------------------------------ loop's end
  def end_loop(self) -> None:
    """The loop's end in memory: B's decoupled collection joined (B's
    lift logged), the next loop's B phase due, D's used set emptied, the
    PRM refit when due. On disk: ``_after_loop_saved``."""
    first = self.b_first
    self.decoupled_b.end(
        first.stats["success"] if first else None, self.metrics, self.state
    )
    self.b_first = None
    s = self.state
    s.loop += 1
    s.phase = "B"
    s.replay_used = []  # D is cleared (RSPO_H: replaced)
    self.decoupled_b.reset()
    if self.prm.due(s.loop):
      self.dense_fn = self.prm.refitted()

  def _after_loop_saved(self) -> None:
    """A loop's end on disk, once its checkpoint is written (a crash
    before then redoes the loop's last steps with D and the loop's groups
    as they were); done again on a resume at a loop's start: D cleared
    (RSPO_H: replaced by A's groups of the loop that ended), the PRM's
    trajectories cleared."""
    if self.uses_b and self.leader:
      self.buffer.clear()
      self.decoupled_b.clear()
    if self.history_source:
      self.buffer = self.history.becomes_d(self.buffer, self.state.loop)
    if self.prm.enabled:
      self.prm.clear()

  # ------------------------------------------------------------ main loop
  def run(self, evaluate: Optional[Callable[[Learner, int], dict]] = None):
    """The loop until A's last step (loop/driver.py); the final state."""
    return driver.run(self, evaluate)

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
