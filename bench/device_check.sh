#!/usr/bin/env bash
# The first accelerator check (docs/performance.md), one command, JSON files:
#
#   bash bench/device_check.sh [OUT.json]           # one H200: < 10 minutes
#   bash bench/device_check.sh --smoke [OUT.json]   # tiny shapes, CPU
#
# 0. bench/device.py --kernel_check, into
#    OUT_kernel.json: the fused attention kernel a run's
#    model.attention='auto' picks (cuDNN on GPU, splash on TPU; none on
#    CPU) against XLA's path in bf16, both against XLA's in float32, at
#    Qwen2.5-1.5B's attention shape with a large-activation head, rows of
#    0 (a padding row: length 1 as the model gives it, and raw length 0),
#    1, 640, 704 and 768 tokens padded to 768 and to 704 (64 mod 128:
#    cuDNN's backward has returned NaN grad_q there, pytorch issue
#    196678): non-finite values and errors of the output and grad q / k /
#    v, then a row recommending 'fused' or 'xla' (model.attention=xla) for
#    a run. Not yet run on a GPU or TPU.
# 1. bench/device.py --paper: the Qwen2.5-1.5B learner step (16 rows x
#    (4096 + 512), fp32 masters, bf16 compute, remat, scanned layers,
#    micro-batches; the batch starts with an all-zero padding row, as a
#    run's do) on all visible devices and on one, with compile seconds,
#    MFU / HFU, peak memory (compiled, planned, allocator), the count of
#    activation-sized collectives and "skipped" (1: a non-finite step,
#    e.g. NaN from the fused attention kernel); pi_old's log-prob pass; the
#    rollout engine's decode. Every row lands in OUT.json (default
#    device_check.json; --smoke: device_check_smoke.json), rewritten after
#    each, so a run cut short keeps what it measured.
# 2. bench/sharding_check.py: the same step compiled for (2, 4, 1) on 8
#    fake CPU devices -- the sharding check a one-GPU machine can make --
#    into OUT_sharding.json: activation-sized collectives, gradient
#    reductions not float32, 'data' all-reduces with 2 and 4 micro-batches.
#    With --cudnn (model.attention=cudnn, as 'auto' picks on a GPU): jax's
#    own cuDNN partitioning code, only the kernels stubbed
#    (rspo_jax/models/cudnn_stub.py), so a one-GPU run checks the
#    multi-device cuDNN compile (docs/scale_out.md, "Start here").
#
# Each step runs under `timeout`: SIGINT at its limit, SIGKILL 20 s later
# (a compile hung in XLA ignores SIGINT); a step that times out is
# reported on one line and the next one still runs. Exit status: the
# first failing step's.
#
# Not yet run on hardware (no session so far had an accelerator): the
# budget is sized from the parts' shapes, not measured.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
STATUS=0

# step NAME SECONDS COMMAND...: COMMAND under a kill timeout.
step() {
  local name=$1 limit=$2 rc
  shift 2
  timeout --signal=INT --kill-after=20 "$limit" "$@"
  rc=$?
  if (( rc == 124 || rc == 137 )); then
    echo "device_check: $name stopped at its ${limit} s limit" >&2
  elif (( rc != 0 )); then
    echo "device_check: $name failed (exit $rc)" >&2
  fi
  (( STATUS == 0 )) && STATUS=$rc
  return 0
}

if [[ "${1:-}" == "--smoke" ]]; then
  shift
  OUT=${1:-device_check_smoke.json}
  # 8 fake CPU devices: the all-devices mesh is (1, 8, 1), as on a node.
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8"
  step kernel_check 120 "$PYTHON" bench/device.py --kernel_check --smoke \
      --out="${OUT%.json}_kernel.json"
  step device.py 300 "$PYTHON" bench/device.py --paper --smoke \
      --peak_tflops=1 --budget_s=120 --out="$OUT"
  step sharding_check.py 300 "$PYTHON" bench/sharding_check.py --smoke --cudnn \
      --out="${OUT%.json}_sharding.json"
  exit "$STATUS"
fi

OUT=${1:-device_check.json}
# As the launchers (launch/cluster/*.sh): JAX may take 92 % of each GPU
# (its default is 75 %); the rest is CUDA context, cuDNN workspace and
# NCCL buffers. No persistent compilation cache: compile seconds are the
# measurement.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
unset JAX_COMPILATION_CACHE_DIR
# The launchers' XLA flags (launch/xla_flags.py); the summary row lists
# them (xla_flags_set).
export RSPO_XLA_PLATFORM=${RSPO_XLA_PLATFORM:-gpu}
# The kernel check: a few small compiles, seconds on a GPU.
step kernel_check 60 "$PYTHON" bench/device.py --kernel_check \
    --out="${OUT%.json}_kernel.json"
# H200 dense bf16 peak: 989 TFLOP/s (PEAK_TFLOPS for another device).
# budget_s: no part starts after 280 s; the step stops at 380 s.
step device.py 380 "$PYTHON" bench/device.py --paper \
    --peak_tflops="${PEAK_TFLOPS:-989}" --budget_s=280 --out="$OUT"
step sharding_check.py 100 "$PYTHON" bench/sharding_check.py --cudnn \
    --out="${OUT%.json}_sharding.json"
exit "$STATUS"
