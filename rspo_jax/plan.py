"""The resolved plan of a run, printed by ``launch/train.py --dry_run``.

Nothing is started and no model is created; devices are counted only when
neither the mesh config nor the environment says how many there are.

Hosts x devices, first match wins:
  1. ``RSPO_NUM_HOSTS`` / ``RSPO_DEVICES_PER_HOST`` (environment),
  2. ``mesh.num_hosts`` / ``mesh.devices_per_host`` (``configs/mesh/*.py``),
  3. this process: ``jax.process_count()`` x ``jax.local_device_count()``.
Devices are taken in process-major order (``jax.devices()``), so each host
holds a contiguous block of the row-major mesh; ``cross_host_axes`` names
the mesh axes whose collectives leave a host.

Memory per device (bytes; docs/scale_out.md works the numbers):

  P      = policy parameters (``ModelConfig.num_params``)
  w      = bytes of the parameter dtype (``model.param_dtype``, default
           fp32: 4); Adam's m, v and the gradient sums follow it
  c      = bytes of the compute dtype (``model.dtype``; bf16: 2)
  r      = bytes of the inference dtype (the narrower of the two: pi_ref
           and the engine's weights)
  shard  = fsdp * tensor              (ways the parameters are split)
  rows   = ceil(micro-batch rows / (data * fsdp))
  T      = max_prompt_tokens + max_new_tokens

  resident (held for the whole run):
    policy_A = P * (w + 2w [Adam m, v] + w [grads]) / shard
    policy_B = policy_A    (RSPO with B: a full trainable copy)
    critic   = policy_A    (PPO: a value model with its own backbone)
    ref      = P * r / shard           (frozen pi_ref)
    engine   = P * r / shard           (in-process JAX rollout engine)
  training transient (one micro-batch forward + backward):
    layer_in = L * rows * T * d * c    (remat: each block's input is kept)
    block    = rows * T * (2 * 4 * H * T        [scores, probs; fp32]
                           + c * (3 * F + (2 H + 2 K) * hd)) / tensor
               (all L blocks live without remat, one with it)
    logits   = 2 * rows * T * V * 4 / tensor    (fp32 logits + their grad)
    gather   = 2 * P_layer * c / tensor        (FSDP: a block's gathered
                                                weights, one prefetched)
  rollout transient (in-process engine only):
    kv_cache = ceil(episodes / (data * fsdp)) * T * L * 2 * K * hd * c / t_kv

  total = resident + max(training transient, rollout transient)

(d width, L layers, H / K query / KV heads, hd head width, F MLP width,
V vocab; t_kv = tensor when it divides K, else 1; GB = 2**30 bytes.) A
dimension that does not divide its mesh axis is replicated
(``sharding.fit_spec_to_shape``), which the estimate ignores: the plan's
``warnings`` name such dimensions.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Optional

GB = 1024**3


# --------------------------------------------------------------------------
# Hosts, devices, mesh
# --------------------------------------------------------------------------


def _mesh_shape(shape, n_devices):
  shape = list(shape)
  known = 1
  for s in shape:
    known *= s if s != -1 else 1
  return [n_devices // known if s == -1 else s for s in shape]


def _env_int(environ, name) -> int:
  value = environ.get(name, "").strip()
  if not value:
    return 0
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} is not an int")


def cross_host_axes(mesh_shape, num_hosts: int) -> list:
  """Mesh axes split between hosts, with devices laid out process-major
  over the row-major mesh (the trailing axes fill a host first)."""
  per_host = math.prod(mesh_shape) // max(num_hosts, 1)
  crossing = []
  for name, size in reversed(list(zip(("data", "fsdp", "tensor"),
                                      mesh_shape))):
    if per_host >= size and per_host % size == 0:
      per_host //= size
    else:
      if size > 1:
        crossing.append(name)
      per_host = 1
  return sorted(crossing, key=("data", "fsdp", "tensor").index)


def resolve_layout(cfg, environ: Optional[Mapping[str, str]] = None) -> dict:
  """{hosts, devices_per_host, devices, platform, mesh, cross_host_axes}.

  Raises ValueError naming the mesh and device count when they disagree.
  """
  environ = os.environ if environ is None else environ
  mesh_cfg = cfg.mesh
  shape = [int(s) for s in mesh_cfg.shape]
  hosts = _env_int(environ, "RSPO_NUM_HOSTS") or int(
      mesh_cfg.get("num_hosts", 0) or 0
  )
  per_host = _env_int(environ, "RSPO_DEVICES_PER_HOST") or int(
      mesh_cfg.get("devices_per_host", 0) or 0
  )
  platform = mesh_cfg.get("platform", "") or ""
  if hosts < 0 or per_host < 0:
    raise ValueError(
        f"hosts={hosts}, devices_per_host={per_host}: must be >= 0"
    )
  if not hosts or not per_host:
    explicit = -1 not in shape
    if explicit and (hosts or per_host):  # one given: the mesh fixes the other
      total = math.prod(shape)
      if hosts and total % hosts == 0:
        per_host = total // hosts
      elif per_host and total % per_host == 0:
        hosts = total // per_host
    if not hosts or not per_host:
      import jax  # only counted when nothing declares the layout

      hosts = hosts or jax.process_count()
      per_host = per_host or jax.local_device_count()
      platform = platform or jax.default_backend()
  n_devices = hosts * per_host
  if shape.count(-1) > 1:
    raise ValueError(f"mesh.shape {tuple(shape)}: at most one -1 entry")
  known = math.prod(s for s in shape if s != -1)
  if known <= 0 or (-1 in shape and n_devices % known):
    raise ValueError(
        f"mesh.shape {tuple(shape)} does not divide {hosts} hosts x"
        f" {per_host} devices = {n_devices}"
    )
  mesh = _mesh_shape(shape, n_devices)
  if math.prod(mesh) != n_devices:
    raise ValueError(
        f"mesh {tuple(mesh)} needs {math.prod(mesh)} devices; the plan has"
        f" {hosts} hosts x {per_host} devices = {n_devices}"
    )
  return {
      "hosts": hosts,
      "devices_per_host": per_host,
      "devices": n_devices,
      "platform": platform or "unknown",
      "mesh": dict(zip(("data", "fsdp", "tensor"), mesh)),
      "cross_host_axes": cross_host_axes(mesh, hosts),
  }


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------


def train_rows(cfg) -> int:
  """Global rows of one micro-batch (a row is one step of an episode)."""
  t = cfg.train
  if t.micro_batch_rows:
    return int(t.micro_batch_rows)
  rows = t.batch_tasks * t.group_size * cfg.env.max_steps
  return min(rows, t.max_train_rows) if t.max_train_rows else rows


def run_dtypes(cfg, mcfg) -> dict:
  """The dtypes the run uses (``build.py``): float32 master weights,
  optimizer state and gradient sums unless ``model.param_dtype`` says
  otherwise; ``model.dtype`` compute; pi_ref and the in-process engine's
  weights in ``mcfg.inference_dtype``; weight exports (SGLang syncs) in the
  compute dtype."""
  export = str(mcfg.dtype)
  return {
      "params": mcfg.param_dtype,
      "optimizer_state": mcfg.param_dtype,
      "grad_accumulation": mcfg.param_dtype,
      "compute": mcfg.dtype,
      "reference": mcfg.inference_dtype,
      "engine": (mcfg.inference_dtype if cfg.rollout.engine == "jax"
                 else export),
      "export": export,
      "remat": bool(mcfg.remat),
  }


def memory_per_device(cfg, mcfg, mesh_shape) -> dict:
  """The terms of the module docstring, in bytes, for ``mesh_shape`` =
  (data, fsdp, tensor)."""
  from rspo_jax.models.config import DTYPES  # bytes per element

  data, fsdp, tensor = (int(x) for x in mesh_shape)
  shard, batch_ways = fsdp * tensor, data * fsdp
  p = mcfg.num_params()
  dtypes = run_dtypes(cfg, mcfg)
  w, opt, grad = (DTYPES[dtypes[k]] for k in
                  ("params", "optimizer_state", "grad_accumulation"))
  c = DTYPES[dtypes["compute"]]
  r = DTYPES[dtypes["reference"]]
  seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
  d, n_layers, vocab = mcfg.hidden_size, mcfg.num_layers, mcfg.vocab_size
  h, k, hd, ff = (mcfg.num_heads, mcfg.num_kv_heads, mcfg.head_dim,
                  mcfg.intermediate_size)
  rows = -(-train_rows(cfg) // batch_ways)

  train_state = p * (w + 2 * opt + grad) / shard
  uses_b = cfg.rspo.enabled and cfg.rspo.data_source in ("rspo", "outcome")
  policy_b = train_state if uses_b else 0.0
  critic = train_state if cfg.algo.name == "ppo" else 0.0
  ref = p * r / shard
  in_process = cfg.rollout.engine == "jax"
  engine = p * DTYPES[dtypes["engine"]] / shard if in_process else 0.0

  block = rows * seq * (
      2 * 4 * h * seq + c * (3 * ff + (2 * h + 2 * k) * hd)
  ) / tensor
  remat = bool(cfg.model.remat)
  activations = (
      n_layers * rows * seq * d * c + block if remat else n_layers * block
  )
  logits = 2 * rows * seq * vocab * 4 / tensor
  layer_params = (p - vocab * d * (1 if mcfg.tie_word_embeddings else 2)
                  ) / n_layers
  gather = 2 * layer_params * c / tensor if fsdp > 1 else 0.0
  t_kv = tensor if k % tensor == 0 else 1
  episodes = cfg.train.batch_tasks * cfg.train.group_size
  kv_cache = (
      -(-episodes // batch_ways) * seq * n_layers * 2 * k * hd * c / t_kv
      if in_process else 0.0
  )
  resident = train_state + policy_b + critic + ref + engine
  training = activations + logits + gather
  total = resident + max(training, kv_cache)
  out = {
      "params": p,
      "train_rows_per_device": rows,
      "policy_A_GB": train_state,
      "policy_B_GB": policy_b,
      "critic_GB": critic,
      "ref_GB": ref,
      "engine_weights_GB": engine,
      "activations_GB": activations,
      "logits_GB": logits,
      "fsdp_gather_GB": gather,
      "kv_cache_GB": kv_cache,
      "resident_GB": resident,
      "total_GB": total,
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


# --------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------


def plan_model_config(cfg):
  """The policy's ModelConfig as the run will build it, without loading
  anything: ``model.checkpoint_dir``'s config.json when it exists, else the
  preset; ``model.overrides`` (``"num_layers=1;hidden_size=64"``) applied;
  CPU presets take the locally trained tokenizer's vocabulary size."""
  from rspo_jax import models

  m = cfg.model
  overrides = {"dtype": m.dtype,
               "param_dtype": str(m.get("param_dtype", "float32") or
                                  "float32"),
               "remat": bool(m.remat)}
  for item in filter(None, str(m.get("overrides", "") or "").split(";")):
    key, _, value = item.partition("=")
    overrides[key.strip()] = int(value)
  config_json = os.path.join(m.checkpoint_dir or "", "config.json")
  if m.checkpoint_dir and os.path.exists(config_json):
    with open(config_json) as f:
      return models.ModelConfig.from_hf_dict(json.load(f), **overrides)
  if m.preset in models.LOCAL_TOKENIZER_PRESETS:
    overrides.setdefault("vocab_size",
                         models.local_vocab_size(int(m.tokenizer_vocab)))
  return models.get_model_config(m.preset, **overrides)


