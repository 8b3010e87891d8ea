"""Weight sync to SGLang servers: a streamed HF export, skipped when the
weights did not change.

  sync(engine, learner, v):  unchanged(learner) ? nothing
                             : export -> dir_v ; engine.update_weights(dir_v)

*Unchanged* means the learner's parameter arrays are the very objects the
engine got last (weak references, so nothing is kept alive). JAX arrays are
immutable and a train step replaces them (its inputs are donated), so the
same objects are the same weights; equal weights in new arrays (B := A) are
exported again.

The export (``export_hf``) writes what ``hf_io.save_hf_model`` writes
(config.json, generation_config.json, the tokenizer's files, the same
tensors in the same dtype) with the weights split one safetensors file per
layer (plus one for the embedding, one for the final norm and head) and an
index, so that a pool of threads casts a layer on device (bfloat16 under
bfloat16 compute: half the bytes move), copies it to the host and writes it
while the others do the same: host memory holds about ``threads`` layers,
never the whole model. The directory alternates between two slots
(``v0``/``v1``); the older is removed once the servers loaded the newer.
``hf_named_arrays`` yields the same tensors one at a time, on the host or
whole on one device, for the no-disk path (rollout/distributed_sync.py).

Multi-host (``export_hf_multihost``, every process calls it): the same
directory, its files shared out over the processes,

  owner(file group i) = i % P,

all processes gather each group's tensors together, one tensor at a time
(cast on device first, then moved), and only the owner keeps them
and writes the group's file (a writer thread, so the hosts write at the
same time); the leader writes the index and json files after a barrier,
from sizes every process computes from shapes. No host ever holds the
model: at most one group it owns plus one tensor in flight. The layers go
in blocks of P consecutive groups (owned by processes 0..P-1 in some
order) when the parameters' mesh lists the devices process by process:
their j-th tensors are stacked into [P, ...] in their own layout, then
resharded so that row p lands on process p's devices (``_exchange``,
``stack_to_owners``: an all-to-all and a collective-permute): each host
receives its own layer's tensor alone, 1/P of what an all-gather sends it.
Other tensors sharded across hosts (embedding, head, the layers left over
when P does not divide L, any tensor under a device order that interleaves
processes) still reach every host once (an all-gather; JAX has no gather
to one process that worked here); one replicated across hosts (a data axis
over hosts) is read by its owner from its own devices, and nothing moves.

Where: ``export_dir``: ``rollout.export_dir``, else a node-local
``/dev/shm/rspo_export_<hash of the workdir>`` when /dev/shm exists, the
run is one process and every server is on this host (it is removed at
exit), else ``<workdir>/export`` (servers on other hosts need a shared
filesystem).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import threading
import time
import urllib.parse
import weakref
from collections import defaultdict
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rspo_jax import distributed
from rspo_jax.models import hf_io

log = logging.getLogger(__name__)
save_safetensors = hf_io.save_safetensors  # every export file's one writer

SHM = "/dev/shm"


# ------------------------------------------------------------------- where


def _is_local(url: str) -> bool:
  host = urllib.parse.urlparse(url).hostname or ""
  return host in (
      "localhost",
      "::1",
      socket.gethostname(),
      socket.getfqdn(),
  ) or host.startswith("127.")


def export_dir(cfg, workdir: str, *, multihost: bool = False) -> str:
  """Where a run's SGLang exports go (see the module docstring)."""
  given = cfg.rollout.export_dir
  if given:
    return given
  text = f"{cfg.rollout.server_urls},{cfg.rollout.b_server_urls}"
  urls = [u for u in re.split(r"[,;\s]+", text) if u]
  if (
      not multihost
      and os.path.isdir(SHM)
      and os.access(SHM, os.W_OK)
      and all(_is_local(u) for u in urls)
  ):
    key = hashlib.sha1(os.path.abspath(workdir).encode()).hexdigest()[:12]
    path = os.path.join(SHM, f"rspo_export_{key}")
    atexit.register(shutil.rmtree, path, ignore_errors=True)  # RAM, not disk
    return path
  return os.path.join(workdir, "export")


# ------------------------------------------------------------------ export


