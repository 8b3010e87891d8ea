"""Accelerator benchmark: Qwen2.5-1.5B shape, train-step MFU and decode speed.

  python bench/device.py [--peak_tflops=989] [--budget_s=420]
  python bench/device.py --smoke          # tiny shapes, runs on a CPU
  python bench/device.py --paper [--out=device.json]
  python bench/device.py --paper --smoke  # the same parts, tiny, on a CPU
  python bench/device.py --kernel_check [--smoke]  # fused attention vs XLA
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
              (bench/_common.py), the compiled program's peak bytes a
              device (memory_analysis: arguments + outputs - aliased +
              temporaries) beside the plan's estimate
              (rspo_jax/plan/programs.py train_step_bytes), the
              allocator's peak so far (memory_stats; accelerators only),
              and the count of all-gather / all-reduce / reduce-scatter
              of activation-sized arrays in the partitioned HLO
              (rspo_jax/hlo.py; 0 expected).
  paper_logprob  pi_old's pass over the same rows in chunks of a
              micro-batch (as Learner.apply), all devices.
  paper_decode  the rollout engine as the run builds it (the unrolled
              bfloat16 copy: build.inference_model / engine_config), all
              devices.

--kernel_check (bench/device_check.sh runs it first): the attention kernel
model.attention='auto' picks here (cuDNN on GPU, splash on TPU; on CPU
none, XLA's path only; --kernel_impl names another) against XLA's path, at
Qwen2.5-1.5B's attention shape (12 / 2 heads of 128), bf16 inputs with a
large-activation kv head (KERNEL_SHIFT), causal,
on rows of 0, 1, 640, 704 and 768 real tokens padded to 768, and 0, 1,
640, 704 to 704 (--smoke: 4 / 2 heads of 32; 0, 1, 96, 128 padded to 128; 0, 1,
40, 64 to 64). Each row is run as the model gives
it to the kernel (a padding row, 0 real tokens, as length 1:
transformer.kernel_lengths) and, for 0, once more with length 0 (a call a
run never makes: what the installed kernel does with it). Per row
(``kernel_check_row``): forward output and gradients w.r.t. q, k, v of the
fused kernel and of XLA's path in bf16, each against XLA's in float32:
non-finite counts and heads, max abs / relative error (by head). Last, a
``kernel_check`` row: ``recommend`` 'fused' or 'xla' and why (KERNEL_TOL_*:
'xla' if the fused kernel is non-finite on a length >= 1 or off by more
than the tolerance), and how a run picks the path (model.attention;
--config.model.attention=xla forces XLA's).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import _common

FULL = dict(
    preset="qwen2.5-1.5b",
    rows=8,
    prompt_len=896,
    resp_len=128,
    gen_batch=64,
    gen_prompt_len=512,
    new_tokens=128,
    iters=3,
)
SMOKE = dict(
    preset="tiny",
    rows=2,
    prompt_len=32,
    resp_len=16,
    gen_batch=4,
    gen_prompt_len=32,
    new_tokens=8,
    iters=1,
)
PAPER = dict(
    preset="qwen2.5-1.5b",
    rows=16,
    prompt_len=4096,
    resp_len=512,
    micro_rows_per_device=1,
    gen_batch=32,
    gen_prompt_len=2048,
    new_tokens=512,
    iters=3,
)
PAPER_SMOKE = dict(
    preset="tiny",
    rows=16,
    prompt_len=112,
    resp_len=16,
    micro_rows_per_device=1,
    gen_batch=8,
    gen_prompt_len=32,
    new_tokens=8,
    iters=1,
)
PAPER_FLAGS = dict(
    dtype="bfloat16",
    param_dtype="float32",
    remat="full",
    scan_layers=True,
    attention="auto",
)
LOSS = dict(alpha=0.125, clip_eps=0.2, kl_coef=0.01, entropy_coef=0.001)
# Batches start with a padding row (all zero, as records_to_batch's bucket
# adds): the kernels meet one as in a run -- a fused kernel given a zero
# length has returned NaN (models/transformer.py, attention), which shows
# as "skipped": 1. It is computed, so it counts in the FLOPs.
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
  return {
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
  batch = _common.policy_batch(
      rows,
      run["prompt_len"],
      run["resp_len"],
      cfg.vocab_size,
      n_off=max(rows // 8, 1),
      n_pad=PADDING_ROWS,
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
  holder, key = [state], jax.random.key(0)

  def one():
    holder[0], metrics = step(holder[0], batch, key)
    return metrics

  t = _common.time_calls(one, iters=run["iters"], sync=jax.block_until_ready)
  tokens = rows * seq
  flops = _common.train_flops(shape_dict(cfg), tokens, seq)
  n_dev = mesh.devices.size
  out.emit(
      {
          "bench": "device_train_step",
          "preset": cfg_name(cfg, run),
          "params": cfg.num_params(),
          "rows": rows,
          "seq_len": seq,
          "compile_s": t["first_s"],
          "step_s": t["median_s"],
          "tokens_per_s": round(tokens / t["median_s"], 1),
          "tflops_per_s": round(flops / t["median_s"] / 1e12, 2),
          "mfu": float(f"{flops / t['median_s'] / (n_dev * peak_flops):.4g}"),
          "mfu_formula": "(6*N_mm*tokens + 12*L*H*Dh*S*tokens) / s / peak",
          "peak_tflops_per_device": peak_flops / 1e12,
          "devices": n_dev,
      }
  )

  logp = ts.make_logprob_fn(
      graphdef,
      frozen,
      mesh=mesh,
      param_shardings=state_sh.params,
      rules=rules,
      window=window,
  )
  inputs = (
      batch.tokens,
      batch.positions,
      batch.attention_mask,
      batch.loss_mask,
  )
  t = _common.time_calls(
      lambda: logp(holder[0].params, *inputs),
      iters=run["iters"],
      sync=jax.block_until_ready,
  )
  out.emit(
      {
          "bench": "device_logprob",
          "preset": cfg_name(cfg, run),
          "compile_s": t["first_s"],
          "seconds": t["median_s"],
          "tokens_per_s": round(tokens / t["median_s"], 1),
      }
  )
  return holder[0].params, graphdef, frozen


def make_engine(cfg, graphdef, params, frozen, mesh):
  """The rollout engine as the run builds it (``build.make_engine``): the
  params' inference copy, unrolled for a scanned model, no remat."""
  from rspo_jax import build
  from rspo_jax.rollout.jax_engine import JaxEngine

  return JaxEngine(
      build.inference_model((graphdef, params, frozen), cfg),
      build.engine_config(cfg),
      mesh=mesh,
      pad_id=0,
      eos_ids=(),
  )


