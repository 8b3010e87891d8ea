"""A tiny deterministic number-line environment for tests and smoke runs.

Task ``t`` of a split starts at a number ``x0`` in [0, L) and asks to reach a
target ``n`` in [0, L) with the actions ``inc`` (x += 1) and ``dec``
(x -= 1) within ``max_steps`` steps, where

  L = line_size,  min_distance <= |n - x0| <= max_distance (None: L),
  n > x0 for direction='up', n < x0 for 'down', either for 'both'.

The defaults (L = 10, min_distance = 1, 'both') are the original toy, task
for task; ``min_distance = 4`` ('distant targets') makes every expert plan
at least 4 steps long, so a policy that is wrong in a few states rarely
wins. Numbers past 9 are whole tokens of a locally trained tokenizer
(``tokenizer_words``). ``expert_below = b`` gives an expert that only knows
tasks whose start and target are below b (``expert_action`` is None on the
others; a weaker warm start). Everything is a pure function of ``(split,
task_id)`` and the task knobs, so instances given the same id and knobs play
the same task.

Rewards follow the project convention (``base.py``):
  reward_t = 10 * won_t (only on the winning step);
  dense_reward_t = (|x_{t-1} - n| - |x_t - n|) / |x0 - n|, so the dense
  rewards of a won episode sum to 1.

A deliberately misaligned dense reward (the ``rspo.dense_only`` hacking
ablation, experiments/toy_mechanism.py): ``dense_target_offset = d`` makes the
progress signal measure approach to a decoy m = n + d instead of n,

  dense_reward_t = (|x_{t-1} - m| - |x_t - m|) / |x0 - n|,

while winning (and the outcome reward) stays reaching n. The decoy is not
clipped to [0, L): the line is unbounded, and a decoy out of reach (e.g.
d = -24 on L = 10, max_steps = 12: every x stays above m) turns the signal
into the real progress with its sign flipped on upward tasks; a decoy
short of the target (-|n - x0| < d < 0) pays for walking to m and
dithering there, never for finishing. The normaliser stays |x0 - n| (m may
equal x0). None (default): the decoy is the target.
An action that is not admissible changes nothing (``valid_action=False``) but
still consumes a step.

Two hidden test hooks, never listed as admissible and never produced by the
expert: ``hang`` sleeps ``hang_s`` seconds (to test worker timeouts), ``crash``
raises ``RuntimeError`` (to test error handling). The line is unbounded:
``dec`` at 0 goes to -1.
"""

from __future__ import annotations

import random
import time
from typing import Optional

from third_party_envs import base

_NUM_TASKS = {"train": 256, "valid_seen": 64, "valid_unseen": 64, "test": 64}
ADMISSIBLE = ["inc", "dec"]


def toy_task(
    split: str,
    task_id: int,
    line_size: int = 10,
    min_distance: int = 1,
    max_distance: Optional[int] = None,
    direction: str = "both",
) -> tuple[int, int]:
  """(start, target) of a task: both in [0, line_size),
  ``min_distance <= |target - start| <= max_distance`` (None: any), the
  target above the start for ``direction='up'``, below for 'down';
  deterministic in the arguments."""
  rng = random.Random(f"toy:{split}:{task_id}")  # str seeds are stable
  far = line_size if max_distance is None else max_distance
  sign = {"both": 0, "up": 1, "down": -1}[direction]
  starts = [
      s
      for s in range(line_size)
      if _targets(s, line_size, min_distance, far, sign)
  ]
  start = (
      rng.randrange(line_size)
      if sign == 0  # the original draw
      else rng.choice(starts)
  )
  return start, rng.choice(_targets(start, line_size, min_distance, far, sign))


def _targets(start, line_size, near, far, sign) -> list[int]:
  return [
      v
      for v in range(line_size)
      if near <= abs(v - start) <= far and (v - start) * sign >= 0
  ]


