"""Overlap (``rollout.overlap=1``): A's next collection, played during A's
update.

Step t + 1's fresh groups are played in a background thread on A's
weights of step t while step t's update runs (overlap.py has the thread
and the reasoning); their clip window is centred on pi_old / pi_behaviour
(one A step stale), never across a B phase or, with RSPO, a loop's end.
The collection's number is counted, its failures checked and its
environment steps added when A's step takes the rows (``take``), so a
checkpoint written meanwhile holds the state without it.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax

from rspo_jax import distributed, overlap, timing, update
from rspo_jax.learner import Learner
from rspo_jax.loop.collection import Collector
from rspo_jax.types import POLICY_A


def check_overlap(cfg, multihost: bool, policy: Optional[Learner]) -> None:
  """Overlap runs in one process only, on a mesh whose collectives the
  thread cannot deadlock (``plan.overlap_problem``)."""
  overlap_on = bool(cfg.rollout.overlap)
  if multihost and overlap_on:
    raise ValueError(
        "rollout.overlap=1 runs in one process only; with"
        f" {jax.process_count()} processes use rollout.overlap=0"
    )
  if overlap_on and policy is not None:  # plan.resolve_run checks too
    from rspo_jax import plan  # pylint: disable=g-import-not-at-top
    from rspo_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top

    problem = plan.overlap_problem(cfg, {"mesh": dict(policy.mesh.shape)})
    if problem:
      raise ConfigError(problem)


class NextCollection:
  """A's prefetched next collection (``pending``) and its thread's seconds
  by phase (``seconds``)."""

  def __init__(
      self,
      cfg,
      collector: Collector,
      updater: update.StepUpdater,
      timer: timing.PhaseTimer,
  ):
    self.cfg, self.collector, self.updater = cfg, collector, updater
    self.timer = timer
    self.pending: Optional[overlap.Prefetch] = None
    self.seconds: dict = {}

  @property
  def enabled(self) -> bool:
    return bool(self.cfg.rollout.overlap)

  def due(self, a_steps: int, k: int) -> bool:
    """Whether A's next step may start collecting now, during the update
    of A's step after ``a_steps``: a next A step exists and no loop ends
    between (with RSPO, B's phase and D's change come there; the baseline
    has neither)."""
    c, done = self.cfg, a_steps + 1  # once this step is taken
    if not self.enabled or done >= c.train.total_steps:
      return False
    return done % k != 0 or not c.rspo.enabled

  def start(
      self,
      learner: Learner,
      n_groups: int,
      state,
      *,
      sync: Callable[[Learner, int], None],
      play: Callable,
  ) -> None:
    """A's next collection of ``n_groups`` groups on ``learner``'s weights
    now (``sync`` puts them on the engine), played by ``play`` (as
    ``Collector.play``) in a background thread; with
    ``rspo.recompute_behavior_logp`` its behaviour log-probs are
    recomputed there by A's learner on a snapshot of these weights (the
    update donates the learner's)."""
    collection = state.collections + 1  # taken by take()
    sync(learner, collection)
    task_ids, seed_of = self.collector.draw(n_groups, collection)
    first, last = distributed.host_share(len(task_ids))
    snapshot = (
        learner.frozen_params()
        if self.cfg.rspo.recompute_behavior_logp
        else None
    )

    def play_and_recompute(timer):
      records, rounds = play(
          task_ids, first, last, seed_of, collection, POLICY_A, timer
      )
      if snapshot is not None:
        self.updater.recompute_behavior_logp(
            learner,
            [r for r in records if not r.failed],
            timer,
            params=snapshot,
        )
      return records, rounds

    self.pending = overlap.Prefetch(
        play_and_recompute,
        weights_step=state.a_steps,
        collection=collection,
        task_ids=task_ids,
    )

  def take(self, n_groups: int, state):
    """The prefetched collection (waiting for it) as (records, each
    round's statistics, task ids, the A steps its weights lag behind A's
    now); ``state.collections`` counts it."""
    p, self.pending = self.pending, None
    with self.timer.phase("collect_wait"):
      records, rounds = p.result()
    if len(p.task_ids) != n_groups or p.collection != state.collections + 1:
      raise RuntimeError(
          f"the prefetched collection ({len(p.task_ids)} groups, number"
          f" {p.collection}) is not A's next ({n_groups} groups, number"
          f" {state.collections + 1})"
      )
    state.collections = p.collection
    self.seconds = p.seconds()
    return records, rounds, p.task_ids, state.a_steps - p.weights_step
