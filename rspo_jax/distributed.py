"""Multi-host JAX: start the runtime, split rows per host, build global arrays.

JAX is multi-controller: one Python process per host (``srun`` task, TPU VM
worker, JobSet pod) runs the *same* program. After ``initialize`` every
process sees all devices (``jax.devices()``, process-major order) but can
only touch its own (``jax.local_devices()``). A jitted step over a global
mesh is SPMD: every process calls it, in the same order, with arrays of the
same global shape, and XLA inserts the cross-host collectives.

Data is host-local: each process feeds only the rows that land on its own
devices. For a leading ``batch`` axis sharded over ``('data', 'fsdp')``,
process ``p`` feeds the rows of its devices' slices,
``process_row_indices(N, sharding)``, ascending; with a mesh built from
``jax.devices()`` on GPU (process-major) that is the block

    rows[p * N / n : (p + 1) * N / n]

and with a TPU ring order (``jax.make_mesh`` follows the torus) it may be
several blocks. ``host_local_to_global`` assembles the per-host rows into
one global ``jax.Array`` without any host ever holding the whole batch;
``host_local_rows`` takes a host's rows of a result back.

Start-up order matters: ``initialize`` must run before anything touches a
JAX backend (``jax.devices()``, creating an array, jitting).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

ENV_COORDINATOR = "RSPO_COORDINATOR"  # host:port of process 0
ENV_NUM_PROCESSES = "RSPO_NUM_PROCESSES"
ENV_PROCESS_ID = "RSPO_PROCESS_ID"
# "auto": let jax detect the cluster (TPU VM / GKE / SLURM / Open MPI)
# even where the checks below would not.
ENV_DISTRIBUTED = "RSPO_DISTRIBUTED"


def _env_int(environ: Mapping[str, str], name: str) -> Optional[int]:
  value = environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} is not an int")


def detected_cluster(environ: Optional[Mapping[str, str]] = None) -> str:
  """Name of a multi-process launcher found in the environment, or "".

  Only launchers that started more than one process count: a single SLURM
  task (``salloc`` + ``python``) or a one-host TPU VM needs no runtime.
  """
  environ = os.environ if environ is None else environ
  if environ.get(ENV_DISTRIBUTED, "").lower() == "auto":
    return "auto"
  tasks = _env_int(environ, "SLURM_STEP_NUM_TASKS") or _env_int(
      environ, "SLURM_NTASKS"
  )
  in_slurm = "SLURM_JOB_ID" in environ and "SLURM_PROCID" in environ
  if in_slurm and (tasks or 1) > 1:
    return "slurm"
  if (_env_int(environ, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "ompi"
  if len(environ.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1:
    return "tpu"
  return ""


def initialize(
    coordinator: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    local_device_ids: Optional[Sequence[int]] = None,
    *,
    environ: Optional[Mapping[str, str]] = None,
) -> bool:
  """Starts ``jax.distributed`` when the job has more than one process.

  Sources, first match wins:
    1. the arguments;
    2. ``RSPO_COORDINATOR`` (``host:port`` of process 0),
       ``RSPO_NUM_PROCESSES``, ``RSPO_PROCESS_ID``;
    3. jax's own cluster detection (SLURM, Open MPI, TPU VM, GKE), used
       when ``detected_cluster()`` finds a multi-process launcher or
       ``RSPO_DISTRIBUTED=auto``.
  With one process, or nothing found, this is a no-op.

  Returns True when the distributed runtime is (now) running.
  Raises ValueError naming the missing or bad setting.
  """
  environ = os.environ if environ is None else environ
  if jax.distributed.is_initialized():
    return True
  coordinator = coordinator or environ.get(ENV_COORDINATOR, "").strip() or None
  if num_processes is None:
    num_processes = _env_int(environ, ENV_NUM_PROCESSES)
  if process_id is None:
    process_id = _env_int(environ, ENV_PROCESS_ID)
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  if num_processes == 1:
    return False
  explicit = (coordinator, num_processes, process_id)
  if all(v is None for v in explicit):
    cluster = detected_cluster(environ)
    if not cluster:
      return False
    log.info("jax.distributed: auto-detecting the %s cluster", cluster)
    jax.distributed.initialize(local_device_ids=local_device_ids)
    return True
  missing = [
      name
      for name, v in zip(
          (
              "coordinator (RSPO_COORDINATOR)",
              "num_processes (RSPO_NUM_PROCESSES)",
              "process_id (RSPO_PROCESS_ID)",
          ),
          explicit,
      )
      if v is None
  ]
  if missing and not detected_cluster(environ):
    raise ValueError(
        f"multi-process start needs all three settings; missing: {missing}"
    )
  if (
      process_id is not None
      and num_processes is not None
      and not (0 <= process_id < num_processes)
  ):
    raise ValueError(
        f"process_id={process_id} is outside [0, num_processes="
        f"{num_processes})"
    )
  log.info(
      "jax.distributed: process %s of %s, coordinator %s",
      process_id,
      num_processes,
      coordinator,
  )
  jax.distributed.initialize(
      coordinator_address=coordinator,
      num_processes=num_processes,
      process_id=process_id,
      local_device_ids=local_device_ids,
  )
  return True


def shutdown() -> None:
  if jax.distributed.is_initialized():
    jax.distributed.shutdown()


def is_leader() -> bool:
  """Process 0 writes logs, metrics and exports; every process saves its
  own shards of a checkpoint (orbax coordinates that)."""
  return jax.process_index() == 0


# --------------------------------------------------------------------------
# Host-local rows
# --------------------------------------------------------------------------


def process_row_indices(n_rows: int, sharding: NamedSharding) -> np.ndarray:
  """The global rows this process feeds under ``sharding`` (a
  NamedSharding of a leading row axis), ascending: the union of its
  devices' row slices. Any device order: with a mesh in ring order (TPU)
  they need not be one block. ``host_local_to_global`` places a host's
  local rows ``k = 0, 1, ...`` at these rows, in this order."""
  index_map = sharding.addressable_devices_indices_map((n_rows,))
  covered = set()
  for idx in index_map.values():
    covered.update(range(*idx[0].indices(n_rows)))
  return np.array(sorted(covered), np.int64)


def process_row_range(
    n_rows: int,
    sharding: Optional[NamedSharding] = None,
    *,
    process_index: Optional[int] = None,
    process_count: Optional[int] = None,
) -> tuple[int, int]:
  """``[start, stop)`` of the global rows this process feeds.

  With ``sharding`` (a NamedSharding of a leading row axis), the block is
  the union of the row slices of this process's devices; without it, the
  even block ``[p * n / P, (p + 1) * n / P)``.
  Raises ValueError when the rows do not split evenly, or when a sharding
  gives this process rows that are not one contiguous block (then use
  ``process_row_indices``).
  """
  if sharding is not None:
    rows = process_row_indices(n_rows, sharding)
    if not len(rows):
      return 0, 0
    start, stop = int(rows[0]), int(rows[-1]) + 1
    if len(rows) != stop - start:
      raise ValueError(
          f"the rows of process {jax.process_index()} under {sharding.spec}"
          " are not contiguous; use process_row_indices"
      )
    return start, stop
  p = jax.process_index() if process_index is None else process_index
  n = jax.process_count() if process_count is None else process_count
  if not 0 <= p < n:
    raise ValueError(f"process_index={p} outside [0, process_count={n})")
  if n_rows % n:
    raise ValueError(
        f"{n_rows} rows do not split evenly over {n} processes; pad the"
        f" batch to a multiple of {n}"
    )
  per = n_rows // n
  return p * per, (p + 1) * per


def host_rows(
    rows: Sequence[Any], sharding: Optional[NamedSharding] = None, **kwargs
) -> list:
  """This process's items of a list of global rows (records, task ids), in
  the order ``host_local_to_global`` expects them."""
  if sharding is not None:
    return [rows[i] for i in process_row_indices(len(rows), sharding)]
  start, stop = process_row_range(len(rows), None, **kwargs)
  return list(rows[start:stop])


def host_local_to_global(tree: Any, shardings: Any) -> Any:
  """Host-local numpy blocks -> global ``jax.Array``s.

  ``tree`` holds this process's rows of each array, in the order of
  ``process_row_indices`` (one block, or several when the mesh's device
  order interleaves hosts), ``shardings`` a matching tree of
  NamedShardings (e.g. ``train_step.batch_shardings(mesh, batch, rules)``).
  Global shape = local rows x the number of row blocks (processes along
  the row axes). With one process this is ``jax.device_put``.
  """

  def one(x, s: NamedSharding):
    x = np.asarray(x)
    blocks = _row_blocks(s, x.ndim)
    global_shape = (x.shape[0] * blocks,) + x.shape[1:] if x.ndim else ()
    return jax.make_array_from_process_local_data(s, x, global_shape)

  return jax.tree.map(one, tree, shardings)


def host_local_rows(x: jax.Array) -> np.ndarray:
  """This process's rows of a global array whose leading axis is split over
  devices (the inverse of ``host_local_to_global``): its devices' row
  slices in ascending order, without an all-gather. With one process (or
  rows replicated) the whole array."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  blocks = {}
  for shard in x.addressable_shards:
    start = (shard.index[0].start or 0) if shard.index else 0
    blocks.setdefault(start, shard.data)
  return np.concatenate([np.asarray(blocks[k]) for k in sorted(blocks)])