def bench_decode(cfg, engine, run, out, name="device_decode", **extra):
  from rspo_jax.rollout.engine import SamplingParams

  n = run["gen_batch"]
  prompts = _common.prompt_ids(n, run["gen_prompt_len"], cfg.vocab_size)
  sp = SamplingParams(temperature=1.0, max_new_tokens=run["new_tokens"], seed=0)
  count = [0]

  def gen():
    res = engine.generate(prompts, sp)
    count[0] = sum(len(o.token_ids) for o in res)
    return res

  t = _common.time_calls(gen, iters=run["iters"])
  out.emit(
      {
          "bench": name,
          "preset": cfg_name(cfg, run),
          "batch": n,
          "prompt_len": run["gen_prompt_len"],
          "new_tokens": run["new_tokens"],
          "compile_s": t["first_s"],
          "seconds": t["median_s"],
          "new_tokens_per_s": round(count[0] / t["median_s"], 1),
          **extra,
      }
  )


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
  batch = _common.policy_batch(
      rows,
      run["prompt_len"],
      run["resp_len"],
      cfg.vocab_size,
      n_off=max(rows // 8, 1),
      n_pad=PADDING_ROWS,
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
      n_micro=n_micro,
      window=window,
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
    # F821: pyflakes sees the later `del holder, compiled`; one() runs before.
    holder[0], last["metrics"] = compiled(  # noqa: F821
        holder[0], batch, key, frozen  # noqa: F821
    )
    return last["metrics"]

  t = _common.time_calls(one, iters=run["iters"], sync=jax.block_until_ready)
  platform = jax.devices()[0].platform
  fused = plan.attention_fused(cfg, platform)
  shape = shape_dict(cfg)
  model = _common.model_train_flops(shape, rows, seq, window)
  executed = _common.executed_train_flops(
      shape, rows, seq, window, remat=cfg.remat, fused=fused
  )
  n_dev = mesh.devices.size
  denom = t["median_s"] * n_dev * peak_flops
  est = plan.train_step_bytes(
      cfg,
      mesh_shape,
      rows,
      seq,
      window=window,
      n_micro=n_micro,
      platform=platform,
  )
  out.emit(
      {
          "bench": "paper_train_step",
          "mesh": label,
          "devices": n_dev,
          "mesh_shape": list(mesh_shape),
          "preset": run["preset"],
          "params": cfg.num_params(),
          "rows": rows,
          "seq_len": seq,
          "window": window,
          "micro_batch_rows": micro,
          "micro_batches": n_micro,
          "padding_rows": PADDING_ROWS,
          "skipped": float(last["metrics"]["skipped"]),  # 1: a non-finite step
          "remat": cfg.remat,
          "scan_layers": cfg.scan_layers,
          "attention": "fused" if fused else "xla (scores materialised)",
          "compile_s": round(compile_s, 2),
          "step_s": t["median_s"],
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
              for k, s, n, a in sorted(bad, key=lambda b: -b[2])[:4]
          ],
      }
  )
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
  fn = ts.make_logprob_fn(
      graphdef,
      frozen,
      mesh=mesh,
      param_shardings=state_sh.params,
      rules=rules,
      window=window,
  )
  rows = len(batch.tokens)
  ways = mesh.shape["data"] * mesh.shape["fsdp"]
  micro, _ = paper_micro(rows, mesh, run["micro_rows_per_device"])
  n_chunks = apply_chunks(rows, micro, ways)
  if n_chunks > 1:
    fn = chunked(fn, n_chunks, mesh, state_sh.params, rules)
  inputs = (
      batch.tokens,
      batch.positions,
      batch.attention_mask,
      batch.loss_mask,
  )
  t = _common.time_calls(
      lambda: fn(params, *inputs),
      iters=run["iters"],
      sync=jax.block_until_ready,
  )
  seq = batch.tokens.shape[1]
  out.emit(
      {
          "bench": "paper_logprob",
          "devices": mesh.devices.size,
          "preset": run["preset"],
          "rows": rows,
          "seq_len": seq,
          "chunks": n_chunks,
          "compile_s": t["first_s"],
          "seconds": t["median_s"],
          "tokens_per_s": round(rows * seq / t["median_s"], 1),
      }
  )


def _gib(n):
  return None if n is None else round(n / 2**30, 3)


def run_paper(args, run, out, summary, start):
  import jax
  from rspo_jax import models, sharding

  cfg = models.get_model_config(
      run["preset"],
      **dict(PAPER_FLAGS, dtype=args.dtype, param_dtype=args.param_dtype),
  )
  devices = jax.devices()
  summary.update(
      model_flags={k: getattr(cfg, k) for k in PAPER_FLAGS},
      inference_dtype=cfg.inference_dtype,
  )
  meshes = [("all devices", devices)]
  if len(devices) > 1:
    meshes.append(("one device", devices[:1]))
  else:
    summary["note"] = (
        "one visible device: 'all devices' and 'one device'" " are the same run"
    )
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
        engine = (mesh, make_engine(cfg, parts[0], parts[1], parts[2], mesh))
    del parts
    gc.collect()
  if engine is not None and due("decode"):
    mesh, eng = engine
    bench_decode(
        cfg,
        eng,
        run,
        out,
        name="paper_decode",
        devices=mesh.devices.size,
        allocator_peak_GiB_so_far=_gib(allocator_peak(mesh.devices.flat)),
    )
  elif engine is None and "decode" not in summary["skipped"]:
    summary["skipped"].append("decode")


# ---------------------------------------------------------- --kernel_check

# Qwen2.5-1.5B's attention (12 query heads, 2 kv heads, head width 128) on
# (padded length, real tokens per row): 768 (a batch bucket, 0 mod 128)
# and 704 (64 mod 128: cuDNN's backward has returned NaN grad_q there when
# a mask is given and a query row's logsumexp is below -88.7,
# github.com/pytorch/pytorch/issues/196678, huggingface/trl#7181). Real
# tokens 0: a padding row, which the model gives the kernel as length 1
# (transformer.kernel_lengths).
KERNEL = dict(
    heads=12,
    kv_heads=2,
    head_dim=128,
    shapes=((768, (0, 1, 704, 640, 768)), (704, (0, 1, 704, 640))),
)
KERNEL_SMOKE = dict(
    heads=4,
    kv_heads=2,
    head_dim=32,
    shapes=((128, (0, 1, 96, 128)), (64, (0, 1, 40, 64))),
)
# Large-activation inputs (Qwen2.5's massive-activation heads, as
# huggingface/trl#7181 reduced them) on kv head 0 and its query heads: key
# feature 0 is KERNEL_SHIFT sqrt(Dh) on every key and q[..., 0] = 1 on
# query head 0, so its every logit is near KERNEL_SHIFT (logsumexp <
# -88.7); query head 1 is scaled by KERNEL_SHARP (a near one-hot
# softmax); the group's other heads have q[..., 0] = 0 (normal logits;
# their grad_q still carries the large key feature). kv heads >= 1 and
# their query heads are plain normal inputs.
KERNEL_SHIFT = -120.0
KERNEL_SHARP = 30.0
# Tolerance, on the normal heads: the XLA path in bfloat16 (bf16 inputs,
# softmax probabilities, outputs and gradients; f32 accumulation) is what
# a bf16 attention gets wrong against the float32 reference by itself. A
# fused kernel computes the same bf16 products with f32 accumulation in
# another order (online softmax), so its error should be of that size: it
# passes within KERNEL_TOL_FACTOR x the XLA bf16 path's max abs error, or
# within KERNEL_TOL_FLOOR = 2^-7 of the reference's largest magnitude (two
# bf16 roundings of it: a flash backward rounds O and dO before D, below)
# -- a max over a few thousand values is a noisy statistic, and a kernel
# fault (NaN, a wrong tile) is off by far more. The large-activation
# group must be finite (the cuDNN NaN above) but its error is only
# reported: a flash backward takes D = rowsum(dO * O) from the bf16 output
# O, and grad_q = scale dS K multiplies D's rounding by the large key
# feature (|120 sqrt(Dh)| scale = 120) -- splash in Pallas's interpreter
# gives grad_q errors there as large as grad_q itself, XLA's autodiff (D
# from float32 probabilities) under 1 % of it. Every flash backward has
# that arithmetic (not a kernel fault): the rows show its size, and
# model.attention='xla' avoids it.
KERNEL_TOL_FACTOR = 2.0
KERNEL_TOL_FLOOR = 2.0**-7
KERNEL_QUANTITIES = ("out", "grad_q", "grad_k", "grad_v")


def kernel_inputs(spec, t, real, seed=0):
  """(q, k, v bfloat16 [B, T, H|Hkv, Dh], real [B] int32, cotangent
  float32 [B, T, H, Dh]): normal q, k, v with kv head 0's group made
  large-activation (KERNEL_SHIFT, KERNEL_SHARP); the cotangent zero on
  padding queries (i >= real tokens), as the loss mask makes it in a
  run."""
  import jax.numpy as jnp
  import numpy as np

  h, kv, dh = spec["heads"], spec["kv_heads"], spec["head_dim"]
  b, g = len(real), h // kv
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, t, h, dh), np.float32)
  k = rng.standard_normal((b, t, kv, dh), np.float32)
  v = rng.standard_normal((b, t, kv, dh), np.float32)
  k[:, :, 0, 0] = KERNEL_SHIFT * np.sqrt(dh)
  q[:, :, :g, 0] = 0.0
  q[:, :, 0, 0] = 1.0
  q[:, :, 1] *= KERNEL_SHARP
  real = np.asarray(real, np.int32)
  live = np.arange(t)[None, :] < real[:, None]
  cot = rng.standard_normal((b, t, h, dh), np.float32)
  cot *= live[:, :, None, None]
  bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)
  return bf16(q), bf16(k), bf16(v), real, jnp.asarray(cot)