class _Layer:
  """Layer ``i`` of a scanned model's stacked [L, ...] array, sliced only
  when read (slicing every layer up front would copy the weights)."""

  def __init__(self, stacked, i: int):
    self.stacked, self.i = stacked, i

  def get(self):
    return self.stacked[self.i]


def _param_groups(module, dtype) -> dict:  # pylint: disable=unused-argument
  """file group -> [(HF name, device or host array in our layout, or a
  ``_Layer`` of one)]: one group a layer, 'embed' and 'head'."""
  groups = defaultdict(list)
  for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
    if hf_io._is_stacked(path):  # pylint: disable=protected-access
      for i in range(var.value.shape[0]):
        q = hf_io._layer_path(path, i)  # pylint: disable=protected-access
        groups[i].append((hf_io._hf_name(q), _Layer(var.value, i)))  # pylint: disable=protected-access
      continue
    name = hf_io._hf_name(path)  # pylint: disable=protected-access
    key = (
        path[1]
        if str(path[0]) == "layers"
        else "embed"
        if name == "model.embed_tokens.weight"
        else "head"
    )
    groups[key].append((name, var.value))
  return groups


def _host(x, dtype) -> np.ndarray:
  """``x`` as numpy in ``dtype``, cast on its device first."""
  if isinstance(x, jax.Array):
    x = jax.device_get(x.astype(dtype))
  return np.asarray(x).astype(dtype, copy=False)


def _on_device(x, dtype, device):
  """``x`` cast to ``dtype`` on its devices, then whole on ``device``."""
  x = jnp.asarray(x).astype(dtype)
  if x.devices() != {device}:
    x = jax.device_put(x, device)
  return x


def _hf_pairs(name: str, x, dtype, cfg, device=None) -> list:
  """[(HF name, tensor)] of one parameter: cast to ``dtype``, in the HF
  layout; numpy, or with ``device`` a jax.Array whole on that device. A
  Qwen2 q/k/v weight without our bias is followed by its zero bias (HF
  Qwen2 always has them: zeros are the exact equivalent)."""
  if isinstance(x, _Layer):
    x = x.get()
  if device is None:
    t = hf_io._to_hf(name, _host(x, dtype))  # pylint: disable=protected-access
    zeros = np.zeros
  else:
    t = hf_io._to_hf(name, _on_device(x, dtype, device))  # pylint: disable=protected-access
    zeros = lambda shape, dt: jax.device_put(jnp.zeros(shape, dt), device)
  out = [(name, t)]
  bias = _zero_bias_name(name, cfg)
  if bias:
    out.append((bias, zeros((t.shape[0],), dtype)))
  return out


def _zero_bias_name(name: str, cfg) -> str:
  """The zero bias HF Qwen2 needs after q/k/v weight ``name`` when our
  model has none; "" otherwise."""
  m = re.fullmatch(
      r"(model\.layers\.\d+\.self_attn\.)([qkv])_proj\.weight", name
  )
  if m and cfg.family == "qwen2" and not cfg.qkv_bias:
    return f"{m[1]}{m[2]}_proj.bias"
  return ""


def _write_group(path: str, fname: str, items, dtype, cfg) -> dict:
  """Casts, fetches and writes one group; {HF name: bytes} of its tensors."""
  tensors = {}
  for name, x in items:
    tensors.update(_hf_pairs(name, x, dtype, cfg))
  save_safetensors(
      tensors, os.path.join(path, fname), metadata={"format": "pt"}
  )
  return {k: int(v.nbytes) for k, v in tensors.items()}


def _group_order(groups) -> list:
  """Embedding, layers 0..L-1, then the final norm and head."""
  return sorted(
      groups,
      key=lambda k: (
          0 if k == "embed" else 2 if k == "head" else 1,
          k if isinstance(k, int) else 0,
      ),
  )


def hf_named_arrays(module, cfg, *, dtype: Optional[str] = None, device=None):
  """Yields (HF name, tensor) one tensor at a time: the tensors
  ``export_hf`` writes (and ``hf_io.save_hf_model``), same names, dtype
  (``hf_io.export_dtype(cfg, dtype)``) and layout, embedding first, then
  layer by layer, then the final norm and head. numpy arrays; with
  ``device`` (a jax.Device), jax.Arrays whole on that device, cast and
  laid out there (a DLPack hand-over to torch copies nothing). Lazy: only
  the tensor being yielded is materialised. One process only."""
  if cfg.family == "llama" and cfg.qkv_bias:
    raise ValueError("llama family with qkv_bias has no HF equivalent")
  dt = jnp.dtype(hf_io.export_dtype(cfg, dtype))
  groups = _param_groups(module, dt)
  for k in _group_order(groups):
    for name, x in groups[k]:
      yield from _hf_pairs(name, x, dt, cfg, device)