class ToyEnv(base.TextEnv):
  """Reach a target number by ``inc``/``dec`` (see module docstring)."""

  name = "toy"

  def __init__(
      self,
      max_steps: int = 12,
      hang_s: float = 3600.0,
      line_size: int = 10,
      min_distance: int = 1,
      max_distance: Optional[int] = None,
      direction: str = "both",
      expert_below: Optional[int] = None,
      dense_target_offset: Optional[int] = None,
  ):
    if max_steps < 1:
      raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if line_size < 2:
      raise ValueError(f"line_size must be >= 2, got {line_size}")
    if not 1 <= min_distance <= line_size // 2:  # every start has a target
      raise ValueError(
          f"min_distance must be in [1, {line_size // 2}] on a"
          f" line of {line_size}, got {min_distance}"
      )
    if max_distance is not None and max_distance < min_distance:
      raise ValueError(
          f"max_distance {max_distance} < min_distance" f" {min_distance}"
      )
    if direction not in ("both", "up", "down"):
      raise ValueError(
          f"direction must be 'both', 'up' or 'down', got" f" {direction!r}"
      )
    if dense_target_offset is not None and (
        int(dense_target_offset) != dense_target_offset
    ):
      raise ValueError(
          f"dense_target_offset must be a whole number or None,"
          f" got {dense_target_offset!r}"
      )
    self.dense_target_offset = (
        None if dense_target_offset is None else int(dense_target_offset)
    )
    self.line_size = line_size
    self.direction = direction
    self.expert_below = expert_below
    self.max_distance = max_distance
    self.max_steps = max_steps
    self.min_distance = min_distance
    self.hang_s = hang_s
    self._x = self._target = self._start = 0
    self._t = 0
    self._done = True
    self._task = ""

  def num_tasks(self, split: str) -> int:
    if split not in _NUM_TASKS:
      raise ValueError(f"unknown split {split!r}; known: {list(_NUM_TASKS)}")
    return _NUM_TASKS[split]

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    n = self.num_tasks(split)
    if not 0 <= task_id < n:
      raise ValueError(f"task_id {task_id} out of range [0, {n}) for {split}")
    self._start, self._target = toy_task(
        split,
        task_id,
        self.line_size,
        self.min_distance,
        self.max_distance,
        self.direction,
    )
    self._x, self._t, self._done = self._start, 0, False
    self._task = f"reach the number {self._target}"
    return self._env_step(0.0, False, 0.0, True)

  def step(self, action: str) -> base.EnvStep:
    if self._done:
      raise ValueError("ToyEnv.step called on a finished episode; reset first")
    if action == "hang":
      time.sleep(self.hang_s)
    elif action == "crash":
      raise RuntimeError("ToyEnv: 'crash' test action")
    valid = action in ADMISSIBLE
    decoy = self._target + (self.dense_target_offset or 0)
    before = abs(self._x - decoy)
    if valid:
      self._x += 1 if action == "inc" else -1
    self._t += 1
    won = self._x == self._target
    self._done = won or self._t >= self.max_steps
    dense = (before - abs(self._x - decoy)) / abs(self._start - self._target)
    return self._env_step(base.SUCCESS_REWARD * won, won, dense, valid)

  def tokenizer_words(self) -> list[str]:
    """Numbers past 9 whole (one token each, like the digits)."""
    return [str(v) for v in range(10, self.line_size)]

  def expert_action(self) -> Optional[str]:
    if self._done:
      return None
    if abs(self._target - self._x) > self.max_steps - self._t:
      return None  # out of reach: lost
    if (
        self.expert_below is not None
        and max(self._start, self._target) >= self.expert_below
    ):
      return None  # a task past what this expert knows
    return "inc" if self._x < self._target else "dec"

  def _env_step(
      self, reward: float, won: bool, dense: float, valid: bool
  ) -> base.EnvStep:
    obs = f"The current number is {self._x}."
    return base.EnvStep(
        observation=obs,
        admissible_actions=list(ADMISSIBLE),
        reward=reward,
        done=self._done,
        won=won,
        score=float(won),
        anchor_obs=obs,
        dense_reward=dense,
        task=self._task,
        task_type="toy",
        valid_action=valid,
        info={"step": self._t},
    )
