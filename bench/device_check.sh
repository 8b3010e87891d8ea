#!/usr/bin/env bash
# The first accelerator check (issue 16 item 8), one command, one JSON file:
#
#   bash bench/device_check.sh [OUT.json]           # one H200: < 8 minutes
#   bash bench/device_check.sh --smoke [OUT.json]   # tiny shapes, CPU, s
#
# bench/device.py --paper: the Qwen2.5-1.5B learner step (16 rows x
# (4096 + 512), fp32 masters, bf16 compute, remat, scanned layers,
# micro-batches) on all visible devices and on one, with compile seconds,
# MFU / HFU, peak memory (compiled, planned, allocator) and the count of
# activation-sized collectives; pi_old's log-prob pass; the rollout
# engine's decode. Every row also lands in OUT.json (default
# device_check.json; --smoke: device_check_smoke.json), rewritten after
# each, so a run cut short by the time limit keeps what it measured.
#
# Not yet run on hardware (no session so far had an accelerator): the
# 8-minute budget is sized from the parts' shapes, not measured.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

if [[ "${1:-}" == "--smoke" ]]; then
  shift
  OUT=${1:-device_check_smoke.json}
  # 8 fake CPU devices: the all-devices mesh is (1, 8, 1), as on a node.
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8"
  exec "$PYTHON" bench/device.py --paper --smoke --peak_tflops=1 \
      --budget_s=120 --out="$OUT"
fi

OUT=${1:-device_check.json}
# As the launchers (launch/cluster/*.sh): JAX may take 92 % of each GPU
# (its default is 75 %); the rest is CUDA context, cuDNN workspace and
# NCCL buffers. No persistent compilation cache: compile seconds are the
# measurement.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
unset JAX_COMPILATION_CACHE_DIR
# H200 dense bf16 peak: 989 TFLOP/s (PEAK_TFLOPS for another device).
# budget_s: no part starts after 6 minutes; timeout: the whole at 8.
timeout --signal=INT 475 "$PYTHON" bench/device.py --paper \
    --peak_tflops="${PEAK_TFLOPS:-989}" --budget_s=360 --out="$OUT"
