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

Memory per device (docs/scale_out.md works the numbers; GB = 2**30
bytes), modelled on what the programs compile to (``train_step_bytes``,
``logprob_bytes``, ``prefill_bytes``; tests/plan_test.py checks each
against ``memory_analysis()`` of small compiled shapes on CPU):

  P, P_layer  policy parameters, of one block; w, c, i the bytes of the
              parameter (float32 masters), compute (bfloat16) and inference
              (the narrower: pi_ref, engine) dtypes
  shard = fsdp * tensor, ways = data * fsdp, t = tensor
  U, n  = rows of one optimizer update (``update_rows``: a mini-batch) and
          its micro-batches, ceil(U / ``train.micro_batch_rows``)
  r     = ceil(micro-batch rows / ways): rows a device computes at once
  T     = max_prompt_tokens + max_new_tokens, W = max_new_tokens (logits
          on the response window only)

  resident (held for the whole run):
    policy_A = 3 w P / shard             (masters, Adam m and v)
    policy_B = policy_A                  (RSPO with B; PPO: critic too)
    ref      = i P / shard               (pi_ref's inference copy)
    engine   = i P / t                   (in-process engine: whole on each
                                          row shard, split over 'tensor')
    prm      = c P / shard               (rspo.dense_reward=prm backbone;
                                          multi-host: / devices a host)
  train step transient (``train_step_bytes``): the larger of
    update   = 4 w P / shard             (grads, new params, m, v)
    backward = w P / shard [grads] (+ w P / shard, their sum: n > 1)
               + c P / shard [compute copy] + P_layer c / t [FSDP gather]
               + carries [remat] + max(one block, 2 r W V / t x 4)
    width    = 8 d + 3 F / t + (H + 2K) hd / t   (float32 a token)
    one block = 0.6 r T 4 width + 3.5 r (H / t) T^2 4 [scores, unless
                attention is fused: cuDNN]; remat none: the larger of 2
                P_layer w / t and 0.8 x that
    carries  = full: L r T d c; dots: L r T (c (3 d + (H + 2K) hd / t)
               + 4 x 2 F / t); none: L (1.6 r T 4 width + 2.0 r (H / t)
               T^2 4 [scores, unless fused])  (``remat_carries``)
  log-prob transient (pi_old, pi_ref of U rows in chunks of r a device;
    ``logprob_bytes``)
  rollout transient (``prefill_bytes``): the KV cache of a prefill call's
    rows r_e (at most ``rollout.engine_max_rows``, ``engine_shapes``)
    1.5 times in one pass (the decode rows' and, when prompts repeat, the
    distinct ones' of at most half the rows), twice in blocks (XLA copies
    it) + 3 float32 score copies [r_e, H / t, Pb - 1, S] (the KV-cache
    path never uses a fused kernel)

  total  = resident + max(train, log-prob, rollout transients)

  overlap (``rollout.overlap=1``, one device only: ``overlap_problem``):
  A's next collection runs beside the update, so
    snapshot = w P / shard               (the weights it plays, when
                                          rspo.recompute_behavior_logp;
                                          LoRA: w P_a / shard), resident
    train    = train transient + max(rollout, log-prob transients)

  LoRA (``model.lora_rank`` = r > 0, ``models/lora.py``): the trained
  parameters are the adapters, P_a = L r sum over targets of (in + out)
  (``adapter_params``: q d + H hd, k and v d + K hd, o H hd + d, gate and
  up d + F, down F + d), float32; the whole model is a frozen base held
  once in the inference dtype and shared by A, B, pi_ref and a critic:
    base     = i P / shard               (the frozen base, once)
    policy_A = 3 w P_a / shard           (adapters, Adam m and v)
    policy_B = policy_A; critic (PPO) the same (its value head's d + 1
               parameters ignored, as without LoRA)
    ref      = w P_a / shard             (pi_ref: A's adapters zeroed; no
                                          copy of the base)
    engine   = i P / t                   (merged weights, as without LoRA)
  and in the train step P_a takes P's place in the gradients, the update
  and the compute copy (the base needs none: i = c); the FSDP gather,
  remat carries, block and logits are those of the full model (the
  backward runs through the frozen base), plus the running block's frozen
  weights in float32, P_layer 4 / t.
  usable = mesh.device_memory_gb x the fraction JAX preallocates
           (``XLA_PYTHON_CLIENT_MEM_FRACTION``; JAX's default 0.75; the
           launchers set it)

(d width, L layers, H / K query / KV heads, hd head width, F MLP width,
V vocab.) A dimension that does not divide its mesh axis is replicated
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
      if explicit and hosts == 1 and 0 < math.prod(shape) < per_host:
        per_host = math.prod(shape)  # sharding.make_mesh takes the first
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

# Live buffers at each compiled program's peak, in copies of an array.
# Counted from XLA's buffer assignment (``memory_analysis``) of the scanned,
# rematerialised programs compiled on CPU with a memory-minimising schedule
# (``hlo.MEMORY_XLA_FLAGS``); tests/plan_compiled_test.py holds the train
# step (remat none, dots, full; LoRA) and the prefill (one pass, blocks)
# within 10 % of it at Qwen2.5-1.5B widths, tests/plan_test.py other
# shapes within 25 %. XLA:CPU runs a block's bfloat16 elementwise work in
# float32, so the block terms are float32 copies: an upper bound where an
# accelerator keeps them in bfloat16.
UPDATE_COPIES = 4  # grads, new params, m, v (the old state is kept until
#                    the step's finite check selects), param dtype each
BLOCK_COPIES = (8, 3, 1)  # float32 per token of one block: widths d, F / t
#                    and (H + 2K) hd / t (``block_width``)
BACKWARD_WIDTH_SHARE = 0.6  # of those, live in one block's backward
TRAIN_SCORE_COPIES = 3.5  # float32 [rows, H / t, T, S] in that backward
#                    (both fitted at T = 1024 and 2048: within 1 %; at
#                    T = 512 the estimate is 0.8 of the compiled step)
# remat 'none': what each block keeps for the backward, in block widths
# and score copies, and the running block's backward: the larger of
# NONE_BLOCK_COPIES P_layer w / t and NONE_BACKWARD_SHARE of a remat
# block's (fitted at T = 512, 1024, 2048 and 2, 4 blocks: within 4 %).
NONE_WIDTH_SHARE = 1.6
NONE_SCORE_COPIES = 2.0
NONE_BLOCK_COPIES = 2
NONE_BACKWARD_SHARE = 0.8
DOTS_F32_WIDTHS = 2  # remat 'dots': gate and up kept in float32 (XLA:CPU)
LORA_BLOCK_F32_COPIES = 1  # LoRA: the running block's frozen weights in
#                    float32, P_layer 4 / t (bfloat16 dots run in float32
#                    on CPU)
FORWARD_SCORE_COPIES = 3  # the same in a forward (log-probs, prefill)
LOGIT_COPIES = 2  # float32 [rows, W, V / t]: logits and their gradient
FORWARD_LOGIT_COPIES = 1
GATHERED_LAYERS = 1  # FSDP: the running block's gathered weights
UNIQUE_CACHE_SHARE = 0.5  # the engine's cache of distinct prompts, at most
#                   half a call's rows (jax_engine: gathered only then)
BATCH_BYTES = 41  # per row and position: 3 int32 inputs, 7 float32 fields,
#                   + is_offpolicy
DEFAULT_MEM_FRACTION = 0.75  # JAX preallocates 75 % of a GPU by default


def attention_fused(mcfg, platform: str) -> bool:
  """Whether the learner's attention is a fused kernel (no [T, S] scores),
  as ``transformer.attention_implementation`` picks it on ``platform``:
  'cudnn' and 'splash' are; 'auto' is cuDNN on GPU for bfloat16 / float16
  compute and head widths that are multiples of 8 up to 128, Pallas splash
  attention on TPU where this version has it (``models.config.ATTENTION``),
  else XLA's, which materialises the scores (CPU). The engine's prefill
  and decode (KV cache) always materialise them."""
  from rspo_jax.models.config import ATTENTION

  if mcfg.attention in ("cudnn", "splash"):
    return True
  if mcfg.attention != "auto":
    return False
  if platform == "tpu":
    return "splash" in ATTENTION
  return (platform == "gpu" and mcfg.dtype in ("bfloat16", "float16")
          and mcfg.head_dim % 8 == 0 and mcfg.head_dim <= 128)


def _dims(mcfg, mesh_shape):
  from rspo_jax.models.config import DTYPES

  data, fsdp, tensor = (int(x) for x in mesh_shape)
  p = mcfg.num_params()
  embed = mcfg.vocab_size * mcfg.hidden_size * (
      1 if mcfg.tie_word_embeddings else 2)
  return dict(
      p=p, p_layer=(p - embed) / mcfg.num_layers, shard=fsdp * tensor,
      ways=data * fsdp, fsdp=fsdp, t=tensor, w=DTYPES[mcfg.param_dtype],
      c=DTYPES[mcfg.dtype], inf=DTYPES[mcfg.inference_dtype],
      d=mcfg.hidden_size, f=mcfg.intermediate_size, h=mcfg.num_heads,
      k=mcfg.num_kv_heads, hd=mcfg.head_dim, v=mcfg.vocab_size,
      layers=mcfg.num_layers, p_a=adapter_params(mcfg))


# target -> (input width, output width) of its base matmul (lora.TARGETS)
def _lora_widths(mcfg) -> dict:
  d, f = mcfg.hidden_size, mcfg.intermediate_size
  q, kv = mcfg.num_heads * mcfg.head_dim, mcfg.num_kv_heads * mcfg.head_dim
  return {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d),
          "gate": (d, f), "up": (d, f), "down": (f, d)}


