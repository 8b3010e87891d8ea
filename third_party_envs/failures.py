"""The first failure of each kind in an environment pool, told once.

A failed episode comes back as a failed ``EnvStep`` whose ``info['error']``
is a traceback (an exception in ``reset``/``step``) or one line (a worker
that died or hung). Every such episode is counted (``num_failures``,
``rollout_failed_episodes``); this module makes sure a person also sees
why, without a log line per episode:

  kind(error) = exception type + the frame that raised it
                (file, line, function), or the one-line error with its
                numbers blanked (worker 3 and worker 5 are one kind);

the first error of each kind is logged at WARNING with its task id and
whole text, and appended to ``path`` (e.g. ``<workdir>/env_errors.log``)
when one is given. Later errors of a known kind are only counted.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Optional

log = logging.getLogger(__name__)


def last_line(error: str) -> str:
  """The last non-blank line (a traceback's ``Type: message``)."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[-1] if lines else ""


def error_kind(error: str) -> str:
  """Exception type and raising frame, or the digit-blanked one-liner."""
  frames = re.findall(r'^\s*File "[^"]*", line \d+, in .*$', str(error), re.M)
  last = last_line(error)
  if frames:
    return f"{last.split(':', 1)[0]} at {frames[-1].strip()}"
  return re.sub(r"\d+", "N", last)


class FailureLog:
  """Kind -> first error text (``errors``); ``record`` tells new kinds."""

  def __init__(self, env_name: str, path: Optional[str] = None):
    self.env_name, self.path = env_name, path
    self.errors: dict[str, str] = {}

  @property
  def first_error(self) -> Optional[str]:
    """The first failure's text (None: nothing failed yet)."""
    return next(iter(self.errors.values()), None)

  def record(self, error: str, task_id=None, split=None) -> None:
    kind = error_kind(error)
    if kind in self.errors:
      return
    self.errors[kind] = error
    where = f"task {task_id}" + (f" of {split!r}" if split else "")
    also = ""
    if self.path is not None and self._append(where, error):
      also = f" (also in {self.path})"
    # Once per kind: the same bug in every episode is one message.
    log.warning(
        "environment %r failed an episode (%s); first failure of "
        "this kind, later ones are only counted in "
        "rollout_failed_episodes%s:\n%s",
        self.env_name,
        where,
        also,
        error.rstrip(),
    )

  def _append(self, where: str, error: str) -> bool:
    try:
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
      with open(self.path, "a") as f:
        f.write(
            f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}"
            f" {self.env_name}, {where}\n{error.rstrip()}\n"
        )
      return True
    except OSError as e:  # the console log still has it
      log.warning("could not write %s: %s", self.path, e)
      return False
