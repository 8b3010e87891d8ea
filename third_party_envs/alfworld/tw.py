"""The stock ALFWorld text engine: textworld's PDDL backend + ALFWorld wrappers.

``make_tw_env`` builds what ``AlfredTWEnv.init_env`` registers per game
(``PddlEnv`` wrapped in ``AlfredDemangler`` and ``AlfredInfos``), without the
gym batching. Object ids like ``Sink_bar_..._bar_SinkBasin`` are shown as
``sinkbasin 1``. ``plan`` asks the built-in planner (fast-downward) for the
walkthrough from the current state: the commands ALFWorld's
``expert_type='planner'`` exposes as ``extra.expert_plan``.
"""

# pylint: disable=protected-access

from __future__ import annotations

import contextlib
import sys

import textworld
from textworld.envs import PddlEnv

from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
from alfworld.agents.environment.alfred_tw_env import AlfredInfos


@contextlib.contextmanager
def keep_argv():
  """fast-downward's translator overwrites ``sys.argv``; put it back."""
  saved = sys.argv
  try:
    yield
  finally:
    sys.argv = saved


def make_tw_env() -> textworld.core.Environment:
  """A PDDL text-world env with ALFWorld's demangler and infos wrappers."""
  infos = textworld.EnvInfos(
      admissible_commands=True, won=True, feedback=True, extras=["gamefile"]
  )
  with keep_argv():
    env = PddlEnv(infos)
  return AlfredInfos(AlfredDemangler(env, shuffle=False))


def load_and_reset(env, game_file: str):
  """Loads ``game_file`` (a ``.tw-pddl`` JSON) and returns the first state."""
  with keep_argv():
    env.load(game_file)
    return env.reset()


def plan(env) -> list[str]:
  """The planner's command sequence from the current state ([] if none)."""
  raw = env.unwrapped
  with keep_argv():
    return list(raw._pddl_state.replan(raw._entity_infos))


def names(env) -> dict:
  """PDDL id -> the name the game shows (after demangling)."""
  return {k: info.name for k, info in env.unwrapped._entity_infos.items()}
