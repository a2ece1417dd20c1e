#!/usr/bin/env bash
# The GPT example under fsdp with one unit per block (--fsdp-block-units) and every block
# checkpointed ends on the weights the plain ddp run ends on (the same weights_l2), and so does it
# when built on the meta device (--meta-init); --meta-init under ddp is refused.
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
meta="$("$run" model --accelerator cpu --devices 2 --strategy fsdp "$gpt" "${tiny[@]}" --fsdp-block-units \
  --activation-checkpointing --meta-init 2>&1)" || fail "fsdp run built on the meta device: $meta"
grep -q '"meta_init":true' <<<"$meta" || fail "the --meta-init run did not say so: $meta"
a="$(l2_of "$ddp")"; b="$(l2_of "$fsdp")"; c="$(l2_of "$meta")"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "weights_l2 $a under ddp, $b under fsdp with block units and checkpointing"
[ "$a" = "$c" ] || fail "weights_l2 $a under ddp, $c under fsdp built on the meta device"
status=0
refused="$("$run" model --accelerator cpu --devices 2 --strategy ddp "$gpt" "${tiny[@]}" --meta-init 2>&1)" || status=$?
[ "$status" -eq 2 ] || fail "--meta-init under ddp exited with $status, expected 2 (a usage error): $refused"
grep -q -- "--meta-init needs --strategy fsdp" <<<"$refused" || fail "--meta-init under ddp: unclear refusal: $refused"
echo "weights_l2 $a in all three: all checks passed"
