"""Accelerator benchmark: Qwen2.5-1.5B shape, train-step MFU and decode speed.

  python bench/device.py [--peak_tflops=989] [--budget_s=420]
  python bench/device.py --smoke          # tiny shapes, runs on a CPU
  python bench/device.py --paper [--out=device.json]
  python bench/device.py --paper --smoke  # the same parts, tiny, on a CPU
  bash bench/device_check.sh [--smoke]    # --paper into one JSON file

Random weights (no checkpoint needed), bf16 compute with float32 master
weights by default (--param_dtype=bfloat16 for all-bf16). One JSON line per
result, then a summary line (``--out``: also all of them in one JSON file,
rewritten after each); the whole script keeps to ``--budget_s`` (default
7 min): a part that would start after it is skipped and reported as
skipped.

Default parts:

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

--paper: the paper's learner shape -- qwen2.5-1.5b with the PAPER model
flags (float32 masters, bfloat16 compute, remat, scanned layers, attention
'auto'), 16 rows x (4096 + 512) tokens, logits on the 512-token response
window, micro-batches of ``micro_rows_per_device`` rows a device -- on all
visible devices (mesh (1, N, 1)) and on one device (when N > 1):

  paper_train_step  compile seconds (lower + compile, no persistent
              cache), step seconds, model-FLOPs MFU (causal attention
              counted at half, as MaxText) and executed-FLOPs HFU (remat's
              second forward; the attention the kernel computes)
              (bench/_common.py), the compiled program's peak bytes a device (memory_analysis:
              arguments + outputs - aliased + temporaries) beside the
              plan's estimate (rspo_jax/plan.py train_step_bytes), the
              allocator's peak so far (memory_stats; accelerators only),
              and the count of all-gather / all-reduce / reduce-scatter
              of activation-sized arrays in the partitioned HLO
              (rspo_jax/hlo.py; 0 expected).
  paper_logprob  pi_old's pass over the same rows in chunks of a
              micro-batch (as Learner.apply), all devices.
  paper_decode  the rollout engine as the run builds it (the unrolled
              bfloat16 copy: build.inference_model / engine_config), all
              devices.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import _common

FULL = dict(preset="qwen2.5-1.5b", rows=8, prompt_len=896, resp_len=128,
            gen_batch=64, gen_prompt_len=512, new_tokens=128, iters=3)
SMOKE = dict(preset="tiny", rows=2, prompt_len=32, resp_len=16,
             gen_batch=4, gen_prompt_len=32, new_tokens=8, iters=1)
PAPER = dict(preset="qwen2.5-1.5b", rows=16, prompt_len=4096, resp_len=512,
             micro_rows_per_device=1, gen_batch=32, gen_prompt_len=2048,
             new_tokens=512, iters=3)
PAPER_SMOKE = dict(preset="tiny", rows=16, prompt_len=112, resp_len=16,
                   micro_rows_per_device=1, gen_batch=8, gen_prompt_len=32,
                   new_tokens=8, iters=1)
PAPER_FLAGS = dict(dtype="bfloat16", param_dtype="float32", remat="full",
                   scan_layers=True, attention="auto")
LOSS = dict(alpha=0.125, clip_eps=0.2, kl_coef=0.01, entropy_coef=0.001)
# Batches start with a padding row (all zero, as records_to_batch's bucket
# adds): the kernels meet one as in a run -- a fused kernel given a zero
# length has returned NaN (issue 37), which shows as "skipped": 1. It is
# computed, so it counts in the FLOPs.
PADDING_ROWS = 1


class Results:
  """Emits each row as a JSON line and keeps them all in ``path`` (one JSON
  object, rewritten after every row: a run cut short leaves what it had)."""

  def __init__(self, path: str = ""):
    self.path, self.rows = path, []

  def emit(self, row: dict) -> None:
    _common.emit(row)
    self.rows.append(row)
    if self.path:
      with open(self.path, "w") as f:
        json.dump({"rows": self.rows}, f, indent=1)


def shape_dict(cfg) -> dict:
  return {k: getattr(cfg, k) for k in (
      "vocab_size", "hidden_size", "intermediate_size", "num_layers",
      "num_heads", "num_kv_heads", "head_dim")}


def bench_train(cfg, mesh, run, peak_flops, out):
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
                               cfg.vocab_size, n_off=max(rows // 8, 1),
                               n_pad=PADDING_ROWS)
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
  out.emit({
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
  out.emit({
      "bench": "device_logprob", "preset": cfg_name(cfg, run),
      "compile_s": t["first_s"], "seconds": t["median_s"],
      "tokens_per_s": round(tokens / t["median_s"], 1),
  })
  return holder[0].params, graphdef, frozen


def make_engine(cfg, graphdef, params, frozen, mesh):
  """The rollout engine as the run builds it (``build.make_engine``): the
  params' inference copy, unrolled for a scanned model, no remat."""
  from rspo_jax import build
  from rspo_jax.rollout.jax_engine import JaxEngine

  return JaxEngine(build.inference_model((graphdef, params, frozen), cfg),
                   build.engine_config(cfg), mesh=mesh, pad_id=0, eos_ids=())


