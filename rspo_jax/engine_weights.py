"""The policy's weights as the rollout engine holds them, and the sync
that pushes a learner's weights to an engine.

Conversions: LoRA merged (``merged``, ``base_model``), cast to the
inference dtype (``cast_floating``, ``inference_params``), a scanned
model's stacks unrolled into the engine's layout (``engine_config``,
``engine_params``, ``inference_model``). The sync (``make_sync_engine``):
in-process for the JAX engine, an HF export or a LoRA adapter over disk for
SGLang servers, or a broadcast (``make_weight_push``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rspo_jax import distributed, weight_sync
from rspo_jax.errors import ConfigError
from rspo_jax.learner import Learner
from rspo_jax.models import lora
from rspo_jax.models import transformer as tfm
from rspo_jax.models.config import LORA_SYNCS
from rspo_jax.rollout.jax_engine import JaxEngine

log = logging.getLogger(__name__)


def _module(learner_or_module):
  if isinstance(learner_or_module, Learner):
    return learner_or_module.module()
  return learner_or_module


def merged(learner_or_module, mcfg):
  """(ModelConfig, Transformer) the engine and exports see: with LoRA the
  base config and the merged weights (``lora.merged_model``, on device);
  else the module as it is."""
  return lora.merged_model(_module(learner_or_module), mcfg)


def cast_floating(tree, dtype):
  """Floating leaves of ``tree`` cast to ``dtype`` (device arrays keep
  their sharding, numpy stays numpy); other leaves as they are."""
  dt = jnp.dtype(dtype)

  def cast(x):
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt:
      return x.astype(dt)
    return x

  return jax.tree.map(cast, tree)


def inference_params(params, mcfg, shardings=None):
  """A copy of ``params`` for a model only run forward (pi_ref) in
  ``mcfg.inference_dtype``: new buffers (training donates its own), the same
  outputs as ``params`` (the forward casts each weight to the compute dtype
  anyway), half the memory of float32 masters under bfloat16 compute."""
  dt = jnp.dtype(mcfg.inference_dtype)

  def copy(x):
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt:
      return x.astype(dt)
    return jnp.copy(x)  # an explicit copy: jit would forward the input

  return jax.jit(lambda t: jax.tree.map(copy, t), out_shardings=shardings)(
      params
  )


def inference_model(model, mcfg):
  """``(graphdef, params, rest)`` of an NNX module (or of such a tuple)
  with the params in ``mcfg.inference_dtype``: what the rollout engine
  holds (it copies them onto its mesh and casts later syncs to the same
  dtypes). A scanned model comes in the unrolled layout the engine runs
  (``engine_config``, ``engine_params``)."""
  if isinstance(model, nnx.Module):
    mcfg, model = merged(model, mcfg)  # LoRA: merged weights
    model = nnx.split(model, nnx.Param, ...)
  graphdef, params, *rest = model
  if mcfg.scan_layers:
    params = engine_params(params, mcfg)  # cast and unrolled
    rest = [tfm.unrolled_state(r) if "layers" in r else r for r in rest]
  else:
    params = cast_floating(params, mcfg.inference_dtype)
  if mcfg.scan_layers or mcfg.remat != "none":
    graphdef = tfm.graphdef_of(engine_config(mcfg))
  return (graphdef, params, *rest)


def engine_config(mcfg):
  """The rollout engine's ModelConfig: the policy's, with unrolled layers
  (per-layer KV-cache buffers written in place at each decode step;
  ``transformer.unrolled``) and no remat (nothing is differentiated; a
  remat block inside the decode loop fails to trace)."""
  return dataclasses.replace(
      lora.base_config(mcfg), scan_layers=False, remat=False
  )


@functools.partial(jax.jit, static_argnums=1)
def _unrolled_inference_params(params, dtype):
  return tfm.unrolled_state(cast_floating(params, dtype))


def engine_params(params, mcfg):
  """A learner's params in the layout the engine runs: a scanned model's
  layer stacks sliced into layers, cast to ``mcfg.inference_dtype`` first
  (on device: one jitted copy in the narrow dtype; host arrays stay on the
  host); an unrolled model's params as they are."""
  if not mcfg.scan_layers:
    return params
  if all(isinstance(x, np.ndarray) for x in jax.tree.leaves(params)):
    return tfm.unrolled_state(cast_floating(params, mcfg.inference_dtype))
  return _unrolled_inference_params(params, mcfg.inference_dtype)


def base_model(learner_or_module, mcfg):
  """(base config, Transformer) of a LoRA model's frozen base: the merged
  weights with every adapter zero, i.e. the base exactly (``merged``)."""
  graphdef, adapters, rest = nnx.split(
      _module(learner_or_module), nnx.LoRAParam, ...
  )
  zero = jax.tree.map(jnp.zeros_like, adapters)
  return merged(nnx.merge(graphdef, zero, rest), mcfg)


