"""What the plan chooses and refuses: ``model.remat`` at 'auto',
``rollout.prefill_chunk`` and ``rollout.engine_max_rows`` at None
(``choose``), written into a run's config at its start
(``resolve_run``); when the estimate does not fit, the one-key change
that makes it fit (``fit_message``); overlap on several devices, which
would deadlock (``overlap_problem``).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

from rspo_jax.plan.layout import _device_limit_gb, resolve_layout, usable_gb
from rspo_jax.plan.memory import (
    AUTO,
    engine_shapes,
    memory_per_device,
    plan_model_config,
    remat_of,
    train_rows,
)

# A choice must fit in this share of the usable memory: the estimates are
# within 10 % of what XLA compiles at the calibrated shapes
# (tests/plan_compiled_test.py; 0.8 at short sequences), so a choice at
# 98 % of the device would not be one.
CHOICE_HEADROOM = 0.9
REMAT_BY = (
    "plan: the lightest of none, dots, full whose train step fits"
    f" in {CHOICE_HEADROOM:g} of the usable memory"
)
CHUNK_BY = (
    f"plan: one pass (0) if the prefill fits in {CHOICE_HEADROOM:g}"
    " of the usable memory, else the widest block that does"
)
ROWS_BY = (
    "plan: no cap (0) if a prefill of a host's episodes fits in"
    f" {CHOICE_HEADROOM:g} of the usable memory (at some prefill"
    " block), else the most rows a call that do"
)


def prefill_chunks(prompt: int) -> list:
  """The prefill block widths the plan tries for prompt bucket ``prompt``,
  widest first: 0 (one pass), then powers of 2 below ``prompt - 1`` down to
  the narrowest block the engine runs (``jax_engine.prefill_block``: at
  most ``MAX_PREFILL_BLOCKS`` blocks)."""
  from rspo_jax.rollout.jax_engine import prefill_block

  out = [0]
  for k in range(max(prompt - 2, 1).bit_length() - 1, 5, -1):
    block = prefill_block(1 << k, prompt)
    if block not in out:
      out.append(block)
  return out


def with_keys(cfg, keys: Mapping):
  """A copy of ``cfg`` with the dotted ``keys`` set (``{'model.remat':
  'dots'}``)."""
  import copy

  out = copy.deepcopy(cfg)
  with out.unlocked():
    for key, value in keys.items():
      node, _, leaf = key.rpartition(".")
      target = out
      for part in filter(None, node.split(".")):
        target = target[part]
      target[leaf] = value
  return out


def _memory(cfg, mesh, layout, mcfg=None, **kw) -> dict:
  return memory_per_device(
      cfg, mcfg or plan_model_config(cfg), mesh, layout, **kw
  )


def _fits(mem, usable, phase=None) -> bool:
  key = {"train": "train_transient_GB", "rollout": "rollout_transient_GB"}.get(
      phase
  )
  need = mem["resident_GB"] + mem[key] if key else mem["total_GB"]
  return need <= usable


def engine_row_caps(cfg, layout) -> list:
  """The ``rollout.engine_max_rows`` the plan tries, most rows first: 0
  (no cap: a host's episodes in calls of ``engine_shapes``' rows), then
  each smaller batch bucket down to 1."""
  from rspo_jax.rollout.jax_engine import BATCH_BUCKETS

  rows = engine_shapes(cfg, layout, max_rows=0)["rows"]
  return [0] + [b for b in sorted(BATCH_BUCKETS, reverse=True) if b < rows]


def choose(cfg, layout, usable: Optional[float]) -> dict:
  """{config key: {"value", "by"}} for ``model.remat``,
  ``rollout.prefill_chunk`` and ``rollout.engine_max_rows`` (the last two
  in-process engine only), each as given or, at 'auto' / None, chosen on
  ``usable`` GiB a device: the lightest remat policy (none, dots, full)
  whose train step fits beside the resident state; for the rollout the
  most rows a call (``engine_row_caps``: no cap first) at which some
  prefill block fits, and at those rows one pass over the prompt if it
  fits, else the widest block of ``prefill_chunks`` that does (the
  fewest rows and narrowest block when none does): fewer rows a call cost
  decode steps (each call's loop reads the weights), narrower blocks
  little. "Fits" in ``CHOICE_HEADROOM`` of ``usable``. Unknown ``usable``
  (None): remat 'full', the engine's default blocks, no row cap."""
  from rspo_jax.models.config import REMAT_POLICIES

  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  remat_auto = str(cfg.model.remat).strip().lower() == AUTO
  chunk = cfg.rollout.prefill_chunk
  max_rows = cfg.rollout.engine_max_rows
  in_process = cfg.rollout.engine == "jax"
  out = {"model.remat": {"value": remat_of(cfg), "by": "config"}}
  if in_process:
    out["rollout.prefill_chunk"] = {
        "value": chunk,
        "by": "config"
        if chunk is not None
        else "engine default (64 on CPU, one pass elsewhere)",
    }
    out["rollout.engine_max_rows"] = {
        "value": max_rows,
        "by": "config" if max_rows is not None else "engine default (no cap)",
    }
  if usable is None:
    if remat_auto:
      out["model.remat"]["by"] = (
          "plan: no device memory to plan with" " (mesh.device_memory_gb)"
      )
    return out
  import dataclasses

  mcfg = plan_model_config(cfg)
  room = usable * CHOICE_HEADROOM
  if remat_auto:
    for policy in REMAT_POLICIES:
      mem = _memory(cfg, mesh, layout, dataclasses.replace(mcfg, remat=policy))
      if _fits(mem, room, "train"):
        break
    out["model.remat"] = {"value": policy, "by": REMAT_BY}
  if in_process and (chunk is None or max_rows is None):
    prompt = engine_shapes(cfg, layout)["prompt"]
    chunks = prefill_chunks(prompt) if chunk is None else [chunk]
    caps = engine_row_caps(cfg, layout) if max_rows is None else [max_rows]
    fit = None
    for cap in caps:
      for c in chunks:
        mem = _memory(cfg, mesh, layout, mcfg, prefill_chunk=c, max_rows=cap)
        if _fits(mem, room, "rollout"):
          fit = (cap, c)
          break
      if fit:
        break
    cap, c = fit or (caps[-1], chunks[-1])
    if chunk is None:
      out["rollout.prefill_chunk"] = {"value": c, "by": CHUNK_BY}
    if max_rows is None:
      out["rollout.engine_max_rows"] = {"value": cap, "by": ROWS_BY}
  return out


def resolved(cfg, choices: dict):
  """``cfg`` with the plan's choices (``choose``) written in."""
  return with_keys(cfg, {k: v["value"] for k, v in choices.items()})


def _trial_fixes(cfg, layout) -> list:
  """One-key changes that cut a device's memory, least disruptive first:
  ({key: value}, what it does)."""
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  per = layout["devices_per_host"] if layout["hosts"] > 1 else math.prod(mesh)
  fixes = []
  if cfg.rollout.engine == "jax":
    t_now = int(cfg.rollout.engine_tensor) or mesh[2]
    for t in range(t_now + 1, per + 1):
      if per % t == 0:
        fixes.append(
            (
                {"rollout.engine_tensor": t},
                "the engine's weights split over more devices",
            )
        )
  if mesh[0] > 1:
    fixes.append(
        (
            {"mesh.shape": (1, mesh[0] * mesh[1], mesh[2])},
            "FSDP over every device (--mesh=...:data=1)",
        )
    )
  if cfg.rollout.engine == "jax":
    fixes.append(
        (
            {"rollout.engine": "sglang"},
            "rollout on SGLang servers, off the learner devices",
        )
    )
  micro = train_rows(cfg)
  ways = mesh[0] * mesh[1]
  while micro // 2 >= ways and micro > 1:
    micro //= 2
    fixes.append(({"train.micro_batch_rows": micro}, "smaller micro-batches"))
  return fixes


def fit_message(cfg, layout, usable: float) -> Optional[str]:
  """None when the run fits ``usable`` GiB a device with the plan's
  choices; else one line: what does not fit and the config key to change
  (the first one-key change of ``_trial_fixes`` that fits, with its
  estimate, or the closest when none does)."""
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  plan_cfg = resolved(cfg, choose(cfg, layout, usable))
  mem = _memory(plan_cfg, mesh, layout)
  if _fits(mem, usable):
    return None
  what = (
      f"{cfg.model.preset} {cfg.env.name} {cfg.algo.name} on mesh"
      f" {'x'.join(map(str, mesh))} ({layout['devices']}"
      f" {layout['platform']} devices): {mem['total_GB']:.1f} GB a device"
      f" (resident {mem['resident_GB']:.1f} + {mem['peak_phase']})"
      f" exceeds the {usable:.1f} GB usable"
  )
  best = None
  for keys, why in _trial_fixes(cfg, layout):
    trial = with_keys(cfg, keys)
    tl = dict(layout)
    if "mesh.shape" in keys:
      tl = dict(
          layout, mesh=dict(zip(("data", "fsdp", "tensor"), keys["mesh.shape"]))
      )
    tmesh = [tl["mesh"][a] for a in ("data", "fsdp", "tensor")]
    try:
      got = _memory(resolved(trial, choose(trial, tl, usable)), tmesh, tl)
    except ValueError:
      continue
    change = ",".join(f"{k}={v}" for k, v in keys.items()).replace(" ", "")
    if _fits(got, usable):
      return f"{what}; set {change} ({why}: {got['total_GB']:.1f} GB)"
    if best is None or got["total_GB"] < best[0]:
      best = (got["total_GB"], change, why)
  closest = (
      f"; no one key fits it (closest: {best[1]}, {best[2]}:"
      f" {best[0]:.1f} GB)"
      if best
      else ""
  )
  return (
      f"{what}{closest}: add devices (a larger mesh, --mesh) or take a"
      " smaller model (model=)"
  )


def resolve_run(cfg, environ: Optional[Mapping[str, str]] = None) -> dict:
  """At the start of a run (``build.build_run``): writes the plan's
  choices (``choose``) into ``cfg`` -- ``model.remat`` at 'auto',
  ``rollout.prefill_chunk`` and ``rollout.engine_max_rows`` at None -- on
  the mesh config's device memory,
  else the devices' own limit (``memory_stats()['bytes_limit']``, the
  smallest of every host's; none on CPU: no plan). Returns the choices
  and, when the estimate does not fit and ``RSPO_ALLOW_PLAN_OVERFLOW=1``
  (``launch/train.py --allow_plan_overflow``), ``"warning"``: the dry
  run's message, and the run goes on.

  Raises:
    ConfigError: the estimate does not fit (the dry run's line naming the
      key to change), unless overflow is allowed; or overlap on more than
      one device (``overlap_problem``), always.
  """
  from rspo_jax.errors import ConfigError

  environ = os.environ if environ is None else environ
  layout = resolve_layout(cfg, environ)
  problem = overlap_problem(cfg, layout)
  if problem:
    raise ConfigError(problem)
  usable, _ = usable_gb(cfg, layout, environ)
  if usable is None:
    usable = _device_limit_gb()
  choices = choose(cfg, layout, usable)
  with cfg.unlocked():
    for key, v in choices.items():
      node, _, leaf = key.partition(".")
      cfg[node][leaf] = v["value"]
  out = dict(choices)
  if usable is not None:
    message = fit_message(cfg, layout, usable)
    if message and not overflow_allowed(environ):
      raise ConfigError(f"{message} ({ALLOW_FLAG} runs it anyway)")
    if message:
      out["warning"] = message
  return out


ALLOW_ENV = "RSPO_ALLOW_PLAN_OVERFLOW"  # 1: a plan that does not fit runs
ALLOW_FLAG = "--allow_plan_overflow"  # launch/train.py's flag that sets it


def overflow_allowed(environ: Mapping[str, str]) -> bool:
  """Whether a run whose plan does not fit goes on (``ALLOW_ENV`` = 1)."""
  return environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def overlap_problem(cfg, layout) -> Optional[str]:
  """One line when ``rollout.overlap=1`` would launch collective programs
  from two threads on the same devices, else None. Overlap's thread runs
  the in-process engine's prefill and decode (compiled over the learner's
  mesh: an all-reduce over 'fsdp') and, with
  ``rspo.recompute_behavior_logp``, a log-prob pass over the learner's
  mesh, while the main thread's update runs its own collectives there:
  two threads enqueueing collectives in different orders on the same
  devices is a known NCCL deadlock. On one device there are none."""
  if not int(cfg.rollout.overlap):
    return None
  devices = math.prod(layout["mesh"].values())
  if devices <= 1:
    return None
  in_process = cfg.rollout.engine == "jax"
  recompute = bool(cfg.rspo.recompute_behavior_logp)
  if not (in_process or recompute):
    return None  # the thread only talks HTTP to SGLang servers
  what = (
      "the in-process engine's prefill and decode"
      if in_process
      else "the behaviour log-prob pass (rspo.recompute_behavior_logp)"
  )
  return (
      f"rollout.overlap=1 on {devices} devices: overlap's thread would"
      f" run {what} beside the update, two threads launching"
      " collectives on the same devices (a NCCL deadlock); set"
      " rollout.overlap=0, or run on one device"
      + (
          ""
          if not in_process
          else ", or rollout.engine=sglang with"
          " rspo.recompute_behavior_logp=False"
      )
  )
