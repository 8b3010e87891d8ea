"""Accelerator benchmark: Qwen2.5-1.5B shape, train-step MFU and decode speed.

  python bench/device.py [--peak_tflops=989] [--budget_s=420]
  python bench/device.py --smoke          # tiny shapes, runs on a CPU

Random weights (no checkpoint needed), bf16 compute with float32 master
weights by default (--param_dtype=bfloat16 for all-bf16). One JSON line per
result, then a summary line; the whole script keeps to ``--budget_s``
(default 7 min): a part that would start after it is skipped and reported
as skipped.

  train_step  the policy step of train_step.make_train_step with the mixed
              RSPO objective (as bench/train_step.py) on rows x seq_len
              tokens over all visible devices (mesh (1, N, 1): FSDP);
              tokens/s and MFU = PaLM train FLOPs / step s / (N * peak),
              train FLOPs = 6 N_mm tokens + 12 L H Dh S tokens
              (bench/_common.py), peak = --peak_tflops (H200 dense bf16:
              989 TFLOP/s).
  logprob     one jitted log-prob pass (pi_old / pi_ref cost), tokens/s.
  decode      JaxEngine.generate: gen_batch distinct prompts of
              gen_prompt_len tokens, new_tokens sampled at temperature 1
              with log-probs, no stop token; new tokens/s (prefill
              included) and the first call (compilation) separately.
"""

from __future__ import annotations

import argparse
import time

import _common

FULL = dict(preset="qwen2.5-1.5b", rows=8, prompt_len=896, resp_len=128,
            gen_batch=64, gen_prompt_len=512, new_tokens=128, iters=3)
SMOKE = dict(preset="tiny", rows=2, prompt_len=32, resp_len=16,
             gen_batch=4, gen_prompt_len=32, new_tokens=8, iters=1)
LOSS = dict(alpha=0.125, clip_eps=0.2, kl_coef=0.01, entropy_coef=0.001)


def shape_dict(cfg) -> dict:
  return {k: getattr(cfg, k) for k in (
      "vocab_size", "hidden_size", "intermediate_size", "num_layers",
      "num_heads", "num_kv_heads", "head_dim")}


