"""The RSPO replay buffer ``D`` over array-record shards.

What one step of A replays is chosen *by trajectory* in
``replay/selection.py`` (``sample_trajectories`` here); the group-level
ranking below (``sample_groups``) is kept for inspecting D:
  * ``reward``:   score(g) = mean_i R_i, highest first;
  * ``variance``: score(g) = mean_i (R_i - mean_j R_j)^2 (population
    variance), highest first;
  * ``random``:   uniform order, without replacement.
Ties are broken uniformly at random with the caller's ``np.random.Generator``.
Asking for more than exists returns everything there is, in strategy order.

Episode identity: ``traj_id`` must be unique among the trajectories in one
buffer, and ``group_id`` names a group in it (the buffer is cleared every RSPO
loop, so ids of one collection suffice). ``add_trajectories`` refuses ids
already present.
"""

from __future__ import annotations

import glob
import os
from typing import Sequence

import numpy as np

from rspo_jax.replay import selection
from rspo_jax.replay.records import encode_record
from rspo_jax.replay.shards import COMPLETE_MARKER
from rspo_jax.replay.shards import ShardWriter
from rspo_jax.replay.shards import TMP_SUFFIX
from rspo_jax.replay.shards import list_shards
from rspo_jax.replay.shards import read_shard
from rspo_jax.replay.shards import recover
from rspo_jax.types import StepRecord
from rspo_jax.types import Trajectory

STRATEGIES = selection.STRATEGIES


