"""ALFWorld behind ``TextEnv``: the real text engine on offline games.

``reset(task_id, split)`` plays game ``task_id`` of ``split``: the official
``json_2.1.1`` game when ALFWorld's data is present (``data_dir`` or
``$ALFWORLD_DATA``), else a game generated on first use into ``cache_dir``
(``gen.GameCache``; deterministic in ``(seed, split, task_id)``). Split
``test`` is ``valid_unseen`` (ALFWorld's out-of-distribution evaluation).
``task_types`` keeps some of the six task types (a CPU-scale curriculum):
task ids then cycle through those types in the given order, over the same
games the full set plays.

Per step, as ALFWorld shows it: the observation is the engine's feedback
(the first one is the intro ``-= Welcome to TextWorld, ALFRED! =- ... Your
task is to: put a clean egg in garbagecan.``), ``admissible_actions`` the
engine's admissible commands. An action not among them changes nothing: the
observation is ``Nothing happens.`` and ``valid_action`` is False.

  reward_t = 10 * won_t; done_t = won_t; score_t = won_t;
  dense_reward_t = (L_{t-1} - L_t) / L_0,
with ``L_t`` the length of the expert's plan from the state after step t
(``L = 0`` once won): the fraction of the initial plan a step removes. It
is negative when a step makes the task longer (picking up a wrong object),
0 for moves the plan does not need, and sums to 1 over a won episode.
``expert_action()`` is that plan's first command (``expert='oracle'``: the
full-knowledge expert of ``expert.py``; ``'planner'``: fast-downward, the
engine's own ``policy_commands``, slow on large rooms). ``expert='search'``
keeps the oracle's plan for ``L_t`` but acts with the searching expert of
``search.py``: a function of the task, the observations, the admissible
commands and its own past actions only (no engine state), which visits
receptacles in turn until it sees the object, as a policy must.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

from third_party_envs import base
from third_party_envs.alfworld import expert as expert_lib
from third_party_envs.alfworld import gen
from third_party_envs.alfworld import official
from third_party_envs.alfworld import search
from third_party_envs.alfworld import speedups
from third_party_envs.alfworld import tw

# Sizes of ALFWorld's splits (json_2.1.1, six task types, solvable).
DEFAULT_NUM_TASKS = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
_ALIASES = {"test": "valid_unseen"}
_TASK_PREFIX = "Your task is to: "
INVALID_FEEDBACK = "Nothing happens."
EXPERTS = ("oracle", "planner", "search")


class AlfWorldEnv(base.TextEnv):
  """One ALFWorld episode at a time (see module docstring)."""

  name = "alfworld"

  def __init__(
      self,
      cache_dir: Optional[str] = None,
      seed: int = 0,
      data_dir: Optional[str] = None,
      num_tasks: Optional[dict] = None,
      dense_reward: bool = True,
      expert: str = "oracle",
      task_types: Optional[Sequence[str]] = None,
  ):
    if expert not in EXPERTS:
      raise ValueError(f"expert must be one of {EXPERTS}, got {expert!r}")
    self.task_types = tuple(task_types or gen.TASK_TYPES)
    unknown = set(self.task_types) - set(gen.TASK_TYPES)
    if unknown or len(set(self.task_types)) != len(self.task_types):
      raise ValueError(
          f"task_types must be distinct names from {gen.TASK_TYPES};"
          f" got {tuple(task_types)}"
      )
    self.expert = expert
    self.dense_reward = dense_reward
    self._official = official.official_root(data_dir)
    self._cache = gen.GameCache(cache_dir, seed)  # installs speedups
    speedups.install(share_replan=expert != "planner")
    self._num_tasks = dict(DEFAULT_NUM_TASKS)
    if num_tasks:
      for split, n in num_tasks.items():
        if split not in DEFAULT_NUM_TASKS or n < 1:
          raise ValueError(f"bad num_tasks entry {split!r}: {n!r}")
        self._num_tasks[split] = int(n)
    self._env = None
    self._traj: dict = {}
    self._last: Optional[base.EnvStep] = None
    self._plan: Optional[list[str]] = None
    self._plan_len0 = self._plan_len = 0
    self._history: list[tuple[str, str]] = []  # (observation, action) shown

  # -- tasks ------------------------------------------------------------------
  @property
  def uses_official_data(self) -> bool:
    return self._official is not None

  def _split(self, split: str) -> str:
    split = _ALIASES.get(split, split)
    if split not in DEFAULT_NUM_TASKS:
      raise ValueError(
          f"unknown split {split!r}; known: {list(DEFAULT_NUM_TASKS)} + test"
      )
    return split

  def _official_games(self, split: str) -> tuple:
    return official.official_games(self._official, split, self.task_types)

  def num_tasks(self, split: str) -> int:
    split = self._split(split)
    if self._official:
      return len(self._official_games(split))
    n, m = self._num_tasks[split], len(self.task_types)
    if m == len(gen.TASK_TYPES):
      return n
    return m * (n // len(gen.TASK_TYPES))  # as many of each type

  def _generated_id(self, task_id: int) -> int:
    """Our ``task_id`` -> the generator's id: task types in
    ``self.task_types`` order, cycling as the generator's ids do."""
    if len(self.task_types) == len(gen.TASK_TYPES):
      return task_id
    m = len(self.task_types)
    kind = gen.TASK_TYPES.index(self.task_types[task_id % m])
    return len(gen.TASK_TYPES) * (task_id // m) + kind

  def game_file(self, task_id: int, split: str = "train") -> str:
    """Path of the ``game.tw-pddl`` of a task (generating it if needed;
    that uses this instance's engine, ending its episode)."""
    n = self.num_tasks(split)
    if not 0 <= task_id < n:
      raise ValueError(f"task_id {task_id} out of range [0, {n}) for {split}")
    split = self._split(split)
    if self._official:
      return self._official_games(split)[task_id]
    if not os.path.exists(
        os.path.join(
            self._cache.task_dir(split, self._generated_id(task_id)),
            "game.tw-pddl",
        )
    ):
      self._last = None  # generating verifies the game on our engine
    return self._cache.game_file(
        split, self._generated_id(task_id), engine=self._engine()
    )

  def _engine(self):
    if self._env is None:
      self._env = tw.make_tw_env()
    return self._env

  # -- episode ----------------------------------------------------------------
  def _expert_plan(self, state) -> Optional[list[str]]:
    """The oracle's (or fast-downward's) plan: hidden state, read for the
    dense reward and by the privileged experts only."""
    if state["won"]:
      return []
    if self.expert == "planner":
      return tw.plan(self._env) or None
    return expert_lib.expert_plan(
        state["_facts"], tw.names(self._env), self._traj
    )

  def _make_step(self, state, **kw) -> base.EnvStep:
    obs = state["feedback"]
    return base.EnvStep(
        observation=obs,
        admissible_actions=list(state["admissible_commands"]),
        anchor_obs=obs,
        task=self._task,
        task_type=self._traj["task_type"],
        info={"gamefile": self._game_file},
        **kw,
    )

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    self._game_file = self.game_file(task_id, split)
    with open(
        os.path.join(os.path.dirname(self._game_file), "traj_data.json")
    ) as f:
      self._traj = json.load(f)
    self._state = tw.load_and_reset(self._engine(), self._game_file)
    intro = self._state["feedback"]
    self._task = intro[intro.find(_TASK_PREFIX) + len(_TASK_PREFIX) :].strip()
    self._plan = self._expert_plan(self._state) if self.dense_reward else None
    self._plan_len0 = self._plan_len = max(len(self._plan or ()), 1)
    self._last = self._make_step(self._state)
    self._history = []
    return self._last

  def step(self, action: str) -> base.EnvStep:
    if self._last is None:
      raise RuntimeError("step() before reset()")
    command = action.strip()
    if not self._last.done:
      self._history.append((self._last.observation, command))
    if self._last.done or command not in self._state["admissible_commands"]:
      return self._invalid_step()
    with tw.keep_argv():
      self._state, _, _ = self._env.step(command)
    won = bool(self._state["won"])
    dense = 0.0
    self._plan = None
    if self.dense_reward:
      self._plan = self._expert_plan(self._state)
      if self._plan is not None:
        dense = (self._plan_len - len(self._plan)) / self._plan_len0
        self._plan_len = len(self._plan)
    self._last = self._make_step(
        self._state,
        reward=base.SUCCESS_REWARD if won else 0.0,
        done=won,
        won=won,
        score=float(won),
        dense_reward=dense,
    )
    return self._last

  def _invalid_step(self) -> base.EnvStep:
    """What the engine answers to a command it does not know; the state,
    and so the admissible commands, stay as they were."""
    last = self._last
    return dataclasses.replace(
        last,
        observation=INVALID_FEEDBACK,
        anchor_obs=INVALID_FEEDBACK,
        reward=0.0,
        dense_reward=0.0,
        valid_action=False,
        admissible_actions=list(last.admissible_actions),
        info=dict(last.info),
    )

  def expert_action(self) -> Optional[str]:
    if self._last is None or self._last.done:
      return None
    if self.expert == "search":  # what the agent was shown, nothing else
      last = self._last
      return search.next_action(
          last.task, last.observation, last.admissible_actions, self._history
      )
    if self._plan is None:
      self._plan = self._expert_plan(self._state)
    return self._plan[0] if self._plan else None

  def expert_thought(self) -> Optional[str]:
    """The searching expert's stated sub-goal ('find mug', 'put mug in
    shelf'; ``search.next_thought``); None for the other experts."""
    if self.expert != "search" or self._last is None or self._last.done:
      return None
    last = self._last
    return search.next_thought(
        last.task, last.observation, last.admissible_actions, self._history
    )

  def close(self) -> None:
    # The engine's private libdownward copy stays mapped: dlclose-ing it
    # (fast_downward.close_lib) crashes the interpreter at exit.
    self._env, self._last = None, None
