"""LoRA adapters for the Transformer: policy A, policy B and the critic.

With ``ModelConfig.lora_rank = r > 0`` every target projection W of every
block (``lora_targets``: attention q, k, v, o and MLP gate, up, down) is

    W x  ->  W x + (alpha / r) B(A(x)),    A [in, r], B [r, out]

(``lora_alpha``), A drawn as PEFT draws it (uniform in +-1/sqrt(fan_in),
PyTorch's kaiming_uniform(a=sqrt(5))) and B zero, so a model with fresh
adapters computes exactly what its base does (the added term is an exact
0). The adapters are ``nnx.LoRAParam`` variables in ``param_dtype``
(float32); every base weight of a LoRA model is a ``FrozenParam`` (an
``nnx.Param``, so HF IO and the sharding rules see it as before) stored in
the compute dtype (``base_dtype``). ``TRAINABLE`` selects what a Learner
differentiates and keeps Adam moments for: every Param but the frozen base,
i.e. the adapters (and a critic's value head); the base travels as a jit
argument beside them (``train_step``), never in the train state, the
checkpoints or the optimizer. pi_ref is the base with the adapters off:
the same adapters' shapes, all zero (``adapters_off``), no second copy of
the base. B := copy of A's adapters; B shares A's base arrays.

Each adapter is applied next to its base matmul (``Adapter.__call__``,
called by ``transformer.Attention`` / ``MLP``) through the same sharded
einsum wrapper: the weight cast to the compute dtype on its own shards and
its gradient taken and reduced in float32. A takes the logical names of
W's input dimensions and B those of W's output dimensions, the rank
dimension unnamed (replicated): adapters are sharded by their base
matrix's rules, in both the unrolled and the scanned ([L, ...]) layouts.

The rollout engine and exports see merged weights (``merged_params``,
``merged_model``): W + (alpha / r) A B per target, computed on device in
float32 and rounded once to the engine's dtype; a PEFT adapter directory
(``save_peft``) carries the adapters alone for tools that load them.

Imports point one way: the layer pieces (``Adapter``, ``FrozenParam``,
``TARGETS`` and the config helpers) live in models/lora_layers.py, which
models/transformer.py imports; this module builds on transformer.py and
hf_io.py and re-exports those pieces (``lora.TRAINABLE`` etc.).

Why our own and not qwix (the LoRA provider Tunix uses) or flax's
``nnx.LoRA`` module. qwix 0.1.8 (read, not installed) intercepts
``jnp.einsum`` / ``dot_general`` and recognises a weight by the identity of
the einsum's right operand with a module attribute (``find_param``). Our
matmuls run ``sharding.ActivationSharding.einsum``: under bf16 compute the
weight is cast on its shards inside a ``jax.custom_vjp``, so the operand
is a cast copy qwix does not recognise (no adapter, silently), and one it
did would have its adapter created inside the custom VJP (no gradient).
qwix also creates the adapters by running the model once and setting
attributes on the module it runs, which for scanned layers is a block
rebuilt inside ``jax.lax.scan`` (the attributes are lost), takes the
adapters' dtype from the base weight (bf16 adapters for a bf16 base) and
their sharding from a concrete array's NamedSharding (none under
``nnx.eval_shape``). ``nnx.LoRA`` wraps a Linear layer with its own
kernel; our projections are einsums over [D, H, Dh] tensors with logical
names. The adapter here is the same math in about 150 lines, uses
``nnx.LoRAParam`` for its variables (so flax's filters and qwix's naming
apply) and keeps the base's numerics and sharding untouched.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rspo_jax import sharding
from rspo_jax.models import hf_io

# The layer pieces, below models/transformer.py (which imports them).
from rspo_jax.models.lora_layers import (  # noqa: F401  (re-exported)
    ATTENTION_TARGETS,
    SUFFIX,
    TARGETS,
    TRAINABLE,
    Adapter,
    FrozenParam,
    adapter,
    base_config,
    base_dtype,
    check,
    enabled,
    merge_subscripts,
    param_kind,
    parse_targets,
    scale,
)
from rspo_jax.models.transformer import Transformer, graphdef_of


def lr_multiplier(run_cfg) -> float:
  """The LoRA learning-rate rule, of a run's config: with
  ``model.lora_rank`` > 0 every adapter (A's, B's, a critic's) trains at
  its optimizer's lr x ``train.lora_lr_multiplier``; 1 without LoRA.

  Why: at the same lr an adapter moves the policy far less than full
  fine-tuning does (B starts at zero; the update is confined to rank r).
  "LoRA Without Regret" (Schulman et al., Thinking Machines, 2025) finds
  LoRA's best lr about 10x full fine-tuning's, independent of rank under
  the alpha / r scaling (docs/results.md "LoRA learning rate")."""
  if int(run_cfg.model.lora_rank) <= 0:
    return 1.0
  return float(run_cfg.train.lora_lr_multiplier)


def lr_line(run_cfg) -> str:
  """The rule as the run shows it, e.g. 'lr 0.0001 x LoRA multiplier 10
  = 0.001 on adapters' (and B's own ``rspo.b_lr``, a critic's
  ``algo.critic_lr``, when set); '' without LoRA."""
  if int(run_cfg.model.lora_rank) <= 0:
    return ""
  m = lr_multiplier(run_cfg)
  parts = [("lr", run_cfg.train.lr)]
  if run_cfg.rspo.enabled and run_cfg.rspo.b_lr:
    parts.append(("B's lr", run_cfg.rspo.b_lr))
  if run_cfg.algo.name == "ppo":
    parts.append(("critic lr", run_cfg.algo.critic_lr))
  return "; ".join(
      f"{name} {lr:g} x LoRA multiplier {m:g} = {lr * m:g}" " on adapters"
      for name, lr in parts
  )


# ------------------------------------------------------- building a model


def _transformer(cfg, seed: int = 0):
  return Transformer(cfg, rngs=nnx.Rngs(seed))


def add_adapters(
    module, cfg, *, seed: int = 0, mesh=None, rules=sharding.DEFAULT_RULES
):
  """A LoRA Transformer of ``cfg`` (``lora_rank > 0``) on the base weights
  of ``module`` (a Transformer of ``base_config(cfg)``, same layout): the
  base cast to ``base_dtype(cfg)`` (a device array keeps its sharding; with
  ``mesh``, placed by the logical rules), fresh adapters (B = 0), created
  on their shards in one jitted init."""
  check(cfg)
  if not enabled(cfg):
    raise ValueError("add_adapters: cfg.lora_rank is 0")

  graphdef, adapters_abs, rest_abs = nnx.split(
      nnx.eval_shape(lambda: _transformer(cfg, seed)), nnx.LoRAParam, ...
  )
  out_sh = None
  if mesh is not None:
    out_sh = sharding.state_shardings(mesh, adapters_abs, rules)
  # Only the adapters are returned: XLA drops the base's init as dead code.
  adapters = jax.jit(
      lambda: nnx.state(_transformer(cfg, seed), nnx.LoRAParam),
      out_shardings=out_sh,
      compiler_options=hf_io._init_compiler_options(),  # pylint: disable=protected-access
  )()
  base = dict(nnx.to_flat_state(nnx.state(module)))
  rest_flat = nnx.to_flat_state(rest_abs)
  missing = sorted("/".join(map(str, p)) for p, _ in rest_flat if p not in base)
  if missing:
    raise ValueError(
        f"add_adapters: the base module lacks {missing[:4]}"
        " (another layout or model shape?)"
    )
  flat_sh = (
      dict(nnx.to_flat_state(sharding.state_shardings(mesh, rest_abs, rules)))
      if mesh is not None
      else {}
  )
  dt = jnp.dtype(base_dtype(cfg))
  out = []
  for p, var in rest_flat:
    value = base[p].get_value()
    if jnp.issubdtype(value.dtype, jnp.floating) and value.dtype != dt:
      value = value.astype(dt)
    if p in flat_sh:
      value = jax.device_put(value, flat_sh[p].get_value())
    out.append((p, var.replace(value)))
  out += list(nnx.to_flat_state(adapters))
  return nnx.merge(graphdef, nnx.from_flat_state(out))


# ------------------------------------------------------------- merging


def _key(path) -> str:
  return "/".join(str(p) for p in path)


def _merge_plan(state, cfg) -> tuple:
  """((a key, b key, W key, einsum, scale), ...) of a LoRA state."""
  plan = []
  s = scale(cfg)
  for path, _ in nnx.to_flat_state(state):
    if path[-1] != "a" or not str(path[-2]).endswith(SUFFIX):
      continue
    target = str(path[-2])[: -len(SUFFIX)]
    stacked = path[0] == "layers" and not isinstance(path[1], int)
    plan.append(
        (
            _key(path),
            _key(path[:-1] + ("b",)),
            _key(path[:-2] + (target,)),
            merge_subscripts(TARGETS[target][0], stacked),
            s,
        )
    )
  return tuple(plan)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _merge(flat: dict, plan: tuple, dtype: str) -> dict:
  """W + scale A B per plan entry, in float32, rounded once to dtype;
  every other base array cast to dtype; the adapters dropped."""
  dt = jnp.dtype(dtype)
  out = {}
  deltas = {w: (spec, s, a, b) for a, b, w, spec, s in plan}
  adapters = {a for a, *_ in plan} | {b for _, b, *_ in plan}
  for k, x in flat.items():
    if k in adapters:
      continue
    if k in deltas:
      spec, s, a, b = deltas[k]
      delta = jnp.einsum(
          spec,
          flat[a].astype(jnp.float32),
          flat[b].astype(jnp.float32),
          precision=jax.lax.Precision.HIGHEST,
      )
      x = x.astype(jnp.float32) + s * delta
    out[k] = x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x
  return out


@functools.lru_cache(maxsize=8)
def _abstract_params(cfg0):
  """The nnx.Param variables (abstract) of a Transformer of ``cfg0``."""
  model = nnx.eval_shape(lambda: _transformer(cfg0))
  return nnx.split(model, nnx.Param, ...)[1]


def merged_params(model, cfg, dtype: Optional[str] = None):
  """``(base_config(cfg), params)``: a LoRA model's (a Transformer, or its
  full ``nnx.State``) weights merged, W + (alpha / r) A B, as the params
  (``nnx.Param``) of a Transformer of the base config, in ``dtype``
  (default ``base_dtype(cfg)``), on device where the inputs are. At
  B = 0 each merged weight is its base weight exactly."""
  state = model if isinstance(model, nnx.State) else nnx.state(model, nnx.Param)
  cfg0 = base_config(cfg)
  dtype = str(jnp.dtype(dtype or base_dtype(cfg)))
  flat = {_key(p): v.get_value() for p, v in nnx.to_flat_state(state)}
  out = _merge(flat, _merge_plan(state, cfg), dtype)
  params = [
      (p, var.replace(out[_key(p)]))
      for p, var in nnx.to_flat_state(_abstract_params(cfg0))
  ]
  return cfg0, nnx.from_flat_state(params)


def merged_model(module, cfg, dtype: Optional[str] = None):
  """``(base_config(cfg), Transformer)`` with merged weights
  (``merged_params``); a model without adapters as it is."""
  if not enabled(cfg):
    return cfg, module

  cfg0, params = merged_params(module, cfg, dtype)
  return cfg0, nnx.merge(graphdef_of(cfg0), params)


def adapters_off(params, shardings=None):
  """pi_ref of a LoRA learner: its trainable params all zero (the base with
  no adapter; a critic's head, if any, zeroed too), new buffers placed as
  ``shardings``. The adapters' size, not the model's."""
  return jax.jit(
      lambda t: jax.tree.map(jnp.zeros_like, t), out_shardings=shardings
  )(params)


def nbytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


# ------------------------------------------------------------ PEFT export


def peft_tensors(model, cfg, dtype: str = "float32") -> dict:
  """PEFT tensor name -> numpy array of a LoRA Transformer's adapters:
  ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``
  [r, in] and ``...lora_B.weight`` [out, r] (PyTorch's [out, in] Linear
  layout: B_hf A_hf = (A B)^T, the delta of HF's weight)."""

  state = nnx.state(model, nnx.LoRAParam)
  out = {}
  for path, var in nnx.to_flat_state(state):
    host = hf_io._host_array(var.get_value(), np.dtype(dtype))  # pylint: disable=protected-access
    target, which = str(path[-2])[: -len(SUFFIX)], path[-1]
    stacked = path[0] == "layers" and not isinstance(path[1], int)
    layers = range(host.shape[0]) if stacked else [path[1]]
    for i in layers:
      a = host[i] if stacked else host
      r = int(cfg.lora_rank)
      t = a.reshape(-1, r).T if which == "a" else a.reshape(r, -1).T
      name = (
          f"base_model.model.model.layers.{i}.{TARGETS[target][1]}"
          f".lora_{which.upper()}.weight"
      )
      out[name] = np.ascontiguousarray(t)
  return dict(sorted(out.items()))


def peft_config(cfg, base_model: str = "") -> dict:
  return {
      "peft_type": "LORA",
      "task_type": "CAUSAL_LM",
      "base_model_name_or_path": base_model or None,
      "r": int(cfg.lora_rank),
      "lora_alpha": float(cfg.lora_alpha),
      "lora_dropout": 0.0,
      "target_modules": sorted(
          TARGETS[t][1].split(".")[-1] for t in cfg.lora_targets
      ),
      "bias": "none",
      "fan_in_fan_out": False,
      "use_rslora": False,
      "init_lora_weights": True,
      "inference_mode": True,
      "modules_to_save": None,
  }


def save_peft(
    model, cfg, path: str, *, base_model: str = "", dtype: str = "float32"
) -> int:
  """Writes a PEFT LoRA adapter directory (adapter_config.json,
  adapter_model.safetensors) of ``model``'s adapters; returns the tensor
  bytes. All processes gather, process 0 writes."""

  tensors = peft_tensors(model, cfg, dtype)
  if jax.process_index() == 0:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
      json.dump(peft_config(cfg, base_model), f, indent=2, sort_keys=True)
      f.write("\n")
    hf_io.save_safetensors(
        tensors,
        os.path.join(path, "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
  return int(sum(t.nbytes for t in tensors.values()))