def bench_train(cfg, mesh, run, peak_flops):
  import jax
  from rspo_jax import models, sharding
  from rspo_jax import train_step as ts

  rules = sharding.DEFAULT_RULES
  module = models.create_sharded_model(cfg, 0, mesh, rules)
  graphdef, params, frozen = ts.split_trainable(module)
  tx = ts.make_optimizer(1e-6)
  state, state_sh = ts.create_train_state(params, tx, mesh, rules)
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  rows = -(-run["rows"] // shards) * shards
  seq = run["prompt_len"] + run["resp_len"]
  batch = _common.policy_batch(rows, run["prompt_len"], run["resp_len"],
                               cfg.vocab_size, n_off=max(rows // 8, 1))
  window = ts.response_window(batch.loss_mask)  # as Learner does
  batch_sh = ts.batch_shardings(mesh, batch, rules)
  batch = jax.device_put(batch, batch_sh)
  step = ts.make_train_step(
      graphdef, frozen, ts.make_policy_loss(ts.PolicyLossConfig(**LOSS)), tx,
      mesh=mesh, state_shardings=state_sh, batch_sharding_tree=batch_sh,
      window=window,
  )
  holder, key = [state], jax.random.key(0)

  def one():
    holder[0], metrics = step(holder[0], batch, key)
    return metrics

  t = _common.time_calls(one, iters=run["iters"], sync=jax.block_until_ready)
  tokens = rows * seq
  flops = _common.train_flops(shape_dict(cfg), tokens, seq)
  n_dev = mesh.devices.size
  _common.emit({
      "bench": "device_train_step", "preset": cfg_name(cfg, run),
      "params": cfg.num_params(), "rows": rows, "seq_len": seq,
      "compile_s": t["first_s"], "step_s": t["median_s"],
      "tokens_per_s": round(tokens / t["median_s"], 1),
      "tflops_per_s": round(flops / t["median_s"] / 1e12, 2),
      "mfu": float(f"{flops / t['median_s'] / (n_dev * peak_flops):.4g}"),
      "mfu_formula": "(6*N_mm*tokens + 12*L*H*Dh*S*tokens) / s / peak",
      "peak_tflops_per_device": peak_flops / 1e12, "devices": n_dev,
  })

  logp = ts.make_logprob_fn(graphdef, frozen, mesh=mesh,
                            param_shardings=state_sh.params, rules=rules,
                            window=window)
  inputs = (batch.tokens, batch.positions, batch.attention_mask,
            batch.loss_mask)
  t = _common.time_calls(lambda: logp(holder[0].params, *inputs),
                         iters=run["iters"], sync=jax.block_until_ready)
  _common.emit({
      "bench": "device_logprob", "preset": cfg_name(cfg, run),
      "compile_s": t["first_s"], "seconds": t["median_s"],
      "tokens_per_s": round(tokens / t["median_s"], 1),
  })
  return holder[0].params, graphdef, frozen


def bench_decode(cfg, graphdef, params, frozen, mesh, run):
  from rspo_jax.rollout.engine import SamplingParams
  from rspo_jax.rollout.jax_engine import JaxEngine

  n = run["gen_batch"]
  engine = JaxEngine((graphdef, params, frozen), cfg, mesh=mesh,
                     pad_id=0, eos_ids=())
  prompts = _common.prompt_ids(n, run["gen_prompt_len"], cfg.vocab_size)
  sp = SamplingParams(temperature=1.0, max_new_tokens=run["new_tokens"],
                      seed=0)
  count = [0]

  def gen():
    out = engine.generate(prompts, sp)
    count[0] = sum(len(o.token_ids) for o in out)
    return out

  t = _common.time_calls(gen, iters=run["iters"])
  _common.emit({
      "bench": "device_decode", "preset": cfg_name(cfg, run), "batch": n,
      "prompt_len": run["gen_prompt_len"], "new_tokens": run["new_tokens"],
      "compile_s": t["first_s"], "seconds": t["median_s"],
      "new_tokens_per_s": round(count[0] / t["median_s"], 1),
  })


def cfg_name(cfg, run) -> str:
  return f"{run['preset']}/{cfg.dtype}"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true",
                 help="tiny preset and shapes; runs on a CPU")
  for k, v in FULL.items():
    p.add_argument(f"--{k}", type=type(v), default=None,
                   help=f"default {v} (smoke: {SMOKE[k]})")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--param_dtype", default="float32")
  p.add_argument("--peak_tflops", type=float, default=989.0)
  p.add_argument("--budget_s", type=float, default=420.0)
  p.add_argument("--skip", default="", help="comma list: train,decode")
  args = p.parse_args(argv)
  run = dict(SMOKE if args.smoke else FULL)
  run.update({k: getattr(args, k) for k in FULL
              if getattr(args, k) is not None})
  start = time.perf_counter()
  import jax
  from rspo_jax import models, sharding

  cfg = models.get_model_config(run["preset"], dtype=args.dtype,
                                param_dtype=args.param_dtype)
  mesh = sharding.make_mesh((1, -1, 1))
  platform = jax.devices()[0].platform
  summary = {"bench": "device_summary", "platform": platform,
             "device_kind": jax.devices()[0].device_kind,
             "devices": len(jax.devices()), "preset": run["preset"],
             "dtype": args.dtype, "param_dtype": args.param_dtype,
             "skipped": []}
  skip = set(filter(None, args.skip.split(",")))
  params = graphdef = frozen = None
  if "train" in skip:
    summary["skipped"].append("train")
  else:
    params, graphdef, frozen = bench_train(cfg, mesh, run,
                                           args.peak_tflops * 1e12)
  if "decode" in skip or time.perf_counter() - start > args.budget_s:
    summary["skipped"].append("decode")
  else:
    if params is None:
      from rspo_jax.train_step import split_trainable

      module = models.create_sharded_model(cfg, 0, mesh,
                                           sharding.DEFAULT_RULES)
      graphdef, params, frozen = split_trainable(module)
    bench_decode(cfg, graphdef, params, frozen, mesh, run)
  summary["wall_s"] = round(time.perf_counter() - start, 1)
  _common.emit(summary)


if __name__ == "__main__":
  main()
