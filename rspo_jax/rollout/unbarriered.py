"""Collection without turn barriers, for engines served over HTTP (SGLang).

``collect`` plays turn by turn: every episode's turn-t request goes out in
one batch, and turn t + 1 starts when the slowest episode's turn t is done.
``collect_unbarriered`` plays each episode in its own thread:

  episode i: prompt_t -> engine.generate([prompt_t]) -> parse -> env step
             -> prompt_{t+1} -> ...   (no wait for the other episodes)

so a server always has the requests of the episodes not waiting on their
environment, and batches them continuously. Environment steps still go
through the one ``VectorEnv``: the calling thread steps, in one call, every
action that is ready (the others' generations go on meanwhile) and hands
each episode its result.

Same records as ``collect`` for the same replies (same fields, turn order,
rewards, statistics keys). Seeds: the request of episode ``i`` at turn ``t``
carries seed ``seed * 1_000_003 + 2 t + i``, which is the seed ``collect``
gives row ``i`` of turn ``t`` while every episode is still running (later
turns of ``collect`` number the rows still active). Greedy decoding gives
the same replies either way. Phases: ``environment_s`` is the calling
thread's wall time in environment steps, ``generation_s`` the rest of the
wall time (requests, prompt building and parsing overlap in the threads;
``gen_tokens_per_s`` divides by it), ``prompts_s`` 0.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time
from typing import Callable, Optional

import numpy as np

from rspo_jax import timing
from rspo_jax.rollout import prompts as prompt_lib
from rspo_jax.rollout.collect import (
    CollectConfig,
    CollectRequest,
    PHASES,
    _Episode,
    _apply_env_results,
    _finish,
)
from rspo_jax.rollout.engine import Engine
from rspo_jax.types import StepRecord


def collect_unbarriered(
    engine: Engine,
    venv,
    tokenizer,
    request: CollectRequest,
    cfg: CollectConfig,
    *,
    progress: Optional[Callable[[int], None]] = None,
    timer: Optional[timing.PhaseTimer] = None,
) -> tuple[list[StepRecord], dict]:
  """``collect``'s (records, statistics), each episode played on its own."""
  task_ids, group_size = request.task_ids, request.group_size
  n = len(task_ids) * group_size
  if n > venv.num_envs:
    raise ValueError(
        f"{n} episodes ({len(task_ids)} groups x {group_size}) need"
        f" {n} environments; the pool has {venv.num_envs}"
    )
  t_start = time.perf_counter()
  row_tasks = [t for t in task_ids for _ in range(group_size)]
  env_s = 0.0
  t0 = time.perf_counter()
  first = venv.reset(row_tasks + [None] * (venv.num_envs - n), cfg.split)
  env_s += time.perf_counter() - t0
  eps = [
      _Episode(
          task_id=t,
          group_id=request.group_id_start + i // group_size,
          traj_id=request.traj_id_start + i,
          obs=first[i],
      )
      for i, t in enumerate(row_tasks)
  ]
  for e in eps:
    e.failed = bool(e.obs.info.get("failed", False))
    e.done = e.failed
    e.anchors.append(e.obs.anchor_obs)
  stats = dict(
      gen_tokens=0,
      gen_time=0.0,
      env_time=0.0,
      prompt_truncated=0,
      invalid=0,
      steps=0,
  )
  lock = threading.Lock()
  ready = queue.Queue()  # (episode, action, threading.Event)
  aborted = threading.Event()  # the calling thread failed: episodes stop

  def play(i: int) -> None:
    e = eps[i]
    for turn in range(cfg.max_steps):
      if e.done:
        return
      ids, _, truncated = prompt_lib.build_prompt_ids(
          tokenizer,
          cfg.env_name,
          task=e.obs.task,
          observation=e.obs.observation,
          admissible_actions=e.obs.admissible_actions,
          history=e.history,
          step_idx=turn,
          history_length=cfg.history_length,
          max_prompt_tokens=cfg.max_prompt_tokens,
      )
      params = dataclasses.replace(
          request.sampling, seed=request.seed * 1_000_003 + turn * 2 + i
      )
      res = engine.generate([ids], params)[0]
      reply = tokenizer.decode(res.token_ids, skip_special_tokens=True)
      action, valid = prompt_lib.parse_action(reply, cfg.env_name)
      with lock:
        stats["gen_tokens"] += len(res.token_ids)
        stats["invalid"] += int(not valid)
        stats["prompt_truncated"] += int(truncated)
      e.records.append(
          StepRecord(
              task_id=e.task_id,
              group_id=e.group_id,
              traj_id=e.traj_id,
              step_idx=turn,
              prompt_ids=np.asarray(ids, np.int32),
              response_ids=np.asarray(res.token_ids, np.int32),
              behavior_logp=np.asarray(res.logprobs, np.float32),
              policy_tag=request.policy_tag,
              weight_version=engine.weight_version,
              env_reward=0.0 if valid else cfg.invalid_action_penalty,
              invalid=not valid,
              anchor_obs=e.obs.anchor_obs,
              action=action,
              task_type=e.obs.task_type,
          )
      )
      stepped = threading.Event()
      ready.put((i, action, stepped))
      while not stepped.wait(0.1):  # the calling thread steps the env
        if aborted.is_set():
          return

  with concurrent.futures.ThreadPoolExecutor(
      max_workers=max(1, n), thread_name_prefix="episode"
  ) as pool:
    futures = [pool.submit(play, i) for i in range(n)]
    try:
      env_s += _step_ready(venv, eps, futures, ready, lock, stats, progress)
    except BaseException:
      aborted.set()
      raise
    for f in futures:
      f.result()  # an episode's error is the collection's
  wall = time.perf_counter() - t_start
  # Requests overlap: generation time is the wall time not spent stepping.
  stats["env_time"], stats["gen_time"] = env_s, wall - env_s
  seconds = {"generation": wall - env_s, "environment": env_s, "prompts": 0.0}
  for name in PHASES:
    stats[f"{name}_s"] = seconds[name]
  if timer is not None:
    for name in PHASES:
      timer.add(name, seconds[name])
  return _finish(eps, cfg, stats, wall)


def _step_ready(venv, eps, futures, ready, lock, stats, progress) -> float:
  """Steps the environments of the actions ready, in one call each time,
  until every episode is done; returns the seconds spent stepping."""
  env_s = 0.0
  while True:
    try:
      batch = [ready.get(timeout=0.05)]
    except queue.Empty:
      if all(f.done() for f in futures):
        break
      continue
    while True:  # every action ready now goes in this step
      try:
        batch.append(ready.get_nowait())
      except queue.Empty:
        break
    actions = [None] * venv.num_envs
    for i, action, _ in batch:
      actions[i] = action
    t0 = time.perf_counter()
    out = venv.step_async(actions).wait()
    env_s += time.perf_counter() - t0
    rows = [i for i, _, _ in batch]
    with lock:
      _apply_env_results(eps, rows, out, stats)
    for _, _, stepped in batch:
      stepped.set()
    if progress is not None:
      progress(len(rows))
  return env_s
