"""Spell a word, one letter a turn: the example of docs/custom_env.md.

Task ``t`` of a split is a 3-letter word over ``a..f`` (a pure function of
``(split, t)``). Actions: ``type <letter>`` appends the letter, ``erase``
removes the last one; anything else changes nothing. The episode is won when
the text equals the word, lost after ``max_steps`` turns.

``env.name=spell_env:SpellEnv`` trains on it, with this directory on
PYTHONPATH; docs/custom_env.md has the command line.
"""

from __future__ import annotations

import random
import re
from typing import Optional

from rspo_jax.rollout.prompts import PromptSpec
from third_party_envs import base

LETTERS = "abcdef"
ACTIONS = [f"type {c}" for c in LETTERS] + ["erase"]
_SPLIT_SIZES = {"train": 128, "valid_seen": 32, "valid_unseen": 32, "test": 32}


def word_of(split: str, task_id: int) -> str:
  rng = random.Random(f"spell:{split}:{task_id}")  # str seeds are stable
  return "".join(rng.choice(LETTERS) for _ in range(3))


def apply(text: str, action: str) -> str:
  """The text after ``action`` (unchanged for an inadmissible one)."""
  if action == "erase":
    return text[:-1]
  if action in ACTIONS:
    return text + action[-1]
  return text


class SpellEnv(base.TextEnv):
  """A ``base.TextEnv``: ``num_tasks``, ``reset``, ``step``,
  ``expert_action``. No ``anchor_obs`` (GiGPO then keys states by the
  observation) and no ``dense_reward`` (``prefix_progress`` below is one)."""

  name = "spell"
  # Optional: the prompt's task line (other parts keep verl-agent's layout).
  prompt_spec = PromptSpec(
      intro="You are typing a word one letter at a time. Your task is to: "
      "{task}.\n"
  )

  def __init__(self, max_steps: int = 8):
    self.max_steps = max_steps
    self.word, self.text, self.t, self.done = "", "", 0, True

  def num_tasks(self, split: str) -> int:
    return _SPLIT_SIZES[split]

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    self.word, self.text = word_of(split, task_id), ""
    self.t, self.done = 0, False
    return self._observe(won=False, valid=True)

  def step(self, action: str) -> base.EnvStep:
    self.text = apply(self.text, action)
    self.t += 1
    won = self.text == self.word
    self.done = won or self.t >= self.max_steps
    return self._observe(won=won, valid=action in ACTIONS)

  def expert_action(self) -> Optional[str]:
    if self.done:
      return None
    if self.word.startswith(self.text):
      return f"type {self.word[len(self.text)]}"
    return "erase"

  def _observe(self, won: bool, valid: bool) -> base.EnvStep:
    return base.EnvStep(
        observation=f"The word is '{self.word}'. You have typed "
        f"'{self.text}'.",
        admissible_actions=list(ACTIONS),
        reward=base.SUCCESS_REWARD * won,  # 10 * won, as every env here
        done=self.done,
        won=won,
        score=float(won),
        task=f"type the word '{self.word}'",
        valid_action=valid,
    )


# -------------------------------------------------- a dense reward for B

_OBS = re.compile(r"The word is '(\w*)'\. You have typed '(\w*)'\.")
STEP_COST = 0.05


def potential(word: str, text: str) -> int:
  """Correct letters minus wrong ones: ``2 * common_prefix - len(text)``."""
  common = 0
  while common < min(len(word), len(text)) and word[common] == text[common]:
    common += 1
  return 2 * common - len(text)


def prefix_progress(records) -> None:
  """``rspo.dense_reward=spell_env:prefix_progress``: fills each step
  record's ``dense_reward`` in place from the record alone,

    dense = (potential(after) - potential(before)) / len(word) - STEP_COST,

  reading the word and the text from the step's observation
  (``record.anchor_obs``) and applying ``record.action`` to it."""
  for r in records:
    match = _OBS.fullmatch(r.anchor_obs)
    if match is None:  # not this environment's observation
      r.dense_reward = -STEP_COST
      continue
    word, text = match.groups()
    gain = potential(word, apply(text, r.action)) - potential(word, text)
    r.dense_reward = gain / len(word) - STEP_COST
