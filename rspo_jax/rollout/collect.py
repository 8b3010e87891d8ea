"""Multi-turn collection: environments x engine -> per-step records.

One call plays ``len(task_ids) * group_size`` episodes (the members of a
group share a task id), for at most ``max_steps`` turns:

  turn t: for every unfinished episode, render the prompt (task, history
  window, current observation, admissible actions) with the chat template ->
  generate one reply per episode in one batched engine call (row i of the
  call draws from the stream (seed * 1_000_003 + 2 t, i)) -> parse the
  ``<action>`` -> step the environments (in worker processes).

Wall seconds by phase (exclusive; also booked to ``timer`` when given):
``generation`` (engine calls), ``environment`` (resets, steps, waiting for
them) and ``prompts`` (prompt building and tokenization, reply decoding and
parsing, records); in the statistics as ``<phase>_s``.

Rewards per step (verl-agent convention):
  env_reward_t = reward_t (10 * won on the winning step)
                 + invalid_action_penalty * [reply had no valid action]
  outcome_reward = sum_t env_reward_t (stored on every step of the episode)
  dense_reward_t = the environment's progress signal (a PRM may overwrite it)

An episode whose environment raised (or whose worker died) is dropped and
counted in ``failed_episodes``; ``check_failures`` stops the run when more
than ``rollout.max_failed_episode_frac`` of a collection's episodes failed.
A result that breaks the environment's contract (a NaN reward, ``reset()``
returning a string: third_party_envs/contract.py) stops it at once: the
``VectorEnv`` raises ``EnvError`` from ``reset`` / ``wait()``, here and in
rollout/unbarriered.py alike.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

import numpy as np

from rspo_jax import timing
from rspo_jax.errors import ConfigError
from rspo_jax.rollout import prompts as prompt_lib
from rspo_jax.rollout.engine import Engine, SamplingParams
from rspo_jax.types import POLICY_A, StepRecord
from third_party_envs import failures

PHASES = ("generation", "environment", "prompts")
FAILED_FRAC_KEY = "rollout.max_failed_episode_frac"


class TooManyFailures(ConfigError):
  """Most episodes of a collection failed: the environment is broken
  (the launchers print the message, one line, and exit 1)."""


@dataclasses.dataclass(frozen=True)
class CollectConfig:
  env_name: str
  max_steps: int
  history_length: int = 2
  max_prompt_tokens: int = 512
  invalid_action_penalty: float = -0.1
  split: str = "train"
  repeat_window: int = 5  # exploration metric: revisits within this window


@dataclasses.dataclass(frozen=True)
class CollectRequest:
  """What one collection plays, and how its records are numbered.

  The long-lived pieces (engine, environment pool, tokenizer,
  ``CollectConfig``) are the collector's own arguments; this is what
  changes from call to call. A call plays ``len(task_ids) * group_size``
  episodes; episode ``i`` belongs to group ``k = i // group_size``.

  Attributes:
    task_ids: one task per group: every member of group ``k`` plays
      ``task_ids[k]`` (kept as a tuple).
    group_size: G, the episodes per group (the same task each).
    sampling: how replies are sampled; its ``seed`` is replaced by the
      per-turn seed below.
    policy_tag: the policy the records are booked to (``types.POLICY_A``
      or ``POLICY_B``).
    traj_id_start: where this call's trajectory ids start: episode ``i``
      is trajectory ``traj_id_start + i``.
    group_id_start: where this call's group ids start: group ``k`` is
      group ``group_id_start + k``.
    seed: the call's sampling seed: turn ``t`` samples with seed
      ``seed * 1_000_003 + 2 t`` (``collect``: row ``i`` of the turn's
      batch draws from stream ``i``; ``collect_unbarriered``: episode
      ``i`` adds ``i`` to it).
  """

  task_ids: Sequence[int]
  group_size: int
  sampling: SamplingParams
  policy_tag: str = POLICY_A
  traj_id_start: int = 0
  group_id_start: int = 0
  seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, "task_ids", tuple(self.task_ids))


@dataclasses.dataclass
class _Episode:
  task_id: int
  group_id: int
  traj_id: int
  obs: object  # latest EnvStep
  history: list = dataclasses.field(default_factory=list)
  records: list = dataclasses.field(default_factory=list)
  anchors: list = dataclasses.field(default_factory=list)
  done: bool = False
  failed: bool = False


def repeated_state_count(anchors: Sequence[str], window: int) -> int:
  """Number of steps whose state was already visited in the previous
  ``window`` steps of the same episode (the exploration metric)."""
  return sum(
      a in anchors[max(0, i - window) : i] for i, a in enumerate(anchors)
  )


def collect(
    engine: Engine,
    venv,
    tokenizer,
    request: CollectRequest,
    cfg: CollectConfig,
    *,
    progress: Optional[Callable[[int], None]] = None,
    timer: Optional[timing.PhaseTimer] = None,
) -> tuple[list[StepRecord], dict]:
  """Plays ``request``'s episodes; returns (step records, statistics).
  ``progress(n)`` is told the ``n`` episodes stepped after each turn."""
  task_ids, group_size = request.task_ids, request.group_size
  n = len(task_ids) * group_size
  if n > venv.num_envs:
    raise ValueError(
        f"{n} episodes ({len(task_ids)} groups x {group_size}) need"
        f" {n} environments; the pool has {venv.num_envs}"
    )
  t_start = time.perf_counter()
  timer = timer or timing.PhaseTimer()
  booked = timer.seconds()
  row_tasks = [t for t in task_ids for _ in range(group_size)]
  with timer.phase("environment"):
    first = venv.reset(row_tasks + [None] * (venv.num_envs - n), cfg.split)
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

  for turn in range(cfg.max_steps):
    active = [i for i, e in enumerate(eps) if not e.done]
    if not active:
      break
    with timer.phase("prompts"):
      prompts = []
      for i in active:
        e = eps[i]
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
        stats["prompt_truncated"] += int(truncated)
        prompts.append(ids)
    t0 = time.perf_counter()
    params = dataclasses.replace(
        request.sampling, seed=request.seed * 1_000_003 + turn * 2
    )
    with timer.phase("generation"):
      results = engine.generate(prompts, params)
    stats["gen_time"] += time.perf_counter() - t0
    with timer.phase("prompts"):
      actions = [None] * venv.num_envs
      for i, ids, res in zip(active, prompts, results):
        reply = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        action, valid = prompt_lib.parse_action(reply, cfg.env_name)
        actions[i] = action
        stats["gen_tokens"] += len(res.token_ids)
        stats["invalid"] += int(not valid)
        eps[i].records.append(
            StepRecord(
                task_id=eps[i].task_id,
                group_id=eps[i].group_id,
                traj_id=eps[i].traj_id,
                step_idx=turn,
                prompt_ids=np.asarray(ids, np.int32),
                response_ids=np.asarray(res.token_ids, np.int32),
                behavior_logp=np.asarray(res.logprobs, np.float32),
                policy_tag=request.policy_tag,
                weight_version=engine.weight_version,
                env_reward=0.0 if valid else cfg.invalid_action_penalty,
                invalid=not valid,
                anchor_obs=eps[i].obs.anchor_obs,
                action=action,
                task_type=eps[i].obs.task_type,
            )
        )
    t0 = time.perf_counter()
    with timer.phase("environment"):
      out = venv.step_async(actions).wait()
    stats["env_time"] += time.perf_counter() - t0
    _apply_env_results(eps, active, out, stats)
    if progress is not None:
      progress(len(active))

  seconds = timer.seconds()
  for name in PHASES:
    stats[f"{name}_s"] = seconds.get(name, 0.0) - booked.get(name, 0.0)
  return _finish(eps, cfg, stats, time.perf_counter() - t_start)


def check_failures(
    stats: dict, limit: float, env_name: str, first_error: Optional[str] = None
) -> None:
  """Raises ``TooManyFailures`` when ``failed_episodes / episodes >
  limit`` (``limit >= 1``: never), naming the environment, the count, the
  last line of ``first_error`` (``VectorEnv.first_error``, whose whole
  traceback is in the log) and the config key."""
  failed, n = int(stats["failed_episodes"]), int(stats["episodes"])
  if not n or failed / n <= limit:
    return
  why = (
      f"first error: {failures.last_line(first_error)} (its traceback is"
      " logged above)"
      if first_error
      else "no error text on this host (see the other hosts' logs)"
  )
  raise TooManyFailures(
      f"environment {env_name!r} failed {failed} of {n} episodes of a"
      f" collection, more than {FAILED_FRAC_KEY}={limit:g}; {why}; fix the"
      f" environment or raise {FAILED_FRAC_KEY}"
  )


def _apply_env_results(eps, rows, results, stats):
  for i in rows:
    e, out = eps[i], results[i]
    rec = e.records[-1]
    rec.env_reward += float(out.reward)
    rec.dense_reward = float(out.dense_reward)  # a plain float, not
    # base.NO_DENSE_REWARD's type
    rec.won = bool(out.won)
    rec.score = float(out.score)
    e.history.append((e.obs.observation, rec.action))
    e.obs = out
    e.anchors.append(out.anchor_obs)
    stats["steps"] += 1
    if out.info.get("failed", False):
      e.failed = True
    if out.done or e.failed:
      e.done = True


def _finish(eps, cfg, stats, wall):
  records = []
  won, scores, lengths, repeats, failed = [], [], [], [], 0
  for e in eps:
    if not e.records:
      failed += int(e.failed)
      continue
    last = e.records[-1]
    last.done = True
    outcome = float(sum(r.env_reward for r in e.records))
    ep_won = bool(last.won)
    for r in e.records:
      r.outcome_reward = outcome
      r.won = ep_won
      r.score = float(last.score)
      r.failed = e.failed
    failed += int(e.failed)
    won.append(ep_won)
    scores.append(last.score)
    lengths.append(len(e.records))
    repeats.append(repeated_state_count(e.anchors, cfg.repeat_window))
    records.extend(e.records)
  n_steps = max(stats["steps"], 1)
  summary = {
      "success_rate": float(np.mean(won)) if won else 0.0,
      "score": float(np.mean(scores)) if scores else 0.0,
      "episode_length": float(np.mean(lengths)) if lengths else 0.0,
      "invalid_action_rate": stats["invalid"] / max(len(records), 1),
      "repeated_states": float(np.mean(repeats)) if repeats else 0.0,
      "failed_episodes": failed,
      "episodes": len(eps),
      "env_steps": stats["steps"],
      "gen_tokens": stats["gen_tokens"],
      "gen_tokens_per_s": stats["gen_tokens"] / max(stats["gen_time"], 1e-9),
      "env_steps_per_s": n_steps / max(stats["env_time"], 1e-9),
      "prompt_truncated": stats["prompt_truncated"],
      "collect_time_s": wall,
  }
  for name in PHASES:
    summary[f"{name}_s"] = float(stats.get(f"{name}_s", 0.0))
  return records, summary


# How one statistic of several hosts' collections combines (multi-host).
_COUNT_KEYS = (
    "failed_episodes",
    "episodes",
    "env_steps",
    "gen_tokens",
    "prompt_truncated",
)
_SUM_KEYS = _COUNT_KEYS + ("gen_tokens_per_s", "env_steps_per_s")
_TIME_KEYS = ("collect_time_s",) + tuple(f"{p}_s" for p in PHASES)
_MAX_KEYS = _TIME_KEYS
_PER_STEP_KEYS = ("invalid_action_rate",)


def empty_stats() -> dict:
  """The statistics of a collection of no episodes (a host whose share of
  the groups is empty)."""
  return _finish(
      [],
      CollectConfig(env_name="", max_steps=0),
      dict(
          gen_tokens=0,
          gen_time=0.0,
          env_time=0.0,
          prompt_truncated=0,
          invalid=0,
          steps=0,
      ),
      0.0,
  )[1]


def combine_rounds(rounds: Sequence[dict]) -> dict:
  """One summary of consecutive collections on one host: as
  ``combine_stats``, but wall times add up and throughputs are the
  time-weighted mean of the rounds'."""
  out = combine_stats(rounds)
  if len(rounds) > 1:
    for key in _TIME_KEYS:
      out[key] = float(sum(float(r.get(key, 0.0)) for r in rounds))
    times = np.asarray([float(r["collect_time_s"]) for r in rounds])
    for key in ("gen_tokens_per_s", "env_steps_per_s"):
      vals = np.asarray([float(r[key]) for r in rounds])
      out[key] = (
          float((vals * times).sum() / times.sum()) if times.sum() else 0.0
      )
  return out


def combine_stats(per_host: Sequence[dict]) -> dict:
  """One summary of several hosts' collections (each ``collect``'s stats):
  counts and throughputs add up, wall time is the slowest host's, rates
  and means are weighted by episodes (per-step rates by steps)."""
  if len(per_host) == 1:
    return dict(per_host[0])
  out = {}
  for key in per_host[0]:
    vals = np.asarray([float(s[key]) for s in per_host])
    if key in _SUM_KEYS:
      out[key] = float(vals.sum())
    elif key in _MAX_KEYS:
      out[key] = float(vals.max())
    else:
      by = "env_steps" if key in _PER_STEP_KEYS else "episodes"
      w = np.asarray([float(s[by]) for s in per_host])
      out[key] = float((vals * w).sum() / w.sum()) if w.sum() else 0.0
    if key in _COUNT_KEYS:
      out[key] = int(out[key])
  return out