def _row_blocks(sharding: NamedSharding, ndim: int) -> int:
  """How many distinct host row blocks the leading axis splits into."""
  if ndim == 0:
    return 1
  probe = 1
  for axes in sharding.spec[:1]:
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    for a in names:
      probe *= sharding.mesh.shape[a]
  if probe == 1:
    return 1  # rows replicated: every host holds all of them
  return probe // len(process_row_indices(probe, sharding))


def host_share(
    n: int,
    *,
    process_index: Optional[int] = None,
    process_count: Optional[int] = None,
) -> tuple[int, int]:
  """``[start, stop)`` of this process's share of ``n`` whole items (task
  groups, evaluation tasks), as even as possible:

      start_p = floor(p n / P),  stop_p = floor((p + 1) n / P)

  Shares differ by at most one item, may be empty (``n < P``), and tile
  ``[0, n)`` in process order. One process: ``(0, n)``.
  """
  p = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= p < count:
    raise ValueError(f"process_index={p} outside [0, process_count={count})")
  if n < 0:
    raise ValueError(f"cannot share n={n} items")
  return p * n // count, (p + 1) * n // count


def is_multihost() -> bool:
  return jax.process_count() > 1


def global_sum(x) -> np.ndarray:
  """Sum over processes of a small host array (identity with one)."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x
  return np.asarray(multihost_utils.process_allgather(x)).sum(axis=0)


def global_max(x) -> np.ndarray:
  """Elementwise max over processes of a small host array."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x
  return np.asarray(multihost_utils.process_allgather(x)).max(axis=0)


