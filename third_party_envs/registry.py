"""Environment names -> constructors, imported lazily.

``env.name`` is a built-in name (``toy``, ``spell``, ``webshop``,
``alfworld``) or the import path ``package.module:ClassName`` of any
``base.TextEnv`` subclass (docs/custom_env.md). Worker processes build
their instances from ``(name, kwargs)`` through ``make_env``, so an
environment only needs to be importable (installed, or on ``PYTHONPATH``),
not picklable.

A user environment may leave out what only some algorithms need; ``make_env``
fills the defaults:
  * ``EnvStep.anchor_obs`` (GiGPO's state key) empty -> the observation text;
  * ``EnvStep.dense_reward`` stays 0.0 -> give RSPO's Agent B a dense reward
    another way (``rspo.dense_reward=prm`` or ``=package.module:function``).
Every ``reset``/``step`` result of a user environment is checked there too
(``contract.check``: an ``EnvStep`` with finite rewards, else ``EnvError``
naming the class, method, task and turn).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from third_party_envs import base
from third_party_envs import contract

# name -> (module, class); the heavy environments load only when asked for.
_ENVS = {
    "toy": ("third_party_envs.toy", "ToyEnv"),
    "spell": ("third_party_envs.spell", "SpellEnv"),
    "webshop": ("third_party_envs.webshop", "WebShopEnv"),
    "alfworld": ("third_party_envs.alfworld", "AlfWorldEnv"),
}
ENV_NAMES = tuple(_ENVS)


def is_import_path(name: str) -> bool:
  """``'pkg.mod:Name'``: a module path, one colon, an attribute path."""
  module, sep, attr = name.partition(":")
  return bool(sep and module and attr and ":" not in attr)


def import_object(path: str, what: str = "object") -> Any:
  """The object at ``'package.module:attr'`` (``attr`` may be dotted).

  Raises ValueError naming the path and what failed (no such module, no such
  attribute) instead of a bare ImportError.
  """
  if not is_import_path(path):
    raise ValueError(
        f"{what} {path!r} is not an import path " "'package.module:name'"
    )
  module_name, _, attr = path.partition(":")
  try:
    obj = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(
        f"{what} {path!r}: cannot import module "
        f"{module_name!r} ({e}); install its package or put "
        "its directory on PYTHONPATH"
    ) from e
  for part in attr.split("."):
    try:
      obj = getattr(obj, part)
    except AttributeError:
      raise ValueError(
          f"{what} {path!r}: module {module_name!r} has no "
          f"attribute {attr!r}"
      ) from None
  return obj


def import_function(path: str, what: str = "function") -> Callable:
  """``import_object`` that must be callable."""
  fn = import_object(path, what)
  if not callable(fn):
    raise ValueError(f"{what} {path!r} is {fn!r}, not callable")
  return fn


def env_class(name: str) -> type:
  """The ``TextEnv`` subclass behind a built-in name or an import path;
  ValueError naming what is wrong (no such module or class, not a
  ``TextEnv``, abstract methods left undefined)."""
  if name in _ENVS:
    module_name, class_name = _ENVS[name]
    return getattr(importlib.import_module(module_name), class_name)
  if not is_import_path(name):
    raise ValueError(
        f"unknown environment {name!r}; known: "
        f"{list(ENV_NAMES)} or an import path "
        "'package.module:ClassName' of a TextEnv subclass"
    )
  cls = import_object(name, "environment")
  if not (isinstance(cls, type) and issubclass(cls, base.TextEnv)):
    raise ValueError(
        f"environment {name!r} is {cls!r}, not a subclass of "
        "third_party_envs.base.TextEnv"
    )
  missing = sorted(getattr(cls, "__abstractmethods__", ()))
  if missing:  # else a TypeError deep in the first worker that builds one
    raise ValueError(
        f"environment {name!r}: class {cls.__name__} does not define "
        f"{', '.join(missing)} (abstract in third_party_envs.base.TextEnv;"
        " docs/custom_env.md, section 1)"
    )
  return cls


def check_env_name(name: str) -> None:
  """ValueError unless ``name`` resolves to an environment class."""
  env_class(name)


def make_env(name: str, **kwargs) -> base.TextEnv:
  """Builds one instance of environment ``name`` with ``kwargs``."""
  env = env_class(name)(**kwargs)
  return env if name in _ENVS else WithDefaults(env, name)


def _fill(step: base.EnvStep) -> base.EnvStep:
  if not step.anchor_obs:
    step.anchor_obs = step.observation
  return step


class WithDefaults(base.TextEnv):
  """A user environment with its results checked (``contract.check``) and
  ``anchor_obs`` defaulted to the observation (see the module docstring);
  every other attribute is the wrapped one's."""

  def __init__(self, env: base.TextEnv, env_name: str = ""):
    self.env = env
    self.name = getattr(env, "name", type(env).__name__)
    self.env_name = env_name or type(env).__name__
    self._task, self._turn = (None, None), 0  # (task id, split), steps

  # base.TextEnv's class attributes would hide the wrapped class's.
  expert_keeps_lost = property(lambda self: self.env.expert_keeps_lost)
  reward_range = property(lambda self: self.env.reward_range)

  def num_tasks(self, split: str) -> int:
    return self.env.num_tasks(split)

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    self._task, self._turn = (task_id, split), 0
    return _fill(self._checked("reset", self.env.reset(task_id, split)))

  def step(self, action: str) -> base.EnvStep:
    self._turn += 1
    return _fill(self._checked("step", self.env.step(action)))

  def _checked(self, method: str, out) -> base.EnvStep:
    return contract.check(
        out,
        self.env_name,
        type(self.env).__name__,
        method,
        *self._task,
        turn=self._turn,
    )

  def expert_action(self) -> Optional[str]:
    return self.env.expert_action()

  def expert_thought(self) -> Optional[str]:
    return self.env.expert_thought()

  def tokenizer_words(self) -> list[str]:
    return self.env.tokenizer_words()

  def close(self) -> None:
    self.env.close()

  def __getattr__(self, attr):  # only called for what is not defined here
    env = self.__dict__.get("env")
    if env is None:
      raise AttributeError(attr)
    return getattr(env, attr)
