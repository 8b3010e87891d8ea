"""Wall seconds per phase of a training step (generation, update, ...).

    with timer.phase("generation"):
      ...
    seconds = timer.reset()   # {"generation": 1.23, ...}; starts afresh

Nested phases count exclusively: an inner phase's seconds are taken out of
the phase around it, so the values of one step add up to the wall time
spent inside any phase (no second is counted twice):

    outer_s = (time inside outer) - (time inside its inner phases)

``add`` books seconds measured elsewhere (e.g. by ``collect``) to a phase
and, when called inside a phase, takes them out of that phase too. With
``count_compiles=True`` the timer also counts XLA compilations by the phase
open when each happened (``compiles()``; "none" outside every phase): a
steady-state step should have none. The timer is for one thread: phases
opened from another thread would interleave with this one's.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from typing import Callable, Iterator

_COMPILE_EVENT = "backend_compile_duration"
_LISTENING: "weakref.WeakSet[PhaseTimer]" = weakref.WeakSet()
_LISTENER_LOCK = threading.Lock()
_LISTENER_ON = [False]


class PhaseTimer:
  """Accumulates exclusive wall seconds per phase name."""

  def __init__(
      self,
      clock: Callable[[], float] = time.perf_counter,
      *,
      count_compiles: bool = False,
  ):
    self._clock = clock
    self._seconds: dict[str, float] = {}
    self._calls: dict[str, int] = {}
    self._compiles: dict[str, int] = {}
    self._compile_s: dict[str, float] = {}
    # One [name, inner seconds] per open phase, innermost last.
    self._open: list[list] = []
    if count_compiles:
      _listen(self)

  @contextlib.contextmanager
  def phase(self, name: str) -> Iterator[None]:
    frame = [name, 0.0]
    self._open.append(frame)
    start = self._clock()
    try:
      yield
    finally:
      elapsed = self._clock() - start
      self._open.pop()
      self._book(name, elapsed - frame[1])
      if self._open:
        self._open[-1][1] += elapsed

  def add(self, name: str, seconds: float) -> None:
    """Books ``seconds`` measured elsewhere to ``name`` (exclusively)."""
    self._book(name, float(seconds))
    if self._open:
      self._open[-1][1] += float(seconds)

  def wrap(self, fn: Callable, name: str) -> Callable:
    """``fn`` with every call inside ``phase(name)``."""

    @functools.wraps(fn)
    def timed(*args, **kwargs):
      with self.phase(name):
        return fn(*args, **kwargs)

    return timed

  def seconds(self) -> dict[str, float]:
    """A copy of the seconds so far, by phase."""
    return dict(self._seconds)

  def calls(self) -> dict[str, int]:
    """How many times each phase was entered (or added) so far."""
    return dict(self._calls)

  def compiles(self) -> dict[str, int]:
    """XLA compilations so far by the phase open at the time
    (``count_compiles=True``; else empty)."""
    return dict(self._compiles)

  def compile_seconds(self) -> dict[str, float]:
    """Seconds those compilations took, by phase (part of its seconds)."""
    return dict(self._compile_s)

  def reset(self) -> dict[str, float]:
    """The seconds so far, by phase; then starts afresh (per step; the
    calls and compilations too)."""
    out = self._seconds
    self._seconds, self._calls = {}, {}
    self._compiles, self._compile_s = {}, {}
    return out

  @property
  def active(self) -> tuple[str, ...]:
    """Names of the open phases, outermost first."""
    return tuple(f[0] for f in self._open)

  def _book(self, name: str, seconds: float) -> None:
    self._seconds[name] = self._seconds.get(name, 0.0) + seconds
    self._calls[name] = self._calls.get(name, 0) + 1

  def _on_compile(self, seconds: float) -> None:
    where = self._open[-1][0] if self._open else "none"
    self._compiles[where] = self._compiles.get(where, 0) + 1
    self._compile_s[where] = self._compile_s.get(where, 0.0) + seconds


def _listen(timer: PhaseTimer) -> None:
  """One process-wide jax.monitoring listener feeds every counting timer."""
  with _LISTENER_LOCK:
    _LISTENING.add(timer)
    if _LISTENER_ON[0]:
      return
    import jax  # pylint: disable=g-import-not-at-top

    def on_event(event: str, duration: float, **kwargs) -> None:
      del kwargs
      if event.endswith(_COMPILE_EVENT):
        for t in list(_LISTENING):
          t._on_compile(duration)  # pylint: disable=protected-access

    jax.monitoring.register_event_duration_secs_listener(on_event)
    _LISTENER_ON[0] = True
