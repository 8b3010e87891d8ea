"""What the loop shows and reports besides the training metrics: the
run's name, its progress bar (B's steps beside A's), the per-phase
timing rows and the metrics writer of a non-leader host."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

from rspo_jax import timing
from rspo_jax.loop import host_stats
from rspo_jax.replay import replayed

_ALGO_NAMES = {"grpo": "GRPO", "ppo": "PPO", "gigpo": "GiGPO"}


def run_name(cfg) -> str:
  """What a run trains, for people: 'RSPO+GRPO', 'GiGPO', ..."""
  r, algo = cfg.rspo, _ALGO_NAMES.get(cfg.algo.name, cfg.algo.name)
  if not r.enabled:
    return algo
  if r.dense_only:
    return f"{algo} on the dense reward"
  variant = {"history": "RSPO_H", "outcome": "RSPO_O"}.get(
      r.data_source, "RSPO"
  )
  return f"{variant}+{algo}"


def progress_counts(
    a_total: int, a_done: int, phase: str, k: int, b_steps: int
) -> tuple[int, int]:
  """(total, done) of the run's progress bar, counting B's steps beside
  A's: every loop of k A steps (the last may be shorter) has ``b_steps``
  B steps first (k; 0 without B). B's phase of the loop A is in is done
  when ``phase`` is "A"; a resume redoes an unfinished one."""
  loops = -(-a_total // k)
  loops_b_done = -(-a_done // k) + (phase == "A" and a_done % k == 0)
  return (
      a_total + loops * b_steps,
      a_done + min(loops_b_done, loops) * b_steps,
  )


def progress_bar(
    a_total: int,
    a_done: int,
    phase: str,
    k: int,
    b_steps: int,
    enabled: bool,
    name: str,
):
  """The run's tqdm bar (``progress_counts``), hidden unless ``enabled``."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  total, done = progress_counts(a_total, a_done, phase, k, b_steps)
  what = "B and A steps" if b_steps else "A steps"
  return tqdm(
      total=total,
      initial=done,
      desc=f"{name} ({what})",
      disable=not enabled,
      dynamic_ncols=True,
  )


def phase_seconds(
    timer: timing.PhaseTimer, t0: float, env_steps0: int, env_steps: int
) -> dict:
  """Wall seconds since ``t0`` by phase (``timing.PhaseTimer``: weight
  sync, generation, environment, prompts, logprobs, update, evaluation,
  checkpoint; ``other_s`` the rest), XLA compilations by phase, and
  environment steps/s (``env_steps`` now, ``env_steps0`` at ``t0``);
  then the timer starts afresh."""
  wall = time.perf_counter() - t0
  compiles = timer.compiles()
  seconds = timer.reset()
  out = {f"{k}_s": v for k, v in seconds.items()}
  out["other_s"] = max(wall - sum(seconds.values()), 0.0)
  out["wall_s"] = wall
  out["env_steps_per_s"] = (env_steps - env_steps0) / max(wall, 1e-9)
  out.update({f"compiles_{k}": float(v) for k, v in compiles.items()})
  return out


def a_step_report(
    m: dict,
    cfg,
    stats: dict,
    records: list,
    *,
    env_steps: int,
    multihost: bool,
    b_logp_gap: Optional[float],
    lag: int,
    overlap_seconds: dict,
) -> dict:
  """A step's metrics ``m`` (update.py's) completed: its collection's
  statistics (``rollout_*``; ``records`` its fresh step rows), the run's
  environment steps, reward means over the fresh rows; with RSPO, the
  replay metrics of a step that replayed nothing; decoupled B's largest
  log-prob gap so far; with overlap, the rows' policy lag and (lag 1) the
  collection thread's seconds by phase."""
  m.update({f"rollout_{k}": v for k, v in stats.items()})
  m["env_steps"] = env_steps
  # As on B's rows: means over A's fresh step rows (update.py's
  # <source>_reward_mean is the step reward over every trained row).
  m.update(host_stats.reward_means(records, multihost))
  if cfg.rspo.enabled:
    for k, v in replayed.metrics(np.zeros(5)).items():
      m.setdefault(k, v)  # nothing replayed this step
    m.setdefault("rows_off", 0.0)
  if b_logp_gap is not None:
    m["behavior_logp_max_gap"] = b_logp_gap
  if cfg.rollout.overlap:
    m["overlap_policy_lag"] = float(lag)
    m.setdefault("overlap_logp_gap_on", 0.0)
    if lag:
      m.update(overlap_seconds)
  return m


class NoMetrics:
  """The metrics writer of a non-leader host: writes nothing."""

  def write(self, step: int, phase: str, metrics: dict) -> None:
    del step, phase, metrics

  def close(self) -> None:
    pass
