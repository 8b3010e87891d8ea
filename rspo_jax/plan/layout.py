"""Hosts, devices and mesh of a run, and the memory a device offers.

Hosts x devices, first match wins:
  1. ``RSPO_NUM_HOSTS`` / ``RSPO_DEVICES_PER_HOST`` (environment),
  2. ``mesh.num_hosts`` / ``mesh.devices_per_host`` (``configs/mesh/*.py``),
  3. this process: ``jax.process_count()`` x ``jax.local_device_count()``.
Devices are taken in process-major order (``jax.devices()``), so each host
holds a contiguous block of the row-major mesh; ``cross_host_axes`` names
the mesh axes whose collectives leave a host. A device's usable memory is
``mesh.device_memory_gb`` times the fraction JAX preallocates
(``mem_fraction``), or the devices' own limit (``_device_limit_gb``).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

GB = 1024**3


def _mesh_shape(shape, n_devices):
  shape = list(shape)
  known = 1
  for s in shape:
    known *= s if s != -1 else 1
  return [n_devices // known if s == -1 else s for s in shape]


def _env_int(environ, name) -> int:
  value = environ.get(name, "").strip()
  if not value:
    return 0
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} is not an int")


def cross_host_axes(mesh_shape, num_hosts: int) -> list:
  """Mesh axes split between hosts, with devices laid out process-major
  over the row-major mesh (the trailing axes fill a host first)."""
  per_host = math.prod(mesh_shape) // max(num_hosts, 1)
  crossing = []
  for name, size in reversed(list(zip(("data", "fsdp", "tensor"), mesh_shape))):
    if per_host >= size and per_host % size == 0:
      per_host //= size
    else:
      if size > 1:
        crossing.append(name)
      per_host = 1
  return sorted(crossing, key=("data", "fsdp", "tensor").index)


def resolve_layout(cfg, environ: Optional[Mapping[str, str]] = None) -> dict:
  """{hosts, devices_per_host, devices, platform, mesh, cross_host_axes}.

  Raises ValueError naming the mesh and device count when they disagree.
  """
  environ = os.environ if environ is None else environ
  mesh_cfg = cfg.mesh  # num_hosts, devices_per_host, platform: set by a
  # configs/mesh/*.py file; 0 / "" (the base config's) means "not declared"
  shape = [int(s) for s in mesh_cfg.shape]
  hosts = _env_int(environ, "RSPO_NUM_HOSTS") or int(mesh_cfg.num_hosts or 0)
  per_host = _env_int(environ, "RSPO_DEVICES_PER_HOST") or int(
      mesh_cfg.devices_per_host or 0
  )
  platform = mesh_cfg.platform or ""
  if hosts < 0 or per_host < 0:
    raise ValueError(
        f"hosts={hosts}, devices_per_host={per_host}: must be >= 0"
    )
  if not hosts or not per_host:
    explicit = -1 not in shape
    if explicit and (hosts or per_host):  # one given: the mesh fixes the other
      total = math.prod(shape)
      if hosts and total % hosts == 0:
        per_host = total // hosts
      elif per_host and total % per_host == 0:
        hosts = total // per_host
    if not hosts or not per_host:
      import jax  # only counted when nothing declares the layout

      hosts = hosts or jax.process_count()
      per_host = per_host or jax.local_device_count()
      platform = platform or jax.default_backend()
      if explicit and hosts == 1 and 0 < math.prod(shape) < per_host:
        per_host = math.prod(shape)  # sharding.make_mesh takes the first
  n_devices = hosts * per_host
  if shape.count(-1) > 1:
    raise ValueError(f"mesh.shape {tuple(shape)}: at most one -1 entry")
  known = math.prod(s for s in shape if s != -1)
  if known <= 0 or (-1 in shape and n_devices % known):
    raise ValueError(
        f"mesh.shape {tuple(shape)} does not divide {hosts} hosts x"
        f" {per_host} devices = {n_devices}"
    )
  mesh = _mesh_shape(shape, n_devices)
  if math.prod(mesh) != n_devices:
    raise ValueError(
        f"mesh {tuple(mesh)} needs {math.prod(mesh)} devices; the plan has"
        f" {hosts} hosts x {per_host} devices = {n_devices}"
    )
  return {
      "hosts": hosts,
      "devices_per_host": per_host,
      "devices": n_devices,
      "platform": platform or "unknown",
      "mesh": dict(zip(("data", "fsdp", "tensor"), mesh)),
      "cross_host_axes": cross_host_axes(mesh, hosts),
  }


DEFAULT_MEM_FRACTION = 0.75  # JAX preallocates 75 % of a GPU by default


def mem_fraction(
    environ: Mapping[str, str], platform: str = "gpu"
) -> tuple[float, str]:
  """(fraction of a device JAX may use, where it came from). GPU:
  ``XLA_PYTHON_CLIENT_MEM_FRACTION``; 1.0 without preallocation
  (``XLA_PYTHON_CLIENT_PREALLOCATE=false``); else JAX's default 0.75. TPU
  and CPU: 1.0 (the variable applies to GPUs only)."""
  if platform != "gpu":
    return 1.0, f"{platform}: no preallocation fraction"
  value = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
  if value:
    try:
      fraction = float(value)
    except ValueError:
      fraction = -1.0
    if not 0.0 < fraction <= 1.0:
      raise ValueError(
          f"XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} is not a"
          " number in (0, 1]"
      )
    return fraction, "XLA_PYTHON_CLIENT_MEM_FRACTION"
  if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() == "false":
    return 1.0, "XLA_PYTHON_CLIENT_PREALLOCATE=false"
  return DEFAULT_MEM_FRACTION, "JAX default"


def usable_gb(cfg, layout, environ) -> tuple:
  """(GiB a device JAX may use, (fraction, where it came from)), or (None,
  None) without ``mesh.device_memory_gb``."""
  device_gb = float(cfg.mesh.device_memory_gb or 0)
  if not device_gb:
    return None, None
  fraction, source = mem_fraction(environ, layout["platform"])
  return device_gb * fraction, (fraction, source)


def _device_limit_gb() -> Optional[float]:
  import jax

  from rspo_jax import distributed

  limits = []
  for d in jax.local_devices():
    try:
      stats = d.memory_stats() or {}
    except Exception:  # CPU and some backends have none
      stats = {}
    if stats.get("bytes_limit"):
      limits.append(int(stats["bytes_limit"]))
  if not limits:
    return None
  return -float(distributed.global_max(-min(limits))) / GB