def kernel_fn(impl: str, dtype: str):
  """jit (q, k, v, lengths, cot) -> (out, (grad_q, grad_k, grad_v)) of
  causal attention by ``impl`` ('xla' / 'cudnn': jax.nn.
  dot_product_attention; 'splash': splash.attention) on q, k, v cast to
  ``dtype``, key_value_seq_lengths = lengths, as the model calls it."""
  import jax
  from rspo_jax.models import splash
  from rspo_jax.models.transformer import NO_SHARDING

  def attend(q, k, v, lengths):
    if impl == "splash":
      return splash.attention(q, k, v, lengths, NO_SHARDING)
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        key_value_seq_lengths=lengths,
        implementation=impl,
    )

  def fn(q, k, v, lengths, cot):
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, lengths), q, k, v)
    return out, vjp(cot.astype(out.dtype))

  return jax.jit(fn)


def kernel_run(impl, dtype, inputs, lengths):
  """(out, grads) as float32 numpy of ``kernel_fn`` on ``inputs``; the
  float32 reference with exact (not TF32) matmuls."""
  import jax
  import numpy as np

  q, k, v, _, cot = inputs
  precision = "highest" if dtype == "float32" else None
  with jax.default_matmul_precision(precision):
    out, grads = kernel_fn(impl, dtype)(q, k, v, np.asarray(lengths), cot)
    out, grads = jax.block_until_ready((out, grads))
  f32 = lambda x: np.asarray(x, dtype=np.float32)
  return dict(zip(KERNEL_QUANTITIES, [f32(out)] + [f32(x) for x in grads]))