def rank_by_score(
    scores: Sequence[float], strategy: str, rng: np.random.Generator
) -> np.ndarray:
  """Indices of ``scores`` best first; ties (and 'random') in random order.

  NaN scores rank last. ``strategy='random'`` ignores the scores.
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy {strategy!r} is not one of {STRATEGIES}")
  n = len(scores)
  perm = rng.permutation(n)
  if strategy == "random":
    return perm
  s = np.nan_to_num(np.asarray(scores, np.float64)[perm], nan=-np.inf)
  # Stable sort of a random permutation: equal scores keep a random order.
  return perm[np.argsort(-s, kind="stable")]


def group_score(rewards: Sequence[float], strategy: str) -> float:
  """The score of one group under ``strategy`` (module doc); 0 for random."""
  r = np.asarray(rewards, np.float64)
  if strategy == "reward":
    return float(r.mean())
  if strategy == "variance":
    return float(r.var())
  if strategy == "random":
    return 0.0
  raise ValueError(f"strategy {strategy!r} is not one of {STRATEGIES}")


def _check_count(n: int, what: str) -> None:
  if n < 0:
    raise ValueError(f"{what}={n} must be >= 0")


class ReplayBuffer:
  """Trajectories stored as shards in ``directory``, sampled by group.

  Closed shards are immutable, so the records read from each are cached;
  shards written by other processes into the same directory are picked up
  on the next read.

  Several writers (one per host of a multi-host run) share a directory by
  writing under their own shard-name ``prefix`` (``p00001-000000-....``);
  every reader sees every writer's closed shards. Start-up then removes
  only the stale temporaries of its own prefix; ``clear`` removes all.
  """

  def __init__(
      self,
      directory: str,
      *,
      records_per_shard: int = 256,
      prefix: str = "shard",
  ):
    self.directory = directory
    self.records_per_shard = records_per_shard
    self.prefix = prefix
    os.makedirs(directory, exist_ok=True)
    self.lost_on_start = recover(
        directory, prefix=None if prefix == "shard" else prefix
    )
    self._writer = self._new_writer()
    self._cache: dict[str, list[StepRecord]] = {}

  def _new_writer(self) -> ShardWriter:
    return ShardWriter(
        self.directory,
        prefix=self.prefix,
        records_per_shard=self.records_per_shard,
    )

  # -- writing ---------------------------------------------------------------

  def add_trajectories(self, trajectories: Sequence[Trajectory]) -> None:
    """Writes trajectories (whole, in order) and publishes their shards.

    A trajectory starts a new shard when it does not fit in the open one, so
    a shard only splits a trajectory longer than ``records_per_shard``.

    Raises:
      ValueError: empty trajectory, steps disagreeing on traj_id/group_id,
        a traj_id already in the buffer (or repeated in the call), or a
        value ``encode_record`` refuses; nothing of the call is written then.
    """
    known = {t.steps[0].traj_id for t in self.trajectories()}
    for t in trajectories:
      if not t.steps:
        raise ValueError("cannot store a trajectory without steps")
      tid, gid = t.steps[0].traj_id, t.steps[0].group_id
      bad = [
          s.step_idx for s in t.steps if s.traj_id != tid or s.group_id != gid
      ]
      if bad:
        raise ValueError(
            f"trajectory {tid}: steps {bad} have another traj_id/group_id"
        )
      if tid in known:
        raise ValueError(f"traj_id {tid} is already in the replay buffer")
      known.add(tid)
    # Encode everything first: a bad value leaves the buffer untouched.
    encoded = [[encode_record(s) for s in t.steps] for t in trajectories]
    w = self._writer
    for steps in encoded:
      if w.num_open_records and (
          w.num_open_records + len(steps) > self.records_per_shard
      ):
        w.rotate()
      for data in steps:
        w.write_encoded(data)
    w.rotate()

  def clear(self) -> None:
    """Deletes every shard (of every prefix), temporary and marker in the
    directory."""
    self._writer.close()
    for path in list_shards(self.directory):
      os.remove(path)
    for path in glob.glob(os.path.join(self.directory, "*" + TMP_SUFFIX)):
      os.remove(path)
    marker = os.path.join(self.directory, COMPLETE_MARKER)
    if os.path.exists(marker):
      os.remove(marker)
    self._cache.clear()
    self._writer = self._new_writer()

  # -- reading ---------------------------------------------------------------

  def records(self) -> list[StepRecord]:
    """All step records of the closed shards, shard by shard."""
    paths = list_shards(self.directory)
    self._cache = {p: self._cache.get(p) or read_shard(p) for p in paths}
    return [r for p in paths for r in self._cache[p]]

  def trajectories(self) -> list[Trajectory]:
    """Trajectories by ascending traj_id, steps by step_idx.

    Raises:
      ValueError: one traj_id holds the same step_idx twice (ids collide).
    """
    by_traj: dict[int, list[StepRecord]] = {}
    for r in self.records():
      by_traj.setdefault(r.traj_id, []).append(r)
    out = []
    for tid in sorted(by_traj):
      steps = sorted(by_traj[tid], key=lambda r: r.step_idx)
      idx = [s.step_idx for s in steps]
      if len(set(idx)) != len(idx):
        raise ValueError(
            f"{self.directory}: traj_id {tid} has repeated step_idx {idx}; "
            "traj_ids must be unique within a replay buffer"
        )
      out.append(Trajectory(steps))
    return out

  @property
  def num_trajectories(self) -> int:
    return len(self.trajectories())

  def groups(self) -> list[list[Trajectory]]:
    """Trajectories grouped by group_id (ascending), each by traj_id."""
    by_group: dict[int, list[Trajectory]] = {}
    for t in self.trajectories():
      by_group.setdefault(t.group_id, []).append(t)
    return [by_group[g] for g in sorted(by_group)]

  # -- sampling --------------------------------------------------------------

  def sample_groups(
      self, n_groups: int, strategy: str, rng: np.random.Generator
  ) -> list[list[Trajectory]]:
    """The first ``n_groups`` groups under ``strategy`` (module doc).

    Returns ``min(n_groups, available)`` groups, best first; the caller
    checks the count when it needs exactly ``n_groups``.
    """
    _check_count(n_groups, "n_groups")
    groups = self.groups()
    scores = [
        group_score([t.outcome_reward for t in g], strategy) for g in groups
    ]
    order = rank_by_score(scores, strategy, rng)
    return [groups[i] for i in order[:n_groups]]

  def sample_trajectories(
      self,
      n: int,
      strategy: str,
      rng: np.random.Generator,
      used: Sequence[int] = (),
      reuse: str = "wins",
  ) -> list[Trajectory]:
    """The first ``n`` trajectories under ``strategy``, best first
    (``selection.select``): 'reward' puts wins first (unused ones, then
    those in ``used``; ``reuse='pass'``: whatever is not in ``used``
    first), then the trajectory's own outcome reward; 'variance' ranks by
    the outcome-reward variance of its group; 'random' is uniform without
    replacement; both take those not in ``used`` first. Returns
    ``min(n, available)`` trajectories.
    """
    _check_count(n, "n")
    return selection.select(
        self.trajectories(), n, strategy, rng, used, reuse
    ).trajectories

  # -- reporting -------------------------------------------------------------

  def shards_by_prefix(self) -> dict[str, int]:
    """{shard-name prefix: number of closed shards} (one prefix per host
    in a multi-host run)."""
    out: dict[str, int] = {}
    for path in list_shards(self.directory):
      key = os.path.basename(path).rsplit("-", 2)[0]
      out[key] = out.get(key, 0) + 1
    return out

  def stats(self, bins: int = 10) -> dict:
    """Counts and outcome-reward summary of the stored trajectories.

    Returns a dict: num_trajectories, num_groups, num_steps, num_shards,
    mean_reward (NaN when empty), success_rate (fraction won, NaN when
    empty), reward_hist_counts / reward_hist_edges (``np.histogram`` of the
    outcome rewards with ``bins`` bins over their range).
    """
    trajs = self.trajectories()
    rewards = np.asarray([t.outcome_reward for t in trajs], np.float64)
    counts, edges = np.histogram(rewards, bins=bins)
    empty = not len(trajs)
    return {
        "num_trajectories": len(trajs),
        "num_groups": len({t.group_id for t in trajs}),
        "num_steps": sum(len(t.steps) for t in trajs),
        "num_shards": len(list_shards(self.directory)),
        "mean_reward": float("nan") if empty else float(rewards.mean()),
        "success_rate": (
            float("nan")
            if empty
            else float(np.mean([t.steps[-1].won for t in trajs]))
        ),
        "reward_hist_counts": counts.tolist(),
        "reward_hist_edges": edges.tolist(),
    }
