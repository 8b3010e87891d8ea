"""Fresh groups for the loop: draw the tasks, play them, finish them.

A collection is numbered (``LoopState.collections``); its number fixes
its tasks (seeds.task_rng), its sampling seeds and its ids: trajectory
ids from ``collection * TRAJS_PER_COLLECTION``, group ids from
``collection * GROUPS_PER_COLLECTION``. ``n_groups`` tasks are drawn for
the whole job; on a multi-host run process ``p`` plays the groups
``distributed.host_share`` gives it (with globally unique ids) and the
statistics are summed over hosts.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from rspo_jax import distributed, timing
from rspo_jax.loop import seeds
from rspo_jax.rollout import collect as collect_lib
from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect
from rspo_jax.rollout.engine import Engine, SamplingParams
from rspo_jax.rollout.unbarriered import collect_unbarriered
from rspo_jax.types import POLICY_B, StepRecord

# Trajectory / group ids of collection c start at c times these.
TRAJS_PER_COLLECTION = 100_000
GROUPS_PER_COLLECTION = 1_000

DenseFn = Callable[[list[StepRecord]], None]  # fills r.dense_reward in place


def collect_config(cfg) -> CollectConfig:
  """How the loop's episodes are played (the environment's side)."""
  return CollectConfig(
      env_name=cfg.env.name,
      max_steps=cfg.env.max_steps,
      history_length=cfg.env.history_length,
      max_prompt_tokens=cfg.rollout.max_prompt_tokens,
      invalid_action_penalty=cfg.algo.invalid_action_penalty,
      split=cfg.env.train_split,
  )


def sampling_params(cfg) -> SamplingParams:
  """How the loop's actions are sampled (the engine's side)."""
  return SamplingParams(
      temperature=cfg.rollout.temperature,
      top_p=cfg.rollout.top_p,
      max_new_tokens=cfg.rollout.max_new_tokens,
      stop_strings=("</action>",),
  )


def sampled_old(cfg) -> bool:
  """Fresh rows take pi_old from their sampling log-probs (update.py):
  the in-process engine, synced to the learner's weights before each
  collection, and ``algo.recompute_old_logprobs`` False. SGLang's
  log-probs come from other kernels on an exported copy: recomputed."""
  return cfg.rollout.engine == "jax" and not cfg.algo.recompute_old_logprobs


class Collector:
  """Draws, plays and finishes the loop's collections on one engine."""

  def __init__(
      self,
      cfg,
      *,
      engine: Engine,
      venv,
      tokenizer,
      num_train_tasks: int,
      process_index: Optional[int],
  ):
    """``process_index``: this host's, None on a one-process run."""
    self.cfg, self.engine, self.venv = cfg, engine, venv
    self.tokenizer, self.num_train_tasks = tokenizer, num_train_tasks
    self.process_index = process_index
    self.collect_cfg = collect_config(cfg)
    # rollout.turn_barriers=False (SGLang): each episode on its own.
    self.collect = collect if cfg.rollout.turn_barriers else collect_unbarriered
    self.sampling = sampling_params(cfg)

  def draw(
      self,
      n_groups: int,
      collection: int,
      replay_of: Optional[tuple[list, int]] = None,
  ):
    """(task ids, seed number) of collection number ``collection``;
    ``replay_of = (task_ids, collection)`` replays an earlier one's."""
    if replay_of is not None:
      return np.asarray(replay_of[0]), replay_of[1]
    rng = seeds.task_rng(self.cfg.seed, collection)
    return (
        rng.choice(self.num_train_tasks, size=n_groups, replace=False),
        collection,
    )

  def play(
      self,
      task_ids,
      first: int,
      last: int,
      seed_of: int,
      collection: int,
      tag: str,
      timer: timing.PhaseTimer,
  ):
    """(records, each round's statistics) of this host's groups
    ``[first, last)`` of ``task_ids``; touches no loop state, so it may
    run in another thread (overlap.py) with that thread's ``timer``."""
    g = self.cfg.train.group_size
    seed = seeds.host_sampling_seed(self.cfg.seed, seed_of, self.process_index)
    mine = [int(t) for t in task_ids[first:last]]
    # More groups than the environment pool holds (e.g. the PRM's training
    # groups) are played in rounds of as many groups as fit.
    per_round = max(1, self.venv.num_envs // g)
    records, rounds = [], []
    for c, lo in enumerate(range(0, len(mine), per_round)):
      request = CollectRequest(
          mine[lo : lo + per_round],
          g,
          self.sampling,
          policy_tag=tag,
          traj_id_start=(collection * TRAJS_PER_COLLECTION + (first + lo) * g),
          group_id_start=collection * GROUPS_PER_COLLECTION + first + lo,
          seed=seeds.round_seed(seed, c),
      )
      got, stats = self.collect(
          self.engine,
          self.venv,
          self.tokenizer,
          request,
          self.collect_cfg,
          timer=timer,
      )
      records += got
      rounds.append(stats)
    return records, rounds

  def finish(
      self,
      records: list,
      rounds: list,
      task_ids,
      tag: str,
      state,
      dense_fn: Optional[DenseFn],
  ):
    """A collection's (records without failed episodes, statistics of all
    hosts): failures checked, environment steps counted in ``state``,
    dense rewards filled by ``dense_fn`` where they are used (B's rows,
    or every row with ``rspo.dense_only``)."""
    stats = (
        collect_lib.combine_rounds(rounds)
        if rounds
        else collect_lib.empty_stats()
    )
    if self.process_index is not None:
      stats = collect_lib.combine_stats(distributed.allgather_objects(stats))
    collect_lib.check_failures(
        stats,
        self.cfg.rollout.max_failed_episode_frac,
        self.cfg.env.name,
        getattr(self.venv, "first_error", None),
    )
    state.env_steps += stats["env_steps"]
    stats["task_ids"] = [int(t) for t in task_ids]
    records = [r for r in records if not r.failed]
    if (
        dense_fn is not None
        and records
        and (tag == POLICY_B or self.cfg.rspo.dense_only)
    ):
      dense_fn(records)  # e.g. PRM scores replace env progress
    return records, stats
