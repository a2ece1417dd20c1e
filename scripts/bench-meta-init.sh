#!/usr/bin/env bash
# Meta-device initialisation under FULL_SHARD (docs/benchmarks.md, "Meta-device initialisation"):
# per-rank peak memory of the build and setup, and of the training steps, for a model built
# normally and on the meta device side by side, on 2 and 4 ranks (apps/bench_fsdp_meta_init.cpp).
# Prints one JSON line per run. MODEL="--layers L --width W" picks the model (default: 96 x 1024,
# 101 M parameters, 403 MB).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
read -r -a model <<<"${MODEL:---layers 96 --width 1024}"
for ranks in 2 4; do
  for flag in "" --meta; do
    OMP_NUM_THREADS=1 "$bin/lightning-run" model --accelerator cpu --devices "$ranks" --no-tag-output \
      "$bin/bench_fsdp_meta_init" "${model[@]}" $flag | grep '"benchmark"'
  done
done
