#!/usr/bin/env bash
# A sharded fsdp checkpoint saved on 2 ranks loads bitwise on 1 and on 4 ranks, and
# `lightning-run model consolidate` turns it into one file equal to the unsharded state.
# Usage: fsdp_checkpoint.sh LIGHTNING_RUN FSDP_CHECKS CHECKPOINT_TOOL
set -euo pipefail
run="$1"; checks="$2"; tool="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$run" model --accelerator cpu --devices 2 "$checks" save FULL_SHARD "$dir"
ls "$dir/ck"
for ranks in 1 4; do
  "$run" model --accelerator cpu --devices "$ranks" "$checks" load "$dir"
done
"$run" model consolidate "$dir/ck"
"$tool" same "$dir/ck.consolidated" "$dir/reference.pt" model
