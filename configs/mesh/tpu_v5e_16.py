"""A TPU v5e-16 slice (4 hosts x 4 chips, 16 GB HBM each): fsdp 16.

The FSDP all-gathers cross hosts over the slice's ICI links.
"""

from configs.mesh import make_mesh_config


def get_config(arg=None):
  return make_mesh_config(
      (1, 16, 1),
      num_hosts=4,
      devices_per_host=4,
      platform="tpu",
      device_memory_gb=16.0,
      arg=arg,
  )
