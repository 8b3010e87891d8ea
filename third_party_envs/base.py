"""The one interface every multi-turn text environment implements.

An environment instance plays one episode at a time. ``reset(task_id)`` starts
the task with that id (instances given the same id play the same task: that is
how a GRPO/GiGPO group shares a task); ``step(action)`` takes the *parsed*
action string (the rollout code parses ``<action>...</action>`` out of the
model's reply; an unparseable reply is passed through unchanged and the
environment treats it as an invalid action that changes nothing).

Rewards: ``EnvStep.reward`` is the environment's own outcome signal for the
step (``10 * won`` on the winning step, 0 otherwise) -- the invalid-action
penalty is added by the rollout layer, not here. ``dense_reward`` is a
*separate* process signal (sub-goal / partial-score progress) that only
Agent B may be trained on; it never enters the outcome reward. Its
default, ``NO_DENSE_REWARD``, is 0.0 that also says "this environment set
none" (``sets_dense_reward``): RSPO with ``rspo.dense_reward=oracle``
refuses such an environment at start (rspo_jax/preflight.py).

What ``reset`` and ``step`` return is checked where it enters the system
(``contract.py``): an ``EnvStep`` with finite rewards, or the run stops.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Optional

SUCCESS_REWARD = 10.0  # reward = 10 * won, as in verl-agent / the paper
SPLITS = ("train", "valid_seen", "valid_unseen", "test")


class _NoDenseReward(float):
  """0.0 that says "the environment set no dense reward": the type of
  ``EnvStep.dense_reward``'s default. Arithmetic sees a plain 0.0."""


NO_DENSE_REWARD = _NoDenseReward(0.0)


@dataclasses.dataclass
class EnvStep:
  observation: str  # text shown to the agent for this state
  admissible_actions: list[str]  # valid actions in this state
  reward: float = 0.0  # outcome reward of this transition (10 * won)
  done: bool = False
  won: bool = False
  score: float = 0.0  # task score so far (WebShop: 0..1 on buy; ALFWorld: won)
  anchor_obs: str = ""  # GiGPO anchor: identical text <=> same state
  # environment progress signal for this step; left out: NO_DENSE_REWARD
  dense_reward: float = NO_DENSE_REWARD
  task: str = ""  # the task / instruction text (for the prompt)
  task_type: str = ""  # e.g. ALFWorld 'pick_and_place_simple'
  valid_action: bool = True  # False when the action was not admissible
  info: dict = dataclasses.field(default_factory=dict)


def sets_dense_reward(step: EnvStep) -> bool:
  """Whether ``step`` was given a ``dense_reward`` (0.0 given counts)."""
  return not isinstance(step.dense_reward, _NoDenseReward)


class TextEnv(abc.ABC):
  """One environment instance. Implementations must be picklable by name
  (constructed inside worker processes from keyword arguments)."""

  name: str = "base"
  # The range of EnvStep.reward this environment returns: 10 * won, as
  # every environment here. A reward outside it is warned about once
  # (contract.py); an environment with other rewards declares its range.
  reward_range: tuple[float, float] = (0.0, SUCCESS_REWARD)

  @abc.abstractmethod
  def num_tasks(self, split: str) -> int:
    """Number of task ids available in ``split``."""

  @abc.abstractmethod
  def reset(self, task_id: int, split: str = "train") -> EnvStep:
    """Starts task ``task_id`` of ``split``; deterministic in the id."""

  @abc.abstractmethod
  def step(self, action: str) -> EnvStep:
    """Applies one parsed action string."""

  @abc.abstractmethod
  def expert_action(self) -> Optional[str]:
    """The scripted solver's next action in the current state (None if lost)."""

  # Behaviour cloning keeps the expert's won episodes only; an env whose
  # expert plays a deliberate policy that can lose (spell's guessing
  # expert) sets True to keep every episode the expert played to its end.
  expert_keeps_lost = False

  def expert_thought(self) -> Optional[str]:
    """What the scripted solver states before ``expert_action()`` (the
    warm start's ``<think>`` text); None: a fixed placeholder."""
    return None

  def tokenizer_words(self) -> list[str]:
    """Strings a locally trained tokenizer should keep whole (one token):
    opaque ids the agent must copy, e.g. WebShop's product ids. Used only
    for the tiny CPU-scale tokenizers; real checkpoints bring their own."""
    return []

  def close(self) -> None:
    pass
