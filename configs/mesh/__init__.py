"""Mesh configs: the device mesh and the machines it spans.

Each file's ``get_config(arg)`` returns a ConfigDict with
  * ``shape``: (data, fsdp, tensor); -1 takes the remaining devices,
  * ``num_hosts``, ``devices_per_host``: the machines (0 = count them at run
    time), so ``launch/train.py --dry_run`` can plan a cluster from a laptop,
  * ``platform``: gpu | tpu | cpu (informational),
  * ``device_memory_gb``: memory of one device, for the plan's fit check
    (0 = unknown).
``launch/train.py --mesh=FILE`` copies these keys into ``config.mesh``.

``arg`` overrides, comma-separated: ``data=``, ``fsdp=``, ``tensor=``,
``hosts=``, ``devices_per_host=``, ``device_memory_gb=``. When the device
count is known, ``fsdp`` absorbs what the other two axes leave, e.g.
``configs/mesh/gpu16.py:tensor=2`` gives (2, 4, 2).
"""

import ml_collections

_AXES = ("data", "fsdp", "tensor")


def make_mesh_config(
    shape,
    *,
    num_hosts=0,
    devices_per_host=0,
    platform="",
    device_memory_gb=0.0,
    arg=None,
) -> ml_collections.ConfigDict:
  axes = dict(zip(_AXES, shape))
  layout = {
      "hosts": num_hosts,
      "devices_per_host": devices_per_host,
      "device_memory_gb": device_memory_gb,
  }
  given = set()
  for item in (arg or "").split(","):
    if not item.strip():
      continue
    key, _, value = item.partition("=")
    key = key.strip()
    if key in axes:
      axes[key] = int(value)
      given.add(key)
    elif key in layout:
      layout[key] = type(layout[key])(float(value))
    else:
      raise ValueError(
          f"unknown mesh override {item!r}; known: {_AXES + tuple(layout)}"
      )
  total = layout["hosts"] * layout["devices_per_host"]
  if total and "fsdp" not in given and -1 not in axes.values():
    rest = axes["data"] * axes["tensor"]
    if total % rest:
      raise ValueError(
          f"mesh data={axes['data']} x tensor={axes['tensor']} does not"
          f" divide {total} devices"
      )
    axes["fsdp"] = total // rest
  c = ml_collections.ConfigDict()
  c.shape = tuple(axes[a] for a in _AXES)
  c.num_hosts = int(layout["hosts"])
  c.devices_per_host = int(layout["devices_per_host"])
  c.platform = platform
  c.device_memory_gb = float(layout["device_memory_gb"])
  return c
