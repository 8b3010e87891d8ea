"""B's stored collection: B plays, log pi_B is recomputed, the reward is
swapped to the outcome reward and the groups are written to D.

B's lift is measured on the way: its first training collection of the
loop (B = A, ``FirstCollection``) against its stored collection (after
its k steps), on the same tasks and sampling seeds unless
``rspo.b_lift_tasks='fresh'``.

Multi-host: each host writes its share of the groups as shards named
``p<process index>-...`` in the shared ``<workdir>/replay``; after a
barrier the leader marks D complete and writes B_collect's metrics.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from rspo_jax import distributed, faults, replay, update
from rspo_jax.learner import Learner
from rspo_jax.loop import host_stats
from rspo_jax.types import POLICY_B, group_trajectories


@dataclasses.dataclass
class FirstCollection:
  """B's first training collection of a loop (B = A): the start of its
  lift."""

  task_ids: list
  collection: int  # its number: its sampling seeds
  stats: dict  # host_stats.play_stats
  wins_by_task: list  # host_stats.wins_by_task, in task_ids' order


def first_collection(
    records, stats: dict, collection: int, multihost: bool
) -> FirstCollection:
  """``FirstCollection`` of B's first training collection (``records``,
  its statistics ``stats``, number ``collection``)."""
  return FirstCollection(
      stats["task_ids"],
      collection,
      host_stats.play_stats(records, multihost),
      host_stats.wins_by_task(records, stats["task_ids"], multihost),
  )


def replay_of(
    cfg, first: Optional[FirstCollection]
) -> Optional[tuple[list, int]]:
  """The tasks and seeds B's stored collection replays: those of its
  first training collection (``rspo.b_lift_tasks='first'``), or None (a
  fresh draw)."""
  if first is None or cfg.rspo.b_lift_tasks != "first":
    return None
  return first.task_ids, first.collection


def lift(first: FirstCollection, stored: dict) -> dict:
  """B's lift over its phase: ``stored`` (``host_stats.play_stats`` of
  its stored collection) against its first training collection."""
  out = {f"b_first_{k}": v for k, v in first.stats.items()}
  out.update({f"b_stored_{k}": v for k, v in stored.items()})
  out.update({f"b_lift_{k}": stored[k] - first.stats[k] for k in stored})
  return out


def store(
    cfg,
    b: Learner,
    first: Optional[FirstCollection],
    *,
    collect_groups: Callable,
    updater: update.StepUpdater,
    buffer: replay.ReplayBuffer,
    metrics,
    state,
    leader: bool,
    multihost: bool,
) -> None:
  """B plays ``batch_tasks`` groups (``collect_groups``, on the tasks of
  its first training collection: ``replay_of``); B's learner recomputes
  log pi_B of their tokens (``rspo.recompute_behavior_logp``); B's lift is
  logged; each trajectory's reward is swapped to the outcome reward; D
  (``buffer``) is written and marked complete."""
  again = replay_of(cfg, first)
  stored, stats = collect_groups(
      b, cfg.train.batch_tasks, POLICY_B, replay_of=again
  )
  extra = {}
  if first is not None:
    extra.update(lift(first, host_stats.play_stats(stored, multihost)))
    if again is not None:  # the same tasks: paired
      extra["b_first_wins_by_task"] = first.wins_by_task
      extra["b_stored_wins_by_task"] = host_stats.wins_by_task(
          stored, first.task_ids, multihost
      )
  if cfg.rspo.recompute_behavior_logp:
    extra["behavior_logp_max_gap"] = updater.recompute_behavior_logp(b, stored)
  for r in stored:  # the reward swap: outcome reward only, never dense
    r.dense_reward = float("nan")
  buffer.add_trajectories(group_trajectories(stored))
  faults.maybe_fail("collect")
  distributed.barrier("rspo_replay_written")  # every host's shards closed
  if leader:
    replay.mark_complete(buffer.directory)
    bstats = buffer.stats()
    if multihost:
      bstats["shards_by_host"] = buffer.shards_by_prefix()
    metrics.write(
        state.a_steps,
        "B_collect",
        {
            "loop": state.loop,
            **{f"rollout_{k}": v for k, v in stats.items()},
            **{
                f"buffer_{k}": v
                for k, v in bstats.items()
                if isinstance(v, (int, float, dict))
            },
            **extra,
        },
    )