def export_hf(
    module,
    cfg,
    path: str,
    *,
    tokenizer_dir: Optional[str] = None,
    dtype: Optional[str] = None,
    threads: int = 8,
) -> int:
  """Writes the HF directory ``hf_io.save_hf_model`` writes, streamed (see
  the module docstring); returns the weights' bytes. One process only."""
  if cfg.family == "llama" and cfg.qkv_bias:
    raise ValueError("llama family with qkv_bias has no HF equivalent")
  dtype_name = hf_io.export_dtype(cfg, dtype)
  dt = jnp.dtype(dtype_name)
  os.makedirs(path, exist_ok=True)
  _remove_stale(path)  # stale weights of an earlier export
  groups = _param_groups(module, dt)
  order = _group_order(groups)
  names = _file_names(order)
  with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
    written = {
        k: pool.submit(_write_group, path, names[k], groups[k], dt, cfg)
        for k in order
    }
    sizes = {k: f.result() for k, f in written.items()}
  return _write_meta(path, cfg, dtype_name, order, names, sizes, tokenizer_dir)


def _file_names(order) -> dict:
  """file group -> its safetensors file name, numbered in ``order``."""
  n = len(order)
  return {
      k: f"model-{i + 1:05d}-of-{n:05d}.safetensors"
      for i, k in enumerate(order)
  }


def _remove_stale(path: str) -> None:
  """Removes an earlier export's weights and index from ``path``."""
  for f in os.listdir(path):
    if f == hf_io.SAFE_INDEX or (
        f.startswith("model") and f.endswith(".safetensors")
    ):
      os.remove(os.path.join(path, f))


def _write_meta(
    path, cfg, dtype_name, order, names, sizes, tokenizer_dir
) -> int:
  """config.json, generation_config.json, the tokenizer's files and, last
  (a directory with an index is complete), the index from ``sizes``
  (group -> {HF name: bytes}); returns the bytes."""
  hf_cfg = cfg.to_hf_dict()
  hf_cfg["torch_dtype"] = hf_cfg["dtype"] = dtype_name
  _write_json(os.path.join(path, "config.json"), hf_cfg)
  gen = {"_from_model_config": True}
  if cfg.bos_token_id is not None:
    gen["bos_token_id"] = cfg.bos_token_id
  if cfg.eos_token_id is not None:
    gen["eos_token_id"] = hf_cfg["eos_token_id"]
  _write_json(os.path.join(path, "generation_config.json"), gen)
  if tokenizer_dir is not None:
    hf_io.copy_tokenizer_files(tokenizer_dir, path)
  weight_map = {t: names[k] for k in order for t in sizes[k]}
  total = sum(b for k in order for b in sizes[k].values())
  _write_json(
      os.path.join(path, hf_io.SAFE_INDEX),
      {"metadata": {"total_size": total}, "weight_map": weight_map},
  )
  return total


def _write_json(path: str, obj) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")


# ------------------------------------------------------- multi-host export


class GatherMeter:
  """What one process's ``export_hf_multihost`` brought to its host:
  ``peak`` (bytes of gathered tensors held at once), ``received`` (bytes
  gathered in all), ``exchanged`` (tensors it received alone, through a
  block exchange: ``_exchange``) and ``written`` (the files it wrote, in
  order)."""

  def __init__(self):
    self.held = self.peak = self.received = self.exchanged = 0
    self.written = []
    self._lock = threading.Lock()

  def hold(self, nbytes: int) -> None:
    with self._lock:
      self.held += nbytes
      self.received += nbytes
      self.peak = max(self.peak, self.held)

  def drop(self, nbytes: int) -> None:
    with self._lock:
      self.held -= nbytes


