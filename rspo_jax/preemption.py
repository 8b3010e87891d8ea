"""Stopping on SIGTERM (preemption) with nothing lost.

A scheduler that preempts a job (SLURM, Kubernetes, a TPU maintenance
event) sends SIGTERM and, after a grace period, SIGKILL. With ``install()``
the first SIGTERM is a request: the trainer finishes the A step (or B
phase) in progress, writes a checkpoint if that step's was not due
(``train.checkpoint_every``), waits for every write in flight, and raises
``Preempted``; ``launch/train.py`` then exits with 143 (128 + SIGTERM).
Started again with the same workdir, the run resumes from that checkpoint
and goes on as if it had not stopped. A second SIGTERM takes the default
action (the process ends at once; the last finished checkpoint stays).

Multi-host: hosts may receive the signal at different times; ``requested``
is the OR over processes (one small all-gather per step), so every host
stops after the same step.
"""

from __future__ import annotations

import logging
import signal
import threading

from rspo_jax import distributed

log = logging.getLogger(__name__)
EXIT_CODE = 128 + signal.SIGTERM


class Preempted(Exception):
  """The run stopped on request after ``a_steps`` A steps, checkpointed."""

  def __init__(self, a_steps: int):
    super().__init__(
        f"stopped on SIGTERM after A step {a_steps}; the"
        " checkpoint is written: start again to resume"
    )
    self.a_steps = a_steps


class StopRequest:
  """A flag set by SIGTERM (once ``install``-ed) or by ``set``."""

  def __init__(self):
    self._event = threading.Event()

  def install(self) -> None:
    """Makes the first SIGTERM set the flag (main thread only)."""
    signal.signal(signal.SIGTERM, self._on_signal)

  def _on_signal(self, signum, frame) -> None:
    del frame
    log.warning(
        "SIGTERM: stopping after the current step, once its"
        " checkpoint is written (a second SIGTERM stops at once)"
    )
    signal.signal(signum, signal.SIG_DFL)
    self._event.set()

  def set(self) -> None:
    self._event.set()

  def requested(self) -> bool:
    """Whether any process was asked to stop (collective when multi-host:
    every process must call it at the same point)."""
    return bool(distributed.global_max(int(self._event.is_set())))
