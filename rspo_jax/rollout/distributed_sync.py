"""No-disk weight sync to SGLang servers (``rollout.weight_sync =
"distributed"``): the learner is rank 0 of a torch.distributed group with
every server's ranks and broadcasts each tensor to them (the pattern of
slime and AReaL, over SGLang's HTTP endpoints).

  connect:  world_size = 1 + sum_s tp_s; server s's ranks start at
            rank_offset_s = 1 + sum_{j<s} tp_j. Every server gets, in its own
            thread (the call returns once the group exists),
              POST /init_weights_update_group {master_address, master_port,
                rank_offset, world_size, group_name, backend}
            while this process joins the group as rank 0: it serves the TCP
            store at master_address:master_port, keys under ``group_name``
            as SGLang's ``init_custom_process_group`` puts them.
  update v: POST /begin_weight_update {} to every server (SGLang 0.5.23
            loads distributed weights only inside such a session; 404: an
            older server without sessions, none is needed);
            per batch of consecutive tensors (at most ``bucket_bytes``, one
            tensor at least), to every server in its own thread
              POST /update_weights_from_distributed {names, dtypes, shapes,
                group_name, flush_cache, [weight_version: "v"]}
            (flush_cache true and weight_version on the last batch only)
            while rank 0 broadcasts the batch's tensors in that order;
            POST /end_weight_update {} to every server.

A server's call blocks until it received the batch, so a server that
refuses a batch (HTTP 4xx/5xx) would leave rank 0's broadcast waiting: the
broadcasts are asynchronous and a refusal ends the wait with
``DistributedSyncError`` (the group is then unusable: the run stops, as it
does when a disk load is refused). Every server must take every update: a
server that died breaks the group (no fail-over, unlike the disk path).

This module imports no JAX. It takes (name, tensor) pairs: numpy arrays
(``torch.from_numpy``; bfloat16 through its bits), torch tensors, or
anything with ``__dlpack__`` (a jax.Array on a GPU becomes a torch CUDA
tensor without a copy). ``nccl`` broadcasts from CUDA memory, ``gloo`` from
host memory. torch is imported on first use; ``require_torch`` names the
fix when it is missing.

``python -m rspo_jax.rollout.distributed_sync --urls ...`` runs one group's
rank 0 on its own (tests drive it from a process without torch): after
connecting it prints ``{"world_size": n}``; then each stdin line
``{"npz": path, "version": v}`` updates the servers with the arrays of that
.npz (in its order) and prints ``update``'s dict (or ``{"error": ...}``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.parse
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from rspo_jax.rollout.sglang_client import _NO_ANSWER, _http, _message

log = logging.getLogger(__name__)

BACKENDS = ("nccl", "gloo")
GROUP_NAME = "rspo_weight_sync"
BUCKET_BYTES = 512 << 20
TORCH_MISSING = (
    "rollout.weight_sync='distributed' needs torch in the learner's process"
    " (the learner joins a torch.distributed group with the SGLang servers:"
    " install torch, with CUDA for the nccl backend, in this environment),"
    " or use rollout.weight_sync='disk'"
)


class DistributedSyncError(RuntimeError):
  pass


def require_torch():
  """torch, with torch.distributed; ImportError naming the fix without."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import torch.distributed  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError(f"{TORCH_MISSING} ({e})") from e
  if not torch.distributed.is_available():
    raise ImportError(f"{TORCH_MISSING} (this torch has no torch.distributed)")
  return torch


def default_backend() -> str:
  """nccl when torch sees a CUDA device, else gloo."""
  return "nccl" if require_torch().cuda.is_available() else "gloo"


# ------------------------------------------------------------ the requests


def rank_offsets(tp_sizes: Sequence[int]) -> tuple[list[int], int]:
  """([rank_offset per server], world_size): rank 0 is the learner, server
  s holds ranks 1 + sum_{j<s} tp_j ... + tp_s - 1."""
  offsets, rank = [], 1
  for tp in tp_sizes:
    if int(tp) < 1:
      raise ValueError(f"tp size {tp} of a server must be >= 1")
    offsets.append(rank)
    rank += int(tp)
  return offsets, rank


