#!/bin/bash
# Cloud TPU VM slice (default v5e-16: 4 hosts x 4 chips). The same command
# runs on every host (gcloud ... ssh --worker=all); JAX finds the other hosts
# by itself (RSPO_DISTRIBUTED=auto -> jax.distributed.initialize()).
#
#   TPU_NAME=rspo ZONE=us-west4-a launch/cluster/tpu_vm.sh create   # the slice
#   TPU_NAME=rspo ZONE=us-west4-a launch/cluster/tpu_vm.sh setup    # code + deps
#   TPU_NAME=rspo ZONE=us-west4-a launch/cluster/tpu_vm.sh train    # run
#   TPU_NAME=rspo ZONE=us-west4-a launch/cluster/tpu_vm.sh plan     # dry run, locally
#   TPU_NAME=rspo ZONE=us-west4-a launch/cluster/tpu_vm.sh delete
#
# WORKDIR must be one directory all hosts share (a Filestore NFS mount or a
# gcsfuse mount): every host writes its shards of each orbax checkpoint.

set -euo pipefail

TPU_NAME=${TPU_NAME:?set TPU_NAME}
ZONE=${ZONE:?set ZONE}
PROJECT=${PROJECT:-$(gcloud config get-value project 2>/dev/null)}
ACCELERATOR=${ACCELERATOR:-v5litepod-16}
RUNTIME=${RUNTIME:-v2-alpha-tpuv5-lite}
REPO_URL=${REPO_URL:-}                   # git URL; empty: copy this checkout
REMOTE_DIR=${REMOTE_DIR:-rspo_jax}       # under each host's home
CONFIG=${CONFIG:-configs/webshop_grpo.py:model=qwen2.5-1.5b}
MESH=${MESH:-configs/mesh/tpu_v5e_16.py}
WORKDIR=${WORKDIR:-/mnt/shared/runs/$TPU_NAME}
EXTRA_ARGS=${EXTRA_ARGS:-}

ssh_all() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" \
    --project="$PROJECT" --worker=all --command="$1"
}

case "${1:-}" in
  create)
    gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
      --project="$PROJECT" --accelerator-type="$ACCELERATOR" \
      --version="$RUNTIME"
    ;;
  setup)
    if [[ -n "$REPO_URL" ]]; then
      ssh_all "rm -rf $REMOTE_DIR && git clone $REPO_URL $REMOTE_DIR"
    else
      here="$(cd "$(dirname "$0")/../.." && pwd)"
      tar -C "$here" --exclude=.git --exclude=runs -czf /tmp/rspo_jax.tgz .
      gcloud compute tpus tpu-vm scp /tmp/rspo_jax.tgz "$TPU_NAME":~/ \
        --zone="$ZONE" --project="$PROJECT" --worker=all
      ssh_all "mkdir -p $REMOTE_DIR && tar -C $REMOTE_DIR -xzf rspo_jax.tgz"
    fi
    # jax[tpu] brings libtpu; the rest is the CPU stack of requirements.txt.
    ssh_all "cd $REMOTE_DIR && python3 -m venv venv && \
      venv/bin/pip install -q -r requirements.txt 'jax[tpu]==0.10.2' && \
      venv/bin/pip install -q --no-deps -e ."
    ;;
  plan)
    here="$(cd "$(dirname "$0")/../.." && pwd)"
    (cd "$here" && python launch/train.py --config="$CONFIG" --mesh="$MESH" \
      --workdir="$WORKDIR" --dry_run)
    ;;
  train)
    # The plan first, on every host: one that does not fit (or a mesh
    # that does not match the slice) stops here with exit 1 and one line
    # naming the key to change (EXTRA_ARGS=--allow_plan_overflow runs it
    # anyway). Then nohup + log per host: the run survives a dropped ssh
    # session. RSPO_XLA_PLATFORM=tpu: launch/train.py puts
    # launch/xla_flags.py's TPU flags (asynchronous, overlapped
    # collectives; MaxText's v5e set; those this libtpu does not know are
    # dropped with a warning) in front of LIBTPU_INIT_ARGS.
    ssh_all "cd $REMOTE_DIR && mkdir -p $WORKDIR && \
      venv/bin/python launch/train.py --config='$CONFIG' --mesh='$MESH' \
        --workdir='$WORKDIR' $EXTRA_ARGS --dry_run > plan.json && \
      RSPO_DISTRIBUTED=auto RSPO_XLA_PLATFORM=tpu nohup \
      venv/bin/python launch/train.py \
        --config='$CONFIG' --mesh='$MESH' --workdir='$WORKDIR' \
        --no_progress $EXTRA_ARGS > \$HOME/train-\$(hostname).log 2>&1 &"
    echo "started; logs: ~/train-<host>.log on each worker"
    ;;
  delete)
    gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" \
      --project="$PROJECT" --quiet
    ;;
  *)
    echo "usage: $0 create|setup|plan|train|delete" >&2
    exit 2
    ;;
esac
