"""Decoupled placement: Agent B's collection runs beside A's phase.

``rollout.placement = 'colocated'`` (the default): B collects its stored
groups, the buffer ``D`` is complete, then A's phase starts.
``rollout.placement = 'decoupled'``: B's collection runs in a background
thread against its own engine (an ``SGLangClient`` to other servers, or a
``JaxEngine`` on ``jax.devices()[k:]``) and its own ``VectorEnv``, writing
each group to array-record shards as soon as it is played; A's phase starts
once the groups it needs exist (``wait_for_groups``) and selects
trajectories among the groups complete at that time (``read_trajectories``).

Files in ``buffer_dir``:

  <prefix>-<seq>-<uid>.array_record   closed shards (``replay.ShardWriter``)
  _GROUP-<seq:06d>.json               manifest of one complete group
  _COMPLETE                           the producer finished
  _ERROR                              the producer failed (its error text)

A group's records are written, its shards published (``rotate``), then its
manifest ``{seq, group_id, task_id, traj_ids, num_records, shards}`` is
written atomically (``*.tmp`` + ``os.replace``). Every shard belongs to one
group, so readers that go through manifests see whole groups only, each
record exactly once, whatever ``records_per_shard`` is. A producer killed
mid-group leaves closed shards of complete groups (readable), possibly
closed shards of the unfinished group (no manifest: ignored) and a ``.tmp``
(invisible; ``replay.recover`` removes it).

Consumers never hang: waits raise ``ProducerError`` (with the producer's
error) when ``_ERROR`` appears or a watched thread ends without a marker,
and ``TimeoutError`` after ``timeout_s`` seconds without a new group (a
producer killed hard writes nothing).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
import traceback
from typing import Callable, Iterable, Iterator, Optional, Sequence

from rspo_jax import replay
from rspo_jax.replay.shards import SHARD_SUFFIX
from rspo_jax.replay.shards import TMP_SUFFIX
from rspo_jax.rollout.collect import CollectConfig, CollectRequest, collect
from rspo_jax.rollout.engine import Engine
from rspo_jax.types import StepRecord, Trajectory
from rspo_jax.types import group_trajectories

ERROR_FILE = "_ERROR"
_MANIFEST_RE = re.compile(r"^_GROUP-(\d{6,})\.json$")


class ProducerError(RuntimeError):
  """B's collection failed or ended without finishing its groups."""


class _Cancelled(Exception):
  pass


@dataclasses.dataclass(frozen=True)
class GroupManifest:
  seq: int  # 0, 1, ... in write order
  group_id: int
  task_id: int
  traj_ids: tuple[int, ...]
  num_records: int
  shards: tuple[str, ...]  # basenames, in write order


# ------------------------------------------------------------ files


def _manifest_path(buffer_dir: str, seq: int) -> str:
  return os.path.join(buffer_dir, f"_GROUP-{seq:06d}.json")


