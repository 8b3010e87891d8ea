"""Errors a person fixes by changing what they passed: a config key or
value, a path, a server URL. The launchers print such an error's message as
one line and exit with status 1 (no traceback); everything else is a bug
and keeps its traceback."""

from __future__ import annotations

import difflib
from typing import Iterable


class ConfigError(ValueError):
  """Something the user passed is wrong. The message is one line naming the
  key (or flag), the bad value and what is accepted or what to pass."""


def did_you_mean(word, choices: Iterable[str]) -> str:
  """``" (did you mean 'x'?)"`` for the choice closest to ``word``
  (difflib's ratio >= 0.6), else ``""``."""
  close = difflib.get_close_matches(
      str(word), [str(c) for c in choices], n=1, cutoff=0.6
  )
  return f" (did you mean {close[0]!r}?)" if close else ""


def one_line(text: str) -> str:
  """``text`` on one line (newlines and runs of spaces become one space)."""
  return " ".join(str(text).split())


class EnvError(ConfigError):
  """An environment returned what docs/custom_env.md does not allow (a
  NaN reward, ``reset()`` returning a string, ...). The message is one
  line naming the environment, the class and method, the task id and the
  turn, what came back and what was expected. It stops the run: the
  person fixes the environment (``third_party_envs/contract.py``)."""


class MissingPackage(ConfigError, ImportError):
  """An optional package the config asks for is not installed (``wandb``
  for ``metrics.wandb_project``, ...). One line naming the key and the
  ``pip install`` that fixes it; also an ImportError."""
