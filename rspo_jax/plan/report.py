"""The plan of a run as ``launch/train.py --dry_run`` prints it
(``make_plan``, ``describe``: JSON) and its memory table (``table``:
markdown, ``python -m rspo_jax.plan``).
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional

from rspo_jax.plan.choices import (
    choose,
    fit_message,
    overlap_problem,
    resolved,
)
from rspo_jax.plan.layout import GB, resolve_layout, usable_gb
from rspo_jax.plan.memory import (
    layout_warnings,
    memory_per_device,
    micro_batches,
    plan_model_config,
    run_dtypes,
    train_rows,
    update_rows,
)
from rspo_jax.plan.programs import adapter_params


def make_plan(
    cfg, workdir: str, environ: Optional[Mapping[str, str]] = None
) -> dict:
  environ = os.environ if environ is None else environ
  layout = resolve_layout(cfg, environ)
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  usable, fraction = usable_gb(cfg, layout, environ)
  choices = choose(cfg, layout, usable)
  given = cfg
  cfg = resolved(cfg, choices)
  mcfg = plan_model_config(cfg)
  mem = memory_per_device(cfg, mcfg, mesh, layout)
  servers = [u.strip() for u in cfg.rollout.server_urls.split(",") if u.strip()]
  if cfg.rollout.engine == "sglang" and not servers:
    raise ValueError("rollout.engine=sglang needs rollout.server_urls")
  device_gb = float(cfg.mesh.device_memory_gb or 0)
  episodes = cfg.train.batch_tasks * cfg.train.group_size
  plan = {
      "workdir": workdir,
      "env": cfg.env.name,
      "algorithm": cfg.algo.name,
      "rspo": bool(cfg.rspo.enabled),
      "model": cfg.model.preset,
      "dtype": run_dtypes(cfg, mcfg),
      **layout,
      "rollout": {
          "engine": cfg.rollout.engine,
          "servers": servers,
          "where": (
              "in the learner processes, on the mesh"
              if cfg.rollout.engine == "jax"
              else f"{len(servers)} SGLang server(s) over HTTP"
          ),
      },
      "batch": {
          "tasks": cfg.train.batch_tasks,
          "group_size": cfg.train.group_size,
          "episodes": episodes,
          "episodes_per_host": episodes / layout["hosts"],
          "update_rows": update_rows(cfg),
          "micro_batch_rows": train_rows(cfg),
          "micro_batches": micro_batches(cfg),
      },
      **(
          {"lora": {**lora_plan(mcfg), "learning_rate": _lora_lr_line(cfg)}}
          if adapter_params(mcfg)
          else {}
      ),
      "steps_of_A": cfg.train.total_steps,
      "rspo_loops": -(-cfg.train.total_steps // cfg.rspo.k),
      "memory_per_device": {
          k: round(v, 2) if isinstance(v, float) else v for k, v in mem.items()
      },
  }
  plan["choices"] = choices
  warnings = layout_warnings(cfg, mcfg, mesh, layout["hosts"])
  problem = overlap_problem(cfg, layout)
  if problem:
    warnings.append(problem)
  if device_gb:
    fraction, source = fraction
    plan["device_memory_GB"] = device_gb
    plan["mem_fraction"] = {"value": fraction, "from": source}
    plan["usable_GB"] = round(usable, 2)
    plan["fits"] = mem["total_GB"] <= usable
    if not plan["fits"]:
      warnings.append(
          f"estimated {mem['total_GB']:.1f} GB a device exceeds the"
          f" {usable:.1f} GB JAX may use ({fraction:g} of the"
          f" {device_gb:g} GB of mesh.device_memory_gb, {source})"
      )
      # launch/train.py --dry_run ends with this line (the key to change)
      plan["stop"] = fit_message(given, layout, usable)
    if mem["prefill_scores_GB"] > usable / 4:
      warnings.append(
          f"the in-process engine's prefill holds"
          f" {mem['prefill_scores_GB']:.1f} GB of attention scores"
          f" ({mem['engine_prefill']['rows']} rows of a"
          f" {mem['engine_prefill']['prompt']}-token prompt bucket,"
          f" blocks of {mem['engine_prefill']['chunk'] or 'all'} columns):"
          " a narrower rollout.prefill_chunk, fewer rows a call"
          " (rollout.engine_max_rows), fewer episodes a host,"
          " rollout.engine=sglang, or a larger mesh cut it"
      )
  if problem:  # before memory: a run would deadlock, not run out
    plan["stop"] = problem
  if plan.get("stop"):  # what --allow_plan_overflow may override: memory
    plan["stop_by"] = "overlap" if problem else "memory"
  plan["warnings"] = warnings
  return plan


def _lora_lr_line(cfg) -> str:
  """The adapters' learning rate (``lora.lr_line``)."""
  from rspo_jax.models import lora

  return lora.lr_line(cfg)


def lora_plan(mcfg) -> dict:
  """LoRA's part of the plan: rank, alpha, targets, adapter parameters
  (``adapter_params``) and their float32 bytes (what an adapter sync or a
  PEFT directory moves), beside the base's."""
  from rspo_jax.models.config import DTYPES

  p_a = adapter_params(mcfg)
  return {
      "rank": int(mcfg.lora_rank),
      "alpha": float(mcfg.lora_alpha),
      "targets": list(mcfg.lora_targets),
      "adapter_params": p_a,
      "adapter_fraction": round(p_a / mcfg.num_params(), 5),
      "adapter_MB": round(DTYPES[mcfg.param_dtype] * p_a / 2**20, 1),
      "frozen_base_GB": round(
          DTYPES[mcfg.inference_dtype] * mcfg.num_params() / GB, 2
      ),
  }