def _write_atomic(path: str, text: str) -> None:
  with open(path + TMP_SUFFIX, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(path + TMP_SUFFIX, path)


def _read_error(buffer_dir: str) -> Optional[str]:
  try:
    with open(os.path.join(buffer_dir, ERROR_FILE)) as f:
      return f.read()
  except FileNotFoundError:
    return None


def clear(buffer_dir: str) -> None:
  """Removes shards, temporaries, manifests and markers of ``buffer_dir``."""
  if not os.path.isdir(buffer_dir):
    return
  for name in os.listdir(buffer_dir):
    if (
        name.endswith((SHARD_SUFFIX, TMP_SUFFIX))
        or _MANIFEST_RE.match(name)
        or name in (replay.COMPLETE_MARKER, ERROR_FILE)
    ):
      os.remove(os.path.join(buffer_dir, name))


def list_groups(buffer_dir: str) -> list[GroupManifest]:
  """Manifests of the complete groups, by seq (missing dir: none).

  Raises:
    replay.ReplayFormatError: naming the manifest that does not parse.
  """
  if not os.path.isdir(buffer_dir):
    return []
  found = sorted(
      (int(m[1]), name)
      for name in os.listdir(buffer_dir)
      if (m := _MANIFEST_RE.match(name))
  )
  out = []
  for _, name in found:
    path = os.path.join(buffer_dir, name)
    try:
      with open(path) as f:
        d = json.load(f)
      out.append(
          GroupManifest(
              seq=int(d["seq"]),
              group_id=int(d["group_id"]),
              task_id=int(d["task_id"]),
              traj_ids=tuple(int(t) for t in d["traj_ids"]),
              num_records=int(d["num_records"]),
              shards=tuple(str(s) for s in d["shards"]),
          )
      )
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise replay.ReplayFormatError(
          f"{path}: bad group manifest ({e})"
      ) from None
  return out


def read_group(
    buffer_dir: str, manifest: GroupManifest, cache: Optional[dict] = None
) -> list[StepRecord]:
  """The records of one complete group, in write order (``cache``: shard
  path -> records, filled and reused when given)."""
  records = []
  for name in manifest.shards:
    path = os.path.join(buffer_dir, name)
    if cache is not None and path in cache:
      records += cache[path]
      continue
    got = replay.read_shard(path)
    if cache is not None:
      cache[path] = got
    records += got
  if len(records) != manifest.num_records:
    raise replay.ReplayFormatError(
        f"{buffer_dir}: group seq {manifest.seq} has {len(records)} records"
        f" in its shards, its manifest says {manifest.num_records}"
    )
  return records


def read_groups(
    buffer_dir: str, cache: Optional[dict] = None
) -> list[list[Trajectory]]:
  """Every complete group's trajectories (by traj_id), groups by seq."""
  return [
      group_trajectories(read_group(buffer_dir, m, cache))
      for m in list_groups(buffer_dir)
  ]


def read_trajectories(
    buffer_dir: str, cache: Optional[dict] = None
) -> list[Trajectory]:
  """Every trajectory of the groups complete now: the D that A's replay
  selection (``replay.selection.select``, as with colocated placement)
  ranks while B is still writing."""
  return [t for g in read_groups(buffer_dir, cache) for t in g]


# ------------------------------------------------------------ producer


def _write_group(
    writer: replay.ShardWriter, seq: int, records: Sequence[StepRecord]
) -> GroupManifest:
  if not records:
    raise ValueError(f"group seq {seq} has no records")
  gids = {r.group_id for r in records}
  if len(gids) != 1:
    raise ValueError(f"group seq {seq} mixes group_ids {sorted(gids)}")
  keys = [(r.traj_id, r.step_idx) for r in records]
  if len(set(keys)) != len(keys):
    raise ValueError(f"group seq {seq} repeats a (traj_id, step_idx)")
  encoded = [replay.encode_record(r) for r in records]  # all or nothing
  writer.rotate()
  first = len(writer.shards_written)
  for data in encoded:
    writer.write_encoded(data)
  writer.rotate()
  manifest = GroupManifest(
      seq=seq,
      group_id=records[0].group_id,
      task_id=records[0].task_id,
      traj_ids=tuple(sorted({r.traj_id for r in records})),
      num_records=len(records),
      shards=tuple(os.path.basename(p) for p in writer.shards_written[first:]),
  )
  _write_atomic(
      _manifest_path(writer.directory, seq),
      json.dumps(dataclasses.asdict(manifest)),
  )
  return manifest


def produce(
    groups: Iterable[Sequence[StepRecord]],
    buffer_dir: str,
    *,
    records_per_shard: int = 16,
    prefix: str = "b",
    cancel: Optional[threading.Event] = None,
) -> list[GroupManifest]:
  """Writes each group of ``groups`` (one group's records per item) as it
  comes, then the ``_COMPLETE`` marker; the body of ``start_collection``,
  usable in any thread or process. ``buffer_dir`` must hold no manifest or
  marker of an earlier collection (``clear`` it).

  On an exception, or when ``cancel`` is set (checked before asking for
  each group; a group being made is still written), writes ``_ERROR`` with
  the error text, publishes what was written and re-raises.
  """
  os.makedirs(buffer_dir, exist_ok=True)
  if (
      list_groups(buffer_dir)
      or replay.is_complete(buffer_dir)
      or _read_error(buffer_dir) is not None
  ):
    raise ValueError(
        f"{buffer_dir} holds another collection's groups: decoupled.clear()"
        " it first"
    )
  writer = replay.ShardWriter(
      buffer_dir, prefix=prefix, records_per_shard=records_per_shard
  )
  manifests = []
  items = iter(groups)
  try:
    while True:
      if cancel is not None and cancel.is_set():
        getattr(items, "close", lambda: None)()
        raise _Cancelled("cancelled")
      try:
        records = next(items)
      except StopIteration:
        break
      manifests.append(_write_group(writer, len(manifests), list(records)))
    writer.close()
  except BaseException as e:
    text = (
        "cancelled"
        if isinstance(e, _Cancelled)
        else ("".join(traceback.format_exception(e, limit=8)))
    )
    _write_atomic(
        os.path.join(buffer_dir, ERROR_FILE),
        f"after {len(manifests)} groups: {text}",
    )
    writer.close()
    raise
  replay.mark_complete(buffer_dir)
  return manifests


def collect_b_groups(
    engine: Engine,
    venv,
    tokenizer,
    request: CollectRequest,
    cfg: CollectConfig,
    *,
    groups_per_call: int = 1,
    swap_rewards: bool = True,
    stats: Optional[list] = None,
) -> Iterator[list[StepRecord]]:
  """Plays ``request`` with ``rollout.collect``, ``groups_per_call``
  groups per call, and yields each group's records.

  Ids match one ``collect`` call over all of ``request.task_ids``: task
  ``i`` is group ``group_id_start + i`` with trajectories ``traj_id_start
  + i * group_size + j``. Chunk ``c`` samples with collect seed ``seed *
  10007 + c``. Records carry ``request.policy_tag`` (B's collection:
  ``types.POLICY_B``). Failed episodes are dropped (a group left empty is
  not yielded); ``swap_rewards`` clears ``dense_reward`` (NaN): stored
  records carry the outcome reward only. Each call's statistics are
  appended to ``stats``. Needs its own ``venv`` (a call resets every
  instance of it). Arguments are checked now; nothing is played until the
  first group is asked for.
  """
  if groups_per_call < 1:
    raise ValueError(f"groups_per_call={groups_per_call} must be >= 1")
  group_size = request.group_size
  if group_size * min(groups_per_call, len(request.task_ids)) > (venv.num_envs):
    raise ValueError(
        f"groups_per_call={groups_per_call} x group_size={group_size}"
        f" episodes need more than the {venv.num_envs} environments of venv"
    )
  request = dataclasses.replace(
      request, task_ids=[int(t) for t in request.task_ids]
  )
  return _collect_b_groups(
      engine,
      venv,
      tokenizer,
      request,
      cfg,
      groups_per_call,
      swap_rewards,
      stats,
  )


def _collect_b_groups(
    engine, venv, tokenizer, request, cfg, groups_per_call, swap_rewards, stats
):
  task_ids = request.task_ids
  for c, start in enumerate(range(0, len(task_ids), groups_per_call)):
    chunk = dataclasses.replace(
        request,
        task_ids=task_ids[start : start + groups_per_call],
        traj_id_start=request.traj_id_start + start * request.group_size,
        group_id_start=request.group_id_start + start,
        seed=request.seed * 10007 + c,
    )
    records, summary = collect(engine, venv, tokenizer, chunk, cfg)
    if stats is not None:
      stats.append(summary)
    by_group: dict[int, list[StepRecord]] = {}
    for r in records:
      if r.failed:
        continue
      if swap_rewards:
        r.dense_reward = float("nan")
      by_group.setdefault(r.group_id, []).append(r)
    for gid in sorted(by_group):
      yield sorted(by_group[gid], key=lambda r: (r.traj_id, r.step_idx))


# ------------------------------------------------------------ consumer


def wait_for_groups(
    buffer_dir: str,
    n_groups: int,
    timeout_s: float,
    *,
    poll_s: float = 0.05,
    alive: Optional[Callable[[], bool]] = None,
) -> int:
  """Blocks until ``n_groups`` complete groups exist; returns how many do.

  Returns fewer only when the producer finished (``_COMPLETE``) with fewer.

  Raises:
    ProducerError: ``_ERROR`` appeared (its text included), or ``alive()``
      says the producer ended without a marker, before ``n_groups`` groups.
    TimeoutError: ``timeout_s`` seconds passed without a new group.
  """
  if n_groups < 0:
    raise ValueError(f"n_groups={n_groups} must be >= 0")
  if timeout_s <= 0 or poll_s <= 0:
    raise ValueError(f"timeout_s={timeout_s}, poll_s={poll_s} must be > 0")
  seen, last_progress = -1, time.monotonic()
  while True:
    # Markers first: a group written before a marker is then listed.
    ended = alive is not None and not alive()
    complete = replay.is_complete(buffer_dir)
    error = _read_error(buffer_dir)
    n = len(list_groups(buffer_dir))
    if n >= n_groups or complete:
      return n
    if error is not None:
      raise ProducerError(
          f"B's collection into {buffer_dir} failed with {n} of {n_groups}"
          f" groups written: {error}"
      )
    if ended:
      raise ProducerError(
          f"B's collection into {buffer_dir} ended with {n} of {n_groups}"
          f" groups and no {replay.COMPLETE_MARKER} or {ERROR_FILE} marker"
      )
    if n > seen:
      seen, last_progress = n, time.monotonic()
    elif time.monotonic() - last_progress > timeout_s:
      raise TimeoutError(
          f"no new group in {buffer_dir} for {timeout_s} s ({n} of"
          f" {n_groups}) and no {replay.COMPLETE_MARKER} or {ERROR_FILE}"
          " marker: is B's collection still running?"
      )
    time.sleep(poll_s)


def stream_groups(
    buffer_dir: str,
    timeout_s: float,
    *,
    poll_s: float = 0.05,
    alive: Optional[Callable[[], bool]] = None,
) -> Iterator[tuple[GroupManifest, list[StepRecord]]]:
  """Yields ``(manifest, records)`` of every group once, by seq, as groups
  complete; stops after the last one once ``_COMPLETE`` exists. Errors as
  ``wait_for_groups``."""
  done = 0
  while True:
    if (
        wait_for_groups(
            buffer_dir, done + 1, timeout_s, poll_s=poll_s, alive=alive
        )
        <= done
    ):
      return  # complete, nothing new
    for m in list_groups(buffer_dir)[done:]:
      yield m, read_group(buffer_dir, m)
      done += 1


class BackgroundCollection:
  """A thread running ``produce(groups, buffer_dir, ...)``; see
  ``start_collection``."""

  def __init__(
      self,
      groups,
      buffer_dir: str,
      *,
      records_per_shard: int,
      prefix: str,
      name: str,
  ):
    self.buffer_dir = buffer_dir
    self.manifests: Optional[list[GroupManifest]] = None
    self.error: Optional[BaseException] = None
    self._cancel = threading.Event()
    self._kwargs = dict(
        records_per_shard=records_per_shard, prefix=prefix, cancel=self._cancel
    )
    self._groups = groups
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)

  def _run(self) -> None:
    try:
      self.manifests = produce(self._groups, self.buffer_dir, **self._kwargs)
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e

  def is_alive(self) -> bool:
    return self._thread.is_alive()

  def wait_for_groups(self, n_groups: int, timeout_s: float) -> int:
    """``wait_for_groups`` that also fails when this thread has ended."""
    return wait_for_groups(
        self.buffer_dir, n_groups, timeout_s, alive=self.is_alive
    )

  def cancel(self) -> None:
    """Stops before the next group (the running ``collect`` call ends
    first); ``join`` then returns the groups written."""
    self._cancel.set()

  def join(self, timeout_s: Optional[float] = None) -> list[GroupManifest]:
    """Waits for the thread; returns the manifests written.

    Raises:
      TimeoutError: still running after ``timeout_s``.
      ProducerError: the collection failed (``from`` its exception).
    """
    self._thread.join(timeout_s)
    if self._thread.is_alive():
      raise TimeoutError(
          f"B's collection into {self.buffer_dir} still running after"
          f" {timeout_s} s"
      )
    if isinstance(self.error, _Cancelled):
      return list_groups(self.buffer_dir)
    if self.error is not None:
      raise ProducerError(
          f"B's collection into {self.buffer_dir} failed:"
          f" {type(self.error).__name__}: {self.error}"
      ) from self.error
    return list(self.manifests or [])


def start_collection(
    groups: Iterable[Sequence[StepRecord]],
    buffer_dir: str,
    *,
    records_per_shard: int = 16,
    prefix: str = "b",
    clear_dir: bool = True,
    name: str = "b-collection",
) -> BackgroundCollection:
  """Clears ``buffer_dir`` (``clear_dir``) and starts a daemon thread that
  writes ``groups`` (e.g. ``collect_b_groups(...)``, evaluated lazily in
  that thread) group by group. ``join`` it before closing the engine or
  environments it uses, and before clearing ``buffer_dir``."""
  if clear_dir:
    clear(buffer_dir)
  job = BackgroundCollection(
      groups,
      buffer_dir,
      records_per_shard=records_per_shard,
      prefix=prefix,
      name=name,
  )
  job._thread.start()  # pylint: disable=protected-access
  return job