def kernel_compare(got, ref, b, real, group):
  """Row ``b``: per quantity, non-finite values (the whole row: the model
  carries every position forward) and the heads holding them; max abs
  error (all heads, by head, and on the normal heads: kv heads >= 1 and
  query heads >= ``group``) and the reference's largest magnitude there
  (out: real queries only; the gradients everywhere -- zero past the real
  tokens in both)."""
  import numpy as np

  row = {}
  for name in KERNEL_QUANTITIES:
    x, r = got[name][b], ref[name][b]  # [T, heads, Dh]
    bad = ~np.isfinite(x)
    if name == "out":
      x, r = x[:real], r[:real]
    first = group if name in ("out", "grad_q") else 1
    if x.shape[0]:
      by_head = np.abs(x - r).max(axis=(0, 2))
      top = np.abs(r).max(axis=(0, 2))
    else:
      by_head = top = np.zeros(x.shape[1], np.float32)
    clean = lambda e: float(e) if np.isfinite(e) else None  # JSON: no NaN
    err, err_n = clean(by_head.max()), clean(by_head[first:].max())
    row[name] = dict(
        nonfinite=int(bad.sum()),
        nonfinite_heads=[int(i) for i in np.nonzero(bad.any(axis=(0, 2)))[0]],
        max_abs_err=err,
        ref_max_abs=float(top.max()),
        rel_err=err / float(top.max())
        if err is not None and top.max() > 0
        else None,
        max_abs_err_by_head=[clean(float(f"{e:.4g}")) for e in by_head],
        normal_heads_max_abs_err=err_n,
        normal_heads_ref_max_abs=float(top[first:].max()),
    )
  return row