def bench_decode(cfg, engine, run, out, name="device_decode", **extra):
  from rspo_jax.rollout.engine import SamplingParams

  n = run["gen_batch"]
  prompts = _common.prompt_ids(n, run["gen_prompt_len"], cfg.vocab_size)
  sp = SamplingParams(temperature=1.0, max_new_tokens=run["new_tokens"],
                      seed=0)
  count = [0]

  def gen():
    res = engine.generate(prompts, sp)
    count[0] = sum(len(o.token_ids) for o in res)
    return res

  t = _common.time_calls(gen, iters=run["iters"])
  out.emit({
      "bench": name, "preset": cfg_name(cfg, run), "batch": n,
      "prompt_len": run["gen_prompt_len"], "new_tokens": run["new_tokens"],
      "compile_s": t["first_s"], "seconds": t["median_s"],
      "new_tokens_per_s": round(count[0] / t["median_s"], 1), **extra,
  })


def cfg_name(cfg, run) -> str:
  return f"{run['preset']}/{cfg.dtype}"


# ---------------------------------------------------------------- --paper


def allocator_peak(devices) -> int | None:
  """Largest ``peak_bytes_in_use`` of ``devices`` so far (None where the
  backend keeps no statistics, e.g. CPU)."""
  peaks = []
  for d in devices:
    try:
      stats = d.memory_stats() or {}
    except Exception:  # pylint: disable=broad-except
      stats = {}
    if "peak_bytes_in_use" in stats:
      peaks.append(int(stats["peak_bytes_in_use"]))
  return max(peaks) if peaks else None