def init_group_bodies(
    tp_sizes: Sequence[int],
    *,
    master_address: str,
    master_port: int,
    group_name: str,
    backend: str,
) -> list[dict]:
  """The ``/init_weights_update_group`` body of each server."""
  if backend not in BACKENDS:
    raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
  offsets, world_size = rank_offsets(tp_sizes)
  return [
      dict(
          master_address=master_address,
          master_port=int(master_port),
          rank_offset=o,
          world_size=world_size,
          group_name=group_name,
          backend=backend,
      )
      for o in offsets
  ]


def dtype_name(x) -> str:
  """SGLang's name of a tensor's dtype (``getattr(torch, name)``):
  'float32', 'bfloat16' ... for numpy (ml_dtypes), jax and torch."""
  return str(x.dtype).removeprefix("torch.")


def batches(named: Iterable, max_bytes: int) -> Iterator[list]:
  """Consecutive (name, tensor) pairs in lists of at most ``max_bytes``
  (a larger tensor alone), in order; reads ``named`` lazily."""
  batch, size = [], 0
  for name, x in named:
    n = int(x.nbytes)
    if batch and size + n > max_bytes:
      yield batch
      batch, size = [], 0
    batch.append((name, x))
    size += n
  if batch:
    yield batch


def with_last(items: Iterable) -> Iterator[tuple]:
  """(item, is_last) pairs, looking one item ahead."""
  it = iter(items)
  try:
    prev = next(it)
  except StopIteration:
    return
  for item in it:
    yield prev, False
    prev = item
  yield prev, True


def update_body(
    batch: Sequence, *, group_name: str, version: int, last: bool
) -> dict:
  """The ``/update_weights_from_distributed`` body of one batch."""
  body = dict(
      names=[n for n, _ in batch],
      dtypes=[dtype_name(x) for _, x in batch],
      shapes=[[int(d) for d in x.shape] for _, x in batch],
      group_name=group_name,
      flush_cache=bool(last),
  )
  if last:
    body["weight_version"] = str(version)
  return body


def _is_local(url: str) -> bool:
  host = urllib.parse.urlparse(url).hostname or ""
  return host in ("localhost", "::1") or host.startswith("127.")


def master_address_for(urls: Sequence[str]) -> str:
  """127.0.0.1 when every server is on this host, else this host's address
  on the route to the first server."""
  if all(_is_local(u) for u in urls):
    return "127.0.0.1"
  parsed = urllib.parse.urlparse(urls[0])
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((parsed.hostname, parsed.port or 80))  # sends nothing
    return s.getsockname()[0]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("", 0))
    return s.getsockname()[1]


# --------------------------------------------------------------- the group


def _join_as_rank0(
    backend: str,
    address: str,
    port: int,
    world_size: int,
    group_name: str,
    timeout_s: float,
):
  """This process's side of SGLang's ``init_custom_process_group``: a
  process group of its own (not the default one), rank 0."""
  require_torch()
  import inspect  # pylint: disable=g-import-not-at-top

  from torch.distributed import distributed_c10d as c10d  # pylint: disable=g-import-not-at-top

  timeout = datetime.timedelta(seconds=timeout_s)
  host = f"[{address}]" if ":" in address else address
  store, _, _ = next(
      c10d.rendezvous(f"tcp://{host}:{port}", 0, world_size, timeout=timeout)
  )
  store.set_timeout(timeout)
  store = c10d.PrefixStore(group_name, store)
  params = inspect.signature(c10d._new_process_group_helper).parameters  # pylint: disable=protected-access
  options = "backend_options" if "backend_options" in params else "pg_options"
  pg, _ = c10d._new_process_group_helper(  # pylint: disable=protected-access
      world_size,
      0,
      [],
      c10d.Backend(backend),
      store,
      group_name=group_name,
      timeout=timeout,
      **{options: None},
  )
  c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}  # pylint: disable=protected-access
  return pg