def _group_sizes(items, dtype, cfg) -> dict:
  """{HF name: bytes} of one group's tensors, as ``_write_group`` returns
  them, from shapes alone (every process knows them, no data is read)."""
  out = {}
  for name, x in items:
    shape = x.stacked.shape[1:] if isinstance(x, _Layer) else np.shape(x)
    hf = jax.eval_shape(
        lambda a, n=name: hf_io._to_hf(n, a),  # pylint: disable=protected-access
        jax.ShapeDtypeStruct(shape, dtype),
    )
    out[name] = math.prod(hf.shape) * dtype.itemsize
    bias = _zero_bias_name(name, cfg)
    if bias:
      out[bias] = hf.shape[0] * dtype.itemsize
  return out


def _on_every_host(x: jax.Array) -> bool:
  """Each process's devices hold all of ``x`` (replicated across hosts,
  e.g. sharded only within them): from the sharding alone, so every
  process gets the same answer."""
  if x.is_fully_addressable or x.is_fully_replicated:
    return True
  blocks = defaultdict(set)  # process -> the index blocks its devices hold
  for d, index in x.sharding.devices_indices_map(x.shape).items():
    blocks[d.process_index].add(_block(index, x.shape))
  every = set().union(*blocks.values())
  return all(b == every for b in blocks.values())


def _block(index, shape) -> tuple:
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _from_own_shards(x: jax.Array) -> np.ndarray:
  """``x`` whole as numpy from this process's shards (``_on_every_host``)."""
  if x.is_fully_addressable or x.is_fully_replicated:
    return np.asarray(x)
  out = np.empty(x.shape, x.dtype)
  done = set()
  for shard in x.addressable_shards:
    key = _block(shard.index, x.shape)
    if key not in done:
      done.add(key)
      out[shard.index] = np.asarray(shard.data)
  return out


def _gather(x, dtype, keep: bool, meter: GatherMeter):
  """One parameter cast to ``dtype`` on its devices (half the bytes move
  under bfloat16), then whole as numpy on this host when ``keep``, else
  None. Every process calls it for every parameter, in the same order. A
  parameter every host holds whole on its devices is read from this
  host's shards by the keeper alone (nothing moves); one sharded across
  processes is all-gathered (``distributed.global_to_host``), so a host
  that does not keep it receives it too and drops it at once."""
  if isinstance(x, _Layer):
    x = x.get()
  moved = False
  if isinstance(x, jax.Array):
    x = x.astype(dtype)
    if not _on_every_host(x):
      x, moved = distributed.global_to_host(x), True  # every process
    elif keep:
      x = _from_own_shards(x)
  if not (keep or moved):
    return None
  out = np.asarray(x).astype(dtype, copy=False)
  meter.hold(out.nbytes)
  if not keep:
    meter.drop(out.nbytes)
    return None
  return out


