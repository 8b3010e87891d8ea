#!/bin/bash
# One node, 8 GPUs, one learner process (no jax.distributed needed).
#
#   launch/cluster/single_node_8gpu.sh                       # FSDP over 8 GPUs,
#                                                            # in-process rollout
#   CONFIG=configs/webshop_gigpo.py:model=qwen2.5-1.5b launch/cluster/single_node_8gpu.sh
#   CONFIG=configs/webshop_grpo.py:model=qwen2.5-1.5b ROLLOUT=sglang \
#     MODEL_DIR=/data/Qwen2.5-1.5B-Instruct \
#     launch/cluster/single_node_8gpu.sh                     # learner on GPUs 0-3,
#                                                            # 4 SGLang servers on 4-7
#   (7B with RSPO needs ~85 GB a GPU on 4 GPUs -- see --dry_run; give it all 8
#   GPUs with the in-process engine, or servers on other nodes.)
#   LORA_RANK=16 ROLLOUT=sglang MODEL_DIR=/data/Qwen2.5-7B-Instruct \
#     launch/cluster/single_node_8gpu.sh                     # LoRA: servers get
#                                                            # only the adapters
#   launch/cluster/single_node_8gpu.sh --dry_run             # print the plan only
#
# Extra arguments go to launch/train.py. The plan's dry run always comes
# first (written to $WORKDIR/plan.json): a run that would not fit stops
# there with exit 1 and one line naming the key to change, before a server
# starts (--allow_plan_overflow runs it anyway).

set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python}                 # venv: requirements.txt, jax[cuda12], -e .
CONFIG=${CONFIG:-configs/alfworld_gigpo.py:model=qwen2.5-7b}
MESH=${MESH:-configs/mesh/gpu8.py}       # gpu8.py:tensor=2 -> (1, 4, 2)
WORKDIR=${WORKDIR:-runs/single_node_$(date +%Y%m%d_%H%M%S)}
MODEL_DIR=${MODEL_DIR:-}                 # HF checkpoint (config.json + safetensors)
ROLLOUT=${ROLLOUT:-jax}                  # jax | sglang
SERVER_GPUS=${SERVER_GPUS:-4}            # ROLLOUT=sglang: GPUs given to servers
SGLANG_PYTHON=${SGLANG_PYTHON:-$PYTHON}
SGLANG_PORT=${SGLANG_PORT:-30000}
LORA_RANK=${LORA_RANK:-}                 # > 0: train LoRA adapters
                                         # (model.lora_rank)
LORA_ALPHA=${LORA_ALPHA:-}               # model.lora_alpha (empty: the
                                         # config's)
LORA_TARGETS=${LORA_TARGETS:-}           # model.lora_targets, e.g. q,v (empty:
                                         # the config's; the servers: all 7)

# JAX's share of each learner GPU (it preallocates 75 % by default); the
# rest is CUDA context, cuDNN workspace and NCCL buffers. --dry_run plans
# with it (memory_per_device vs usable_GB).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
# launch/train.py puts launch/xla_flags.py's GPU flags in front of
# XLA_FLAGS (latency-hiding scheduler, pipelined FSDP collectives, no CUDA
# graphs: each with its reason there); RSPO_XLA_PLATFORM=none leaves
# XLA_FLAGS as it is.
export RSPO_XLA_PLATFORM=${RSPO_XLA_PLATFORM:-gpu}

ARGS=(--config="$CONFIG" --workdir="$WORKDIR")
[[ -n "$MODEL_DIR" ]] && ARGS+=(--config.model.checkpoint_dir="$MODEL_DIR")

# LORA_RANK > 0: the learner's model.lora_* flags in ARGS, the servers'
# LoRA flags in SERVER_ARGS.
source launch/cluster/lora_args.sh

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

if [[ "$ROLLOUT" == "sglang" ]]; then
  [[ -n "$MODEL_DIR" ]] || { echo "ROLLOUT=sglang needs MODEL_DIR" >&2; exit 1; }
  LEARNER_GPUS=$((8 - SERVER_GPUS))
  URLS=()
  for ((g = LEARNER_GPUS; g < 8; g++)); do
    URLS+=("http://127.0.0.1:$((SGLANG_PORT + g))")
  done
  # The learner sees only its GPUs; the mesh shrinks to match
  # (make_mesh_config: fsdp absorbs the devices).
  MESH="$MESH:devices_per_host=$LEARNER_GPUS"
  ARGS+=(--config.rollout.engine=sglang
         --config.rollout.server_urls="$(IFS=,; echo "${URLS[*]}")")
fi

# The plan first (no GPU is touched): exit 1 here when it does not fit.
mkdir -p "$WORKDIR"
"$PYTHON" launch/train.py "${ARGS[@]}" --mesh="$MESH" "$@" --dry_run \
  > "$WORKDIR/plan.json"
for arg in "$@"; do
  [[ "$arg" == --dry_run ]] && { cat "$WORKDIR/plan.json"; exit 0; }
done

if [[ "$ROLLOUT" == "sglang" ]]; then
  for ((g = LEARNER_GPUS; g < 8; g++)); do
    CUDA_VISIBLE_DEVICES=$g SGLANG_RETURN_ORIGINAL_LOGPROB=1 \
      "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$MODEL_DIR" \
      --host 127.0.0.1 --port "$((SGLANG_PORT + g))" --dtype bfloat16 \
      --mem-fraction-static 0.85 ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"} \
      > "$WORKDIR/sglang-$g.log" 2>&1 &
    PIDS+=($!)
  done
  for url in "${URLS[@]}"; do
    for ((t = 0; t < 180; t++)); do
      curl -sf "$url/health" > /dev/null && break
      sleep 5
    done
    curl -sf "$url/health" > /dev/null || { echo "$url not healthy" >&2; exit 1; }
  done
  export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((LEARNER_GPUS - 1)))
fi

"$PYTHON" launch/train.py "${ARGS[@]}" --mesh="$MESH" "$@"
