#!/usr/bin/env bash
# Pipeline parallelism on this CPU (docs/benchmarks.md, "Pipeline parallelism"): the pipeline
# tests' GPT (build/bin/lf_pipeline_checks --bench) in 2 stages on 2 ranks (this machine has 2
# cores: one rank per core), GPipe and 1F1B at 4 and 8 micro-batches, against ddp on the same 2
# ranks and global batch (pipe size 1, one micro-batch). Each configuration runs REPEATS times
# (default 3) in turn; each run prints one line per rank: the step time (the slower rank's, median
# over the steps after the first), that rank's idle fraction against it, its forward and backward
# time, the most micro-batches it held and how far training raised its peak resident memory.
# The textbook bubble (p - 1) / (m + p - 1) is printed beside each pipeline configuration.
# MODEL="--d-model D --seq L --blocks K --batch B" picks the model; STEPS the steps per run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-3}"
steps="${STEPS:-8}"
read -r -a model <<<"${MODEL:---d-model 128 --seq 256 --blocks 6 --batch 64}"
export OMP_NUM_THREADS=1
run() {  # label, then lf_pipeline_checks flags
  local label="$1"; shift
  "$bin/lightning-run" model --accelerator cpu --devices 2 --no-tag-output \
    "$bin/lf_pipeline_checks" --bench "${model[@]}" --steps "$steps" "$@" | grep '^pipeline bench' | sed "s/^/$label: /"
}
for _ in $(seq "$repeats"); do
  for m in 4 8; do
    for schedule in GPipe 1F1B; do
      run "$schedule m=$m textbook $(python3 -c "print(round(1/($m+1), 4))")" --pipe 2 --schedule "$schedule" --micro-batches "$m"
    done
  done
  run "ddp" --pipe 1 --micro-batches 1
done
