"""Decoupled placement (``rollout.placement='decoupled'``): B's stored
collection on B's own engine, beside A's phase.

B's stored groups are played on B's own (engine, environments,
tokenizer) in a background thread, their log pi_B recomputed by B's
learner there, and written group by group to ``<workdir>/replay_b``
(decoupled.py); A's steps replay the groups written so far. The job ends
with its loop (``end``), where B's lift is logged. One process only.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import jax

from rspo_jax import decoupled, timing, update
from rspo_jax.learner import Learner
from rspo_jax.loop import host_stats, seeds
from rspo_jax.loop.collection import (
    GROUPS_PER_COLLECTION,
    TRAJS_PER_COLLECTION,
    Collector,
)
from rspo_jax.rollout.collect import CollectRequest
from rspo_jax.types import POLICY_B


def check_one_process(cfg, multihost: bool) -> None:
  """Decoupled placement runs in one process only."""
  if multihost and cfg.rollout.placement == "decoupled":
    raise ValueError(
        "rollout.placement='decoupled' runs in one process only; with"
        f" {jax.process_count()} processes use 'colocated'"
    )


class DecoupledB:
  """B's own rollout (``rollout``: (engine, venv, tokenizer), set by
  build.py), its running collection (``job``) and what it wrote."""

  def __init__(
      self, cfg, workdir: str, collector: Collector, updater: update.StepUpdater
  ):
    self.cfg, self.collector, self.updater = cfg, collector, updater
    self.rollout = None
    self.job: Optional[decoupled.BackgroundCollection] = None
    self.directory = os.path.join(workdir, "replay_b")
    self._cache: dict = {}  # shard path -> records
    self.logp_gap: Optional[float] = None  # B's largest so far

  def start(
      self,
      b: Learner,
      state,
      *,
      sync_engine: Callable[[object, Learner, int], None],
      replay_of: Optional[tuple[list, int]],
  ) -> None:
    """B's stored collection (``batch_tasks`` groups; the tasks and seeds
    of ``replay_of``, else a fresh draw) started in the background on
    B's engine, with B's weights (``sync_engine``)."""
    engine, venv, tokenizer = self.rollout
    state.collections += 1
    sync_engine(engine, b, state.collections)
    tasks, seed_of = self.collector.draw(
        self.cfg.train.batch_tasks, state.collections, replay_of
    )
    request = CollectRequest(
        [int(t) for t in tasks],
        self.cfg.train.group_size,
        self.collector.sampling,
        policy_tag=POLICY_B,
        traj_id_start=state.collections * TRAJS_PER_COLLECTION,
        group_id_start=state.collections * GROUPS_PER_COLLECTION,
        seed=seeds.sampling_seed(self.cfg.seed, seed_of),
    )
    groups = decoupled.collect_b_groups(
        engine, venv, tokenizer, request, self.collector.collect_cfg
    )
    if self.cfg.rspo.recompute_behavior_logp:
      self.logp_gap = 0.0
      groups = self._recomputed(b, groups)
    self.job = decoupled.start_collection(groups, self.directory)

  def _recomputed(self, b: Learner, groups):
    """``groups`` with log pi_B from B's learner (runs in B's thread)."""
    b_timer = timing.PhaseTimer()  # this thread's own (timing.py)
    for records in groups:
      gap = self.updater.recompute_behavior_logp(b, records, b_timer)
      self.logp_gap = max(self.logp_gap, gap)
      yield records

  def trajectories(self, n_off: int, n_used: int, a_steps: int, k: int) -> list:
    """D's trajectories: the groups B has written so far, once enough
    exist for ``n_off`` unused ones (``n_used`` replayed already) at A's
    step after ``a_steps``."""
    if self.job is not None:
      # A's step at position p of the loop ranks at least (p + 1) / k of
      # B's groups (waiting for only the groups it draws would rank the
      # first ceil(n_off / G) finished groups, whatever their wins).
      g = self.cfg.train.group_size
      tasks, pos = self.cfg.train.batch_tasks, a_steps % k
      need = min(
          tasks, max(-(-(n_used + n_off) // g), -(-tasks * (pos + 1) // k))
      )
      self.job.wait_for_groups(need, self.cfg.rollout.decoupled_timeout_s)
    return decoupled.read_trajectories(self.directory, self._cache)

  def end(self, first_success: Optional[float], metrics, state) -> None:
    """The loop's end: B's collection must end with it; B's lift (from
    ``first_success``, its first training collection's success rate) is
    logged once the dense rewards are swapped out."""
    if self.job is None:
      return
    self.job.join(self.cfg.rollout.decoupled_timeout_s)
    self.job = None
    if first_success is not None:
      won = [
          t.steps[-1].won
          for t in decoupled.read_trajectories(self.directory, self._cache)
      ]
      stored = host_stats.mean(won)
      metrics.write(
          state.a_steps,
          "B_collect",
          {
              "loop": state.loop,
              "b_first_success": first_success,
              "b_stored_success": stored,
              "b_lift_success": stored - first_success,
          },
      )

  def reset(self) -> None:
    """A new loop: nothing of B's last collection is cached."""
    self._cache, self.logp_gap = {}, None

  def clear(self) -> None:
    """``replay_b`` emptied (the loop's end on disk)."""
    decoupled.clear(self.directory)