def paper_micro(rows: int, mesh, per_device: int) -> tuple[int, int]:
  """(micro-batch rows, micro-batches): ``per_device`` rows on each of the
  data x fsdp devices at once, at most all ``rows``."""
  ways = mesh.shape["data"] * mesh.shape["fsdp"]
  micro = min(rows, ways * per_device)
  return micro, -(-rows // micro)


def paper_train(cfg, mesh, run, peak_flops, out, label):
  """One ``paper_train_step`` row (module docstring); returns (graphdef,
  params, frozen, state shardings, batch, window) for the other parts."""
  import jax
  from rspo_jax import hlo, models, plan, sharding
  from rspo_jax import train_step as ts

  rules = sharding.DEFAULT_RULES
  module = models.create_sharded_model(cfg, 0, mesh, rules)
  graphdef, params, frozen = ts.split_trainable(module)
  del module
  tx = ts.make_optimizer(1e-6)
  state, state_sh = ts.create_train_state(params, tx, mesh, rules)
  rows, seq = run["rows"], run["prompt_len"] + run["resp_len"]
  micro, n_micro = paper_micro(rows, mesh, run["micro_rows_per_device"])
  batch = _common.policy_batch(rows, run["prompt_len"], run["resp_len"],
                               cfg.vocab_size, n_off=max(rows // 8, 1),
                               n_pad=PADDING_ROWS)
  window = ts.response_window(batch.loss_mask)  # as Learner does
  batch_sh = ts.batch_shardings(mesh, batch, rules)
  batch = jax.device_put(batch, batch_sh)
  step = ts.make_train_step(
      graphdef, frozen, ts.make_policy_loss(ts.PolicyLossConfig(**LOSS)), tx,
      mesh=mesh, state_shardings=state_sh, batch_sharding_tree=batch_sh,
      n_micro=n_micro, window=window,
  )
  key = jax.random.key(0)
  t0 = time.perf_counter()
  compiled = step.lower(state, batch, key).compile()
  compile_s = time.perf_counter() - t0
  mem = hlo.memory(compiled)
  text = compiled.as_text()
  mesh_shape = tuple(mesh.shape[a] for a in ("data", "fsdp", "tensor"))
  c = hlo.Compiled("train_step", text, mem, micro, seq, params)
  bound = hlo.activation_bound(c, mesh_shape, cfg.hidden_size)
  bad = hlo.activation_collectives(text, params, mesh_shape, bound)
  del text, c
  holder, last = [state], {}
  del state, params

  def one():
    holder[0], last["metrics"] = compiled(holder[0], batch, key, frozen)
    return last["metrics"]

  t = _common.time_calls(one, iters=run["iters"], sync=jax.block_until_ready)
  platform = jax.devices()[0].platform
  fused = plan.attention_fused(cfg, platform)
  shape = shape_dict(cfg)
  model = _common.model_train_flops(shape, rows, seq, window)
  executed = _common.executed_train_flops(shape, rows, seq, window,
                                          remat=cfg.remat, fused=fused)
  n_dev = mesh.devices.size
  denom = t["median_s"] * n_dev * peak_flops
  est = plan.train_step_bytes(cfg, mesh_shape, rows, seq, window=window,
                              n_micro=n_micro, platform=platform)
  out.emit({
      "bench": "paper_train_step", "mesh": label, "devices": n_dev,
      "mesh_shape": list(mesh_shape), "preset": run["preset"],
      "params": cfg.num_params(), "rows": rows, "seq_len": seq,
      "window": window, "micro_batch_rows": micro, "micro_batches": n_micro,
      "padding_rows": PADDING_ROWS,
      "skipped": float(last["metrics"]["skipped"]),  # 1: a non-finite step
      "remat": cfg.remat, "scan_layers": cfg.scan_layers,
      "attention": "fused" if fused else "xla (scores materialised)",
      "compile_s": round(compile_s, 2), "step_s": t["median_s"],
      "tokens_per_s": round(rows * seq / t["median_s"], 1),
      "model_tflop": round(model / 1e12, 3),
      "executed_tflop": round(executed / 1e12, 3),
      "mfu": float(f"{model / denom:.4g}"),
      "hfu": float(f"{executed / denom:.4g}"),
      "peak_tflops_per_device": peak_flops / 1e12,
      "compiled_peak_GiB": round(mem["peak"] / 2**30, 3),
      "compiled_temp_GiB": round(mem["temp"] / 2**30, 3),
      "plan_peak_GiB": round(est["peak"] / 2**30, 3),
      "plan_over_compiled": round(est["peak"] / mem["peak"], 3),
      "allocator_peak_GiB_so_far": _gib(allocator_peak(mesh.devices.flat)),
      "activation_collectives": len(bad),
      "activation_bound_elements": bound,
      "largest_activation_collectives": [
          [k, list(s), n, list(a)]
          for k, s, n, a in sorted(bad, key=lambda b: -b[2])[:4]],
  })
  params = holder[0].params
  del holder, compiled
  return graphdef, params, frozen, state_sh, batch, window, n_micro


def paper_logprob(cfg, mesh, run, out, parts):
  import jax
  from rspo_jax import sharding
  from rspo_jax import train_step as ts
  from rspo_jax.learner import apply_chunks, chunked

  graphdef, params, frozen, state_sh, batch, window, _ = parts
  rules = sharding.DEFAULT_RULES
  fn = ts.make_logprob_fn(graphdef, frozen, mesh=mesh,
                          param_shardings=state_sh.params, rules=rules,
                          window=window)
  rows = len(batch.tokens)
  ways = mesh.shape["data"] * mesh.shape["fsdp"]
  micro, _ = paper_micro(rows, mesh, run["micro_rows_per_device"])
  n_chunks = apply_chunks(rows, micro, ways)
  if n_chunks > 1:
    fn = chunked(fn, n_chunks, mesh, state_sh.params, rules)
  inputs = (batch.tokens, batch.positions, batch.attention_mask,
            batch.loss_mask)
  t = _common.time_calls(lambda: fn(params, *inputs), iters=run["iters"],
                         sync=jax.block_until_ready)
  seq = batch.tokens.shape[1]
  out.emit({
      "bench": "paper_logprob", "devices": mesh.devices.size,
      "preset": run["preset"], "rows": rows, "seq_len": seq,
      "chunks": n_chunks, "compile_s": t["first_s"],
      "seconds": t["median_s"],
      "tokens_per_s": round(rows * seq / t["median_s"], 1),
  })


def _gib(n):
  return None if n is None else round(n / 2**30, 3)


def run_paper(args, run, out, summary, start):
  import jax
  from rspo_jax import models, sharding

  cfg = models.get_model_config(run["preset"], **dict(
      PAPER_FLAGS, dtype=args.dtype, param_dtype=args.param_dtype))
  devices = jax.devices()
  summary.update(model_flags={k: getattr(cfg, k) for k in PAPER_FLAGS},
                 inference_dtype=cfg.inference_dtype)
  meshes = [("all devices", devices)]
  if len(devices) > 1:
    meshes.append(("one device", devices[:1]))
  else:
    summary["note"] = ("one visible device: 'all devices' and 'one device'"
                       " are the same run")
  skip = set(filter(None, args.skip.split(",")))
  engine = None

  def due(part):
    if part in skip or time.perf_counter() - start > args.budget_s:
      summary["skipped"].append(part)
      return False
    return True

  for label, devs in meshes:
    mesh = sharding.make_mesh((1, -1, 1), devs)
    tag = label.split()[0]
    if not due(f"train[{tag}]"):
      continue
    parts = paper_train(cfg, mesh, run, args.peak_tflops * 1e12, out, label)
    if label == "all devices":
      if due("logprob"):
        paper_logprob(cfg, mesh, run, out, parts)
      if "decode" not in skip:  # the engine's copy; the train state goes
        engine = (mesh, make_engine(cfg, parts[0], parts[1], parts[2],
                                    mesh))
    del parts
    gc.collect()
  if engine is not None and due("decode"):
    mesh, eng = engine
    bench_decode(cfg, eng, run, out, name="paper_decode",
                 devices=mesh.devices.size,
                 allocator_peak_GiB_so_far=_gib(allocator_peak(
                     mesh.devices.flat)))
  elif engine is None and "decode" not in summary["skipped"]:
    summary["skipped"].append("decode")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true",
                 help="tiny preset and shapes; runs on a CPU")
  p.add_argument("--paper", action="store_true",
                 help="the paper's learner shape (module docstring)")
  for k, v in dict(FULL, **PAPER).items():
    p.add_argument(f"--{k}", type=type(v), default=None,
                   help=f"default {FULL.get(k, '-')} (--paper: {PAPER[k]})")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--param_dtype", default="float32")
  p.add_argument("--peak_tflops", type=float, default=989.0)
  p.add_argument("--budget_s", type=float, default=420.0)
  p.add_argument("--skip", default="", help="comma list: train,decode"
                 " (--paper: train[all],train[one],logprob,decode)")
  p.add_argument("--out", default="", help="also write every row to this"
                 " JSON file")
  args = p.parse_args(argv)
  if args.paper:
    run = dict(PAPER_SMOKE if args.smoke else PAPER)
  else:
    run = dict(SMOKE if args.smoke else FULL)
  run.update({k: getattr(args, k) for k in run
              if getattr(args, k) is not None})
  start = time.perf_counter()
  out = Results(args.out)
  # As a run: launch/xla_flags.py's flags on a GPU / TPU host, set before
  # JAX starts (launch/train.py does the same).
  from rspo_launch import xla_flags

  xla_env = xla_flags.apply(os.environ)
  import jax
  from rspo_jax import models, sharding

  summary = {"bench": "paper_summary" if args.paper else "device_summary",
             "platform": jax.devices()[0].platform,
             "device_kind": jax.devices()[0].device_kind,
             "devices": len(jax.devices()), "preset": run["preset"],
             "dtype": args.dtype, "param_dtype": args.param_dtype,
             "run": run, "skipped": [], "xla_flags_set": xla_env}
  if args.paper:
    run_paper(args, run, out, summary, start)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    out.emit(summary)
    return

  cfg = models.get_model_config(run["preset"], dtype=args.dtype,
                                param_dtype=args.param_dtype)
  mesh = sharding.make_mesh((1, -1, 1))
  skip = set(filter(None, args.skip.split(",")))
  params = graphdef = frozen = None
  if "train" in skip:
    summary["skipped"].append("train")
  else:
    params, graphdef, frozen = bench_train(cfg, mesh, run,
                                           args.peak_tflops * 1e12, out)
  if "decode" in skip or time.perf_counter() - start > args.budget_s:
    summary["skipped"].append("decode")
  else:
    if params is None:
      from rspo_jax.train_step import split_trainable

      module = models.create_sharded_model(cfg, 0, mesh,
                                           sharding.DEFAULT_RULES)
      graphdef, params, frozen = split_trainable(module)
    bench_decode(cfg, make_engine(cfg, graphdef, params, frozen, mesh), run,
                 out)
  summary["wall_s"] = round(time.perf_counter() - start, 1)
  out.emit(summary)


if __name__ == "__main__":
  main()