def _kernel_ok(fused, xla) -> tuple[bool, str]:
  """Whether a fused row passes (finite everywhere; on the normal heads
  within KERNEL_TOL_* of the XLA bf16 path's error) and, if not, why."""
  for name in KERNEL_QUANTITIES:
    f, x = fused[name], xla[name]
    if f["nonfinite"]:
      return False, (
          f"{f['nonfinite']} non-finite {name} (heads"
          f" {f['nonfinite_heads']})"
      )
    tol = max(
        KERNEL_TOL_FACTOR * (x["normal_heads_max_abs_err"] or 0.0),
        KERNEL_TOL_FLOOR * x["normal_heads_ref_max_abs"],
    )
    err = f["normal_heads_max_abs_err"]
    if err is None or err > tol:
      return False, (
          f"{name} max abs error {err} on the normal heads >"
          f" {tol:.3g} ({KERNEL_TOL_FACTOR:g} x the XLA bf16"
          f" path's {x['normal_heads_max_abs_err']})"
      )
  return True, ""


def kernel_check(spec, fused_impl, out, platform, auto_impl):
  """Emits one ``kernel_check_row`` per (padded length, batch, row) and the
  ``kernel_check`` verdict (module docstring: --kernel_check)."""
  import jax.numpy as jnp
  import numpy as np
  from rspo_jax.models import transformer

  fails, errors, failed, zero = [], [], [], []
  group = spec["heads"] // spec["kv_heads"]
  for t, real in spec["shapes"]:
    inputs = kernel_inputs(spec, t, real)
    mask = jnp.arange(t)[None, :] < jnp.asarray(inputs[3])[:, None]
    model_lengths = np.asarray(transformer.kernel_lengths(mask))
    # "model": lengths as the model gives them (padding rows: 1); "raw":
    # the real counts, 0 included -- a call the model never makes, to
    # record what the installed kernel does with a zero length.
    for batch, lengths in (
        ("model", model_lengths),
        ("raw", np.asarray(real, np.int32)),
    ):
      ref = kernel_run("xla", "float32", inputs, lengths)
      paths = {"xla_bf16": kernel_run("xla", "bfloat16", inputs, lengths)}
      if fused_impl:
        try:
          paths["fused"] = kernel_run(fused_impl, "bfloat16", inputs, lengths)
        except Exception as e:  # pylint: disable=broad-except
          errors.append(
              f"{fused_impl} at T={t} ({batch} batch):"
              f" {type(e).__name__}: {e}"[:300]
          )
          if batch == "model":  # the raw call is one a run never makes
            failed.append(errors[-1])
      for b, n in enumerate(real):
        if batch == "raw" and lengths[b] == model_lengths[b]:
          continue  # the same call as the model batch's row
        row = {
            "bench": "kernel_check_row",
            "padded_length": t,
            "batch": batch,
            "real_tokens": int(n),
            "kernel_length": int(lengths[b]),
            "padding_row": int(n) == 0,
        }
        for name, got in paths.items():
          row[name] = kernel_compare(got, ref, b, int(n), group)
        if "fused" in paths:
          ok, why = _kernel_ok(row["fused"], row["xla_bf16"])
          row["fused_ok"] = ok
          if not ok:
            row["fused_problem"] = why
            if lengths[b] >= 1:  # a length a run can give the kernel
              fails.append(
                  f"T={t} length {int(lengths[b])}" f" ({batch} batch): {why}"
              )
        if batch == "raw" and "fused" in paths and lengths[b] == 0:
          zero.append(
              not any(row["fused"][q]["nonfinite"] for q in KERNEL_QUANTITIES)
          )
        if batch == "raw":  # the other rows of the raw call: unchanged?
          row["other_rows_finite"] = {
              name: bool(
                  all(
                      np.isfinite(got[q][i]).all()
                      for q in KERNEL_QUANTITIES
                      for i in range(len(real))
                      if i != b
                  )
              )
              for name, got in paths.items()
          }
        out.emit(row)
  auto = f"'auto' picks {auto_impl} on {platform}"
  if not fused_impl:
    recommend, reason = "xla", (
        f"{auto}: no fused kernel here to check; the XLA bf16 path against"
        " the float32 reference is in the rows"
    )
  elif failed:
    recommend, reason = "xla", "the fused kernel failed: " + failed[0]
  elif fails:
    recommend, reason = "xla", (
        f"{fused_impl} on a length a run gives it (>= 1): "
        + fails[0]
        + (f" (and {len(fails) - 1} more rows)" if len(fails) > 1 else "")
    )
  else:
    recommend, reason = "fused", (
        f"{fused_impl} finite on every length a run gives it (>= 1), and"
        f" within {KERNEL_TOL_FACTOR:g} x the XLA bf16 path's error on the"
        " normal heads (the large-activation heads' errors are in the"
        " rows)"
    )
  out.emit(
      {
          "bench": "kernel_check",
          "recommend": recommend,
          "reason": reason,
          "platform": platform,
          "fused_impl": fused_impl,
          "shape": {k: spec[k] for k in ("heads", "kv_heads", "head_dim")},
          "tolerance": {"factor": KERNEL_TOL_FACTOR, "floor": KERNEL_TOL_FLOOR},
          "errors": errors,
          # What the kernel does with a raw length 0 (never given it by a run).
          "fused_finite_at_length_0": all(zero) if zero else None,
          "config_key": "model.attention",
          "how_a_run_picks": (
              "model.attention (configs/base.py, default 'auto'): 'auto' is"
              " splash on TPU, cudnn on GPU for bf16/fp16 and head_dim % 8 == 0"
              " <= 128, else xla; 'xla' / 'plain' force XLA's path (scores"
              " materialised: more memory, plan.train_step_bytes counts it),"
              " 'cudnn' / 'splash' force a fused one. " + auto + "."
          ),
          "set": (
              "keep model.attention='auto'"
              if recommend == "fused"
              else "--config.model.attention=xla"
          ),
      }
  )
  return recommend


