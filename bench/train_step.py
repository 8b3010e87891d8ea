"""Policy train-step speed: one JSON line per (preset, mesh layout).

  python bench/train_step.py [--quick] [--fake_devices=N] [--presets=a,b]
      [--iters=3] [--profile_dir=DIR]

Times the jitted, sharded policy step of ``train_step.make_train_step`` with
the mixed RSPO objective (``make_policy_loss``: alpha 1/8, clip 0.2, k3 KL
0.01, entropy 0.001; AdamW after global-norm clipping) on a random batch of
``rows x (prompt + response)`` tokens, 1/8 of the rows off-policy. The batch
is placed on the mesh once, so a step is forward + backward + optimizer only.

Mesh layouts over the ``N`` visible devices (duplicates dropped): (N, 1, 1)
pure data parallel, (1, N, 1) FSDP, (1, N/2, 2) FSDP x tensor. With
``--fake_devices N`` the CPU is split into N XLA host devices (they share
the same cores, so this measures sharding overhead, not a speed-up).

Reported per line: parameter count, compile (first call) seconds, median
step seconds (wall and process CPU), tokens/s, and achieved FLOP/s by
_common.train_flops (6 N tokens + 12 L H Dh S tokens). ``--quick`` runs the
'tiny' preset only.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import _common

# rows x prompt + response per preset: ~1-10 s a step on one CPU core.
DEFAULT_ROWS = {"tiny": 16, "small-25m": 8, "base-100m": 4}
LOSS = dict(alpha=0.125, clip_eps=0.2, kl_coef=0.01, entropy_coef=0.001)


def mesh_layouts(n: int) -> list[tuple[int, int, int]]:
  """(N,1,1), (1,N,1), (1,N/2,2), without duplicates."""
  out = [(n, 1, 1), (1, n, 1)]
  if n >= 2 and n % 2 == 0:
    out.append((1, n // 2, 2))
  seen, uniq = set(), []
  for m in out:
    if m not in seen:
      seen.add(m)
      uniq.append(m)
  return uniq


def bench_one(
    preset: str,
    mesh_shape,
    *,
    rows: int,
    prompt_len: int,
    resp_len: int,
    iters: int,
    dtype: str,
    profile_dir=None,
):
  """Times one (preset, mesh) pair; returns the JSON row."""
  import jax
  from rspo_jax import models, sharding
  from rspo_jax import train_step as ts

  cfg = models.get_model_config(preset, dtype=dtype, param_dtype=dtype)
  mesh = sharding.make_mesh(mesh_shape)
  rules = sharding.DEFAULT_RULES
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  rows = -(-rows // shards) * shards  # every batch shard gets whole rows
  module = models.create_sharded_model(cfg, 0, mesh, rules)
  graphdef, params, frozen = ts.split_trainable(module)
  tx = ts.make_optimizer(1e-6)
  state, state_sh = ts.create_train_state(params, tx, mesh, rules)
  batch = _common.policy_batch(
      rows, prompt_len, resp_len, cfg.vocab_size, n_off=max(rows // 8, 1)
  )
  window = ts.response_window(batch.loss_mask)  # as Learner does
  batch_sh = ts.batch_shardings(mesh, batch, rules)
  batch = jax.device_put(batch, batch_sh)
  step = ts.make_train_step(
      graphdef,
      frozen,
      ts.make_policy_loss(ts.PolicyLossConfig(**LOSS)),
      tx,
      mesh=mesh,
      state_shardings=state_sh,
      batch_sharding_tree=batch_sh,
      window=window,
  )
  rng = jax.random.key(0)
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], batch, rng)
    return metrics

  timing = _common.time_calls(
      run, iters=iters, warmup=1, sync=jax.block_until_ready
  )
  if profile_dir:
    with jax.profiler.trace(str(profile_dir)):
      jax.block_until_ready(run())
  tokens = rows * (prompt_len + resp_len)
  shape = {
      k: getattr(cfg, k)
      for k in (
          "vocab_size",
          "hidden_size",
          "intermediate_size",
          "num_layers",
          "num_heads",
          "num_kv_heads",
          "head_dim",
      )
  }
  flops = _common.train_flops(shape, tokens, prompt_len + resp_len)
  return {
      "bench": "train_step",
      "preset": preset,
      "params": cfg.num_params(),
      "dtype": dtype,
      "mesh": list(mesh_shape),
      "devices": len(jax.devices()),
      "platform": jax.devices()[0].platform,
      "rows": rows,
      "seq_len": prompt_len + resp_len,
      "tokens_per_step": tokens,
      "compile_s": timing["first_s"],
      "step_s": timing["median_s"],
      "step_cpu_s": timing["cpu_s"],
      "tokens_per_s": round(tokens / timing["median_s"], 1),
      "train_gflops_per_s": round(flops / timing["median_s"] / 1e9, 2),
      "peak_rss_mb": _common.peak_rss_mb(),
      "load_avg": _common.load_average(),
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="'tiny' preset only")
  p.add_argument("--presets", default="tiny,base-100m")
  p.add_argument("--fake_devices", type=int, default=0)
  p.add_argument(
      "--rows",
      type=int,
      default=0,
      help="rows per batch (0 = per-preset default)",
  )
  p.add_argument("--prompt_len", type=int, default=256)
  p.add_argument("--resp_len", type=int, default=32)
  p.add_argument("--iters", type=int, default=3)
  p.add_argument("--dtype", default="float32")
  p.add_argument(
      "--profile_dir",
      default="",
      help="write a jax.profiler trace of one step per line here",
  )
  args = p.parse_args(argv)
  _common.force_host_devices(args.fake_devices)
  import jax

  presets = ["tiny"] if args.quick else args.presets.split(",")
  for preset in presets:
    for mesh_shape in mesh_layouts(len(jax.devices())):
      t0 = time.perf_counter()
      prof = None
      if args.profile_dir:
        mesh_name = "x".join(map(str, mesh_shape))
        prof = Path(args.profile_dir) / f"{preset}_{mesh_name}"
      row = bench_one(
          preset,
          mesh_shape,
          rows=args.rows or DEFAULT_ROWS.get(preset, 4),
          prompt_len=args.prompt_len,
          resp_len=args.resp_len,
          iters=args.iters,
          dtype=args.dtype,
          profile_dir=prof,
      )
      row["wall_s"] = round(time.perf_counter() - t0, 1)
      _common.emit(row)


if __name__ == "__main__":
  main()