def make_plan(cfg, workdir: str,
              environ: Optional[Mapping[str, str]] = None) -> dict:
  layout = resolve_layout(cfg, environ)
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  mcfg = plan_model_config(cfg)
  mem = memory_per_device(cfg, mcfg, mesh)
  servers = [u.strip() for u in cfg.rollout.server_urls.split(",")
             if u.strip()]
  if cfg.rollout.engine == "sglang" and not servers:
    raise ValueError("rollout.engine=sglang needs rollout.server_urls")
  device_gb = float(cfg.mesh.get("device_memory_gb", 0) or 0)
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
          "where": ("in the learner processes, on the mesh"
                    if cfg.rollout.engine == "jax"
                    else f"{len(servers)} SGLang server(s) over HTTP"),
      },
      "batch": {
          "tasks": cfg.train.batch_tasks,
          "group_size": cfg.train.group_size,
          "episodes": episodes,
          "episodes_per_host": episodes / layout["hosts"],
          "micro_batch_rows": train_rows(cfg),
      },
      "steps_of_A": cfg.train.total_steps,
      "rspo_loops": -(-cfg.train.total_steps // cfg.rspo.k),
      "memory_per_device": {
          k: round(v, 2) if isinstance(v, float) else v
          for k, v in mem.items()
      },
  }
  warnings = layout_warnings(cfg, mcfg, mesh, layout["hosts"])
  if device_gb:
    plan["device_memory_GB"] = device_gb
    plan["fits"] = mem["total_GB"] <= device_gb
    if not plan["fits"]:
      warnings.append(
          f"estimated {mem['total_GB']:.1f} GB a device exceeds the"
          f" {device_gb:g} GB of mesh.device_memory_gb"
      )
  plan["warnings"] = warnings
  return plan


def describe(cfg, workdir: str,
             environ: Optional[Mapping[str, str]] = None) -> str:
  """The plan as indented JSON."""
  return json.dumps(make_plan(cfg, workdir, environ), indent=1)
