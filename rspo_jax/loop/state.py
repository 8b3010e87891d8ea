"""What a resumed run restores besides the learners: ``LoopState``.

A checkpoint is written after B's collection is complete, after every
``train.checkpoint_every``-th A step and after each loop's (and the
run's) last A step, in the background (checkpoint.py); a run killed
anywhere restarts from the last complete one and redoes the steps after
it (B's phase is redone from A when it was interrupted; B is never
checkpointed).

Besides D, the loop keeps A's groups of the loop on disk (array-record
shards): RSPO_H's next D (``<workdir>/replay_next``, history.py) and,
with ``rspo.prm_refresh_loops``, the PRM's next training trajectories
(``<workdir>/prm_recent``, prm_refresh.py); those written after the
restored checkpoint are dropped on resume (``drop_unsaved_shards``: their
steps are redone). What a loop's end changes on disk (D cleared or,
RSPO_H, replaced by ``replay_next``; ``prm_recent`` cleared) waits until
the loop's checkpoint is written; a resume at a loop's start finishes it
when it was cut short (``RSPOTrainer._after_loop_saved``).
"""

from __future__ import annotations

import dataclasses
import logging
import os

import jax

from rspo_jax import distributed, replay
from rspo_jax.checkpoint import RunCheckpointer
from rspo_jax.loop.collection import TRAJS_PER_COLLECTION

log = logging.getLogger(__name__)


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


def fingerprint(cfg, params) -> dict:
  """What a checkpoint must match to be restored into this run."""
  return {
      "model": cfg.model.preset,
      "algo": cfg.algo.name,
      "env": cfg.env.name,
      "rspo": bool(cfg.rspo.enabled),
      "n_params": int(sum(x.size for x in jax.tree.leaves(params))),
  }


def checkpoint_step(state: LoopState) -> int:
  """Orbax steps must increase: one checkpoint per (A step, phase)."""
  return state.a_steps * 2 + (1 if state.phase == "A" else 0)


def save(
    ckpt: RunCheckpointer,
    state: LoopState,
    learner_states: dict,
    fingerprint_: dict,
) -> None:
  """``learner_states`` and ``state`` (with the run's fingerprint) as the
  checkpoint of ``state``'s (A step, phase)."""
  meta = dataclasses.asdict(state)
  meta["fingerprint"] = fingerprint_
  ckpt.save(checkpoint_step(state), learner_states, meta)


def restore(
    ckpt: RunCheckpointer, learner_states: dict, fingerprint_: dict
) -> tuple[dict, LoopState]:
  """(learner states, loop state) of the latest checkpoint."""
  states, meta = ckpt.restore(learner_states, fingerprint=fingerprint_)
  meta.pop("fingerprint", None)
  return states, LoopState(**meta)


def drop_unsaved_shards(directory: str, collections: int, leader: bool) -> None:
  """Removes the shards of ``directory`` (A's groups of the loop) written
  after the restored checkpoint, whose ``collections`` counter it holds
  (their steps are redone). A shard holds groups of one collection, whose
  trajectory ids start at ``collection * TRAJS_PER_COLLECTION``."""
  first_unsaved = (collections + 1) * TRAJS_PER_COLLECTION
  if leader:
    for path in replay.list_shards(directory):
      ids = [r.traj_id for r in replay.read_shard(path)]
      if ids and min(ids) >= first_unsaved:
        os.remove(path)
  distributed.barrier("rspo_loop_groups_trimmed")


def count_non_finite(
    state: LoopState, metrics: dict, max_bad_steps: int, checkpoint_dir: str
) -> None:
  """``state.bad_steps``: consecutive updates skipped as non-finite
  (``metrics["skipped"]``); ``FloatingPointError`` at ``max_bad_steps``."""
  if metrics.get("skipped", 0.0) > 0:
    state.bad_steps += 1
    log.warning("non-finite update skipped (%d in a row)", state.bad_steps)
    if state.bad_steps >= max_bad_steps:
      raise FloatingPointError(
          f"{state.bad_steps} consecutive non-finite updates; the last"
          f" good checkpoint is kept in {checkpoint_dir}"
      )
  else:
    state.bad_steps = 0
