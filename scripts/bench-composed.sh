#!/usr/bin/env bash
# Every 2-D and 3-D configuration of the composed strategy on this CPU (docs/benchmarks.md, "Every
# 2-D and 3-D configuration"): build/bin/bench_composed_memory under lightning-run, one JSON line
# per configuration: the median step time and each rank's peak memory during the step against the
# formula (parameters, gradients and AdamW's two states of what the rank trains). 4 ranks for the
# 2-D meshes, 8 for the 3-D ones (SECTIONS="2d 3d", the default). MODEL="--layers L ..." picks the
# model (default: the bench's 8 blocks of width 512, sequence 32).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
read -r -a model <<<"${MODEL:-}"
export OMP_NUM_THREADS=1
run() {  # devices, then the bench's flags
  "$bin/lightning-run" model --accelerator cpu --devices "$1" --no-tag-output \
    "$bin/bench_composed_memory" "${model[@]}" "${@:2}" | grep '^{"benchmark"'
}
sections="${SECTIONS:-2d 3d}"
if [[ " $sections " == *" 2d "* ]]; then
  run 4 --data ddp --tensor 2
  run 4 --data fsdp --tensor 2
  run 4 --data hsdp --shard 2
  run 4 --data fsdp --context 2
  run 4 --data ddp --context 2
  run 4 --data ddp --context 2 --tensor 2
fi
if [[ " $sections " == *" 3d "* ]]; then
  run 8 --data hsdp --shard 2 --tensor 2
  run 8 --data fsdp --context 2 --tensor 2
  run 8 --data ddp --context 2 --tensor 2
fi
