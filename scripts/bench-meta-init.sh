#!/usr/bin/env bash
# Meta-device initialisation under FULL_SHARD (docs/benchmarks.md, "Meta-device initialisation"):
# per-rank peak memory of the build and setup, and of the training steps, for a model built
# normally and on the meta device side by side, on 2 and 4 ranks, then the meta build on 4 ranks
# without backward prefetch and with Adam (apps/bench_fsdp_meta_init.cpp).
# Prints one JSON line per run. MODEL="--layers L --width W" picks the model (default: 96 x 1024,
# 101 M parameters, 403 MB).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
read -r -a model <<<"${MODEL:---layers 96 --width 1024}"
run() { OMP_NUM_THREADS=1 "$bin/lightning-run" model --accelerator cpu --devices "$1" --no-tag-output \
  "$bin/bench_fsdp_meta_init" "${model[@]}" "${@:2}" | grep '"benchmark"'; }
for ranks in 2 4; do
  for flag in "" --meta; do run "$ranks" $flag; done
done
run 4 --meta --no-prefetch  # without the unit backward prefetching holds
run 4 --meta --adam          # the ZeRO-3 formula with optimizer state
