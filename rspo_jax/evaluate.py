"""Evaluation on a fixed split: success rate and score, per task type.

Greedy (temperature 0) or sampled decoding; several seeds give mean and
spread. Each task is played once per seed (group size 1).

``per_task`` lists every episode's outcome, one entry per (seed, task_id),
sorted by seed then task: ``{"seed", "task_id", "won" (0/1), "score"}``, so
intervals over goals and seeds can be computed later (rspo_jax/intervals.py).

Multi-host: every process calls ``evaluate`` with the same task list, plays
its share of the tasks (``distributed.host_share``) on its own engine, and
the sums and counts are added over processes, so every process returns the
same numbers, those of the whole list.

With ``max_failed_frac`` set, a seed whose failed episodes (the environment
raised; all hosts' together) exceed that share of its episodes stops the
evaluation (``collect.check_failures``): its numbers would measure the
environment's bug, not the policy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

import numpy as np

from rspo_jax import distributed
from rspo_jax.rollout.collect import (
    CollectConfig,
    CollectRequest,
    check_failures,
    collect,
)
from rspo_jax.rollout.engine import SamplingParams


def evaluate(
    engine,
    venv,
    tokenizer,
    collect_cfg: CollectConfig,
    task_ids: Sequence[int],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 48,
    seeds: Sequence[int] = (0,),
    max_failed_frac: Optional[float] = None,
) -> dict:
  """Plays every task in ``task_ids`` once per seed (in chunks that fit the
  environment pool)."""
  per_seed, per_task = [], []
  by_type = defaultdict(list)
  first, last = distributed.host_share(len(task_ids))
  mine = list(task_ids[first:last])
  sampling = SamplingParams(
      temperature=temperature,
      max_new_tokens=max_new_tokens,
      stop_strings=("</action>",),
  )
  for seed in seeds:
    won, score, lengths, failed, episodes = [], [], [], 0, 0
    for start in range(0, len(mine), venv.num_envs):
      chunk = [int(t) for t in mine[start : start + venv.num_envs]]
      request = CollectRequest(
          chunk,
          1,
          sampling,
          traj_id_start=first + start,
          group_id_start=first + start,
          seed=seed,
      )
      records, stats = collect(engine, venv, tokenizer, request, collect_cfg)
      failed += stats["failed_episodes"]
      episodes += stats["episodes"]
      for r in records:
        if r.done:
          won.append(float(r.won))
          score.append(r.score)
          lengths.append(r.step_idx + 1)
          by_type[r.task_type or "all"].append(float(r.won))
          per_task.append(
              {
                  "seed": int(seed),
                  "task_id": int(r.task_id),
                  "won": int(bool(r.won)),
                  "score": float(r.score),
              }
          )
    # Sums and counts over every host's share (one process: its own).
    total = distributed.global_sum(
        np.array(
            [
                np.sum(won),
                np.sum(score),
                np.sum(lengths),
                len(won),
                failed,
                episodes,
            ],
            np.float64,
        )
    )
    if max_failed_frac is not None:
      check_failures(
          {"failed_episodes": total[4], "episodes": total[5]},
          max_failed_frac,
          collect_cfg.env_name,
          getattr(venv, "first_error", None),
      )
    n = total[3]
    per_seed.append(tuple(total[:3] / n) if n else (0.0, 0.0, 0.0))
  arr = np.array(per_seed)
  out = {
      "success_rate": float(arr[:, 0].mean()),
      "success_rate_std": float(arr[:, 0].std()),
      "score": float(arr[:, 1].mean()),
      "score_std": float(arr[:, 1].std()),
      "episode_length": float(arr[:, 2].mean()),
      "num_tasks": len(task_ids),
      "seeds": list(seeds),
  }
  merged = defaultdict(lambda: [0.0, 0])  # type -> [wins, episodes]
  for host in distributed.allgather_objects(
      {k: [float(np.sum(v)), len(v)] for k, v in by_type.items()}
  ):
    for k, (wins, n) in host.items():
      merged[k][0] += wins
      merged[k][1] += n
  if len(merged) > 1:
    out["success_by_type"] = {k: wins / n for k, (wins, n) in merged.items()}
  every = [e for host in distributed.allgather_objects(per_task) for e in host]
  out["per_task"] = sorted(every, key=lambda e: (e["seed"], e["task_id"]))
  return out