def make_sync_engine(
    mcfg,
    tokenizer_dir: str,
    export_dir: str,
    *,
    threads: int = 8,
    push=None,
    lora_sync: str = "auto",
) -> "EngineSync":
  """Pushes a learner's weights to the engine: in-process state for the JAX
  engine (cast to its ``mcfg.inference_dtype`` weights); for SGLang servers
  an HF directory exported in the compute dtype (``weight_sync.export_hf``:
  layer files written by ``threads`` threads into ``export_dir``'s slot
  ``v{version % 2}``; the other slot is removed once the servers loaded it;
  multi-host, ``weight_sync.export_hf_multihost``: each host writes its
  share of the layer files, no host gathers the whole model),
  or with ``push`` (``rollout.weight_sync='distributed'``: a
  ``distributed_sync.DistributedPush``) the same tensors, in the compute
  dtype, broadcast to the servers one batch at a time, no file written.
  A sync whose weights the engine already has does nothing
  (``weight_sync.SyncedWeights``). ``sync.log`` (``weight_sync.SyncLog``)
  counts exports, broadcasts and skips and keeps each sync's seconds (also
  logged); ``sync.close()`` closes ``push``'s groups.

  LoRA policies on SGLang servers (``lora_sync``, the config's
  ``rollout.sglang_lora_sync``; one process, disk sync): 'adapter' writes
  only the PEFT adapter directory (``lora.save_peft``, float32) into slot
  ``adapter_v{version % 2}`` and has the servers load it
  (``SGLangClient.update_adapter``); the frozen base is exported once, at
  the first such sync, into ``export_dir/lora_base`` (kept for servers that
  restart) and loaded by each server once. 'merged' exports W + (alpha / r)
  A B in full every sync, as without LoRA. 'auto' (default) tries the
  adapter at an engine's first sync and, when a server refuses it (started
  without --enable-lora, or with a smaller --max-lora-rank), warns once and
  syncs that engine merged for the rest of the run; a refusal after
  adapters worked is an error. ``sync.log``'s entries then carry
  ``adapter`` (True for adapter syncs) and ``base_bytes`` (the one base
  export)."""
  if lora_sync not in LORA_SYNCS:
    raise ConfigError(
        f"rollout.sglang_lora_sync={lora_sync!r}: one of" f" {LORA_SYNCS}"
    )
  return EngineSync(
      mcfg,
      tokenizer_dir,
      export_dir,
      threads=threads,
      push=push,
      lora_sync=lora_sync,
  )


