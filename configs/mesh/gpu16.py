"""Two nodes x 8 GPUs (the paper's 16-GPU layout): data x fsdp = 2 x 8.

Parameters are sharded (ZeRO-3) over the 8 GPUs of a node, where NVLink
carries the all-gathers, and replicated across the 2 nodes (hybrid FSDP),
so only the gradient all-reduce crosses the network. 80 GB per GPU
(A100/H100 80GB). `:tensor=2` gives (2, 4, 2); `:data=1` gives FSDP over
all 16 GPUs (half the resident memory, cross-node all-gathers).
"""

from configs.mesh import make_mesh_config


def get_config(arg=None):
  return make_mesh_config(
      (2, 8, 1),
      num_hosts=2,
      devices_per_host=8,
      platform="gpu",
      device_memory_gb=80.0,
      arg=arg,
  )
