#!/usr/bin/env bash
# P9: the time the training loop is blocked per checkpoint, fabric.save against
# fabric.save_in_background, on 2 CPU ranks with MB (default 512) megabytes of weights plus Adam's
# state, under fsdp (sharded folder) and ddp (one file); and Python's torch.distributed.checkpoint
# save against async_save under FSDP2 as the peer, each beside the disk's sequential write
# bandwidth measured just before with plain files (the floor). Needs a build with tests (the bench mode of
# build/bin/lf_background_save_checks). docs/benchmarks.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
megabytes="${MB:-512}"
repeats="${REPEATS:-3}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/p9.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
# The floor: the disk's sequential write bandwidth, measured here with plain files the size of
# each rank's part (3 x MB MiB over 2 ranks: weights, exp_avg, exp_avg_sq), written by two dd
# processes at once with fsync, before each configuration (the disk's speed drifts).
disk_floor() {
  local start end
  start=$(date +%s.%N)
  for rank in 0 1; do dd if=/dev/zero of="$dir/plain.$rank" bs=4M count=$((3 * megabytes / 2 / 4)) conv=fsync status=none & done
  wait
  end=$(date +%s.%N)
  rm -f "$dir"/plain.*
  python3 -c "print(f'P9 disk: {3 * $megabytes / 1024:.2f} GiB of plain files in {$end - $start:.2f} s, {3 * $megabytes / 1024 / ($end - $start):.2f} GiB/s (the floor for a save of this state)')"
}
for strategy in fsdp ddp; do
  disk_floor
  "$bin/lightning-run" model --accelerator cpu --devices 2 "$bin/lf_background_save_checks" bench "$strategy" "$dir" \
    "$megabytes" "$repeats" 2>/dev/null | grep "P9" | sed 's/^\[rank 0\]: //'
  rm -rf "${dir:?}"/*
done
disk_floor
OMP_NUM_THREADS=1 "$root/.venv/bin/torchrun" --standalone --nproc-per-node 2 "$root/scripts/bench_background_save_python.py" \
  "$dir" "$megabytes" "$repeats" 2>/dev/null | grep "P9"
