"""Overlap (``rollout.overlap=1``): A's next collection runs during A's update.

Without it an A step runs its parts in turn. With it, step t starts step
t + 1's collection on the weights it holds, theta_t, just before its own
update, in a background thread:

  step t      take rows (prefetched, or collect) -> replay -> start the
              next collection on theta_t  ||  update: theta_t -> theta_t+1
  step t + 1  wait for the rows (``collect_wait``) -> replay -> ...

so A's collection leaves the critical path where the update is the longer
part, and the rows of step t + 1 are one A step stale: pi_old (theta_t+1,
at the step's start) did not sample them. They keep the log-probs of
theta_t as behaviour log-probs (A's learner recomputes them in the thread
on a snapshot of theta_t when ``rspo.recompute_behavior_logp``, else the
engine's), and the loss centres their clip window on
c = pi_old / pi_behaviour: the shifted clip RSPO uses for B's replayed rows
(update.py ``stale_on``, losses.mixed_objective with
``LossConfig.overlap``; AReaL's decoupled PPO). Logged per A step:
``overlap_policy_lag`` (A steps between the weights that played a step's
rows and those that train on them) and ``overlap_logp_gap_on`` (mean
|log pi_old - log pi_behaviour| on its fresh tokens at the step's start).

Never across a B phase (B := A after the update) or, with RSPO, a loop's
end (D changes there): the first A step of such a loop collects on its own
weights (lag 0). The thread plays on the engine, the environments and the
tokenizer, which nothing else uses meanwhile (an evaluation waits for it);
it changes no loop state. The main thread counts the collection, checks
its failures and adds its environment steps when it takes the rows, so a
checkpoint written while the thread runs holds the state without it: a
resumed run collects that step again on its own weights (lag 0) and loses
nothing more than it did without overlap. An exception in the thread is
raised in the main thread when it takes the rows, as ``OverlapError`` from
it, with its traceback. One process only (the thread would join
collectives of its own), and one device whenever the thread runs compiled
programs there -- the in-process engine's prefill and decode, or the
behaviour log-prob pass: two threads launching collectives on the same
devices can deadlock (NCCL), so such a run stops at start with one line
(``plan.overlap_problem``). The weights the thread plays are copied
before each update (``Learner.frozen_params``) and counted by the plan
(``overlap_snapshot_GB``), as is its collection beside the update.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Callable, Optional

from rspo_jax import timing


class OverlapError(RuntimeError):
  """A's background collection failed (``__cause__``: its exception)."""


class Prefetch:
  """``fn(timer)`` in a daemon thread started now; ``result()`` waits for
  its value. ``timer`` is the thread's own ``timing.PhaseTimer`` (a timer
  is for one thread)."""

  def __init__(
      self,
      fn: Callable[[timing.PhaseTimer], object],
      *,
      weights_step: int,
      collection: int,
      task_ids,
      name: str = "a-next-collection",
  ):
    self.weights_step = weights_step  # A steps taken by the weights played
    self.collection, self.task_ids = collection, task_ids
    self.timer = timing.PhaseTimer()
    self.wall_s = 0.0
    self._value = None
    self._error: Optional[BaseException] = None
    self._thread = threading.Thread(
        target=self._run, args=(fn,), name=name, daemon=True
    )
    self._thread.start()

  def _run(self, fn) -> None:
    t0 = time.perf_counter()
    try:
      self._value = fn(self.timer)
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e
    finally:
      self.wall_s = time.perf_counter() - t0

  def wait(self) -> None:
    """Until the thread has ended (its error, if any, stays for
    ``result``)."""
    self._thread.join()

  def result(self):
    """``fn``'s value once the thread has ended.

    Raises:
      OverlapError: ``fn`` raised (``from`` its exception; the message
        holds its traceback).
    """
    self.wait()
    e = self._error
    if e is not None:
      tb = "".join(traceback.format_exception(e, limit=12))
      raise OverlapError(
          f"A's background collection (on the weights after A step"
          f" {self.weights_step}) failed: {type(e).__name__}: {e}\n"
          f"its traceback:\n{tb}"
      ) from e
    return self._value

  def seconds(self) -> dict:
    """The thread's wall seconds and its phases', as
    ``overlap_collect_s`` and ``overlap_<phase>_s``."""
    out = {f"overlap_{k}_s": v for k, v in self.timer.seconds().items()}
    out["overlap_collect_s"] = self.wall_s
    return out
