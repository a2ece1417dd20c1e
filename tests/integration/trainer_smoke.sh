#!/usr/bin/env bash
# The Trainer example under lightning-run on 2 workers: two short epochs with gradient
# accumulation, validation, checkpoints every epoch, CSV and TensorBoard logs written by rank 0.
# Usage: trainer_smoke.sh LIGHTNING_RUN BUILD_YOUR_OWN_TRAINER
set -euo pipefail
run="$1"; example="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$run" model --accelerator cpu --devices 2 "$example" --max-epochs 2 --limit-train-batches 12 --grad-accum-steps 3 \
  --limit-val-batches 4 --checkpoint-dir "$dir/ck" --log-dir "$dir/logs" >"$dir/out" 2>&1 || { cat "$dir/out"; echo "FAIL: the run failed"; exit 1; }
cat "$dir/out"
grep -q "done: epoch 2 step 8" "$dir/out" || { echo "FAIL: expected 2 epochs of 4 optimizer steps (12 batches / 3)"; exit 1; }
[ "$(grep -c "val_acc" "$dir/out")" -eq 2 ] || { echo "FAIL: expected one validation per epoch"; exit 1; }
ls "$dir/ck"
[ -f "$dir/ck/epoch=1-step=4.ckpt" ] && [ -f "$dir/ck/epoch=2-step=8.ckpt" ] || { echo "FAIL: checkpoints missing"; exit 1; }
csv="$dir/logs/csv/version_0/metrics.csv"
head -n 3 "$csv"
[ "$(head -n 1 "$csv")" = "step,train_loss,val_acc,val_loss" ] || { echo "FAIL: CSV header"; exit 1; }
[ "$(grep -c . "$csv")" -eq 11 ] || { echo "FAIL: expected 8 train rows + 2 validation rows + header"; exit 1; }
ls "$dir"/logs/tensorboard/version_0/events.out.tfevents.* >/dev/null || { echo "FAIL: no TensorBoard file"; exit 1; }
