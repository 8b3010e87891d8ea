"""Bytes per device of each compiled program a run holds at its peak:
the policy's train step (``train_step_bytes``), a log-prob pass
(``logprob_bytes``) and the in-process engine's prefill
(``prefill_bytes``), from the model's widths and the mesh
(``rspo_jax.plan``'s docstring gives the formulas; tests/plan_test.py and
tests/plan_compiled_test.py check them against ``memory_analysis()``).
"""

from __future__ import annotations

from typing import Optional

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
  return (
      platform == "gpu"
      and mcfg.dtype in ("bfloat16", "float16")
      and mcfg.head_dim % 8 == 0
      and mcfg.head_dim <= 128
  )


def _dims(mcfg, mesh_shape):
  from rspo_jax.models.config import DTYPES

  data, fsdp, tensor = (int(x) for x in mesh_shape)
  p = mcfg.num_params()
  embed = (
      mcfg.vocab_size
      * mcfg.hidden_size
      * (1 if mcfg.tie_word_embeddings else 2)
  )
  return dict(
      p=p,
      p_layer=(p - embed) / mcfg.num_layers,
      shard=fsdp * tensor,
      ways=data * fsdp,
      fsdp=fsdp,
      t=tensor,
      w=DTYPES[mcfg.param_dtype],
      c=DTYPES[mcfg.dtype],
      inf=DTYPES[mcfg.inference_dtype],
      d=mcfg.hidden_size,
      f=mcfg.intermediate_size,
      h=mcfg.num_heads,
      k=mcfg.num_kv_heads,
      hd=mcfg.head_dim,
      v=mcfg.vocab_size,
      layers=mcfg.num_layers,
      p_a=adapter_params(mcfg),
  )


# target -> (input width, output width) of its base matmul (lora.TARGETS)
def _lora_widths(mcfg) -> dict:
  d, f = mcfg.hidden_size, mcfg.intermediate_size
  q, kv = mcfg.num_heads * mcfg.head_dim, mcfg.num_kv_heads * mcfg.head_dim
  return {
      "q": (d, q),
      "k": (d, kv),
      "v": (d, kv),
      "o": (q, d),
      "gate": (d, f),
      "up": (d, f),
      "down": (f, d),
  }


def adapter_params(mcfg) -> int:
  """Parameters of a LoRA model's adapters (0 without LoRA): per block and
  target, A [in, r] and B [r, out], r (in + out)."""
  r = int(mcfg.lora_rank)
  if r <= 0:
    return 0
  widths = _lora_widths(mcfg)
  return mcfg.num_layers * r * sum(sum(widths[t]) for t in mcfg.lora_targets)


def block_width(x) -> float:
  """Float32 values per token of one block's internals (``BLOCK_COPIES``):
  8 d + 3 F / t + (H + 2K) hd / t."""
  kd, kf, kh = BLOCK_COPIES
  t = x["t"]
  return (
      kd * x["d"] + kf * x["f"] / t + kh * (x["h"] + 2 * x["k"]) * x["hd"] / t
  )


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


def remat_carries(x, rows, length, policy: str, fused: bool = False) -> float:
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
    scores = (
        0.0
        if fused
        else (NONE_SCORE_COPIES * rows * x["h"] / t * length * length * 4)
    )
    return x["layers"] * (
        NONE_WIDTH_SHARE * rows * length * 4 * block_width(x) + scores
    )
  per_token = {
      "full": x["d"] * x["c"],
      "dots": (
          x["c"] * (3 * x["d"] + (x["h"] + 2 * x["k"]) * x["hd"] / t)
          + 4 * DOTS_F32_WIDTHS * x["f"] / t
      ),
  }[policy]
  return x["layers"] * rows * length * per_token