def run_kernel_check(args, out):
  import types

  import jax
  from rspo_jax.models import transformer

  spec = KERNEL_SMOKE if args.smoke else KERNEL
  platform = jax.devices()[0].platform
  # What a run's model.attention='auto' calls here.
  auto = transformer.attention_implementation(
      types.SimpleNamespace(
          attention="auto", dtype="bfloat16", head_dim=spec["head_dim"]
      )
  )
  impl = auto if args.kernel_impl == "auto" else args.kernel_impl
  kernel_check(
      spec, None if impl in ("xla", "none") else impl, out, platform, auto
  )


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument(
      "--smoke",
      action="store_true",
      help="tiny preset and shapes; runs on a CPU",
  )
  p.add_argument(
      "--paper",
      action="store_true",
      help="the paper's learner shape (module docstring)",
  )
  for k, v in dict(FULL, **PAPER).items():
    p.add_argument(
        f"--{k}",
        type=type(v),
        default=None,
        help=f"default {FULL.get(k, '-')} (--paper: {PAPER[k]})",
    )
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--param_dtype", default="float32")
  p.add_argument("--peak_tflops", type=float, default=989.0)
  p.add_argument("--budget_s", type=float, default=420.0)
  p.add_argument(
      "--skip",
      default="",
      help="comma list: train,decode"
      " (--paper: train[all],train[one],logprob,decode)",
  )
  p.add_argument(
      "--out", default="", help="also write every row to this" " JSON file"
  )
  p.add_argument(
      "--kernel_check",
      action="store_true",
      help="only the fused attention kernel against XLA's"
      " (module docstring)",
  )
  p.add_argument(
      "--kernel_impl",
      default="auto",
      help="--kernel_check's fused side: auto (what"
      " model.attention='auto' picks here; none on CPU), cudnn,"
      " splash, none",
  )
  args = p.parse_args(argv)
  if args.paper:
    run = dict(PAPER_SMOKE if args.smoke else PAPER)
  else:
    run = dict(SMOKE if args.smoke else FULL)
  run.update({k: getattr(args, k) for k in run if getattr(args, k) is not None})
  start = time.perf_counter()
  out = Results(args.out)
  # As a run: launch/xla_flags.py's flags on a GPU / TPU host, set before
  # JAX starts (launch/train.py does the same).
  from rspo_launch import xla_flags

  xla_env = xla_flags.apply(os.environ)
  import jax
  from rspo_jax import models, sharding

  if args.kernel_check:
    run_kernel_check(args, out)
    return
  summary = {
      "bench": "paper_summary" if args.paper else "device_summary",
      "platform": jax.devices()[0].platform,
      "device_kind": jax.devices()[0].device_kind,
      "devices": len(jax.devices()),
      "preset": run["preset"],
      "dtype": args.dtype,
      "param_dtype": args.param_dtype,
      "run": run,
      "skipped": [],
      "xla_flags_set": xla_env,
  }
  if args.paper:
    run_paper(args, run, out, summary, start)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    out.emit(summary)
    return

  cfg = models.get_model_config(
      run["preset"], dtype=args.dtype, param_dtype=args.param_dtype
  )
  mesh = sharding.make_mesh((1, -1, 1))
  skip = set(filter(None, args.skip.split(",")))
  params = graphdef = frozen = None
  if "train" in skip:
    summary["skipped"].append("train")
  else:
    params, graphdef, frozen = bench_train(
        cfg, mesh, run, args.peak_tflops * 1e12, out
    )
  if "decode" in skip or time.perf_counter() - start > args.budget_s:
    summary["skipped"].append("decode")
  else:
    if params is None:
      from rspo_jax.train_step import split_trainable

      module = models.create_sharded_model(cfg, 0, mesh, sharding.DEFAULT_RULES)
      graphdef, params, frozen = split_trainable(module)
    bench_decode(
        cfg, make_engine(cfg, graphdef, params, frozen, mesh), run, out
    )
  summary["wall_s"] = round(time.perf_counter() - start, 1)
  out.emit(summary)


if __name__ == "__main__":
  main()