def export_hf_multihost(
    module,
    cfg,
    path: str,
    *,
    tokenizer_dir: Optional[str] = None,
    dtype: Optional[str] = None,
    meter: Optional[GatherMeter] = None,
) -> int:
  """``export_hf`` in a multi-process job: every process calls it with the
  same (globally sharded) ``module``; the directory is the one
  ``export_hf`` writes in one process, file for file and byte for byte.

    owner(group i of _group_order) = i % P    (P = jax.process_count())

  All processes walk the groups in order and take part in the gather of
  each group's tensors, one tensor at a time (``_gather``: cast on device
  first, then ``process_allgather``); only the owner keeps them, and its
  writer thread writes the group's file while the process goes on to the
  next groups, so the writes of all hosts overlap; before its next group
  an owner waits for its previous write. A host thus holds at most one
  group it owns plus one tensor in flight (``meter.peak``), never the
  model, and writes only its own files. Layers go in blocks of P groups
  (``_exchange_blocks``), each host receiving only its own layer's
  tensors (``stack_to_owners``); another tensor sharded across processes
  reaches every host once (an all-gather: the network carries what a full
  gather did); one every host holds whole on its devices (replicated
  across hosts) is read by its owner from its own shards, nothing moves.

  The leader removes stale weights first (barrier) and, after every
  process's files are written (barrier), writes the index (from sizes
  every process computes from shapes: ``_group_sizes``), config.json,
  generation_config.json and the tokenizer's files; a last barrier returns
  when the directory is complete. The three barriers fail on every
  process when one failed before it (``_raise_if_any_failed``; the
  directory not made or its stale weights not removed, a write): a host
  whose write raised still takes part in the remaining gathers, writes
  nothing more, and raises its error at the barrier; the others raise a
  RuntimeError naming it. ``path`` must be one directory every
  host sees. Returns the weights' bytes.

  Not used: JAX's one gather that reaches the owner alone, a cross-host
  ``jax.device_put`` of each remote shard (experimental; needs
  ``jax_cross_host_transfer_socket_address`` set before the backend
  starts). On 2 CPU processes here (JAX 0.10.2) one transfer was right,
  but shard-by-shard gathers to an owner returned wrong blocks in each of
  3 runs and hung in 2 (a 3-process run hung too)."""
  if cfg.family == "llama" and cfg.qkv_bias:
    raise ValueError("llama family with qkv_bias has no HF equivalent")
  meter = GatherMeter() if meter is None else meter
  dtype_name = hf_io.export_dtype(cfg, dtype)
  dt = jnp.dtype(dtype_name)
  count, me = jax.process_count(), jax.process_index()
  error = None
  try:
    os.makedirs(path, exist_ok=True)
    if me == 0:
      _remove_stale(path)
  except Exception as e:  # pylint: disable=broad-except
    error = e
  _raise_if_any_failed(error, "preparing the directory")
  groups = _param_groups(module, dt)
  order = _group_order(groups)
  names = _file_names(order)
  sizes = {k: _group_sizes(groups[k], dt, cfg) for k in order}

  error = None  # this process's first failed write
  pending = None
  mesh = _exchange_mesh(groups)
  blocks = _exchange_blocks(order, groups, count) if mesh else {}
  in_blocks = {j for b in blocks.values() for j in b}
  with concurrent.futures.ThreadPoolExecutor(1) as writer:
    for i, k in enumerate(order):
      block = blocks.get(i)
      if block is None and i in in_blocks:
        continue  # exchanged with its block
      mine = i % count == me or block is not None
      if mine and pending is not None:
        error = error or pending.exception()  # one owned group at a time
        pending = None
      keep = mine and error is None  # after a failure: gather, write nothing
      if block is None:
        items = [(name, _gather(x, dt, keep, meter)) for name, x in groups[k]]
      else:  # each process receives its own group of the block
        k = order[block[me]]
        items = _exchange(block, order, groups, dt, mesh, keep, meter)
      if keep:
        pending = writer.submit(
            _write_owned, items, path, names[k], sizes[k], dt, cfg, meter
        )
      del items
    if pending is not None:
      error = error or pending.exception()
  log.info(
      "export: process %d wrote %d of %d files; host peak %.1f MB, "
      "received %.1f MB",
      me,
      len(meter.written),
      len(order),
      meter.peak / 1e6,
      meter.received / 1e6,
  )
  _raise_if_any_failed(error, "writing its weight files")
  total = sum(b for k in order for b in sizes[k].values())
  error = None
  if me == 0:
    try:
      total = _write_meta(
          path, cfg, dtype_name, order, names, sizes, tokenizer_dir
      )
    except Exception as e:  # pylint: disable=broad-except
      error = e
  _raise_if_any_failed(error, "writing the index, configs and tokenizer")
  return total


def _write_owned(items, path, file_name, sizes, dt, cfg, meter) -> None:
  """``_write_group`` of an owned group's arrays, each let go once laid
  out for HF (the group is not held twice); checked against ``sizes``."""
  nbytes = sum(x.nbytes for _, x in items)
  try:
    tensors = {}
    for j, (name, x) in enumerate(items):
      items[j] = None
      tensors.update(_hf_pairs(name, x, dt, cfg))
    save_safetensors(
        tensors, os.path.join(path, file_name), metadata={"format": "pt"}
    )
  finally:
    meter.drop(nbytes)
  got = {t: int(v.nbytes) for t, v in tensors.items()}
  if got != sizes:
    raise RuntimeError(f"{file_name}: wrote {got}, the index says {sizes}")
  meter.written.append(file_name)


