#!/usr/bin/env bash
# fsdp prefetching on the GPT example (docs/benchmarks.md, "fsdp prefetch"): rank 0's median
# FULL_SHARD step with one unit per block, 2 ranks, one thread each, for each --fsdp-prefetch
# setting side by side, alternated REPEATS times (default 3). BACKEND=gloo for gloo (default shm).
# Prints one JSON line per run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
model=(--layers 8 --d-model 256 --heads 4 --seq 256 --vocab 2048 --batch-size 4 --steps 6 --warmup 2 --no-progress)
for _ in $(seq "${REPEATS:-3}"); do
  for prefetch in off backward forward both; do
    OMP_NUM_THREADS=1 "$bin/lightning-run" model --accelerator cpu --devices 2 --strategy fsdp \
      --process-group-backend "${BACKEND:-shm}" --no-tag-output "$bin/gpt" "${model[@]}" --fsdp-block-units \
      --fsdp-prefetch "$prefetch" | grep '"benchmark"'
  done
done
