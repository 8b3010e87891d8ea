"""Fault injection for the crash tests: ``RSPO_FAULT_AT=<point>[:<n>]``.

With the variable set, the process SIGKILLs itself (no cleanup, no atexit,
no flush: the same as ``kill -9`` or an OOM kill) the ``n``-th time
(default 1) it reaches ``point``; with ``RSPO_FAULT_SIGNAL=TERM`` it sends
itself SIGTERM instead (a scheduler's preemption: preemption.py). Points
named by the library:

  b_phase     B's phase, after B's first update (A untouched, no replay yet)
  collect     B's collection, shards written but the buffer not marked
              complete
  a_phase     A's phase, after A's update, before its metrics and checkpoint
  checkpoint  inside a checkpoint write, after orbax started writing and
              before it finished

Unset (always, outside tests) this is a dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "RSPO_FAULT_AT"
SIGNAL_VAR = "RSPO_FAULT_SIGNAL"  # KILL (default) or TERM
POINTS = ("b_phase", "collect", "a_phase", "checkpoint")
_hits: dict[str, int] = {}


def parse(spec: str) -> tuple[str, int]:
  """``'a_phase:2'`` -> ``('a_phase', 2)``; ValueError names a bad spec."""
  point, _, count = spec.partition(":")
  if point not in POINTS or (count and not count.isdigit()) or count == "0":
    raise ValueError(
        f"{ENV_VAR}={spec!r}: expected <point>[:<n>], point one of {POINTS},"
        " n >= 1"
    )
  return point, int(count or 1)


def maybe_fail(point: str) -> None:
  """SIGKILLs (or SIGTERMs) this process at the ``n``-th arrival at
  ``point`` when ``RSPO_FAULT_AT`` asks for it."""
  spec = os.environ.get(ENV_VAR)
  if not spec:
    return
  target, n = parse(spec)
  if point != target:
    return
  _hits[point] = _hits.get(point, 0) + 1
  if _hits[point] == n:
    name = os.environ.get(SIGNAL_VAR, "KILL")
    if name not in ("KILL", "TERM"):
      raise ValueError(f"{SIGNAL_VAR}={name!r}: expected KILL or TERM")
    os.kill(os.getpid(), getattr(signal, "SIG" + name))
