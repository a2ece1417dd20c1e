#!/usr/bin/env bash
# Runs the benchmark drivers and prints their JSON lines (docs/benchmarks.md records results).
# P1: Fabric step time over the raw LibTorch step, side by side, one thread (the LibTorch wheel's MKL),
# for batch 64 and 4, in three configurations:
#   sgd  --fused 0  Fabric steps through LibTorch's SGD, as the raw loop does (Fabric's own overhead)
#   sgd  --fused 1  Fabric's default: ATen's fused SGD kernel, against LibTorch's SGD
#   adam --fused 1  Fabric's fused Adam against LibTorch's Adam
# Then, as a user comparing two programs would: the Adam loop at batch 64 with each side alone in
# its own process (--side), at one thread and at the machine's default; and the GPT example's whole
# loop on the CPU with LibTorch's AdamW step and with the fused one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-3}"
for config in "sgd 0" "sgd 1" "adam 1"; do
  read -r optimizer fused <<<"$config"
  for batch in 64 4; do
    for _ in $(seq "$repeats"); do
      OMP_NUM_THREADS=1 "$bin/bench_step_time" --steps 300 --warmup 30 --batch-size "$batch" \
        --optimizer "$optimizer" --fused "$fused"
    done
  done
done
for threads in 1 default; do
  for _ in $(seq "$repeats"); do
    for side in raw fabric; do
      if [ "$threads" = 1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
      "$bin/bench_step_time" --steps 300 --warmup 30 --batch-size 64 --optimizer adam --fused 1 --side "$side"
    done
  done
done
unset OMP_NUM_THREADS
for _ in $(seq "$repeats"); do
  for step in libtorch fused; do
    "$bin/gpt" --accelerator cpu --vocab 1024 --seq 64 --d-model 256 --heads 4 --layers 2 --batch-size 8 \
      --steps 100 --warmup 10 --optimizer-step "$step" --no-progress | tail -n 1
  done
done
