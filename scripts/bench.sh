#!/usr/bin/env bash
# Runs the benchmark drivers and prints their JSON lines (docs/benchmarks.md records results).
# P1: Fabric step time over the raw LibTorch step, side by side, one thread (the LibTorch wheel's MKL).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-3}"
for batch in 64 4; do
  for _ in $(seq "$repeats"); do
    OMP_NUM_THREADS=1 "$bin/bench_step_time" --steps 300 --warmup 30 --batch-size "$batch"
  done
done