def adapter_params(mcfg) -> int:
  """Parameters of a LoRA model's adapters (0 without LoRA): per block and
  target, A [in, r] and B [r, out], r (in + out)."""
  r = int(getattr(mcfg, "lora_rank", 0) or 0)
  if r <= 0:
    return 0
  widths = _lora_widths(mcfg)
  return mcfg.num_layers * r * sum(sum(widths[t]) for t in mcfg.lora_targets)


def block_width(x) -> float:
  """Float32 values per token of one block's internals (``BLOCK_COPIES``):
  8 d + 3 F / t + (H + 2K) hd / t."""
  kd, kf, kh = BLOCK_COPIES
  t = x["t"]
  return kd * x["d"] + kf * x["f"] / t + kh * (x["h"] + 2 * x["k"]) * x[
      "hd"] / t


def _block_bytes(x, rows, length, fused, backward):
  """One block's live internals on a device: a backward's
  ``BACKWARD_WIDTH_SHARE`` of the float32 [rows, T, ``block_width``] and,
  unless fused, ``TRAIN_SCORE_COPIES`` of the [rows, H / t, T, T] scores;
  a forward's scores (``FORWARD_SCORE_COPIES``) or MLP, the larger."""
  t = x["t"]
  scores = 0.0
  if not fused:
    copies = TRAIN_SCORE_COPIES if backward else FORWARD_SCORE_COPIES
    scores = copies * rows * x["h"] / t * length * length * 4
  if not backward:  # a forward holds the scores or the MLP, not both
    return max(scores, rows * length * 4 * 2 * x["f"] / t)
  return BACKWARD_WIDTH_SHARE * rows * length * 4 * block_width(x) + scores