def _exchange_mesh(groups) -> Optional[Mesh]:
  """A ('procs', 'local') mesh over the parameters' devices in their mesh's
  order, row p = process p's devices: the same device assignment, so one
  jitted copy reshards onto it. None with one process, parameters on
  several meshes, or devices not in process blocks (e.g. a TPU ring
  order)."""
  count = jax.process_count()
  meshes = {
      x.sharding.mesh
      for items in groups.values()
      for _, x in items
      for x in [x.stacked if isinstance(x, _Layer) else x]
      if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding)
  }
  if count == 1 or len(meshes) != 1:
    return None
  devices = np.asarray(next(iter(meshes)).devices)
  if devices.size % count:
    return None
  rows = devices.reshape(count, -1)
  procs = np.vectorize(lambda d: d.process_index)(rows)
  if not (procs == np.arange(count)[:, None]).all():
    return None
  return Mesh(rows, ("procs", "local"))


def _exchange_blocks(order, groups, count) -> dict:
  """{i: [i', ...]}: runs of ``count`` consecutive groups from index i
  whose tensors match in names (up to the layer number), shapes and dtypes
  -- the layers -- listed by owner (entry p is the group process p owns:
  ``i' % count == p``). Every process gets the same answer (shapes
  only)."""

  def signature(k):
    return tuple(
        (
            re.sub(r"\.\d+\.", ".#.", name),
            tuple(
                x.stacked.shape[1:] if isinstance(x, _Layer) else np.shape(x)
            ),
            str((x.stacked if isinstance(x, _Layer) else x).dtype),
        )
        for name, x in groups[k]
    )

  out, i = {}, 0
  while i + count <= len(order):
    run = range(i, i + count)
    if (
        all(isinstance(order[j], int) for j in run)
        and len({signature(order[j]) for j in run}) == 1
    ):
      out[i] = sorted(run, key=lambda j: j % count)
      i += count
    else:
      i += 1
  return out


@functools.lru_cache(maxsize=None)
def _stacker(dtype, sharding):
  """jitted [x_0, ..., x_{P-1}] -> [P, ...] in ``dtype``, laid out as the
  x's (``sharding``: theirs with the new axis whole): no communication."""
  return jax.jit(
      lambda xs: jnp.stack([x.astype(dtype) for x in xs]),
      out_shardings=sharding,
  )


def stack_to_owners(xs, dtype, mesh: Mesh) -> jax.Array:
  """[x_0, ..., x_{P-1}] (one shape and sharding) -> a [P, ...] array whose
  row p lies on process p's devices of ``mesh`` (``_exchange_mesh``),
  split over them along its first axis where that divides. Two jitted
  copies: the stack, in the x's own layout (nothing moves), then the
  reshard, which XLA lowers to an all-to-all and a collective-permute,
  each device receiving its share of its own row only (one stacked jit
  all-gathered every row first, 'involuntary full rematerialization';
  ``tests/multihost_export_test.py`` checks the HLO)."""
  src = xs[0].sharding
  stacked = _stacker(
      jnp.dtype(dtype), NamedSharding(src.mesh, PartitionSpec(None, *src.spec))
  )(xs)
  local = mesh.shape["local"]
  split = stacked.ndim > 1 and stacked.shape[1] % local == 0
  return distributed.reshard(
      stacked,
      NamedSharding(mesh, PartitionSpec("procs", "local" if split else None)),
  )


def _exchange(
    block, order, groups, dtype, mesh: Mesh, keep: bool, meter: GatherMeter
):
  """Process p's group of ``block`` (``_exchange_blocks``), gathered
  together with the others' groups, tensor position by position: the P
  groups' j-th tensors stacked and resharded so row p lands on process
  p's devices (``stack_to_owners``; each host receives its own tensor,
  where an all-gather sent every host all P). Tensors every host holds
  whole are read from its own shards (``_gather``), nothing moves; others
  that cannot be stacked (host arrays, shardings without a mesh) are
  gathered by every process, each keeping its own, as before. Returns
  [(name, numpy array)] of this process's group (None arrays unless
  ``keep``)."""
  me = jax.process_index()
  mine = groups[order[block[me]]]
  out = []
  for j, (name, _) in enumerate(mine):
    xs = [groups[order[b]][j][1] for b in block]
    xs = [x.get() if isinstance(x, _Layer) else x for x in xs]
    if all(not isinstance(x, jax.Array) or _on_every_host(x) for x in xs):
      out.append((name, _gather(xs[me], dtype, keep, meter)))  # no moves
      continue
    if not all(
        isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding)
        for x in xs
    ):
      got = None  # every process takes part in every gather
      for p, x in enumerate(xs):
        r = _gather(x, dtype, keep and p == me, meter)
        got = r if p == me else got
      out.append((name, got))
      continue
    rows = stack_to_owners(xs, dtype, mesh)
    x = None
    if keep:  # this host's row, from its own devices' blocks
      x = np.empty(rows.shape[1:], rows.dtype)
      for shard in rows.addressable_shards:
        if shard.replica_id == 0:
          x[shard.index[1:]] = np.asarray(shard.data)[0]
      meter.hold(x.nbytes)
      meter.exchanged += 1
    del rows
    out.append((name, x))
  return out


