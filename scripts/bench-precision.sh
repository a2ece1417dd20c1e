#!/usr/bin/env bash
# bf16-mixed against 32-true on this CPU, one thread (docs/benchmarks.md, issue #5):
# (a) the P1 MLP step, Fabric in bf16-mixed against the raw float32 loop, side by side;
# (b) the image classifier's CNN, 300 steps of batch 64 plus the test pass, wall time of each.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
for _ in $(seq "$repeats"); do
  "$bin/bench_step_time" --steps 200 --warmup 20 --batch-size 64 --precision bf16-mixed
done
for _ in $(seq "$repeats"); do
  for precision in 32-true bf16-mixed; do
    "$bin/image_classifier" --max-steps 300 --batch-size 64 --accelerator cpu --precision "$precision" |
      sed "s/^{/{\"precision\":\"$precision\",\"threads\":$OMP_NUM_THREADS,/"
  done
done
