#!/usr/bin/env bash
# P6 (memory per rank under ddp / SHARD_GRAD_OP / FULL_SHARD on 2 and 4 ranks against the ZeRO
# formulas), P6b (a step's peak memory with and without sharding units) and P7 (consolidate throughput against cp of the same bytes). docs/benchmarks.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
for ranks in 2 4; do
  for strategy in ddp SHARD_GRAD_OP FULL_SHARD; do
    "$bin/lightning-run" model --accelerator cpu --devices "$ranks" "$bin/bench_fsdp_memory" "$strategy" 2>/dev/null |
      grep '"P6' | sed 's/^\[rank 0\]: //'
  done
done
# P6b: a FULL_SHARD step's peak memory above rest, one unit for the whole model against one per layer.
for ranks in 2 4; do
  for units in "" --units; do
    "$bin/lightning-run" model --accelerator cpu --devices "$ranks" "$bin/bench_fsdp_peak" $units 2>/dev/null |
      grep '"P6b' | sed 's/^\[rank 0\]: //'
  done
done
# P7: a sharded checkpoint of the MLP with width W (model + Adam state: 12 bytes x ~W^2, ~340 MB at 3072).
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
width="${P7_WIDTH:-3072}"
"$bin/lightning-run" model --accelerator cpu --devices 2 "$bin/bench_fsdp_memory" FULL_SHARD --width "$width" \
  --save "$dir/ck" >/dev/null 2>&1
bytes="$(du -sb "$dir/ck" | cut -f1)"
for repeat in $(seq "${REPEATS:-3}"); do
  sync; rm -rf "$dir/copy" "$dir/ck.consolidated"
  start=$(date +%s.%N); cp -r "$dir/ck" "$dir/copy"; sync; end=$(date +%s.%N)
  cp_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')
  start=$(date +%s.%N); "$bin/lightning-run" model consolidate "$dir/ck" >/dev/null; sync; end=$(date +%s.%N)
  consolidate_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')
  ratio=$(awk -v a="$cp_s" -v b="$consolidate_s" 'BEGIN { printf "%.2f", a / b }')
  echo "{\"benchmark\":\"P7 consolidate\",\"bytes\":$bytes,\"cp_s\":$cp_s,\"consolidate_s\":$consolidate_s,\"throughput_ratio\":$ratio}"
done