def remat_carries(x, rows, length, policy: str,
                  fused: bool = False) -> float:
  """What the forward keeps of every block for the backward under the
  remat ``policy`` (``models.config.REMAT_POLICIES``), on ``rows`` x
  ``length`` tokens a device (``_dims`` ``x``):

    full  L r T d c                        (each block's input)
    dots  L r T (c (3 d + (H + 2K) hd / t) + 4 x 2 F / t)   (the input and
          the weight matmuls' outputs: q, k, v, gate, up split over
          'tensor', gate and up in float32 (``DOTS_F32_WIDTHS``); o and
          down [r, T, d] before their reduction)
    none  L (NONE_WIDTH_SHARE r T 4 block_width + NONE_SCORE_COPIES r H / t
          T^2 4 [unless ``fused``])        (every block's internals)"""
  t = x["t"]
  if policy == "none":
    scores = 0.0 if fused else (
        NONE_SCORE_COPIES * rows * x["h"] / t * length * length * 4)
    return x["layers"] * (
        NONE_WIDTH_SHARE * rows * length * 4 * block_width(x) + scores)
  per_token = {"full": x["d"] * x["c"],
               "dots": (x["c"] * (3 * x["d"] + (x["h"] + 2 * x["k"])
                                  * x["hd"] / t)
                        + 4 * DOTS_F32_WIDTHS * x["f"] / t)}[policy]
  return x["layers"] * rows * length * per_token


