"""Find the key in the rooms: a user environment, and the mistakes people
make writing one (tests/user_env_errors_test.py; docs/custom_env.md).

Task ``t`` of a split hides the key in one of the rooms other than the
hall (a pure function of ``(split, t)``). The agent starts in the hall;
``go <room>`` walks there, ``take key`` takes the key when it is in the
room (won), anything else changes nothing. The observation says where
the agent is and whether the key is there. Dense reward: 1 on the step
that enters the key's room, 0 otherwise.

Two experts (``expert=``): ``'direct'`` (the default) knows the task and
walks straight to the key; its won episodes show no room without the key,
so a clone of it has never seen the state a wrong guess leads to.
``'search'`` knows only what the observation says: it visits the rooms in
``SEARCH_ORDER`` and takes the key where it is, winning every task in at
most 4 steps; ``SearchingKeyHunt`` is the environment with it (and 64
tasks a split), for ``env.name`` on a command line (docs/custom_env.md).

The classes below ``KeyHunt`` each break one rule of
docs/custom_env.md, section 1, and ``env.name=key_env:<Class>`` runs them.
"""

from __future__ import annotations

import random
from typing import Optional

from third_party_envs import base

ROOMS = ("hall", "kitchen", "study", "cellar")
ACTIONS = [f"go {r}" for r in ROOMS] + ["take key"]
SEARCH_ORDER = ROOMS  # the 'search' expert's walk: hall, kitchen, ...
EXPERTS = ("direct", "search")


def key_room(split: str, task_id: int) -> str:
  return random.Random(f"key:{split}:{task_id}").choice(ROOMS[1:])


class KeyHunt(base.TextEnv):
  """The environment, right."""

  name = "key_hunt"

  def __init__(
      self, max_steps: int = 4, expert: str = "direct", num_tasks: int = 16
  ):
    if expert not in EXPERTS:
      raise ValueError(f"expert={expert!r}; one of {EXPERTS}")
    self.max_steps, self.expert, self.tasks = max_steps, expert, num_tasks
    self.key, self.room, self.t, self.done = "", "hall", 0, True

  def num_tasks(self, split: str) -> int:
    return self.tasks

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    self.key, self.room = key_room(split, task_id), "hall"
    self.t, self.done = 0, False
    return self._observe(won=False, valid=True, dense=0.0)

  def step(self, action: str) -> base.EnvStep:
    self.t += 1
    won, entered = False, False
    if action.startswith("go ") and action[3:] in ROOMS:
      entered = action[3:] == self.key != self.room
      self.room = action[3:]
    elif action == "take key":
      won = self.room == self.key
    self.done = won or self.t >= self.max_steps
    return self._observe(won=won, valid=action in ACTIONS, dense=float(entered))

  def expert_action(self) -> Optional[str]:
    if self.done:
      return None
    if self.room == self.key:
      return "take key"
    if self.expert == "direct":
      return f"go {self.key}"
    # 'search': the room after this one (the key is never in the hall, so
    # the walk ends at the key by the last room).
    return f"go {SEARCH_ORDER[SEARCH_ORDER.index(self.room) + 1]}"

  def _observe(self, won: bool, valid: bool, dense: float) -> base.EnvStep:
    here = "The key is here." if self.room == self.key else "No key here."
    return base.EnvStep(
        observation=f"You are in the {self.room}. {here}",
        admissible_actions=list(ACTIONS),
        reward=base.SUCCESS_REWARD * won,
        done=self.done,
        won=won,
        score=float(won),
        task="find the key and take it",
        valid_action=valid,
        dense_reward=dense,
    )


class SearchingKeyHunt(KeyHunt):
  """``KeyHunt`` with the 'search' expert and 64 tasks a split."""

  def __init__(self, max_steps: int = 4):
    super().__init__(max_steps, expert="search", num_tasks=64)


class NoDenseReward(KeyHunt):
  """Sets no ``EnvStep.dense_reward`` (fine, unless B trains on it)."""

  def _observe(self, won, valid, dense):
    step = super()._observe(won, valid, dense)
    step.dense_reward = base.NO_DENSE_REWARD  # as if never written
    return step


class NanReward(KeyHunt):
  """``reward`` NaN from ``nan_turn`` on, in the tasks of ``nan_tasks``
  (all when empty)."""

  def __init__(
      self, max_steps: int = 4, nan_turn: int = 1, nan_tasks: tuple = ()
  ):
    super().__init__(max_steps)
    self.nan_turn, self.nan_tasks, self.task_id = nan_turn, nan_tasks, 0

  def reset(self, task_id, split="train"):
    self.task_id = task_id
    return super().reset(task_id, split)

  def step(self, action):
    step = super().step(action)
    if self.t >= self.nan_turn and (
        not self.nan_tasks or self.task_id in self.nan_tasks
    ):
      step.reward = float("nan")
    return step


class LateNanReward(NanReward):
  """NaN only at turn 2 of task 1: past the launcher's probe episode."""

  def __init__(self, max_steps: int = 4):
    super().__init__(max_steps, nan_turn=2, nan_tasks=(1,))

  def expert_action(self):  # wanders, so that turn 2 comes
    return None if self.done else "go hall"


class StrReset(KeyHunt):
  """``reset`` returns the observation text instead of an ``EnvStep``."""

  def reset(self, task_id, split="train"):
    return super().reset(task_id, split).observation


class DictReset(KeyHunt):
  """``reset`` returns the fields as a dict."""

  def reset(self, task_id, split="train"):
    return vars(super().reset(task_id, split))


class BigReward(KeyHunt):
  """Pays 100 for the key: outside the declared ``reward_range``."""

  def step(self, action):
    step = super().step(action)
    step.reward = 100.0 * step.won
    return step
