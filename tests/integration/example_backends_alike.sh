#!/usr/bin/env bash
# The example classifier on 2 workers trains to exactly the same weights and optimizer state on
# the shm backend as on gloo: with 2 ranks a sum has one order, so every all-reduce is bitwise
# equal, and so is everything that follows.
# Usage: example_backends_alike.sh LIGHTNING_RUN EXAMPLE CHECKPOINT_TOOL
set -euo pipefail
run="$1"; example="$2"; tool="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
for backend in shm gloo; do
  "$run" model --accelerator cpu --devices 2 --process-group-backend "$backend" \
    "$example" --batch-size 32 --accelerator cpu --max-steps 30 --checkpoint-dir "$dir/$backend" >"$dir/$backend.log" 2>&1 ||
    { cat "$dir/$backend.log"; echo "FAIL: the $backend run failed"; exit 1; }
done
shm="$(ls -d "$dir"/shm/*step=30.ckpt)"
gloo="$(ls -d "$dir"/gloo/*step=30.ckpt)"
"$tool" same "$shm" "$gloo" model || { echo "FAIL: the weights differ"; exit 1; }
"$tool" same "$shm" "$gloo" optimizer || { echo "FAIL: the optimizer state differs"; exit 1; }
echo "shm and gloo trained alike"
