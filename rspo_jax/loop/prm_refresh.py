"""The PRM refit (``rspo.dense_reward=prm``, ``rspo.prm_refresh_loops=N``):
every N loops the PRM head is fitted again on A's trajectories of the
loop (their outcome rewards) and becomes the dense reward.

Multi-host: every host writes its share of A's groups to the shared
``<workdir>/prm_recent``; after a barrier the leader alone reads them
all and fits the head, and each host scores its own records with it on
its own devices (``build.make_prm_refresh``).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from rspo_jax import distributed, replay
from rspo_jax.loop import state as state_lib
from rspo_jax.loop.collection import DenseFn
from rspo_jax.types import group_trajectories


class PrmRefresh:
  """A's trajectories of the loop (``recent``) and the refit (``refit``:
  records -> the new dense reward function; None: never refit, set by
  build.py)."""

  def __init__(self, cfg, workdir: str, prefix: str, leader: bool):
    self.cfg, self.prefix, self.leader = cfg, prefix, leader
    self.refit: Optional[Callable[[list], DenseFn]] = None
    self.recent = replay.ReplayBuffer(
        os.path.join(workdir, "prm_recent"), prefix=prefix
    )

  @property
  def enabled(self) -> bool:
    return self.refit is not None

  def add(self, records: list) -> None:
    """A's fresh step rows of the loop."""
    self.recent.add_trajectories(group_trajectories(records))

  def due(self, loop: int) -> bool:
    """Whether the PRM is refit as loop ``loop`` starts."""
    every = self.cfg.rspo.prm_refresh_loops
    return self.enabled and bool(every) and loop % every == 0

  def refitted(self) -> DenseFn:
    """The dense reward function of the PRM refit on A's trajectories of
    the loop: every host's, written to the shared ``prm_recent``, read by
    the leader."""
    distributed.barrier("rspo_prm_recent")
    return self.refit(self.recent.records() if self.leader else [])

  def clear(self) -> None:
    """The loop's end on disk: its trajectories cleared (by the leader)."""
    if self.leader:
      self.recent.clear()

  def drop_unsaved(self, collections: int) -> None:
    """Resume: the groups written after the restored checkpoint dropped
    (``state.drop_unsaved_shards``)."""
    state_lib.drop_unsaved_shards(
        self.recent.directory, collections, self.leader
    )
    self.recent = replay.ReplayBuffer(self.recent.directory, prefix=self.prefix)
