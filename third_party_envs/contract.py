"""What ``reset`` and ``step`` must return, checked where it comes in.

docs/custom_env.md, section 1, names the contract: an ``EnvStep`` whose

  observation, anchor_obs, task, task_type    are str,
  admissible_actions                          a list (or tuple) of str,
  reward, score, dense_reward                 finite numbers,
  done, won, valid_action                     bools,
  info                                        a dict.

``check`` raises ``EnvError`` (a ``ConfigError``: the launchers print it
as one line and exit 1) naming the environment, ``Class.method()``, the
task id, the split and the turn (0 = ``reset``, t = the t-th ``step``
after it), what came back and what was expected. It runs in two places:
every user environment's instance (``registry.WithDefaults``: in the
worker processes, in-process and in the warm start's expert episodes),
and ``VectorEnv`` for every environment's result (the collections and
evaluations, in-process or in workers, barriered or not). A NaN reward
therefore stops the run at the first step that returns it.

A user's dense reward function (``rspo.dense_reward=package.module:fn``)
is held to the same rule: ``checked_dense_fn`` raises ``EnvError`` on a
record whose ``dense_reward`` it left NaN or infinite.

A reward outside the class's declared ``reward_range`` (default ``(0,
10)``: ``10 * won``) is no error: ``warn_reward_range`` logs it once per
environment and process.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Optional

from rspo_jax.errors import EnvError
from third_party_envs import base

log = logging.getLogger(__name__)

DOC = "docs/custom_env.md, section 1"
_TEXT = ("observation", "anchor_obs", "task", "task_type")
_NUMBERS = ("reward", "score", "dense_reward")
_FLAGS = ("done", "won", "valid_action")
_warned: set[str] = set()  # environments whose reward range was warned


def _short(value, limit: int = 40) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_flag(value) -> bool:
  """A bool, a numpy bool, or the integers 0 and 1."""
  if isinstance(value, bool):
    return True
  dtype = getattr(value, "dtype", None)  # numpy's bool scalar
  if dtype is not None and dtype.kind == "b" and value.ndim == 0:
    return True
  return isinstance(value, numbers.Integral) and value in (0, 1)


def problem(out) -> Optional[str]:
  """What is wrong with ``out`` as a ``reset``/``step`` result: ``"<what
  came back>; expected <what is allowed>"``, or None when it is fine."""
  if not isinstance(out, base.EnvStep):
    return (
        f"a {type(out).__name__} ({_short(out)}); expected a"
        " third_party_envs.base.EnvStep"
    )
  for name in _TEXT:
    value = getattr(out, name)
    if not isinstance(value, str):
      return (
          f"{name}={_short(value)} (a {type(value).__name__});"
          " expected a str"
      )
  actions = out.admissible_actions
  if not (
      isinstance(actions, (list, tuple))
      and all(isinstance(a, str) for a in actions)
  ):
    return f"admissible_actions={_short(actions)}; expected a list of" " str"
  for name in _NUMBERS:
    value = getattr(out, name)
    if not isinstance(value, numbers.Real):
      return (
          f"{name}={_short(value)} (a {type(value).__name__});"
          " expected a finite number"
      )
    if not math.isfinite(float(value)):
      return f"{name}={float(value)!r}; expected a finite number"
  for name in _FLAGS:
    value = getattr(out, name)
    if not _is_flag(value):
      return (
          f"{name}={_short(value)} (a {type(value).__name__});"
          " expected a bool"
      )
  if not isinstance(out.info, dict):
    return f"info={_short(out.info)}; expected a dict"
  return None


def where(
    env_name: str, class_name: str, method: str, task_id, split, turn: int
) -> str:
  """``"environment 'x': Cls.step() on task 3 of 'train', turn 2"``."""
  task = f"task {task_id}" + (f" of {split!r}" if split else "")
  return (
      f"environment {env_name!r}: {class_name}.{method}() on {task},"
      f" turn {turn}"
  )


def check(
    out,
    env_name: str,
    class_name: str,
    method: str,
    task_id=None,
    split=None,
    turn: int = 0,
):
  """``out``, or ``EnvError`` when it breaks the contract (module
  docstring)."""
  why = problem(out)
  if why is not None:
    at = where(env_name, class_name, method, task_id, split, turn)
    raise EnvError(f"{at}, returned {why} ({DOC})")
  return out


def warn_reward_range(
    out: base.EnvStep,
    env_name: str,
    env_class: type,
    method: str,
    task_id=None,
    split=None,
    turn: int = 0,
) -> bool:
  """Logs a WARNING, once per ``env_name`` in this process, when
  ``out.reward`` is outside ``env_class.reward_range``; True if it did."""
  low, high = getattr(env_class, "reward_range", (-math.inf, math.inf))
  if env_name in _warned or low <= out.reward <= high:
    return False
  _warned.add(env_name)
  log.warning(
      "%s, returned reward=%r, outside %s.reward_range=(%g, %g): the"
      " outcome reward is 10 * won on the winning step (%s); if yours is"
      " meant to be, declare reward_range on the class. Told once.",
      where(env_name, env_class.__name__, method, task_id, split, turn),
      float(out.reward),
      env_class.__name__,
      low,
      high,
      DOC,
  )
  return True


def checked_dense_fn(fn, path: str):
  """``fn`` (a user's ``rspo.dense_reward=package.module:function``) that
  then raises ``EnvError`` when a record's ``dense_reward`` is not a
  finite number, naming the function, the task and the step."""

  def checked(records):
    out = fn(records)
    for r in records:
      value = r.dense_reward
      if not (isinstance(value, numbers.Real) and math.isfinite(value)):
        raise EnvError(
            f"rspo.dense_reward={path!r} set dense_reward={_short(value)} on"
            f" a record of task {r.task_id}, step {r.step_idx}; expected a"
            " finite number (docs/custom_env.md, section 3)"
        )
    return out

  return checked