def allgather_objects(obj: Any) -> list:
  """``[obj of process 0, obj of process 1, ...]`` on every process, for
  small JSON-serialisable values (stats dicts, id lists)."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  size = int(global_max(np.int64(len(data))))
  padded = np.zeros(size, np.uint8)
  padded[: len(data)] = data
  lengths = np.asarray(multihost_utils.process_allgather(np.int64(len(data))))
  rows = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(bytes(r[:n]).decode()) for r, n in zip(rows, lengths)]


def pad_rows_and_length(tree: Any, rows: int, length: int) -> Any:
  """Zero-pads every array of ``tree`` to ``rows`` on axis 0 and, for
  arrays of rank >= 2, to ``length`` on axis 1 (so every host feeds blocks
  of the same shape; padded rows and columns carry zero masks)."""

  def one(x):
    x = np.asarray(x)
    if x.shape[0] > rows or (x.ndim >= 2 and x.shape[1] > length):
      raise ValueError(
          f"cannot pad an array of shape {x.shape} down to ({rows},"
          f" {length})"
      )
    pad = [(0, rows - x.shape[0])]
    if x.ndim >= 2:
      pad.append((0, length - x.shape[1]))
    pad += [(0, 0)] * (x.ndim - len(pad))
    return np.pad(x, pad)

  return jax.tree.map(one, tree)


def global_to_host(tree: Any) -> Any:
  """Global arrays -> full numpy arrays on every process: an all-gather of
  each leaf that spans processes (every process must call it), a plain copy
  of one this process holds whole (addressable or fully replicated). Not
  ``process_allgather(tree)``: a numpy or Python leaf, or an array of this
  process alone, is returned as it is, not stacked over processes."""

  def one(x):
    if getattr(x, "is_fully_addressable", True) or x.is_fully_replicated:
      return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(one, tree)


def host_mesh(mesh: Mesh, tensor: int = 0) -> Mesh:
  """This process's devices of ``mesh`` as a ('data', 'fsdp', 'tensor')
  mesh of their own, (1, n / T, T), for the rollout engine, in ``mesh``'s
  order. ``tensor`` = 0 (the default):

    T = mesh's 'tensor' size  when every tensor group of ``mesh`` (devices
                              differing only in their 'tensor' index) lies
                              on one process, each device at its own
                              tensor index (device (0, i, t) holds tensor
                              block t in ``mesh`` too, so ``to_host_mesh``
                              moves no tensor block),
        1                     otherwise;

  ``tensor`` > 0: T = ``tensor`` (the engine's own tensor parallelism;
  ValueError when it does not divide this process's devices). One process
  and T = mesh's: the same devices and layout as ``mesh``'s rows."""
  devices = np.asarray(mesh.devices)
  me = jax.process_index()
  procs = np.vectorize(lambda d: d.process_index)(devices)
  mine = devices[procs == me]
  if mine.size == 0:
    raise ValueError(f"process {me} has no device in the mesh {mesh.shape}")
  if tensor:
    if mine.size % tensor:
      raise ValueError(
          f"engine tensor axis {tensor} does not divide the"
          f" {mine.size} devices of process {me}"
      )
    mine = mine.reshape(-1, tensor)
  else:
    groups = procs.reshape(-1, procs.shape[-1])  # a row a tensor group
    # The same answer on every process: every group, not only its own.
    if (groups == groups[:, :1]).all():
      mine = devices.reshape(groups.shape)[groups[:, 0] == me]
    else:  # a tensor group spans hosts: whole weights on every device
      mine = mine.reshape(-1, 1)
  return Mesh(
      mine.reshape((1,) + mine.shape),
      mesh.axis_names,
      axis_types=mesh.axis_types,
  )


def _host_spec(spec, tensor: bool):
  """``spec`` without 'data' and 'fsdp' (and 'tensor' unless ``tensor``):
  whole over the engine's row axes."""
  drop = {"data", "fsdp"} | (set() if tensor else {"tensor"})

  def keep(axes):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    names = tuple(a for a in names if a not in drop)
    return names[0] if len(names) == 1 else (names or None)

  return PartitionSpec(*(keep(a) for a in spec))


def _keeps_tensor_blocks(mesh: Mesh, local: Mesh) -> bool:
  """Whether both meshes have one 'tensor' size and every device of
  ``local`` sits at the tensor index it has in ``mesh``."""
  if local.shape["tensor"] != mesh.shape["tensor"]:
    return False
  where = {d: t for (*_, t), d in np.ndenumerate(mesh.devices)}
  return all(where.get(d) == t for (*_, t), d in np.ndenumerate(local.devices))


def to_host_mesh(tree: Any, mesh: Mesh, shardings: Any = None) -> Any:
  """Global arrays on ``mesh`` -> arrays of this process alone with
  ``shardings`` (a matching tree of NamedShardings over this process's
  devices, whole over 'data' and 'fsdp': the engine's weights, e.g.
  ``JaxEngine.param_shardings``); default: on ``host_mesh(mesh)``, each
  array's spec on ``mesh`` without 'data' and 'fsdp' (and 'tensor' where
  the host mesh has none). Every process calls it, with the same tree;
  cast the arrays first (they move in their own dtype).

    1. one jitted copy on ``mesh`` into the target's spec: XLA all-gathers
       each weight over the row axes device to device (NCCL / ICI / gloo)
       and keeps a 'tensor' split whose blocks already lie where the target
       wants them (``host_mesh``'s default layout);
    2. each process wraps its own devices' blocks as arrays on the target's
       mesh (``make_array_from_single_device_arrays``: no copy).

  A weight the target splits over 'tensor' otherwise (the engine's own
  tensor size or device order: ``rollout.engine_tensor``) goes leaf by
  leaf: whole on every device, wrapped, then split by ``device_put``
  between this host's devices (one whole leaf at a time beside the
  result).

  No host memory holds a weight (``global_to_host`` did: a full
  ``process_allgather`` of every leaf to numpy on every host, then a copy
  back onto the devices). Numpy and Python leaves are returned as they
  are. A weight already in the target layout may come back in its own
  buffers (jit forwards it): a caller that keeps the result while the
  learner donates its buffers copies it (``JaxEngine`` does)."""
  leaves, treedef = jax.tree.flatten(tree)
  arrays = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
  if shardings is None:
    local = host_mesh(mesh)
    keep = local.shape["tensor"] > 1
    targets = [
        NamedSharding(local, _host_spec(_spec(leaves[i]), keep)) for i in arrays
    ]
  else:
    flat = treedef.flatten_up_to(shardings)  # raises on another structure
    targets = [flat[i] for i in arrays]
  for t in targets:
    if {"data", "fsdp"} & set(jax.tree.leaves(tuple(t.spec))):
      raise ValueError(f"engine weights split over a row axis: {t.spec}")
  # One answer on every process: each runs the same jitted copies.
  aligned = all(
      allgather_objects(
          all(_keeps_tensor_blocks(mesh, m) for m in {t.mesh for t in targets})
      )
  )
  fast = [
      k
      for k, t in enumerate(targets)
      if aligned or "tensor" not in jax.tree.leaves(tuple(t.spec))
  ]

  def wrap(x, target):
    blocks = {s.device: s.data for s in x.addressable_shards}
    return jax.make_array_from_single_device_arrays(
        x.shape, target, [blocks[d] for d in target.mesh.devices.flat]
    )

  moved = reshard(
      [leaves[arrays[k]] for k in fast],
      [NamedSharding(mesh, targets[k].spec) for k in fast],
  )
  for k, x in zip(fast, moved):
    leaves[arrays[k]] = wrap(x, targets[k])
  for k in sorted(set(range(len(arrays))) - set(fast)):
    t = targets[k]
    whole = reshard(leaves[arrays[k]], NamedSharding(mesh, PartitionSpec()))
    leaves[arrays[k]] = jax.device_put(
        wrap(whole, NamedSharding(t.mesh, PartitionSpec())), t
    )
    del whole
  return jax.tree.unflatten(treedef, leaves)


def reshard(tree: Any, shardings: Any) -> Any:
  """``tree`` copied to ``shardings`` by one jitted identity (device to
  device; every process calls it for arrays spanning processes). One
  function object, so jit's caches keep its compiled copies."""
  return jax.jit(_identity, out_shardings=shardings)(tree)


def _identity(x):
  return x


def _spec(x) -> PartitionSpec:
  return (
      x.sharding.spec
      if isinstance(x.sharding, NamedSharding)
      else PartitionSpec()
  )


def barrier(name: str) -> None:
  """Blocks until every process reaches ``barrier(name)``."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def global_mesh_devices(mesh: Mesh) -> dict:
  """{process index: number of its devices in ``mesh``} (for logs)."""
  out: dict = {}
  for d in np.asarray(mesh.devices).flat:
    out[d.process_index] = out.get(d.process_index, 0) + 1
  return out
