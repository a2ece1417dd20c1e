#!/usr/bin/env bash
# The GPT example under fsdp with one unit per block (--fsdp-block-units) and every block
# checkpointed ends on the weights the plain ddp run ends on (the same weights_l2).
#   gpt_fsdp_block_units.sh LIGHTNING_RUN GPT
set -uo pipefail
run="$1"; gpt="$2"
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
tiny=(--layers 2 --d-model 64 --heads 4 --seq 32 --vocab 128 --batch-size 2 --steps 3 --warmup 1 --no-progress)
l2_of() { sed -n 's/.*"weights_l2":\([0-9.e+-]*\).*/\1/p' <<<"$1"; }
ddp="$("$run" model --accelerator cpu --devices 2 --strategy ddp "$gpt" "${tiny[@]}" 2>&1)" || fail "ddp run: $ddp"
fsdp="$("$run" model --accelerator cpu --devices 2 --strategy fsdp "$gpt" "${tiny[@]}" --fsdp-block-units \
  --activation-checkpointing 2>&1)" || fail "fsdp run: $fsdp"
grep -q '"activation_checkpointing":true' <<<"$fsdp" || fail "the fsdp run did not checkpoint: $fsdp"
a="$(l2_of "$ddp")"; b="$(l2_of "$fsdp")"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "weights_l2 $a under ddp, $b under fsdp with block units and checkpointing"
echo "weights_l2 $a both: all checks passed"
