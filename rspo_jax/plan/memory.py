"""A run's memory per device (``memory_per_device``): its config's rows,
dtypes and engine shapes, the programs' estimates (``programs``) and what
stays resident, the model config the run will build
(``plan_model_config``) and the layouts that cost more than estimated
(``layout_warnings``).
"""

from __future__ import annotations

import json
import math
import os

from rspo_jax.plan.layout import GB
from rspo_jax.plan.programs import (
    _dims,
    adapter_params,
    logprob_bytes,
    prefill_bytes,
    train_step_bytes,
)


def engine_shapes(cfg, layout, chunk="config", max_rows="config") -> dict:
  """What one prefill call of the in-process engine holds (its defaults,
  ``rollout/jax_engine.py``): a host's episodes of a turn in calls of at
  most ``jax_engine.rows_per_call`` rows -- on an accelerator all of them
  (up to 256) unless ``rollout.engine_max_rows`` caps them, chunks of 8
  rows on CPU -- in ``calls_per_turn`` equal calls, each padded to a batch
  bucket (``rows``); the prompt's columns in blocks of
  ``rollout.prefill_chunk`` (None: the engine's default, 64 on CPU and
  one pass elsewhere, unless the plan chose it: ``choose``), widened to
  at most ``MAX_PREFILL_BLOCKS``; prompts padded to a prompt bucket, new
  tokens to a multiple of 16. ``chunk`` / ``max_rows``: the values to
  plan with instead of the config's. Rows split over the engine mesh's
  data x fsdp (one host: the learner's mesh; several: each host's own
  devices)."""
  from rspo_jax.rollout import engine_layout as je

  on_cpu = layout["platform"] == "cpu"
  episodes = -(-cfg.train.batch_tasks * cfg.train.group_size // layout["hosts"])
  if max_rows == "config":
    max_rows = cfg.rollout.engine_max_rows
  cap = je.rows_per_call(
      je.BATCH_BUCKETS, je.CPU_GROUP_ROWS if on_cpu else 0, int(max_rows or 0)
  )
  calls = -(-episodes // cap)
  rows = je.bucket_size(-(-episodes // calls), je.BATCH_BUCKETS, "batch size")
  prompt = je.bucket_size(
      min(cfg.rollout.max_prompt_tokens, max(je.PROMPT_BUCKETS)),
      je.PROMPT_BUCKETS,
      "prompt length",
  )
  new = je.round_up(cfg.rollout.max_new_tokens, 16)
  if chunk == "config":  # else the block width to plan with
    chunk = cfg.rollout.prefill_chunk
  if chunk is None:
    chunk = je.CPU_PREFILL_CHUNK if on_cpu else 0
  chunk = je.prefill_block(int(chunk), prompt)
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  own = int(cfg.rollout.engine_tensor)  # build.make_engine_mesh
  per = layout["devices_per_host"] if layout["hosts"] > 1 else math.prod(mesh)
  if own and per % own:
    raise ValueError(
        f"rollout.engine_tensor={own} does not divide the"
        f" {per} devices of a host"
    )
  if layout["hosts"] > 1:  # distributed.host_mesh
    t = own or (1 if "tensor" in layout["cross_host_axes"] else mesh[2])
    mesh = [1, per // t, t]
  elif own and own != mesh[2]:
    mesh = [1, per // own, own]
  return dict(
      rows=rows,
      prompt=prompt,
      new=new,
      chunk=chunk,
      mesh=mesh,
      calls_per_turn=calls,
  )


def step_rows(cfg) -> int:
  """Most rows one A step trains on: one per episode step (batch_tasks x
  group_size x env.max_steps), at most ``train.max_train_rows``."""
  t = cfg.train
  rows = t.batch_tasks * t.group_size * cfg.env.max_steps
  return min(rows, t.max_train_rows) if t.max_train_rows else rows


def update_rows(cfg) -> int:
  """Most rows of one optimizer update (``update.StepUpdater.mini_batches``):
  ceil(step rows / ``train.updates_per_step``) when that is set; else
  ``train.mini_batch_rows`` when it is below the step's rows; else all."""
  t, rows = cfg.train, step_rows(cfg)
  fixed, m = int(t.updates_per_step), int(t.mini_batch_rows)
  if fixed:
    return -(-rows // min(fixed, rows))
  return m if 0 < m < rows else rows


def train_rows(cfg) -> int:
  """Global rows of one micro-batch: ``train.micro_batch_rows`` when it
  splits an update, else the update's rows."""
  m, rows = int(cfg.train.micro_batch_rows or 0), update_rows(cfg)
  return m if 0 < m < rows else rows


def micro_batches(cfg) -> int:
  """Micro-batches of one update (``Learner.n_micro``): ceil(update rows /
  micro-batch rows); more than one keeps a float32 gradient sum."""
  return -(-update_rows(cfg) // train_rows(cfg))


def run_dtypes(cfg, mcfg) -> dict:
  """The dtypes the run uses (``build.py``): float32 master weights,
  optimizer state and gradient sums unless ``model.param_dtype`` says
  otherwise; ``model.dtype`` compute; pi_ref and the in-process engine's
  weights in ``mcfg.inference_dtype``; weight exports (SGLang syncs) in the
  compute dtype."""
  export = str(mcfg.dtype)
  out = {
      "params": mcfg.param_dtype,
      "optimizer_state": mcfg.param_dtype,
      "grad_accumulation": mcfg.param_dtype,
      "compute": mcfg.dtype,
      "reference": mcfg.inference_dtype,
      "engine": (
          mcfg.inference_dtype if cfg.rollout.engine == "jax" else export
      ),
      "export": export,
      "remat": mcfg.remat,
      "scan_layers": bool(mcfg.scan_layers),
  }
  if adapter_params(mcfg):  # LoRA: params are the adapters
    out["frozen_base"] = mcfg.inference_dtype
  return out


def _update_passes(cfg, mcfg, mesh_shape, ways: int, platform: str):
  """One update's compiled passes: (update rows, micro-batches, the train
  step's terms, the pi_old pass's, the pi_ref pass's)."""
  seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
  window = min(seq - 1, cfg.rollout.max_new_tokens)
  # One optimizer update: its rows in micro-batches of ``train_rows``
  # (a float32 gradient sum when there are several).
  rows, n_micro = update_rows(cfg), micro_batches(cfg)
  train = train_step_bytes(
      mcfg,
      mesh_shape,
      n_micro * train_rows(cfg),
      seq,
      window=window,
      n_micro=n_micro,
      platform=platform,
  )
  # pi_old / pi_ref of an update's rows: ``Learner.apply`` in chunks of at
  # most micro-batch rows inside one call (``learner.apply_chunks``).
  from rspo_jax.learner import apply_chunks

  chunks = apply_chunks(rows, train_rows(cfg), ways)
  old = logprob_bytes(
      mcfg,
      mesh_shape,
      rows,
      seq,
      window=window,
      n_chunks=chunks,
      platform=platform,
  )
  ref_pass = logprob_bytes(
      mcfg,
      mesh_shape,
      rows,
      seq,
      window=window,
      n_chunks=chunks,
      param_dtype=mcfg.inference_dtype,
      platform=platform,
  )
  return rows, n_micro, train, old, ref_pass


def _engine_terms(cfg, mcfg, layout, prefill_chunk, max_rows):
  """The in-process engine's shapes (None: an SGLang engine) and bytes:
  (weights, KV cache, prefill scores, second cache), 0 without one."""
  if cfg.rollout.engine != "jax":
    return None, (0.0, 0.0, 0.0, 0.0)
  eng = engine_shapes(cfg, layout, prefill_chunk, max_rows)
  pre = prefill_bytes(
      mcfg,
      eng["mesh"],
      eng["rows"],
      eng["prompt"],
      eng["new"],
      chunk=eng["chunk"],
  )
  return eng, (pre["weights"], pre["cache"], pre["scores"], pre["second"])


def memory_per_device(
    cfg,
    mcfg,
    mesh_shape,
    layout=None,
    *,
    prefill_chunk="config",
    max_rows="config",
) -> dict:
  """The run's bytes per device (``rspo_jax.plan``'s docstring), in GiB
  for the ``*_GB`` keys. ``layout`` (``resolve_layout``): platform and
  hosts; a one-host GPU by default."""
  layout = layout or {
      "platform": "gpu",
      "hosts": 1,
      "devices_per_host": math.prod(mesh_shape),
      "mesh": dict(zip(("data", "fsdp", "tensor"), mesh_shape)),
  }
  platform = layout["platform"]
  x = _dims(mcfg, mesh_shape)
  p, shard = x["p"], x["shard"]
  rows, n_micro, train, old, ref_pass = _update_passes(
      cfg, mcfg, mesh_shape, x["ways"], platform
  )

  state, base = train["state"], train["base"]
  lora_p = x["p_a"]
  uses_b = cfg.rspo.enabled and cfg.rspo.data_source in ("rspo", "outcome")
  policy_b = state if uses_b else 0.0
  critic = state if cfg.algo.name == "ppo" else 0.0
  # pi_ref: the inference copy; with LoRA A's adapters zeroed over the
  # shared base (``lora.adapters_off``).
  ref = x["w"] * lora_p / shard if lora_p else ref_pass["params"]
  # The PRM's backbone: on the run's mesh with one host, else on each
  # host's own devices (build.prm_mesh), split over all of them.
  prm_shard = layout["devices_per_host"] if layout["hosts"] > 1 else shard
  prm = (
      x["c"] * p / prm_shard
      if cfg.rspo.enabled and cfg.rspo.dense_reward == "prm"
      else 0.0
  )
  in_process = cfg.rollout.engine == "jax"
  eng, (engine, kv_cache, prefill, second_cache) = _engine_terms(
      cfg, mcfg, layout, prefill_chunk, max_rows
  )
  # Overlap: the next collection's weights, copied before each update
  # (Learner.frozen_params) when its thread recomputes their log-probs.
  overlap = bool(cfg.rollout.overlap)
  snapshot = (
      x["w"] * (lora_p or p) / shard
      if overlap and cfg.rspo.recompute_behavior_logp
      else 0.0
  )
  resident = base + state + policy_b + critic + ref + engine + prm + snapshot
  train_transient = train["batch"] + train["transient"]
  logprob_transient = max(old["transient"], ref_pass["transient"])
  rollout = kv_cache + second_cache + prefill
  if overlap:  # the thread's prefill or log-prob pass beside the update
    train_transient += max(
        rollout if in_process else 0.0, old["transient"] if snapshot else 0.0
    )
  phases = {
      "train step": train_transient,
      "log-probs": logprob_transient,
      "rollout prefill": rollout,
  }
  peak_phase = max(phases, key=phases.get)
  total = resident + phases[peak_phase]
  out = {
      "params": p,
      "adapter_params": lora_p,
      "update_rows": rows,
      "micro_batches": n_micro,
      "train_rows_per_device": train["rows"],
      "attention": "fused" if train["fused"] else "materialised scores",
      "base_GB": base,
      "policy_A_GB": state,
      "policy_B_GB": policy_b,
      "critic_GB": critic,
      "ref_GB": ref,
      "engine_weights_GB": engine,
      "prm_GB": prm,
      "overlap_snapshot_GB": snapshot,
      "resident_GB": resident,
      "grads_GB": train["grads"],
      "compute_copy_GB": train["compute_copy"],
      "optimizer_update_GB": train["update"],
      "fsdp_gather_GB": train["gathered"],
      "block_grad_GB": train["layer"],
      "activations_GB": train["activations"],
      "logits_GB": train["logits"],
      "train_transient_GB": train_transient,
      "logprob_transient_GB": logprob_transient,
      "kv_cache_GB": kv_cache,
      "second_cache_GB": second_cache,
      "prefill_scores_GB": prefill,
      "rollout_transient_GB": rollout,
      "total_GB": total,
      "peak_phase": peak_phase,
  }
  if eng is not None:
    out["engine_prefill"] = {
        k: eng[k] for k in ("rows", "prompt", "new", "chunk")
    }
  return {k_: v / GB if k_.endswith("_GB") else v for k_, v in out.items()}


def layout_warnings(cfg, mcfg, mesh_shape, hosts: int) -> list:
  """Layouts that run but cost more than the estimate says (or fail)."""
  data, fsdp, tensor = mesh_shape
  out = []
  for what, size, axis, ways in (
      ("hidden_size (embed)", mcfg.hidden_size, "fsdp", fsdp),
      ("num_heads", mcfg.num_heads, "tensor", tensor),
      ("num_kv_heads", mcfg.num_kv_heads, "tensor", tensor),
      ("intermediate_size (mlp)", mcfg.intermediate_size, "tensor", tensor),
      ("vocab_size", mcfg.vocab_size, "tensor", tensor),
  ):
    if size % ways:
      out.append(
          f"{what}={size} does not split over {axis}={ways}: those weights"
          " are replicated on that axis (more memory than estimated)"
      )
  rows = train_rows(cfg)
  if rows % (data * fsdp):
    out.append(
        f"micro-batch of {rows} rows does not split over data x fsdp ="
        f" {data * fsdp} devices"
    )
  episodes = cfg.train.batch_tasks * cfg.train.group_size
  if episodes % hosts:
    out.append(f"{episodes} episodes do not split evenly over {hosts} hosts")
  return out


AUTO = "auto"  # model.remat=auto: the plan picks (rollout.prefill_chunk: None)


def remat_of(cfg) -> str:
  """``model.remat`` as a ModelConfig policy (``models.config.
  remat_policy``: 'none' | 'dots' | 'full', the old bools accepted);
  'auto' not yet planned (``resolve_run``) reads as 'full', the policy
  that keeps least."""
  from rspo_jax.models.config import remat_policy

  value = cfg.model.remat
  if isinstance(value, str) and value.strip().lower() == AUTO:
    return "full"
  return remat_policy(value)


def plan_model_config(cfg):
  """The policy's ModelConfig as the run will build it, without loading
  anything: ``model.checkpoint_dir``'s config.json when it exists, else the
  preset; ``model.overrides`` (``"num_layers=1;hidden_size=64"``) applied;
  CPU presets take the locally trained tokenizer's vocabulary size;
  ``model.lora_rank`` > 0 adds the LoRA fields (as ``build.lora_config``).
  """
  import dataclasses

  from rspo_jax import models
  from rspo_jax.models import lora

  m = cfg.model
  overrides = {
      "dtype": m.dtype,  # as build.model_numerics sets them
      "param_dtype": str(m.param_dtype or "float32"),
      "remat": remat_of(cfg),
      "scan_layers": bool(m.scan_layers),
      "attention": m.attention,
  }
  for item in filter(None, m.overrides.split(";")):
    key, _, value = item.partition("=")
    overrides[key.strip()] = int(value)
  config_json = os.path.join(m.checkpoint_dir or "", "config.json")
  if m.checkpoint_dir and os.path.exists(config_json):
    with open(config_json) as f:
      mcfg = models.ModelConfig.from_hf_dict(json.load(f), **overrides)
  else:
    if m.preset in models.LOCAL_TOKENIZER_PRESETS:
      overrides.setdefault(
          "vocab_size", models.local_vocab_size(int(m.tokenizer_vocab))
      )
    mcfg = models.get_model_config(m.preset, **overrides)
  rank = int(m.lora_rank)  # the one read of model.lora_rank in the plan
  if rank:
    mcfg = dataclasses.replace(
        mcfg,
        lora_rank=rank,
        lora_alpha=float(m.lora_alpha),
        lora_targets=lora.parse_targets(m.lora_targets),
    )
    lora.check(mcfg)
  return mcfg