def describe(
    cfg, workdir: str, environ: Optional[Mapping[str, str]] = None
) -> str:
  """The plan as indented JSON."""
  return json.dumps(make_plan(cfg, workdir, environ), indent=1)


_TABLE = (  # (memory_per_device key, what it holds)
    ("policy_A_GB", "policy A: float32 masters, Adam m and v"),
    ("policy_B_GB", "policy B (RSPO): the same"),
    ("critic_GB", "critic (PPO): the same"),
    ("ref_GB", "pi_ref: inference copy"),
    ("prm_GB", "PRM backbone (rspo.dense_reward=prm)"),
    ("engine_weights_GB", "engine weights (in-process rollout)"),
    ("overlap_snapshot_GB", "overlap: the next collection's weights"),
    ("resident_GB", "**resident**"),
    ("grads_GB", "train step: gradients (+ their sum over micro-batches)"),
    ("compute_copy_GB", "train step: compute-dtype copy of the weights"),
    ("fsdp_gather_GB", "train step: one FSDP-gathered block"),
    ("block_grad_GB", "train step: the running block in float32 (LoRA)"),
    ("activations_GB", "train step: remat carries + one block"),
    ("logits_GB", "train step: window logits and their gradient"),
    ("optimizer_update_GB", "train step: the update (4 copies)"),
    ("train_transient_GB", "**train step transient** (with the batch)"),
    ("logprob_transient_GB", "**log-prob transient** (pi_old, pi_ref)"),
    ("kv_cache_GB", "rollout: KV cache of one prefill call"),
    (
        "second_cache_GB",
        "rollout: a second cache (repeated prompts'"
        " or XLA's copy in blocks)",
    ),
    ("prefill_scores_GB", "rollout: prefill attention scores"),
    ("rollout_transient_GB", "**rollout transient** (caches + scores)"),
)
_LORA_TABLE = {  # LoRA's rows in place of _TABLE's
    "policy_A_GB": "policy A: float32 adapters, Adam m and v",
    "policy_B_GB": "policy B (RSPO): a copy of A's adapters, the same",
    "critic_GB": "critic (PPO): its own adapters, the same",
    "ref_GB": "pi_ref: the base with A's adapters zeroed (no copy)",
    "engine_weights_GB": "engine weights (in-process rollout): merged",
    "grads_GB": "train step: adapter gradients (+ their sum)",
    "compute_copy_GB": "train step: compute-dtype copy of the adapters",
    "optimizer_update_GB": "train step: the adapters' update (4 copies)",
}


def _engine_line(mem: dict) -> str:
  """' (R rows a prefill call, ...)' for the in-process engine."""
  e = mem.get("engine_prefill")
  if not e:
    return ""
  return (
      f" ({e['rows']} rows a prefill call, prompt columns in"
      f" {'blocks of ' + str(e['chunk']) if e['chunk'] else 'one pass'})"
  )


def table(p: dict) -> str:
  """A dry-run plan (``make_plan``) as a markdown table of memory a
  device, GiB."""
  mem = p["memory_per_device"]
  mesh = "x".join(str(p["mesh"][a]) for a in ("data", "fsdp", "tensor"))
  b = p["batch"]
  lines = [
      f"{p['model']} ({mem['params']:,} parameters), {p['env']}"
      f" {p['algorithm']}{' + RSPO' if p['rspo'] else ''}; {p['hosts']} x"
      f" {p['devices_per_host']} {p['platform']} devices, mesh {mesh}"
      f" (data x fsdp x tensor); rollout {p['rollout']['engine']}"
      f"{_engine_line(mem)};"
      f" updates of {b['update_rows']} rows in {b['micro_batches']}"
      f" micro-batches of {b['micro_batch_rows']}"
      f" ({mem['train_rows_per_device']} a device); attention"
      f" {mem['attention']}; dtypes: "
      + ", ".join(f"{k} {v}" for k, v in p["dtype"].items()),
      "",
      "| per device | GiB |",
      "|---|---:|",
  ]
  rows = list(_TABLE)
  if p.get("lora"):
    lo = p["lora"]
    lines[0] += (
        f"; LoRA r={lo['rank']} on {','.join(lo['targets'])}:"
        f" {lo['adapter_params']:,} adapter parameters"
        f" ({lo['adapter_MB']:g} MB float32)"
    )
    rows = [
        (
            "base_GB",
            "frozen base (LoRA): compute dtype, shared by A, B,"
            " pi_ref, critic",
        )
    ] + [(k, _LORA_TABLE.get(k, what)) for k, what in rows]
  lines += [
      f"| {what} | {mem[k]:.2f} |"
      for k, what in rows
      if k not in ("overlap_snapshot_GB", "block_grad_GB") or mem.get(k)
  ]
  lines.append(
      f"| **total** = resident + {mem['peak_phase']} |"
      f" **{mem['total_GB']:.2f}** |"
  )
  if "usable_GB" in p:
    f = p["mem_fraction"]
    lines.append(
        f"| usable: {p['device_memory_GB']:g} GB x {f['value']:g}"
        f" ({f['from']}) | {p['usable_GB']:.2f} |"
    )
    lines.append(f"| fits | {'yes' if p['fits'] else '**no**'} |")
  lines += [f"\nwarning: {w}" for w in p["warnings"]]
  return "\n".join(lines)
