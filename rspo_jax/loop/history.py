"""RSPO_H (``rspo.data_source='history'``): D is A's own groups of the
previous loop.

A's fresh groups of loop L are written to ``<workdir>/replay_next``;
once loop L's checkpoint is on disk, ``replay_next`` becomes D (given a
``_FROM_LOOP`` file holding L) for loop L + 1's A steps.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

from rspo_jax import distributed, replay
from rspo_jax.loop import state as state_lib
from rspo_jax.types import group_trajectories

FROM_LOOP = "_FROM_LOOP"  # RSPO_H: the loop whose groups D holds


class History:
  """A's groups of the current loop (``buffer``), D of the next one."""

  def __init__(self, workdir: str, prefix: str, leader: bool):
    self.prefix, self.leader = prefix, leader
    self.buffer = replay.ReplayBuffer(
        os.path.join(workdir, "replay_next"), prefix=prefix
    )

  def add(self, records: list) -> None:
    """A's fresh step rows of the loop."""
    self.buffer.add_trajectories(group_trajectories(records))

  def drop_unsaved(self, collections: int) -> None:
    """Resume: the groups written after the restored checkpoint dropped
    (``state.drop_unsaved_shards``)."""
    state_lib.drop_unsaved_shards(
        self.buffer.directory, collections, self.leader
    )
    self.buffer = self._reopened(self.buffer)

  def becomes_d(self, d: replay.ReplayBuffer, loop: int) -> replay.ReplayBuffer:
    """D (``d``) after ``replay_next``, A's groups of loop L = ``loop - 1``,
    is marked complete, given a ``_FROM_LOOP`` file holding L and renamed
    onto D. Idempotent: not redone once D holds L's groups; a move cut
    short is finished (begun: D holds an older loop's, or ``replay_next``
    shards or its marks; a workdir of a version without ``_FROM_LOOP``
    moved before the loop's save)."""
    done, h = str(loop - 1), self.buffer.directory
    distributed.barrier("rspo_history_written")
    # Only the leader reads: it may be removing D while others would read.
    d_from = (
        _read(os.path.join(d.directory, FROM_LOOP)) if self.leader else None
    )
    if (
        self.leader
        and d_from != done
        and (
            d_from is not None or replay.is_complete(h) or replay.list_shards(h)
        )
    ):
      _write(os.path.join(h, FROM_LOOP), done)
      replay.mark_complete(h)
      shutil.rmtree(d.directory, ignore_errors=True)
      os.rename(h, d.directory)
    distributed.barrier("rspo_history_moved")
    self.buffer = self._reopened(self.buffer)
    return self._reopened(d)

  def _reopened(self, buffer: replay.ReplayBuffer) -> replay.ReplayBuffer:
    return replay.ReplayBuffer(buffer.directory, prefix=self.prefix)


def _read(path: str) -> Optional[str]:
  """The text of ``path``, None when it does not exist."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read()


def _write(path: str, text: str) -> None:
  """``path`` := ``text`` atomically and durably (a temporary, fsynced, then
  a rename): after a power loss the file holds ``text`` or is absent, never
  empty (an empty ``_FROM_LOOP`` would read as a move cut short)."""
  with open(path + ".tmp", "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(path + ".tmp", path)
