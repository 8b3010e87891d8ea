"""A finished run's policy A as a Hugging Face directory (launch/export.py).

The run's latest checkpoint (``<workdir>/checkpoints/<step>``, what
launch/eval.py evaluates with ``--workdir``) holds A's train state (item
'policy': params + optimizer state) and, for PPO, the critic's; only A's
params are written, in ``param_dtype`` (the float32 masters exactly), with
the run's tokenizer: ``config.json``, ``generation_config.json``,
``model.safetensors``, tokenizer files, and ``export.json`` (the checkpoint
step, A's steps, the weights' bytes). Evaluating it
(``model.checkpoint_dir=<dir>``, no checkpoint in the eval's workdir) gives
what evaluating the checkpoint gives: both load the same float32 params.

The model is built as the run built it (``build``): the structure and
numerics of its starting policy (``model.checkpoint_dir``, else
``<workdir>/warm_start``) with the run's ``model_numerics``, A's learner
with the run's optimizer (the restore needs the optimizer state's shapes).
Nothing is trained and no tokenizer is made: a missing starting policy or
tokenizer is an error. ``max_bytes``: a policy whose params take more bytes
than that (counted from the shapes before any weight is read) is not
exported.

LoRA runs (``model.lora_rank`` > 0): the checkpoint holds A's adapters;
the export writes the merged weights, W + (alpha / r) A B in float32, as
the HF directory above (the base config: any HF tool loads it), and the
adapters alone as a PEFT directory in ``<out>/adapter``
(``adapter_config.json``, ``adapter_model.safetensors`` with PEFT's names,
``lora.save_peft``) for tools that load adapters onto the base.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

EXPORT_JSON = "export.json"
ADAPTER_DIR = "adapter"  # LoRA runs: the PEFT adapter directory in out


def starting_policy_dir(cfg, workdir: str) -> str:
  return cfg.model.checkpoint_dir or os.path.join(workdir, "warm_start")


def tokenizer_dir(cfg, workdir: str) -> str:
  """The tokenizer the run used (``build.make_tokenizer``'s path)."""
  return (
      cfg.model.tokenizer_dir
      or cfg.model.checkpoint_dir
      or os.path.join(workdir, "tokenizer")
  )


def param_bytes(mcfg) -> int:
  """Bytes of a model's params in ``mcfg.param_dtype``, from the shapes
  alone: sum over params of prod(shape) * itemsize."""
  from rspo_jax.models.transformer import Transformer

  abstract = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
  n = sum(
      math.prod(x.shape)
      for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))
  )
  return int(n) * jnp.dtype(mcfg.param_dtype).itemsize


def export_latest_policy(
    cfg, workdir: str, out: str, *, max_bytes: Optional[int] = None
) -> dict:
  """Writes A of ``workdir``'s latest checkpoint into ``out`` (module
  docstring); {'exported': bool, 'bytes', 'step', 'a_steps'} ('reason'
  when not exported)."""
  from rspo_jax import build, models, sharding
  from rspo_jax import train_step as ts
  from rspo_jax.checkpoint import RunCheckpointer
  from rspo_jax.errors import ConfigError
  from rspo_jax.models import lora
  from rspo_jax.models.hf_io import read_config

  start, tok = starting_policy_dir(cfg, workdir), tokenizer_dir(cfg, workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  for path, what in (
      (os.path.join(start, "config.json"), "starting policy"),
      (ckpt_dir, "checkpoints"),
  ):
    if not os.path.exists(path):
      raise ConfigError(
          f"{path}: no such file or directory (the run's"
          f" {what}); the export builds A as the run did"
      )
  if not any(
      os.path.isfile(os.path.join(tok, f))
      for f in ("tokenizer.json", "tokenizer_config.json")
  ):
    raise ConfigError(f"{tok} holds no tokenizer (the run's)")
  mcfg = dataclasses.replace(read_config(start), **build.model_numerics(cfg))
  size = param_bytes(mcfg)
  if max_bytes is not None and size > max_bytes:
    return {
        "exported": False,
        "bytes": size,
        "reason": f"{size} bytes of params > max_bytes={max_bytes}",
    }
  mesh = sharding.make_mesh(tuple(cfg.mesh.shape))
  mcfg, module = build.load_policy(cfg, start, mesh)
  mcfg, module = build.with_lora(cfg, mcfg, module, mesh)
  learner = build.make_policy_learner(
      cfg,
      module,
      mesh,
      lr=cfg.train.lr,
      loss_fn=ts.make_policy_loss(
          build.policy_loss_config(cfg, rspo=cfg.rspo.enabled)
      ),
  )
  ckpt = RunCheckpointer(ckpt_dir)
  try:
    step = ckpt.latest_step()
    if step is None:
      raise ConfigError(f"{ckpt_dir}: no checkpoint to export")
    states, meta = ckpt.restore({"policy": learner.state}, step=step)
  finally:
    ckpt.close()
  learner.state = states["policy"]
  base_cfg, merged = build.merged(learner, mcfg)
  models.save_hf_model(
      merged, base_cfg, out, tokenizer_dir=tok, dtype=mcfg.param_dtype
  )
  info = {
      "exported": True,
      "bytes": size,
      "step": int(step),
      "a_steps": int(meta.get("a_steps", 0)),
  }
  if lora.enabled(mcfg):
    info["adapter_bytes"] = lora.save_peft(
        learner.module(),
        mcfg,
        os.path.join(out, ADAPTER_DIR),
        base_model=os.path.abspath(start),
    )
  with open(os.path.join(out, EXPORT_JSON), "w") as f:
    json.dump(info, f, indent=1)
  return info
