# LoRA flags for the GPU launchers (single_node_8gpu.sh, slurm_gpu.sbatch),
# which source this file from the repository root after setting LORA_RANK,
# LORA_ALPHA, LORA_TARGETS and the learner's ARGS.
#
# LoRA (LORA_RANK > 0): the learner trains adapters on a frozen base, and
# each SGLang server starts with LoRA on, so a weight sync loads only the
# PEFT adapter (rollout.sglang_lora_sync, docs/scale_out.md "LoRA").
# --lora-target-modules: the HF names of the targets (q -> q_proj, gate ->
# gate_proj, ...), as the adapter's target_modules (rspo_jax/models/lora.py
# peft_config). A CONFIG that sets model.lora_targets needs the same list
# in LORA_TARGETS (the script does not read the config).
#
# Sets: ARGS += the learner's model.lora_* flags; SERVER_ARGS: the SGLang
# servers' LoRA flags (empty with LoRA off). LORA_TARGETS may separate the
# targets by commas, semicolons or spaces; the learner gets them joined by
# commas (lora.parse_targets splits on , and ; only).
SERVER_ARGS=()
if [[ -n "$LORA_RANK" && "$LORA_RANK" != 0 ]]; then
  [[ "$LORA_RANK" =~ ^[0-9]+$ ]] || {
    echo "LORA_RANK=$LORA_RANK: a positive integer, or 0 / empty for off" >&2
    exit 1; }
  IFS=',; ' read -ra LORA_TARGET_LIST \
    <<< "${LORA_TARGETS:-q,k,v,o,gate,up,down}"
  LORA_MODULES=()
  for target in ${LORA_TARGET_LIST[@]+"${LORA_TARGET_LIST[@]}"}; do
    case "$target" in
      q|k|v|o|gate|up|down) LORA_MODULES+=("${target}_proj") ;;
      *) echo "LORA_TARGETS: $target is not one of q,k,v,o,gate,up,down" >&2
         exit 1 ;;
    esac
  done
  ARGS+=(--config.model.lora_rank="$LORA_RANK")
  [[ -n "$LORA_ALPHA" ]] && ARGS+=(--config.model.lora_alpha="$LORA_ALPHA")
  [[ -n "$LORA_TARGETS" ]] && ARGS+=(
    --config.model.lora_targets="$(IFS=,; echo "${LORA_TARGET_LIST[*]}")")
  SERVER_ARGS+=(--enable-lora --max-lora-rank "$LORA_RANK"
                --lora-target-modules
                ${LORA_MODULES[@]+"${LORA_MODULES[@]}"})
fi
