#!/usr/bin/env bash
# Activation checkpointing on the GPT example (docs/benchmarks.md, "Activation checkpointing"):
# rank 0's step time, activation memory (heap a forward keeps until its backward) and peak RSS,
# with and without --activation-checkpointing side by side, in one process and under lightning-run
# with 2 ranks (ddp, fsdp) and 4 ranks (ddp), one thread per rank. Prints one JSON line per run.
#   REPEATS=N (default 1) alternates the pair N times.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-1}"
model=(--layers 8 --d-model 256 --heads 4 --seq 256 --vocab 2048 --batch-size 4 --steps 4 --warmup 1 --no-progress)
for layout in "1 ddp" "2 ddp" "2 fsdp" "4 ddp"; do
  read -r ranks strategy <<<"$layout"
  for _ in $(seq "$repeats"); do
    for flag in "" --activation-checkpointing; do
      if [ "$ranks" = 1 ]; then
        line="$(OMP_NUM_THREADS=1 "$bin/gpt" --accelerator cpu "${model[@]}" $flag)"
      else
        line="$(OMP_NUM_THREADS=1 "$bin/lightning-run" model --accelerator cpu --devices "$ranks" --strategy "$strategy" \
          --no-tag-output "$bin/gpt" "${model[@]}" $flag | grep '"benchmark"')"
      fi
      echo "{\"ranks\":$ranks,\"strategy\":\"$strategy\",${line#\{}"
    done
  done
done