def _raise_if_any_failed(error: Optional[BaseException], what: str) -> None:
  """A barrier that fails on every process when one failed: each process
  says whether ``error`` is set (``distributed.global_max``), so a host
  whose write raised does not leave the others waiting at the next
  collective. Raises ``error`` itself where it happened, a RuntimeError
  naming the failed processes elsewhere."""
  flags = np.zeros(jax.process_count(), np.int32)
  flags[jax.process_index()] = error is not None
  failed = np.flatnonzero(distributed.global_max(flags)).tolist()
  if error is not None:
    raise error
  if failed:
    raise RuntimeError(
        f"export: process(es) {failed} failed {what}; see" " their logs"
    )


# ------------------------------------------------------------------- skips


class SyncedWeights:
  """Per engine, weak references to the parameter arrays it got last."""

  def __init__(self):
    self._refs = {}  # id(engine) -> (weakref(engine), [weakref(leaf)])

  @staticmethod
  def _leaves(learner) -> list:
    return jax.tree.leaves((learner.params, learner.frozen))

  def unchanged(self, engine, learner) -> bool:
    """The engine got exactly these arrays last (see the module doc)."""
    got = self._refs.get(id(engine))
    if got is None or got[0]() is not engine:
      return False
    leaves = self._leaves(learner)
    return len(leaves) == len(got[1]) and all(
        r() is x for r, x in zip(got[1], leaves)
    )

  def record(self, engine, learner) -> None:
    try:
      refs = [weakref.ref(x) for x in self._leaves(learner)]
      self._refs[id(engine)] = (weakref.ref(engine), refs)
    except TypeError:  # a leaf without weak references: never skip
      self._refs.pop(id(engine), None)


class SyncLog:
  """Counts and seconds of a run's syncs: ``exports`` (directories
  written), ``broadcasts`` (pushes over a torch.distributed group:
  rollout.weight_sync='distributed'), ``skipped``, and per sync a dict
  (version, skipped, export_s, load_s, broadcast_s, total_s, bytes) in
  ``history`` (the last 1000)."""

  def __init__(self):
    self.exports = 0
    self.broadcasts = 0
    self.skipped = 0
    self.history = []

  def add(self, **entry) -> None:
    self.history = self.history[-999:] + [entry]
    if entry.get("skipped"):
      self.skipped += 1
      log.info(
          "weight sync v%d skipped: the engine has these weights",
          entry["version"],
      )
      return
    if entry.get("broadcast_s") is not None:
      self.broadcasts += 1
      log.info(
          "weight sync v%d: %.2f s (broadcast %.2f s, %.1f MB)",
          entry["version"],
          entry["total_s"],
          entry["broadcast_s"],
          (entry.get("bytes") or 0) / 1e6,
      )
      return
    if entry.get("export_s") is not None:
      self.exports += 1
    log.info(
        "weight sync v%d: %.2f s (export %.2f s, %.1f MB; load %.2f s)",
        entry["version"],
        entry["total_s"],
        entry.get("export_s") or 0,
        (entry.get("bytes") or 0) / 1e6,
        entry.get("load_s") or 0,
    )


def timed(fn, *args, **kwargs):
  """(fn(*args, **kwargs), wall seconds)."""
  t = time.perf_counter()
  out = fn(*args, **kwargs)
  return out, time.perf_counter() - t
