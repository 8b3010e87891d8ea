"""Orbax checkpoints of a run: train states + the loop's bookkeeping.

A checkpoint is written atomically by orbax (a temporary directory renamed
when complete), so a run killed mid-write restores the previous one. Items:
  * one ``StandardSave`` per learner state (policy A, its critic, ...),
  * ``meta``: a JSON dict -- loop index, phase, steps done, counters, the
    config fingerprint (a checkpoint of another model shape or config is
    refused with a message naming the difference).

Saves are asynchronous: ``save`` returns once orbax has copied the arrays
to host memory (its default, synchronous device-to-host transfer: a train
step donating or updating the state afterwards cannot change what is
written) and the files are written by a background thread. The next save,
``latest_step``, ``restore`` and ``close`` first wait for a save in flight.

Which A steps are saved (``due``): every ``train.checkpoint_every``-th, and
always the last step of each loop (D is cleared after that save) and of the
run; the loop saves after B's collection too. A run restarted from an
earlier checkpoint redoes the steps after it exactly as it first did them
(every draw is keyed by the saved counters).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from rspo_jax import faults
from rspo_jax.errors import ConfigError

log = logging.getLogger(__name__)


def due(a_steps: int, every: int, loop_done: bool) -> bool:
  """Whether the checkpoint after A's step ``a_steps`` is written:

      loop_done  or  every <= 1  or  a_steps % every == 0

  (``loop_done``: the step ended a loop, or the run)."""
  return bool(loop_done) or every <= 1 or a_steps % every == 0


def _abstract(tree):
  """Restore targets: shape, dtype and the *current* NamedShardings."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree,
  )


class RunCheckpointer:

  def __init__(self, directory: str, *, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._mgr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=True,
            enable_async_checkpointing=True,
        ),
    )
    self.saved_steps: list[int] = []  # this process's saves, in order

  def latest_step(self) -> Optional[int]:
    """The newest complete checkpoint (after a save in flight ends)."""
    self.wait()
    return self._mgr.latest_step()

  def save(self, step: int, states: dict[str, Any], meta: dict) -> None:
    """Starts writing checkpoint ``step`` and returns once its arrays are
    on the host (module docstring); a save in flight is finished first."""
    self.wait()
    args = {k: ocp.args.StandardSave(v) for k, v in states.items()}
    args["meta"] = ocp.args.JsonSave(meta)
    self._mgr.save(step, args=ocp.args.Composite(**args), force=True)
    self.saved_steps.append(int(step))
    log.info("checkpoint %d: writing in the background", step)
    faults.maybe_fail("checkpoint")  # crash tests: kill mid-write

  def wait(self) -> None:
    """Blocks until a save in flight is complete on disk."""
    self._mgr.wait_until_finished()

  def restore(
      self,
      like: dict[str, Any],
      *,
      fingerprint: Optional[dict] = None,
      step: Optional[int] = None,
  ) -> tuple[dict[str, Any], dict]:
    """Restores the states shaped and sharded like ``like``."""
    self.wait()
    step = self._mgr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    try:
      meta = self._mgr.restore(
          step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
      )["meta"]
    except Exception as e:  # a damaged file: name the checkpoint
      raise ValueError(
          f"checkpoint {self.directory}/{step} is unreadable (its meta item:"
          f" {type(e).__name__}: {e}); move it away to resume from the one"
          " before"
      ) from e
    if fingerprint is not None:
      saved = meta.get("fingerprint", {})
      diff = {
          k: (saved.get(k), v)
          for k, v in fingerprint.items()
          if saved.get(k) != v
      }
      if diff:  # the launchers' one line (a ValueError too)
        raise ConfigError(
            f"checkpoint {self.directory}/{step} was written by another"
            f" configuration: (saved, current) = {diff}; pass another"
            " --workdir, or the configuration that wrote it"
        )
    args = {k: ocp.args.StandardRestore(_abstract(v)) for k, v in like.items()}
    try:
      out = self._mgr.restore(step, args=ocp.args.Composite(**args))
    except Exception as e:  # orbax raises several types on shape mismatch
      raise ValueError(
          f"checkpoint {self.directory}/{step} does not match the current"
          f" model/optimizer shapes, or its files are damaged: {e}"
      ) from e
    return {k: out[k] for k in like}, meta

  def close(self) -> None:
    """Waits for a save in flight, then releases orbax's threads."""
    self.wait()
    self._mgr.close()
