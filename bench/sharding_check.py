"""Sharding check of the paper-shape learner step on any one machine.

  python bench/sharding_check.py [--smoke] [--cudnn] [--out=FILE]

The step of bench/device.py --paper (qwen2.5-1.5b widths, float32 masters,
bfloat16 compute, remat, scanned layers; rows of 4096 + 512 tokens, logits
on the 512-token response window, micro-batches of a row a device;
--smoke: tiny) is compiled -- never run -- for the mesh (2, 4, 1) of 8 fake
CPU devices (two nodes of four: 'data' across nodes, 'fsdp' within) on 32
rows, in 4 micro-batches (the paper's micro-batch) and in 2, and its HLO
read (rspo_jax/hlo.py):

  sharding_step  activation-sized collectives (hlo.activation_collectives;
                 0 expected), gradient reductions over 'data' / 'fsdp' not
                 float32 in the HLO right after SPMD partitioning (0
                 expected), compile seconds.
  sharding_data  array all-reduces over 'data' per update with 2 and with 4
                 micro-batches (equal expected, one per parameter after the
                 loop: train_step._data_local).

--cudnn: model.attention=cudnn, as 'auto' picks on a GPU, with jax's own
cuDNN partitioning code and only the kernels' lowering stubbed
(rspo_jax/models/cudnn_stub.py), so the compile runs on CPU devices and
checks what a multi-GPU run compiles: before the kernel ran under
``shard_map`` (rspo_jax/models/cudnn_attention.py) this step failed on
(2, 4, 1) with 2 or more micro-batches ('GSPMDSharding' object has no
attribute 'spec'). Each row says which attention it compiled.

A machine with one GPU runs the learner on one device, where nothing is
partitioned; this is its check of the sharding, with its own jax and XLA
(bash bench/device_check.sh runs it after the GPU parts). Two layers: the
sharding of a scanned stack does not depend on its depth.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Before jax starts: 8 CPU devices, whatever accelerator the machine has.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
)

import device  # noqa: E402  (bench/device.py: the paper shapes and flags)

MESH = (2, 4, 1)


def check(smoke: bool, out: device.Results, cudnn: bool = False) -> None:
  import jax
  from rspo_jax import hlo, models, sharding

  run = device.PAPER_SMOKE if smoke else device.PAPER
  flags = dict(device.PAPER_FLAGS)
  attention = "xla"  # what 'auto' is on CPU devices
  if cudnn:
    from rspo_jax.models import cudnn_stub

    cudnn_stub.install()
    flags["attention"] = attention = "cudnn"
  cfg = models.get_model_config(run["preset"], num_layers=2, **flags)
  mesh = sharding.make_mesh(MESH)
  rows, seq = 2 * run["rows"], run["prompt_len"] + run["resp_len"]
  micro, n_micro = device.paper_micro(
      run["rows"], mesh, run["micro_rows_per_device"]
  )
  n_micro = rows // micro  # the paper's micro-batches, twice as many
  window = run["resp_len"]
  over_data = {}
  for n in (n_micro // 2, n_micro):
    t0 = time.perf_counter()
    c = hlo.compile_train_step(
        mesh, cfg, rows, seq, n_micro=n, window=window, partitioned=n == n_micro
    )
    over_data[n] = sum(
        r.times * sum(1 for shape in r.shapes if shape)
        for r in hlo.reductions(c.hlo, MESH)
        if "data" in r.axes
    )
    if n != n_micro:
      continue
    bound = hlo.activation_bound(c, MESH, cfg.hidden_size)
    bad = hlo.activation_collectives(c.hlo, c.params, MESH, bound)
    skip = hlo.param_shapes(c.params, mesh.size)
    narrow = [
        r
        for r in hlo.reductions(c.partitioned, MESH, loops=False)
        if r.axes & {"data", "fsdp"}
        and r.shapes[0]
        and tuple(d for d in r.shapes[0] if d != 1) in skip
        and set(r.dtypes) != {"f32"}
    ]
    out.emit(
        {
            "bench": "sharding_step",
            "mesh_shape": list(MESH),
            "attention": attention + (" (stubbed kernel)" if cudnn else ""),
            "preset": run["preset"],
            "layers": cfg.num_layers,
            "rows": rows,
            "seq_len": seq,
            "window": window,
            "micro_batch_rows": micro,
            "micro_batches": n,
            "compile_s": round(time.perf_counter() - t0, 1),
            "activation_collectives": len(bad),
            "largest_activation_collectives": [
                [k, list(s), e, list(a)]
                for k, s, e, a in sorted(bad, key=lambda b: -b[2])[:4]
            ],
            "gradient_reductions_not_f32": len(narrow),
        }
    )
  out.emit(
      {
          "bench": "sharding_data",
          "mesh_shape": list(MESH),
          "attention": attention,
          "parameters": len(jax.tree.leaves(c.params)),
          "data_all_reduces_per_update": {
              str(k): v for k, v in over_data.items()
          },
      }
  )


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="tiny preset")
  p.add_argument(
      "--cudnn",
      action="store_true",
      help="cuDNN attention, its kernel stubbed on CPU",
  )
  p.add_argument("--out", default="", help="also write the rows here")
  args = p.parse_args(argv)
  check(args.smoke, device.Results(args.out), args.cudnn)


if __name__ == "__main__":
  sys.exit(main())
