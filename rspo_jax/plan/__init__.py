"""The resolved plan of a run, printed by ``launch/train.py --dry_run``.

Nothing is started and no model is created; devices are counted only when
neither the mesh config nor the environment says how many there are.

How hosts, devices and the mesh are found: ``plan/layout.py``.

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

# The plan's modules, lowest first (each imports only those above it):
# layout (hosts, devices, mesh, usable memory), programs (each compiled
# program's bytes), memory (a run's bytes per device), choices (remat,
# prefill blocks, rows a call; fit and overlap checks), report (the dry
# run's plan and table). Callers import their names from here.
from rspo_jax.plan.layout import (  # noqa: F401
    DEFAULT_MEM_FRACTION,
    GB,
    cross_host_axes,
    mem_fraction,
    resolve_layout,
    usable_gb,
)
from rspo_jax.plan.programs import (  # noqa: F401
    BACKWARD_WIDTH_SHARE,
    BATCH_BYTES,
    BLOCK_COPIES,
    DOTS_F32_WIDTHS,
    FORWARD_LOGIT_COPIES,
    FORWARD_SCORE_COPIES,
    GATHERED_LAYERS,
    LOGIT_COPIES,
    LORA_BLOCK_F32_COPIES,
    NONE_BACKWARD_SHARE,
    NONE_BLOCK_COPIES,
    NONE_SCORE_COPIES,
    NONE_WIDTH_SHARE,
    TRAIN_SCORE_COPIES,
    UNIQUE_CACHE_SHARE,
    UPDATE_COPIES,
    _dims,
    adapter_params,
    attention_fused,
    block_width,
    logprob_bytes,
    prefill_bytes,
    remat_carries,
    train_step_bytes,
)
from rspo_jax.plan.memory import (  # noqa: F401
    AUTO,
    engine_shapes,
    layout_warnings,
    memory_per_device,
    micro_batches,
    plan_model_config,
    remat_of,
    run_dtypes,
    step_rows,
    train_rows,
    update_rows,
)
from rspo_jax.plan.choices import (  # noqa: F401
    ALLOW_ENV,
    ALLOW_FLAG,
    CHOICE_HEADROOM,
    CHUNK_BY,
    REMAT_BY,
    ROWS_BY,
    choose,
    engine_row_caps,
    fit_message,
    overflow_allowed,
    overlap_problem,
    prefill_chunks,
    resolve_run,
    resolved,
    with_keys,
)
from rspo_jax.plan.report import (  # noqa: F401
    describe,
    lora_plan,
    make_plan,
    table,
)