def train_step_bytes(
    mcfg,
    mesh_shape,
    rows: int,
    length: int,
    *,
    window: int,
    n_micro: int = 1,
    platform: str = "gpu",
) -> dict:
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
  gathered = (
      GATHERED_LAYERS * x["p_layer"] * c / x["t"] if x["fsdp"] > 1 else 0.0
  )
  block = _block_bytes(x, r, length, fused, backward=True)
  layer = LORA_BLOCK_F32_COPIES * 4 * x["p_layer"] / x["t"] if x["p_a"] else 0.0
  if mcfg.remat == "none":
    block = max(
        NONE_BLOCK_COPIES * w * x["p_layer"] / x["t"],
        NONE_BACKWARD_SHARE * block,
    )
  window_scores = 0.0
  if fused and window and not mcfg.scan_layers:
    # Unrolled layers: the last block runs on the response window by the
    # plain path (an offset window): [r, H / t, W, T] float32 scores.
    window_scores = (
        TRAIN_SCORE_COPIES * r * x["h"] / x["t"] * window * length * 4
    )
  carries = remat_carries(x, r, length, mcfg.remat, fused)
  block += window_scores
  logits = LOGIT_COPIES * r * window * x["v"] / x["t"] * 4
  acts = carries + max(block, logits)
  backward = grads + copy + gathered + layer + acts
  return dict(
      base=base,
      state=state,
      batch=batch,
      update=update,
      grads=grads,
      compute_copy=copy,
      gathered=gathered,
      layer=layer,
      carries=carries,
      block=block,
      logits=logits,
      activations=carries + block,
      transient=max(update, backward),
      peak=base + state + batch + max(update, backward),
      rows=r,
      fused=fused,
  )


def logprob_bytes(
    mcfg,
    mesh_shape,
    rows: int,
    length: int,
    *,
    window: int,
    n_chunks: int = 1,
    param_dtype: Optional[str] = None,
    platform: str = "gpu",
) -> dict:
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
    copy = (c * p / shard if x["inf"] != c else 0.0) + (
        c * x["p_a"] / shard if x["w"] != c else 0.0
    )
  gathered = (
      GATHERED_LAYERS * x["p_layer"] * c / x["t"] if x["fsdp"] > 1 else 0.0
  )
  block = _block_bytes(
      x, r, length, attention_fused(mcfg, platform), backward=False
  )
  logits = FORWARD_LOGIT_COPIES * r * window * x["v"] / x["t"] * 4
  transient = copy + gathered + 2 * r * length * x["d"] * c + max(block, logits)
  return dict(
      params=params,
      io=io,
      compute_copy=copy,
      gathered=gathered,
      block=block,
      logits=logits,
      transient=transient,
      peak=params + io + transient,
      rows=r,
  )


def prefill_bytes(
    mcfg,
    mesh_shape,
    rows: int,
    prompt: int,
    new: int,
    *,
    chunk: int = 0,
    gathered: Optional[bool] = None,
) -> dict:
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
  from rspo_jax.rollout.engine_layout import prefill_block

  x = _dims(mcfg, mesh_shape)
  r = -(-rows // x["ways"])
  s = prompt + new
  t_kv = x["t"] if x["k"] % x["t"] == 0 else 1
  weights = x["inf"] * x["p"] / x["t"]
  d, hd = x["d"], x["hd"]
  unused = (
      2 * d * x["h"] * hd  # q, o
      + (x["h"] * hd if mcfg.qkv_bias else 0)
      + 3 * d * x["f"]
      + 2 * d  # MLP, post-attention and final norm
      + (0 if mcfg.tie_word_embeddings else x["v"] * d)
  )
  read = weights - x["inf"] * unused / x["t"]
  cache = r * s * x["layers"] * 2 * x["k"] * hd * x["c"] / t_kv
  chunk = prefill_block(chunk, prompt)
  blocks = 0 < chunk < prompt - 1
  copies = {True: 1 + UNIQUE_CACHE_SHARE, False: 2 if blocks else 1}
  copies[None] = max(copies.values())
  second = (copies[gathered] - 1) * cache
  q, keys = (chunk, prompt - 1) if blocks else (prompt - 1, s)
  scores = FORWARD_SCORE_COPIES * r * x["h"] / x["t"] * q * keys * 4
  return dict(
      weights=weights,
      read=read,
      cache=cache,
      second=second,
      scores=scores,
      transient=cache + second + scores,
      peak=read + cache + second + scores,
      rows=r,
  )
