#!/usr/bin/env bash
# The Trainer example stopped after epoch 1 and started again (it resumes from its newest
# checkpoint) ends epoch 2 with exactly the weights and optimizer state of an uninterrupted 2-epoch
# run: the resumed data loader must replay epoch 2's shuffle (set_epoch), not epoch 1's again.
# Usage: example_resume_later_epoch.sh BUILD_YOUR_OWN_TRAINER CHECKPOINT_TOOL
set -euo pipefail
example="$1"; tool="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
run() { "$example" --accelerator cpu --batch-size 32 --limit-train-batches 10 --limit-val-batches 1 --no-progress "$@"; }
run --max-epochs 2 --checkpoint-dir "$dir/straight" >/dev/null
run --max-epochs 1 --checkpoint-dir "$dir/split" >/dev/null
run --max-epochs 2 --checkpoint-dir "$dir/split" >"$dir/log"
grep -q "resumed from" "$dir/log" || { cat "$dir/log"; echo "FAIL: did not resume"; exit 1; }
ls "$dir/straight" "$dir/split"
straight="$(ls -d "$dir"/straight/epoch=2-step=*.ckpt)"
split="$(ls -d "$dir"/split/epoch=2-step=*.ckpt)"
"$tool" same "$straight" "$split" model || { echo "FAIL: weights differ after resuming in epoch 2"; exit 1; }
"$tool" same "$straight" "$split" optimizer || { echo "FAIL: optimizer state differs after resuming in epoch 2"; exit 1; }
echo "PASS: resumed in epoch 2, bitwise equal to the uninterrupted run"