def train_step_bytes(mcfg, mesh_shape, rows: int, length: int, *,
                     window: int, n_micro: int = 1,
                     platform: str = "gpu") -> dict:
  """Bytes per device of the compiled policy train step on ``rows`` global
  rows of ``length`` tokens in ``n_micro`` micro-batches, logits on a
  response ``window``:

    state     = 3 w P / shard                     (masters, Adam m and v)
    batch     = rows / ways x T x BATCH_BYTES
    update    = UPDATE_COPIES w P / shard
    backward  = P / shard (w [grads] + w [accumulator, n_micro > 1]
                           + c [compute copy, c != w]) + gathered
                + layer + acts
    gathered  = GATHERED_LAYERS P_layer c / t     (fsdp > 1)
    layer     = LoRA: LORA_BLOCK_F32_COPIES P_layer 4 / t (the running
                block's frozen weights in float32)
    acts      = carries + max(block, LOGIT_COPIES r W V / t x 4)
    block     = r T 4 x BACKWARD_WIDTH_SHARE x block_width
                + TRAIN_SCORE_COPIES r H / t x T^2 x 4 (unless fused);
                remat 'none': the larger of NONE_BLOCK_COPIES P_layer w / t
                and NONE_BACKWARD_SHARE x that block
    carries   = what remat keeps of each block (``remat_carries``: 'full'
                L r T d c, 'dots' adds the weight matmuls' outputs, 'none'
                every block's internals)
    peak      = state + batch + max(update, backward)

  r = ceil(rows / n_micro / ways) rows a device computes at once. LoRA:
  the trained P_a (adapters) in state, update, grads and the compute
  copy, and the frozen base, i P / shard, an argument beside them
  (``base``, in the peak). A fused kernel with
  unrolled layers: the last block's plain-path scores on the response
  window, TRAIN_SCORE_COPIES r H / t x W x T x 4, are added (scanned
  layers take the window after the last block)."""
  x = _dims(mcfg, mesh_shape)
  p, shard, w, c = x["p"], x["shard"], x["w"], x["c"]
  r = -(-rows // (n_micro * x["ways"]))
  fused = attention_fused(mcfg, platform)
  pt = x["p_a"] or p  # trained: the adapters under LoRA, else every weight
  base = x["inf"] * p / shard if x["p_a"] else 0.0
  state = 3 * w * pt / shard
  batch = -(-rows // x["ways"]) * length * BATCH_BYTES
  update = UPDATE_COPIES * w * pt / shard
  grads = w * pt / shard * (2 if n_micro > 1 else 1)
  copy = c * pt / shard if c != w else 0.0
  if x["p_a"] and x["inf"] != c:  # a base narrower than the compute dtype
    copy += c * p / shard
  gathered = GATHERED_LAYERS * x["p_layer"] * c / x["t"] if x["fsdp"] > 1 \
      else 0.0
  block = _block_bytes(x, r, length, fused, backward=True)
  layer = (LORA_BLOCK_F32_COPIES * 4 * x["p_layer"] / x["t"] if x["p_a"]
           else 0.0)
  if mcfg.remat == "none":
    block = max(NONE_BLOCK_COPIES * w * x["p_layer"] / x["t"],
                NONE_BACKWARD_SHARE * block)
  window_scores = 0.0
  if fused and window and not mcfg.scan_layers:
    # Unrolled layers: the last block runs on the response window by the
    # plain path (an offset window): [r, H / t, W, T] float32 scores.
    window_scores = (TRAIN_SCORE_COPIES * r * x["h"] / x["t"] * window
                     * length * 4)
  carries = remat_carries(x, r, length, mcfg.remat, fused)
  block += window_scores
  logits = LOGIT_COPIES * r * window * x["v"] / x["t"] * 4
  acts = carries + max(block, logits)
  backward = grads + copy + gathered + layer + acts
  return dict(base=base, state=state, batch=batch, update=update,
              grads=grads, compute_copy=copy, gathered=gathered, layer=layer,
              carries=carries, block=block, logits=logits,
              activations=carries + block, transient=max(update, backward),
              peak=base + state + batch + max(update, backward), rows=r,
              fused=fused)


def logprob_bytes(mcfg, mesh_shape, rows: int, length: int, *, window: int,
                  n_chunks: int = 1, param_dtype: Optional[str] = None,
                  platform: str = "gpu") -> dict:
  """Bytes per device of the compiled log-prob pass (pi_old on the float32
  masters, pi_ref on its ``inference_dtype`` copy: ``param_dtype``) over
  ``rows`` rows in ``n_chunks`` calls inside one program
  (``learner.chunked``):

    params    = P b / shard                   (argument; b its bytes)
    io        = rows / ways x T x 20          (4 inputs, the output)
    transient = P c / shard [b != c] + gathered + 2 r T d c
                + max(block forward, FORWARD_LOGIT_COPIES r W V / t x 4)
    peak      = params + io + transient

  r = ceil(rows / n_chunks / ways): rows a device computes at once. LoRA:
  params = the frozen base, i P / shard, and the float32 adapters (A's, or
  pi_ref's zeroed ones), w P_a / shard, whatever ``param_dtype``."""
  from rspo_jax.models.config import DTYPES

  x = _dims(mcfg, mesh_shape)
  b = DTYPES[param_dtype or mcfg.param_dtype]
  p, shard, c = x["p"], x["shard"], x["c"]
  r = -(-rows // (n_chunks * x["ways"]))
  params = b * p / shard
  io = -(-rows // x["ways"]) * length * 20
  copy = c * p / shard if b != c else 0.0
  if x["p_a"]:
    params = x["inf"] * p / shard + x["w"] * x["p_a"] / shard
    copy = ((c * p / shard if x["inf"] != c else 0.0)
            + (c * x["p_a"] / shard if x["w"] != c else 0.0))
  gathered = GATHERED_LAYERS * x["p_layer"] * c / x["t"] if x["fsdp"] > 1 \
      else 0.0
  block = _block_bytes(x, r, length, attention_fused(mcfg, platform),
                       backward=False)
  logits = FORWARD_LOGIT_COPIES * r * window * x["v"] / x["t"] * 4
  transient = copy + gathered + 2 * r * length * x["d"] * c + max(block,
                                                                  logits)
  return dict(params=params, io=io, compute_copy=copy, gathered=gathered,
              block=block, logits=logits, transient=transient,
              peak=params + io + transient, rows=r)


def prefill_bytes(mcfg, mesh_shape, rows: int, prompt: int, new: int, *,
                  chunk: int = 0, gathered: Optional[bool] = None) -> dict:
  """Bytes per device of the engine's compiled prefill of ``rows`` prompts
  of bucket ``prompt`` into a cache of S = prompt + new slots (the KV-cache
  path: scores always materialised; ``chunk`` columns at a time, 0 = all
  prompt - 1 at once):

    weights   = P i / t                      (split over 'tensor' only)
    cache     = r S L 2 K hd c / t_kv        (the decode rows' cache)
    second    = a second cache, (copies - 1) x cache:
                ``gathered`` (prompts repeat): the distinct prompts'
                cache, UNIQUE_CACHE_SHARE of the rows, gathered to the
                decode rows -- copies 1.5;
                not gathered, one pass: none (the prefill writes the
                engine's donated empty cache in place) -- copies 1;
                not gathered, blocks: XLA's copy of the cache being
                written block by block -- copies 2;
                None (the plan: prompts may repeat or not): the larger
    scores    = FORWARD_SCORE_COPIES r H / t x q x keys x 4
    peak      = read + cache + second + scores

  r = ceil(rows / ways), t_kv = t when it divides K else 1; one pass: q =
  prompt - 1 queries over S keys; blocks of ``chunk`` columns (as the
  engine widens them: ``jax_engine.prefill_block``): the last block's q =
  chunk queries over prompt - 1 keys. ``read`` (the weights the program
  takes) is P i / t less what the prefill never reads: the last block's
  query, output and MLP weights, the final norm and an untied LM head
  (the engine holds them all: ``weights``, resident in
  ``memory_per_device``; at 28 blocks a few per cent, at 2 half)."""
  from rspo_jax.rollout.jax_engine import prefill_block

  x = _dims(mcfg, mesh_shape)
  r = -(-rows // x["ways"])
  s = prompt + new
  t_kv = x["t"] if x["k"] % x["t"] == 0 else 1
  weights = x["inf"] * x["p"] / x["t"]
  d, hd = x["d"], x["hd"]
  unused = (2 * d * x["h"] * hd  # q, o
            + (x["h"] * hd if getattr(mcfg, "qkv_bias", False) else 0)
            + 3 * d * x["f"] + 2 * d  # MLP, post-attention and final norm
            + (0 if mcfg.tie_word_embeddings else x["v"] * d))
  read = weights - x["inf"] * unused / x["t"]
  cache = r * s * x["layers"] * 2 * x["k"] * hd * x["c"] / t_kv
  chunk = prefill_block(chunk, prompt)
  blocks = 0 < chunk < prompt - 1
  copies = {True: 1 + UNIQUE_CACHE_SHARE, False: 2 if blocks else 1}
  copies[None] = max(copies.values())
  second = (copies[gathered] - 1) * cache
  q, keys = (chunk, prompt - 1) if blocks else (prompt - 1, s)
  scores = FORWARD_SCORE_COPIES * r * x["h"] / x["t"] * q * keys * 4
  return dict(weights=weights, read=read, cache=cache, second=second,
              scores=scores, transient=cache + second + scores,
              peak=read + cache + second + scores, rows=r)


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
  from rspo_jax.rollout import jax_engine as je

  on_cpu = layout["platform"] == "cpu"
  episodes = -(-cfg.train.batch_tasks * cfg.train.group_size
               // layout["hosts"])
  if max_rows == "config":
    max_rows = cfg.rollout.get("engine_max_rows", None)
  cap = je.rows_per_call(je.BATCH_BUCKETS,
                         je.CPU_GROUP_ROWS if on_cpu else 0,
                         int(max_rows or 0))
  calls = -(-episodes // cap)
  rows = je.bucket_size(-(-episodes // calls), je.BATCH_BUCKETS,
                        "batch size")
  prompt = je.bucket_size(min(cfg.rollout.max_prompt_tokens,
                              max(je.PROMPT_BUCKETS)), je.PROMPT_BUCKETS,
                          "prompt length")
  new = je.round_up(cfg.rollout.max_new_tokens, 16)
  if chunk == "config":  # else the block width to plan with
    chunk = cfg.rollout.get("prefill_chunk", None)
  if chunk is None:
    chunk = je.CPU_PREFILL_CHUNK if on_cpu else 0
  chunk = je.prefill_block(int(chunk), prompt)
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  own = int(cfg.rollout.get("engine_tensor", 0))  # build.make_engine_mesh
  per = layout["devices_per_host"] if layout["hosts"] > 1 else math.prod(mesh)
  if own and per % own:
    raise ValueError(f"rollout.engine_tensor={own} does not divide the"
                     f" {per} devices of a host")
  if layout["hosts"] > 1:  # distributed.host_mesh
    t = own or (1 if "tensor" in layout["cross_host_axes"] else mesh[2])
    mesh = [1, per // t, t]
  elif own and own != mesh[2]:
    mesh = [1, per // own, own]
  return dict(rows=rows, prompt=prompt, new=new, chunk=chunk, mesh=mesh,
              calls_per_turn=calls)


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
  fixed = int(t.get("updates_per_step", 0) or 0)
  m = int(t.get("mini_batch_rows", 0) or 0)
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
      "engine": (mcfg.inference_dtype if cfg.rollout.engine == "jax"
                 else export),
      "export": export,
      "remat": mcfg.remat,
      "scan_layers": bool(mcfg.scan_layers),
  }
  if adapter_params(mcfg):  # LoRA: params are the adapters
    out["frozen_base"] = mcfg.inference_dtype
  return out


def memory_per_device(cfg, mcfg, mesh_shape, layout=None, *,
                      prefill_chunk="config", max_rows="config") -> dict:
  """The run's bytes per device (module docstring), in GiB for the
  ``*_GB`` keys. ``layout`` (``resolve_layout``): platform and hosts; a
  one-host GPU by default."""
  layout = layout or {
      "platform": "gpu", "hosts": 1, "devices_per_host": math.prod(
          mesh_shape),
      "mesh": dict(zip(("data", "fsdp", "tensor"), mesh_shape))}
  platform = layout["platform"]
  x = _dims(mcfg, mesh_shape)
  p, shard = x["p"], x["shard"]
  seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
  window = min(seq - 1, cfg.rollout.max_new_tokens)
  # One optimizer update: its rows in micro-batches of ``train_rows``
  # (a float32 gradient sum when there are several).
  rows, n_micro = update_rows(cfg), micro_batches(cfg)
  train = train_step_bytes(mcfg, mesh_shape, n_micro * train_rows(cfg), seq,
                           window=window, n_micro=n_micro,
                           platform=platform)
  # pi_old / pi_ref of an update's rows: ``Learner.apply`` in chunks of at
  # most micro-batch rows inside one call (``learner.apply_chunks``).
  from rspo_jax.learner import apply_chunks

  chunks = apply_chunks(rows, train_rows(cfg), x["ways"])
  old = logprob_bytes(mcfg, mesh_shape, rows, seq, window=window,
                      n_chunks=chunks, platform=platform)
  ref_pass = logprob_bytes(mcfg, mesh_shape, rows, seq, window=window,
                           n_chunks=chunks, param_dtype=mcfg.inference_dtype,
                           platform=platform)

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
  prm_shard = (layout["devices_per_host"] if layout["hosts"] > 1
               else shard)
  prm = (x["c"] * p / prm_shard if cfg.rspo.enabled
         and cfg.rspo.dense_reward == "prm" else 0.0)
  in_process = cfg.rollout.engine == "jax"
  engine = kv_cache = prefill = second_cache = 0.0
  eng = None
  if in_process:
    eng = engine_shapes(cfg, layout, prefill_chunk, max_rows)
    pre = prefill_bytes(mcfg, eng["mesh"], eng["rows"], eng["prompt"],
                        eng["new"], chunk=eng["chunk"])
    engine, kv_cache, prefill = pre["weights"], pre["cache"], pre["scores"]
    second_cache = pre["second"]
  # Overlap: the next collection's weights, copied before each update
  # (Learner.frozen_params) when its thread recomputes their log-probs.
  overlap = bool(cfg.rollout.get("overlap", 0))
  snapshot = (x["w"] * (lora_p or p) / shard if overlap
              and cfg.rspo.get("recompute_behavior_logp", True) else 0.0)
  resident = (base + state + policy_b + critic + ref + engine + prm
              + snapshot)
  train_transient = train["batch"] + train["transient"]
  logprob_transient = max(old["transient"], ref_pass["transient"])
  rollout = kv_cache + second_cache + prefill
  if overlap:  # the thread's prefill or log-prob pass beside the update
    train_transient += max(rollout if in_process else 0.0,
                           old["transient"] if snapshot else 0.0)
  phases = {"train step": train_transient, "log-probs": logprob_transient,
            "rollout prefill": rollout}
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
    out["engine_prefill"] = {k: eng[k] for k in
                             ("rows", "prompt", "new", "chunk")}
  return {k_: v / GB if k_.endswith("_GB") else v for k_, v in out.items()}


def mem_fraction(environ: Mapping[str, str],
                 platform: str = "gpu") -> tuple[float, str]:
  """(fraction of a device JAX may use, where it came from). GPU:
  ``XLA_PYTHON_CLIENT_MEM_FRACTION``; 1.0 without preallocation
  (``XLA_PYTHON_CLIENT_PREALLOCATE=false``); else JAX's default 0.75. TPU
  and CPU: 1.0 (the variable applies to GPUs only)."""
  if platform != "gpu":
    return 1.0, f"{platform}: no preallocation fraction"
  value = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
  if value:
    try:
      fraction = float(value)
    except ValueError:
      fraction = -1.0
    if not 0.0 < fraction <= 1.0:
      raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} is not a"
                       " number in (0, 1]")
    return fraction, "XLA_PYTHON_CLIENT_MEM_FRACTION"
  if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() == "false":
    return 1.0, "XLA_PYTHON_CLIENT_PREALLOCATE=false"
  return DEFAULT_MEM_FRACTION, "JAX default"


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
# What the plan chooses: remat policy, prefill blocks; what else to change
# --------------------------------------------------------------------------

AUTO = "auto"  # model.remat=auto: the plan picks (rollout.prefill_chunk: None)
# A choice must fit in this share of the usable memory: the estimates are
# within 10 % of what XLA compiles at the calibrated shapes
# (tests/plan_compiled_test.py; 0.8 at short sequences), so a choice at
# 98 % of the device would not be one.
CHOICE_HEADROOM = 0.9
REMAT_BY = ("plan: the lightest of none, dots, full whose train step fits"
            f" in {CHOICE_HEADROOM:g} of the usable memory")
CHUNK_BY = (f"plan: one pass (0) if the prefill fits in {CHOICE_HEADROOM:g}"
            " of the usable memory, else the widest block that does")
ROWS_BY = ("plan: no cap (0) if a prefill of a host's episodes fits in"
           f" {CHOICE_HEADROOM:g} of the usable memory (at some prefill"
           " block), else the most rows a call that do")


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
  return memory_per_device(cfg, mcfg or plan_model_config(cfg), mesh,
                           layout, **kw)


def _fits(mem, usable, phase=None) -> bool:
  key = {"train": "train_transient_GB",
         "rollout": "rollout_transient_GB"}.get(phase)
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
  chunk = cfg.rollout.get("prefill_chunk", None)
  max_rows = cfg.rollout.get("engine_max_rows", None)
  in_process = cfg.rollout.engine == "jax"
  out = {"model.remat": {"value": remat_of(cfg), "by": "config"}}
  if in_process:
    out["rollout.prefill_chunk"] = {
        "value": chunk, "by": "config" if chunk is not None else
        "engine default (64 on CPU, one pass elsewhere)"}
    out["rollout.engine_max_rows"] = {
        "value": max_rows, "by": "config" if max_rows is not None else
        "engine default (no cap)"}
  if usable is None:
    if remat_auto:
      out["model.remat"]["by"] = ("plan: no device memory to plan with"
                                  " (mesh.device_memory_gb)")
    return out
  import dataclasses

  mcfg = plan_model_config(cfg)
  room = usable * CHOICE_HEADROOM
  if remat_auto:
    for policy in REMAT_POLICIES:
      mem = _memory(cfg, mesh, layout,
                    dataclasses.replace(mcfg, remat=policy))
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
        mem = _memory(cfg, mesh, layout, mcfg, prefill_chunk=c,
                      max_rows=cap)
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
  per = (layout["devices_per_host"] if layout["hosts"] > 1
         else math.prod(mesh))
  fixes = []
  if cfg.rollout.engine == "jax":
    t_now = int(cfg.rollout.get("engine_tensor", 0) or 0) or mesh[2]
    for t in range(t_now + 1, per + 1):
      if per % t == 0:
        fixes.append(({"rollout.engine_tensor": t},
                      "the engine's weights split over more devices"))
  if mesh[0] > 1:
    fixes.append(({"mesh.shape": (1, mesh[0] * mesh[1], mesh[2])},
                  "FSDP over every device (--mesh=...:data=1)"))
  if cfg.rollout.engine == "jax":
    fixes.append(({"rollout.engine": "sglang"},
                  "rollout on SGLang servers, off the learner devices"))
  micro = train_rows(cfg)
  ways = mesh[0] * mesh[1]
  while micro // 2 >= ways and micro > 1:
    micro //= 2
    fixes.append(({"train.micro_batch_rows": micro},
                  "smaller micro-batches"))
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
  what = (f"{cfg.model.preset} {cfg.env.name} {cfg.algo.name} on mesh"
          f" {'x'.join(map(str, mesh))} ({layout['devices']}"
          f" {layout['platform']} devices): {mem['total_GB']:.1f} GB a device"
          f" (resident {mem['resident_GB']:.1f} + {mem['peak_phase']})"
          f" exceeds the {usable:.1f} GB usable")
  best = None
  for keys, why in _trial_fixes(cfg, layout):
    trial = with_keys(cfg, keys)
    tl = dict(layout)
    if "mesh.shape" in keys:
      tl = dict(layout, mesh=dict(zip(("data", "fsdp", "tensor"),
                                      keys["mesh.shape"])))
    tmesh = [tl["mesh"][a] for a in ("data", "fsdp", "tensor")]
    try:
      got = _memory(resolved(trial, choose(trial, tl, usable)), tmesh, tl)
    except ValueError:
      continue
    change = ",".join(f"{k}={v}" for k, v in keys.items()).replace(" ", "")
    if _fits(got, usable):
      return (f"{what}; set {change} ({why}: {got['total_GB']:.1f} GB)")
    if best is None or got["total_GB"] < best[0]:
      best = (got["total_GB"], change, why)
  closest = (f"; no one key fits it (closest: {best[1]}, {best[2]}:"
             f" {best[0]:.1f} GB)" if best else "")
  return (f"{what}{closest}: add devices (a larger mesh, --mesh) or take a"
          " smaller model (model=)")


def usable_gb(cfg, layout, environ) -> tuple:
  """(GiB a device JAX may use, (fraction, where it came from)), or (None,
  None) without ``mesh.device_memory_gb``."""
  device_gb = float(cfg.mesh.get("device_memory_gb", 0) or 0)
  if not device_gb:
    return None, None
  fraction, source = mem_fraction(environ, layout["platform"])
  return device_gb * fraction, (fraction, source)


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
  if not int(cfg.rollout.get("overlap", 0) or 0):
    return None
  devices = math.prod(layout["mesh"].values())
  if devices <= 1:
    return None
  in_process = cfg.rollout.engine == "jax"
  recompute = bool(cfg.rspo.get("recompute_behavior_logp", True))
  if not (in_process or recompute):
    return None  # the thread only talks HTTP to SGLang servers
  what = ("the in-process engine's prefill and decode" if in_process
          else "the behaviour log-prob pass (rspo.recompute_behavior_logp)")
  return (f"rollout.overlap=1 on {devices} devices: overlap's thread would"
          f" run {what} beside the update, two threads launching"
          " collectives on the same devices (a NCCL deadlock); set"
          " rollout.overlap=0, or run on one device"
          + ("" if not in_process else
             ", or rollout.engine=sglang with"
             " rspo.recompute_behavior_logp=False"))


def _device_limit_gb() -> Optional[float]:
  import jax

  from rspo_jax import distributed

  limits = []
  for d in jax.local_devices():
    try:
      stats = d.memory_stats() or {}
    except Exception:  # CPU and some backends have none
      stats = {}
    if stats.get("bytes_limit"):
      limits.append(int(stats["bytes_limit"]))
  if not limits:
    return None
  return -float(distributed.global_max(-min(limits))) / GB


# --------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------


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
  overrides = {"dtype": m.dtype,  # as build.model_numerics sets them
               "param_dtype": str(m.get("param_dtype", "float32") or
                                  "float32"),
               "remat": remat_of(cfg),
               "scan_layers": bool(m.get("scan_layers", False)),
               "attention": m.get("attention", "auto")}
  for item in filter(None, str(m.get("overrides", "") or "").split(";")):
    key, _, value = item.partition("=")
    overrides[key.strip()] = int(value)
  config_json = os.path.join(m.checkpoint_dir or "", "config.json")
  if m.checkpoint_dir and os.path.exists(config_json):
    with open(config_json) as f:
      mcfg = models.ModelConfig.from_hf_dict(json.load(f), **overrides)
  else:
    if m.preset in models.LOCAL_TOKENIZER_PRESETS:
      overrides.setdefault("vocab_size",
                           models.local_vocab_size(int(m.tokenizer_vocab)))
    mcfg = models.get_model_config(m.preset, **overrides)
  rank = int(m.get("lora_rank", 0) or 0)
  if rank:
    mcfg = dataclasses.replace(
        mcfg, lora_rank=rank, lora_alpha=float(m.get("lora_alpha", 32.0)),
        lora_targets=lora.parse_targets(m.get("lora_targets",
                                              ",".join(lora.TARGETS))))
    lora.check(mcfg)
  return mcfg


def make_plan(cfg, workdir: str,
              environ: Optional[Mapping[str, str]] = None) -> dict:
  environ = os.environ if environ is None else environ
  layout = resolve_layout(cfg, environ)
  mesh = [layout["mesh"][a] for a in ("data", "fsdp", "tensor")]
  usable, fraction = usable_gb(cfg, layout, environ)
  choices = choose(cfg, layout, usable)
  given = cfg
  cfg = resolved(cfg, choices)
  mcfg = plan_model_config(cfg)
  mem = memory_per_device(cfg, mcfg, mesh, layout)
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
          "update_rows": update_rows(cfg),
          "micro_batch_rows": train_rows(cfg),
          "micro_batches": micro_batches(cfg),
      },
      **({"lora": {**lora_plan(mcfg), "learning_rate": _lora_lr_line(cfg)}}
         if adapter_params(mcfg) else {}),
      "steps_of_A": cfg.train.total_steps,
      "rspo_loops": -(-cfg.train.total_steps // cfg.rspo.k),
      "memory_per_device": {
          k: round(v, 2) if isinstance(v, float) else v
          for k, v in mem.items()
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
          " rollout.engine=sglang, or a larger mesh cut it")
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
  return {"rank": int(mcfg.lora_rank), "alpha": float(mcfg.lora_alpha),
          "targets": list(mcfg.lora_targets), "adapter_params": p_a,
          "adapter_fraction": round(p_a / mcfg.num_params(), 5),
          "adapter_MB": round(DTYPES[mcfg.param_dtype] * p_a / 2**20, 1),
          "frozen_base_GB": round(DTYPES[mcfg.inference_dtype]
                                  * mcfg.num_params() / GB, 2)}


def describe(cfg, workdir: str,
             environ: Optional[Mapping[str, str]] = None) -> str:
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
    ("second_cache_GB", "rollout: a second cache (repeated prompts'"
     " or XLA's copy in blocks)"),
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
  return (f" ({e['rows']} rows a prefill call, prompt columns in"
          f" {'blocks of ' + str(e['chunk']) if e['chunk'] else 'one pass'})")


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
      f" {mem['attention']}; dtypes: " + ", ".join(
          f"{k} {v}" for k, v in p["dtype"].items()), "",
      "| per device | GiB |", "|---|---:|"]
  rows = list(_TABLE)
  if p.get("lora"):
    lo = p["lora"]
    lines[0] += (f"; LoRA r={lo['rank']} on {','.join(lo['targets'])}:"
                 f" {lo['adapter_params']:,} adapter parameters"
                 f" ({lo['adapter_MB']:g} MB float32)")
    rows = [("base_GB", "frozen base (LoRA): compute dtype, shared by A, B,"
             " pi_ref, critic")] + [(k, _LORA_TABLE.get(k, what))
                                    for k, what in rows]
  lines += [f"| {what} | {mem[k]:.2f} |" for k, what in rows
            if k not in ("overlap_snapshot_GB", "block_grad_GB")
            or mem.get(k)]
  lines.append(f"| **total** = resident + {mem['peak_phase']} |"
               f" **{mem['total_GB']:.2f}** |")
  if "usable_GB" in p:
    f = p["mem_fraction"]
    lines.append(f"| usable: {p['device_memory_GB']:g} GB x {f['value']:g}"
                 f" ({f['from']}) | {p['usable_GB']:.2f} |")
    lines.append(f"| fits | {'yes' if p['fits'] else '**no**'} |")
  lines += [f"\nwarning: {w}" for w in p["warnings"]]
  return "\n".join(lines)


if __name__ == "__main__":
  # launch/train.py ... --dry_run | python -m rspo_jax.plan: the table.
  import sys

  print(table(json.load(sys.stdin)))
