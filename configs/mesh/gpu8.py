"""One node of 8 GPUs: FSDP over all 8 (ZeRO-3), as verl does for 1.5B-7B.

For 7B with long prompts, `:tensor=2` gives (1, 4, 2). 80 GB per GPU.
"""

from configs.mesh import make_mesh_config


def get_config(arg=None):
  return make_mesh_config(
      (1, 8, 1),
      num_hosts=1,
      devices_per_host=8,
      platform="gpu",
      device_memory_gb=80.0,
      arg=arg,
  )
