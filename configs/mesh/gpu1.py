"""One 80 GB GPU (A100/H100 80GB): mesh 1 x 1 x 1.

For LoRA runs (``model.lora_rank=16``): the frozen bf16 base, A's and B's
float32 adapters and the engine's merged weights on one device
(docs/scale_out.md lists which paper presets fit). `single_host.py` counts
the local devices at run time instead; this file lets `--dry_run` plan a
one-GPU run from a laptop.
"""

from configs.mesh import make_mesh_config


def get_config(arg=None):
  return make_mesh_config(
      (1, 1, 1),
      num_hosts=1,
      devices_per_host=1,
      platform="gpu",
      device_memory_gb=80.0,
      arg=arg,
  )
