#!/usr/bin/env bash
# What a user tries: train the example under fsdp on 2 workers with --checkpoint-dir, consolidate
# the sharded entry, resume from the sharded entry, and load the consolidated file on one process.
# Usage: example_fsdp_consolidate.sh LIGHTNING_RUN IMAGE_CLASSIFIER CHECKPOINT_TOOL
set -euo pipefail
run="$1"; example="$2"; tool="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$run" model --strategy fsdp --accelerator cpu --devices 2 "$example" --max-steps 15 --batch-size 32 --checkpoint-dir ck
entry="ck/epoch=1-step=15.ckpt"
[ -d "$entry" ] || { echo "FAIL: no sharded folder $entry"; ls -R ck; exit 1; }
"$run" model consolidate "$entry"
# The consolidated file resumes a single-process run (fsdp's model and Adam state are whole there).
"$example" --max-steps 20 --batch-size 32 --accelerator cpu --resume "$entry.consolidated" --checkpoint-dir single >log1
grep -q '"steps":20' log1 || { cat log1; echo "FAIL: resuming from the consolidated file"; exit 1; }
# The sharded folder resumes an fsdp run too.
"$run" model --strategy fsdp --accelerator cpu --devices 2 "$example" --max-steps 20 --batch-size 32 \
  --resume "$entry" --checkpoint-dir ck2 >log2
grep -q "resumed from" log2 && grep -q '"steps":20' log2 || { cat log2; echo "FAIL: resuming from the sharded folder"; exit 1; }
ls single ck2