class WeightUpdateGroup:
  """Rank 0 of one group with a set of SGLang servers (module docstring).

  Args:
    urls: the servers; every one takes every update.
    backend: 'nccl' (tensors broadcast from CUDA memory) or 'gloo' (host).
    master_address, master_port: where rank 0 serves the group's store
      (reachable from every server; port 0 = a free one).
    tp_sizes: each server's tensor-parallel size (None: read
      ``GET /server_info``).
    bucket_bytes: the most bytes one ``/update_weights_from_distributed``
      call carries (one tensor at least).
    timeout_s: HTTP calls and the group's collectives.
  """

  def __init__(
      self,
      urls: Sequence[str],
      *,
      backend: str = "gloo",
      master_address: str = "",
      master_port: int = 0,
      group_name: str = GROUP_NAME,
      tp_sizes: Optional[Sequence[int]] = None,
      bucket_bytes: int = BUCKET_BYTES,
      timeout_s: float = 600.0,
  ):
    if backend not in BACKENDS:
      raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if bucket_bytes < 1:
      raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    self.urls = [u.rstrip("/") for u in urls]
    if not self.urls:
      raise ValueError("no server URLs")
    self.backend = backend
    self.master_address = master_address or master_address_for(self.urls)
    self.master_port = int(master_port) or free_port()
    self.group_name = group_name
    self.tp_sizes = None if tp_sizes is None else [int(t) for t in tp_sizes]
    self.bucket_bytes = int(bucket_bytes)
    self.timeout_s = float(timeout_s)
    self.world_size = None
    self.updates = 0  # updates sent
    self._sessions = True  # the servers know /begin_weight_update
    self._pg = None
    self._torch = None
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(2, len(self.urls)),
        thread_name_prefix="weight-update-group",
    )

  # ------------------------------------------------------------------ http

  def _post(self, url: str, route: str, body) -> tuple[int, object]:
    """(status, answer JSON or text); DistributedSyncError without an
    HTTP answer."""
    try:
      status, text = _http(url + route, "POST", body, self.timeout_s)
    except _NO_ANSWER as e:
      raise DistributedSyncError(f"{url}{route}: no answer ({e})") from e
    try:
      return status, json.loads(text)
    except json.JSONDecodeError:
      return status, text

  def _post_ok(self, url: str, route: str, body) -> dict:
    status, answer = self._post(url, route, body)
    if (
        status != 200
        or not isinstance(answer, dict)
        or answer.get("success") is False
    ):
      text = json.dumps(answer) if isinstance(answer, dict) else str(answer)
      raise DistributedSyncError(
          f"{url}{route} failed (HTTP {status}): {_message(text)}"
      )
    return answer

  def _tp_size(self, url: str) -> int:
    for route in ("/server_info", "/get_server_info"):
      try:
        status, text = _http(url + route, "GET", None, self.timeout_s)
      except _NO_ANSWER as e:
        raise DistributedSyncError(f"{url}{route}: no answer ({e})") from e
      if status == 200:
        info = json.loads(text)
        if (
            int(info.get("pp_size") or 1) != 1
            or int(info.get("dp_size") or 1) != 1
        ):
          raise DistributedSyncError(
              f"{url}: pp_size {info.get('pp_size')} / dp_size"
              f" {info.get('dp_size')}: SGLang's distributed weight update"
              " needs pp_size = dp_size = 1"
          )
        return int(info.get("tp_size") or 1)
    raise DistributedSyncError(f"{url}: no /server_info (HTTP {status})")

  def _all(self, fn, *args) -> list:
    """fn(url, *args) for every server at once; the results in order."""
    futures = [self._pool.submit(fn, u, *args) for u in self.urls]
    return [f.result() for f in futures]

  # -------------------------------------------------------------- connect

  def connect(self) -> "WeightUpdateGroup":
    """Builds the group: every server's ``/init_weights_update_group``
    (concurrently) while this process joins as rank 0."""
    self._torch = require_torch()
    if self.backend == "nccl":
      os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # as SGLang's tests
    if self.tp_sizes is None:
      self.tp_sizes = self._all(self._tp_size)
    if len(self.tp_sizes) != len(self.urls):
      raise ValueError(
          f"{len(self.tp_sizes)} tp sizes for" f" {len(self.urls)} servers"
      )
    bodies = init_group_bodies(
        self.tp_sizes,
        master_address=self.master_address,
        master_port=self.master_port,
        group_name=self.group_name,
        backend=self.backend,
    )
    self.world_size = bodies[0]["world_size"]
    log.info(
        "weight update group %s: %s:%d, world size %d, %s",
        self.group_name,
        self.master_address,
        self.master_port,
        self.world_size,
        self.backend,
    )
    futures = [
        self._pool.submit(self._post_ok, u, "/init_weights_update_group", b)
        for u, b in zip(self.urls, bodies)
    ]
    joined = {}

    def join():
      try:
        joined["pg"] = _join_as_rank0(
            self.backend,
            self.master_address,
            self.master_port,
            self.world_size,
            self.group_name,
            self.timeout_s,
        )
      except Exception as e:  # pylint: disable=broad-except
        joined["error"] = e

    # A daemon thread: a server that refused to join ends the wait at once
    # (rank 0 would otherwise wait for it until the timeout).
    thread = threading.Thread(
        target=join, daemon=True, name="weight-update-group-join"
    )
    thread.start()
    while thread.is_alive():
      for f in futures:
        if f.done() and f.exception() is not None:
          raise DistributedSyncError(
              f"a server did not join weight update group"
              f" {self.group_name}: {f.exception()}"
          )
      thread.join(0.05)
    if "error" in joined:
      raise DistributedSyncError(
          f"joining weight update group {self.group_name} at"
          f" {self.master_address}:{self.master_port} failed:"
          f" {joined['error']}"
      ) from joined["error"]
    self._pg = joined["pg"]
    for f in futures:
      f.result()
    return self

  # --------------------------------------------------------------- update

  def _to_torch(self, x):
    """A torch tensor of ``x`` where the backend broadcasts from."""
    torch = self._torch
    if isinstance(x, np.ndarray):
      x = np.ascontiguousarray(x)
      if x.dtype.name == "bfloat16":  # ml_dtypes: torch takes the bits
        t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
      else:
        t = torch.from_numpy(x)
    elif isinstance(x, torch.Tensor):
      t = x
    else:  # a jax.Array (or any DLPack producer), without a copy
      if hasattr(x, "block_until_ready"):
        x.block_until_ready()
      t = torch.from_dlpack(x)
    if self.backend == "nccl" and t.device.type != "cuda":
      t = t.cuda()
    elif self.backend == "gloo" and t.device.type != "cpu":
      t = t.cpu()
    return t.contiguous()

  def _begin(self, url: str) -> bool:
    """Opens ``url``'s weight-update session (one left open by a failed
    sync is closed first); False when the server has no sessions."""
    status, answer = self._post(url, "/begin_weight_update", {})
    if status == 404:
      return False
    if (
        status != 200
        and isinstance(answer, dict)
        and "already open" in str(answer.get("message", ""))
    ):
      self._post_ok(url, "/end_weight_update", {})
      status, answer = self._post(url, "/begin_weight_update", {})
    if status != 200:
      raise DistributedSyncError(
          f"{url}/begin_weight_update failed (HTTP {status}): {answer}"
      )
    return True

  def _broadcast(self, batch, body) -> None:
    dist = self._torch.distributed
    futures = {
        u: self._pool.submit(
            self._post_ok, u, "/update_weights_from_distributed", body
        )
        for u in self.urls
    }
    tensors = [self._to_torch(x) for _, x in batch]  # alive until sent
    works = [
        dist.broadcast(t, src=0, group=self._pg, async_op=True) for t in tensors
    ]
    deadline = time.monotonic() + self.timeout_s
    while not all(w.is_completed() for w in works):
      for u, f in futures.items():
        if f.done() and f.exception() is not None:
          raise DistributedSyncError(
              f"{u} refused a weight batch while it was being broadcast"
              f" (weight update group {self.group_name} is now unusable):"
              f" {f.exception()}"
          )
      if time.monotonic() > deadline:
        raise DistributedSyncError(
            f"broadcast of {len(tensors)} tensors to group"
            f" {self.group_name} took over {self.timeout_s:.0f} s"
        )
      time.sleep(0.001)
    for w in works:
      w.wait()
    for f in futures.values():
      f.result()

  def update(self, named: Iterable, version: int) -> dict:
    """Sends (name, tensor) pairs as weights ``version`` (see the module
    docstring); {bytes, tensors, batches, seconds}."""
    if self._pg is None:
      raise DistributedSyncError("update before connect()")
    start = time.perf_counter()
    if self._sessions:
      self._sessions = all(self._all(self._begin))
    nbytes = ntensors = nbatches = 0
    for batch, last in with_last(batches(named, self.bucket_bytes)):
      body = update_body(
          batch, group_name=self.group_name, version=version, last=last
      )
      self._broadcast(batch, body)
      nbytes += sum(int(x.nbytes) for _, x in batch)
      ntensors += len(batch)
      nbatches += 1
    if self._sessions:
      self._all(self._post_ok, "/end_weight_update", {})
    self.updates += 1
    return dict(
        bytes=nbytes,
        tensors=ntensors,
        batches=nbatches,
        seconds=time.perf_counter() - start,
    )

  def close(self) -> None:
    """Asks the servers to leave the group (answers ignored) and leaves."""
    if self._pg is not None:
      for u in self.urls:
        try:
          self._post(
              u,
              "/destroy_weights_update_group",
              {"group_name": self.group_name},
          )
        except DistributedSyncError:
          pass
      try:
        self._torch.distributed.destroy_process_group(self._pg)
      except Exception as e:  # pylint: disable=broad-except
        log.warning("leaving weight update group %s: %s", self.group_name, e)
      self._pg = None
    self._pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------ for a run