class EngineSync:
  """``sync(engine, learner, version)``: see :func:`make_sync_engine`."""

  def __init__(
      self, mcfg, tokenizer_dir, export_dir, *, threads, push, lora_sync
  ):
    self.mcfg, self.tokenizer_dir, self.export_dir = (
        mcfg,
        tokenizer_dir,
        export_dir,
    )
    self.threads, self.push, self.lora_sync = threads, push, lora_sync
    self.synced, self.log = weight_sync.SyncedWeights(), weight_sync.SyncLog()
    self.lora_modes = {}  # id(engine) -> 'adapter' | 'merged', once decided
    self.base_dir = os.path.join(export_dir, "lora_base")
    self.base_written = []

  def close(self) -> None:
    if self.push is not None:
      self.push.close()

  def __call__(self, engine, learner: Learner, version: int):
    if self.synced.unchanged(engine, learner):
      self.log.add(version=version, skipped=True)
      return
    start = time.perf_counter()
    multihost = distributed.is_multihost()
    if self.push is not None and not isinstance(engine, JaxEngine):
      self._broadcast(engine, learner, version, start)
      return
    if isinstance(engine, JaxEngine):
      self._in_process(engine, learner, version, start, multihost)
      return
    if (
        lora.enabled(self.mcfg)
        and self.lora_sync != "merged"
        and not multihost
        and self.lora_modes.get(id(engine)) != "merged"
        and hasattr(engine, "update_adapter")
    ):
      if self._adapter(engine, learner, version, start):
        return
      start = time.perf_counter()
    self._export(engine, learner, version, start, multihost)

  def _broadcast(self, engine, learner, version, start):
    # One process (check_multihost): its first device holds each tensor
    # whole for a DLPack hand-over under nccl; gloo sends host copies.
    device = None if self.push.on_host else jax.local_devices()[0]
    out = self.push(
        engine,
        weight_sync.hf_named_arrays(
            *merged(learner, self.mcfg)[::-1], device=device
        ),
        version,
    )
    self.synced.record(engine, learner)
    self.log.add(
        version=version,
        broadcast_s=out["seconds"],
        total_s=time.perf_counter() - start,
        bytes=out["bytes"],
    )

  def _in_process(self, engine, learner, version, start, multihost):
    # Multi-host: every host's engine gets the whole weights (split over
    # the engine's 'tensor' axis), cast first so half the bytes move
    # under bfloat16 compute, resharded device to device onto its host
    # mesh (no host copy; the SGLang export below shares the files out
    # instead).
    mcfg = self.mcfg
    if lora.enabled(mcfg):  # merged on device (lora.merged_params)
      cfg0, params = lora.merged_params(learner.module(), mcfg)
      params = engine_params(params, cfg0)
    else:
      params = engine_params(learner.params, mcfg)
    if multihost:
      params = distributed.to_host_mesh(
          cast_floating(params, mcfg.inference_dtype),
          learner.mesh,
          engine.param_shardings,
      )
    engine.update_weights(params, version)
    self.synced.record(engine, learner)
    self.log.add(version=version, total_s=time.perf_counter() - start)

  def _adapter(self, engine, learner, version, start) -> bool:
    """The adapter route; False when 'auto' falls back to merged."""
    from rspo_jax.rollout.sglang_client import SGLangAdapterRefused  # pylint: disable=g-import-not-at-top

    export_dir, base_dir = self.export_dir, self.base_dir
    base_bytes = None
    if not self.base_written:
      base_bytes = weight_sync.export_hf(
          *base_model(learner, self.mcfg)[::-1],
          base_dir,
          tokenizer_dir=self.tokenizer_dir,
          threads=self.threads,
      )
      self.base_written.append(base_dir)
    path = os.path.join(export_dir, f"adapter_v{version % 2}")
    shutil.rmtree(path, ignore_errors=True)
    nbytes = lora.save_peft(
        learner.module(), self.mcfg, path, base_model=os.path.abspath(base_dir)
    )
    export_s = time.perf_counter() - start
    try:
      engine.update_adapter(path, version, base_dir=base_dir)
    except SGLangAdapterRefused as e:
      if (
          self.lora_sync == "adapter"
          or self.lora_modes.get(id(engine)) == "adapter"
      ):
        raise
      log.warning(
          "LoRA adapter sync refused (%s); syncing merged weights"
          " (rollout.sglang_lora_sync=merged) from now on",
          e,
      )
      self.lora_modes[id(engine)] = "merged"
      shutil.rmtree(path, ignore_errors=True)
      if "adapter" not in self.lora_modes.values():  # no engine needs base
        shutil.rmtree(base_dir, ignore_errors=True)
        self.base_written.clear()
      return False
    self.lora_modes[id(engine)] = "adapter"
    shutil.rmtree(
        os.path.join(export_dir, f"adapter_v{(version + 1) % 2}"),
        ignore_errors=True,
    )
    self.synced.record(engine, learner)
    self.log.add(
        version=version,
        export_s=export_s,
        load_s=time.perf_counter() - start - export_s,
        total_s=time.perf_counter() - start,
        bytes=nbytes,
        adapter=True,
        base_bytes=base_bytes,
    )
    return True

  def _export(self, engine, learner, version, start, multihost):
    path = os.path.join(self.export_dir, f"v{version % 2}")
    if multihost:
      # One directory, its layer files written by their owning hosts (no
      # host holds the model; weight_sync.export_hf_multihost); it returns
      # when the directory is complete, then every host's client loads it.
      nbytes = weight_sync.export_hf_multihost(
          *merged(learner, self.mcfg)[::-1],
          path,
          tokenizer_dir=self.tokenizer_dir,
      )
    else:
      nbytes = weight_sync.export_hf(
          *merged(learner, self.mcfg)[::-1],
          path,
          tokenizer_dir=self.tokenizer_dir,
          threads=self.threads,
      )
    export_s = time.perf_counter() - start
    engine.update_weights(path, version)
    load_s = time.perf_counter() - start - export_s
    if distributed.is_leader():  # loaded: the other slot is not needed
      shutil.rmtree(
          os.path.join(self.export_dir, f"v{(version + 1) % 2}"),
          ignore_errors=True,
      )
    self.synced.record(engine, learner)
    self.log.add(
        version=version,
        export_s=export_s,
        load_s=load_s,
        total_s=time.perf_counter() - start,
        bytes=nbytes,
    )


WEIGHT_SYNCS = ("disk", "distributed")


def make_weight_push(cfg):
  """``rollout.weight_sync``: None for 'disk' (or the in-process engine),
  a ``distributed_sync.DistributedPush`` for 'distributed' (ImportError
  naming the fix when torch is not importable here)."""
  how = cfg.rollout.weight_sync
  if how not in WEIGHT_SYNCS:
    raise ConfigError(f"rollout.weight_sync={how!r}: one of {WEIGHT_SYNCS}")
  if how == "disk" or cfg.rollout.engine != "sglang":
    return None
  from rspo_jax.rollout import distributed_sync  # pylint: disable=g-import-not-at-top

  r = cfg.rollout
  return distributed_sync.DistributedPush(
      backend=r.weight_sync_backend,
      master_address=r.weight_sync_master_address,
      master_port=int(r.weight_sync_master_port),
      bucket_bytes=int(float(r.weight_sync_bucket_mb) * 2**20),
      timeout_s=float(r.server_timeout_s),
  )
