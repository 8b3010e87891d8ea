"""Compile time of a run: JAX's persistent compilation cache, and compile
seconds per jitted function in the metrics.

    directory = cache_dir(cfg, workdir)   # train.compile_cache_dir, else
    enable(directory)                      # $JAX_COMPILATION_CACHE_DIR, else
                                           # <workdir>/compile_cache

A later process of the run (a restart, an evaluation) reads each program it
compiled before from the directory instead of compiling it again, when its
compilation took at least ``jax_persistent_cache_min_compile_time_secs``
(JAX's default 1 s: the programs worth it). ``enable`` must come before the
process's first compilation: JAX decides once per process whether a cache
is in use (``enable`` resets that decision, so a late call still works).

``CompileLog`` collects, from JAX's monitoring events, the seconds spent in
XLA's backend compilation per function (``fun_name``, e.g. the train step,
the engine's ``_prefill`` / ``_decode``), and persistent-cache hits (a hit
is still counted as a compilation, of its retrieval time);
``CompileMetrics`` writes them as a ``compile`` metrics row after any row
that followed compilations:

    {"compiles": n, "compile_s": total, "cache_hits": h,
     "<function>_s": seconds, ...}     # since the previous such row
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from typing import Optional

log = logging.getLogger(__name__)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
NONE = "none"  # train.compile_cache_dir value that turns the cache off


def cache_dir(cfg, workdir: str) -> Optional[str]:
  """``train.compile_cache_dir``; "" = JAX's own
  ``JAX_COMPILATION_CACHE_DIR`` when the environment sets it (one cache
  shared by many runs: a sweep, the test suite), else
  ``<workdir>/compile_cache``; "none" = no persistent cache (None)."""
  path = str(cfg.train.compile_cache_dir or "")
  if path.lower() == NONE:
    return None
  path = path or os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
  return os.path.abspath(path or os.path.join(workdir, "compile_cache"))


def enable(directory: Optional[str]) -> Optional[str]:
  """Turns JAX's persistent compilation cache on in ``directory`` (made if
  missing) for this process; None leaves it off. Returns the directory."""
  if directory is None:
    return None
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache

  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  compilation_cache.reset_cache()  # decided anew at the next compilation
  log.info("persistent compilation cache: %s", directory)
  return directory


# ------------------------------------------------------------ compile log

_LOGS: "weakref.WeakSet[CompileLog]" = weakref.WeakSet()
_LOCK = threading.Lock()
_LISTENING = [False]


def _name(fun_name) -> str:
  """A metrics key of a compiled function's name ('jit(step)' -> 'step'):
  word characters only."""
  name = str(fun_name or "unnamed")
  name = re.sub(r"^p?jit\((.*)\)$", r"\1", name)
  return re.sub(r"\W+", "_", name).strip("_") or "fn"


class CompileLog:
  """Compile seconds per function and cache hits since the last ``take``
  (every thread's compilations: the decoupled B collection's too)."""

  def __init__(self):
    self._seconds: dict[str, float] = {}
    self._counts: dict[str, int] = {}
    self._hits = 0
    self._lock = threading.Lock()
    _listen(self)

  def take(self) -> dict:
    """``{compiles, compile_s, cache_hits, <function>_s...}`` since the
    last call, then starts afresh; {} when nothing compiled."""
    with self._lock:
      seconds, counts, hits = self._seconds, self._counts, self._hits
      self._seconds, self._counts, self._hits = {}, {}, 0
    if not counts and not hits:
      return {}
    out = {
        "compiles": float(sum(counts.values())),
        "compile_s": float(sum(seconds.values())),
        "cache_hits": float(hits),
    }
    out.update({f"{k}_s": v for k, v in sorted(seconds.items())})
    return out

  def _on_compile(self, fun_name, seconds: float) -> None:
    key = _name(fun_name)
    with self._lock:
      self._seconds[key] = self._seconds.get(key, 0.0) + float(seconds)
      self._counts[key] = self._counts.get(key, 0) + 1

  def _on_hit(self) -> None:
    with self._lock:
      self._hits += 1


def _listen(compile_log: CompileLog) -> None:
  """One pair of process-wide jax.monitoring listeners feeds every log."""
  with _LOCK:
    _LOGS.add(compile_log)
    if _LISTENING[0]:
      return
    import jax  # pylint: disable=g-import-not-at-top

    def on_duration(event: str, duration: float, **kwargs) -> None:
      if event == COMPILE_EVENT:
        for one in list(_LOGS):
          one._on_compile(kwargs.get("fun_name"), duration)  # pylint: disable=protected-access

    def on_event(event: str, **kwargs) -> None:
      del kwargs
      if event == CACHE_HIT_EVENT:
        for one in list(_LOGS):
          one._on_hit()  # pylint: disable=protected-access

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    _LISTENING[0] = True


class CompileMetrics:
  """A metrics writer that, after each row it writes, writes a
  ``compile`` row at the same step when anything compiled since the
  previous one (``CompileLog.take``); otherwise the writer it wraps."""

  def __init__(self, writer, compile_log: Optional[CompileLog] = None):
    self._writer = writer
    self._log = compile_log or CompileLog()

  def write(self, step: int, phase: str, metrics: dict) -> None:
    self._writer.write(step, phase, metrics)
    got = self._log.take()
    if got:
      self._writer.write(step, "compile", got)

  def close(self) -> None:
    self._writer.close()

  def __getattr__(self, name):
    return getattr(self._writer, name)