class DistributedPush:
  """``push(engine, named, version)``: weights ``version`` to an
  ``SGLangClient``'s servers through a ``WeightUpdateGroup`` of their own
  (built on the engine's first push: the A and B engines of a decoupled run
  get two groups), then ``engine.weights_updated(version)`` checks that
  every server reports the version. Returns the group's ``update`` dict.

  ``connect(urls, index) -> group`` builds group ``index`` (default:
  ``WeightUpdateGroup(...).connect()`` with these settings, group name
  ``{group_name}_{index}``, port ``master_port + index`` or a free one).
  ``on_host``: the backend broadcasts from host memory (gloo), so callers
  hand numpy arrays; else device arrays.
  """

  def __init__(
      self,
      *,
      backend: str = "",
      master_address: str = "",
      master_port: int = 0,
      group_name: str = GROUP_NAME,
      bucket_bytes: int = BUCKET_BYTES,
      timeout_s: float = 600.0,
      connect: Optional[Callable] = None,
  ):
    if connect is None:
      require_torch()
    self.backend = backend or default_backend()
    if self.backend not in BACKENDS:
      raise ValueError(
          f"rollout.weight_sync_backend {self.backend!r} is not"
          f" one of {BACKENDS} (or '' for nccl on CUDA, else"
          " gloo)"
      )
    self._settings = dict(
        master_address=master_address,
        master_port=int(master_port),
        group_name=group_name,
        bucket_bytes=int(bucket_bytes),
        timeout_s=float(timeout_s),
    )
    self._connect = connect or self._default_connect
    self._groups = {}
    self._lock = threading.Lock()  # A's and B's engines sync from 2 threads

  @property
  def on_host(self) -> bool:
    return self.backend == "gloo"

  def _default_connect(self, urls, index: int):
    s = self._settings
    return WeightUpdateGroup(
        urls,
        backend=self.backend,
        master_address=s["master_address"],
        master_port=s["master_port"] + index if s["master_port"] else 0,
        group_name=f"{s['group_name']}_{index}",
        bucket_bytes=s["bucket_bytes"],
        timeout_s=s["timeout_s"],
    ).connect()

  def __call__(self, engine, named: Iterable, version: int) -> dict:
    key = tuple(engine.urls)
    with self._lock:
      if key not in self._groups:
        self._groups[key] = self._connect(list(key), len(self._groups))
      group = self._groups[key]
    out = group.update(named, version)
    engine.weights_updated(version)
    return out

  def close(self) -> None:
    for group in self._groups.values():
      group.close()
    self._groups = {}


