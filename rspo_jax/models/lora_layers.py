"""LoRA's layer pieces: the adapter module and the config helpers the
Transformer's layers call (models/transformer.py imports this; models/
lora.py, above both, builds, merges and saves LoRA models; its docstring
has the math and the design).

    W x  ->  W x + (alpha / r) B(A(x)),    A [in, r], B [r, out]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

# target -> (the base matmul's einsum, the HF module name of its weight)
TARGETS = {
    "q": ("btd,dhk->bthk", "self_attn.q_proj"),
    "k": ("btd,dhk->bthk", "self_attn.k_proj"),
    "v": ("btd,dhk->bthk", "self_attn.v_proj"),
    "o": ("bthk,hkd->btd", "self_attn.o_proj"),
    "gate": ("btd,df->btf", "mlp.gate_proj"),
    "up": ("btd,df->btf", "mlp.up_proj"),
    "down": ("btf,fd->btd", "mlp.down_proj"),
}
ATTENTION_TARGETS = ("q", "k", "v", "o")
_RANK = "r"  # the rank dimension's einsum letter (unused by TARGETS)
_STACK = "L"  # a scanned model's leading layer axis
SUFFIX = "_lora"  # attribute of target t's adapter: f"{t}_lora" (a, b)


class FrozenParam(nnx.Param):
  """A base weight of a LoRA model: read, never trained (module doc)."""


# What a Learner trains: every Param except a LoRA model's frozen base.
TRAINABLE = nnx.All(nnx.Param, nnx.Not(FrozenParam))


def enabled(cfg) -> bool:
  return int(getattr(cfg, "lora_rank", 0) or 0) > 0


def check(cfg) -> None:
  """ValueError naming a bad ``lora_*`` field."""
  if int(cfg.lora_rank) < 0:
    raise ValueError(
        f"ModelConfig.lora_rank must be >= 0, got" f" {cfg.lora_rank}"
    )
  if not enabled(cfg):
    return
  if not float(cfg.lora_alpha) > 0:
    raise ValueError(
        f"ModelConfig.lora_alpha must be > 0, got" f" {cfg.lora_alpha}"
    )
  targets = cfg.lora_targets
  if isinstance(targets, str) or not targets:
    raise ValueError(
        f"ModelConfig.lora_targets must be a non-empty tuple of"
        f" {tuple(TARGETS)}, got {targets!r}"
    )
  bad = sorted(set(targets) - set(TARGETS))
  if bad:
    raise ValueError(
        f"ModelConfig.lora_targets {bad} unknown; use some of"
        f" {tuple(TARGETS)}"
    )


def parse_targets(text) -> tuple:
  """'q,k,v,o,gate,up,down' (or a sequence) -> a tuple in TARGETS order."""
  items = text.replace(";", ",").split(",") if isinstance(text, str) else text
  items = {str(t).strip() for t in items if str(t).strip()}
  bad = sorted(items - set(TARGETS))
  if bad:
    raise ValueError(
        f"model.lora_targets {bad} unknown; use some of" f" {tuple(TARGETS)}"
    )
  return tuple(t for t in TARGETS if t in items)


def scale(cfg) -> float:
  return float(cfg.lora_alpha) / int(cfg.lora_rank)


def base_dtype(cfg) -> str:
  """The dtype a model's base weights are held in: with LoRA the compute
  dtype (``inference_dtype``: the forward casts every weight to it anyway,
  so outputs are unchanged and the base takes half the memory of float32
  masters under bf16); without, ``param_dtype`` (trained masters)."""
  return cfg.inference_dtype if enabled(cfg) else cfg.param_dtype


def param_kind(cfg):
  """The Variable type of a base weight."""
  return FrozenParam if enabled(cfg) else nnx.Param


def base_config(cfg):
  """``cfg`` without adapters (every ``lora_*`` field at its default): the
  layout of merged weights and exports."""
  if not enabled(cfg):
    return cfg
  return dataclasses.replace(
      cfg,
      **{
          f.name: f.default
          for f in dataclasses.fields(cfg)
          if f.name.startswith("lora_")
      },
  )


def _terms(subscripts: str):
  """'btd,dhk->bthk' -> ('btd', 'dhk', 'bthk', in 'd', out 'hk')."""
  lhs, out = subscripts.split("->")
  x, w = lhs.split(",")
  return (
      x,
      w,
      out,
      "".join(c for c in w if c in x),
      "".join(c for c in w if c in out),
  )


def merge_subscripts(subscripts: str, stacked: bool = False) -> str:
  """The einsum of the weight delta A B in W's layout ('dr,rhk->dhk')."""
  _, w, _, fin, fout = _terms(subscripts)
  s = _STACK if stacked else ""
  return f"{s}{fin}{_RANK},{s}{_RANK}{fout}->{s}{w}"


class Adapter(nnx.Module):
  """``(alpha / r) B(A(x))`` for one base matmul ``einsum(subscripts, x,
  W)``; A [W's input dims..., r], B [r, W's output dims...]."""

  def __init__(self, cfg, subscripts: str, w_shape, w_names, *, rngs: nnx.Rngs):
    x, w, out, fin, fout = _terms(subscripts)
    assert _RANK not in subscripts, subscripts
    dims = dict(zip(w, w_shape))
    names = dict(zip(w, w_names))
    r, pdt = int(cfg.lora_rank), jnp.dtype(cfg.param_dtype)
    a_shape = tuple(dims[c] for c in fin) + (r,)
    bound = 1.0 / math.sqrt(math.prod(dims[c] for c in fin))
    self.a = nnx.LoRAParam(
        jax.random.uniform(rngs.params(), a_shape, pdt, -bound, bound),
        out_sharding=tuple(names[c] for c in fin) + (None,),
    )
    self.b = nnx.LoRAParam(
        jnp.zeros((r,) + tuple(dims[c] for c in fout), pdt),
        out_sharding=(None,) + tuple(names[c] for c in fout),
    )
    rows = "".join(c for c in x if c not in w)
    self.down_spec = f"{x},{fin}{_RANK}->{rows}{_RANK}"
    self.up_spec = f"{rows}{_RANK},{_RANK}{fout}->{out}"
    self.scale = scale(cfg)

  def __call__(self, shard, x):
    """The delta in x's dtype (both einsums through ``shard.einsum``)."""
    u = shard.einsum(
        self.down_spec,
        x,
        self.a.value,
        self.a.get_metadata().get("out_sharding"),
    )
    u = u * jnp.asarray(self.scale, u.dtype)
    return shard.einsum(
        self.up_spec, u, self.b.value, self.b.get_metadata().get("out_sharding")
    )


def adapter(
    cfg, target: str, w_shape, w_names, *, rngs: nnx.Rngs
) -> Optional[Adapter]:
  """Target ``target``'s adapter, or None (LoRA off / not a target)."""
  if not enabled(cfg) or target not in cfg.lora_targets:
    return None
  return Adapter(cfg, TARGETS[target][0], w_shape, w_names, rngs=rngs)
