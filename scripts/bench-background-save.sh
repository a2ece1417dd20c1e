#!/usr/bin/env bash
# P9: the time the training loop is blocked per checkpoint, fabric.save against
# fabric.save_in_background, on 2 CPU ranks with MB (default 512) megabytes of weights plus Adam's
# state, under fsdp (sharded folder) and ddp (one file); and Python's torch.distributed.checkpoint
# save against async_save under FSDP2 as the peer. Needs a build with tests (the bench mode of
# build/bin/lf_background_save_checks). docs/benchmarks.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
megabytes="${MB:-512}"
repeats="${REPEATS:-3}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/p9.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
for strategy in fsdp ddp; do
  "$bin/lightning-run" model --accelerator cpu --devices 2 "$bin/lf_background_save_checks" bench "$strategy" "$dir" \
    "$megabytes" "$repeats" 2>/dev/null | grep "P9" | sed 's/^\[rank 0\]: //'
  rm -rf "${dir:?}"/*
done
OMP_NUM_THREADS=1 "$root/.venv/bin/torchrun" --standalone --nproc-per-node 2 "$root/scripts/bench_background_save_python.py" \
  "$dir" "$megabytes" "$repeats" 2>/dev/null | grep "P9"