# -------------------------------------------------------------- the CLI


def _read_npz(path: str) -> list:
  with np.load(path) as z:
    return [(k, z[k]) for k in z.files]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--urls", required=True, help="comma-separated servers")
  p.add_argument("--backend", default="gloo", choices=BACKENDS)
  p.add_argument("--master_address", default="")
  p.add_argument("--master_port", type=int, default=0)
  p.add_argument("--group_name", default=GROUP_NAME)
  p.add_argument("--bucket_bytes", type=int, default=BUCKET_BYTES)
  p.add_argument("--timeout_s", type=float, default=600.0)
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, stream=sys.stderr)
  group = WeightUpdateGroup(
      [u for u in args.urls.split(",") if u],
      backend=args.backend,
      master_address=args.master_address,
      master_port=args.master_port,
      group_name=args.group_name,
      bucket_bytes=args.bucket_bytes,
      timeout_s=args.timeout_s,
  ).connect()
  print(json.dumps({"world_size": group.world_size}), flush=True)
  try:
    for line in sys.stdin:
      if not line.strip():
        continue
      cmd = json.loads(line)
      try:
        out = group.update(_read_npz(cmd["npz"]), int(cmd["version"]))
      except Exception as e:  # pylint: disable=broad-except
        out = {"error": f"{type(e).__name__}: {e}"}
      print(json.dumps(out), flush=True)
  finally:
    group.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
