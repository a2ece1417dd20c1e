#!/usr/bin/env bash
# The store at scale (docs/benchmarks.md, "Store at scale"): bench_store_scale at 64, 256, 1024 and
# 4096 simulated ranks, each over at least two hang-watch periods, then the same rendezvous
# pattern with Python torch's TCPStore (torchrun's store) for comparison. Runs in a network
# namespace of its own when root (unshare -n): c10d looks up the name of every store connection,
# and a host whose DNS server does not answer stalls those lookups in 5 s steps.
#   scripts/bench-store-scale.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
if [ "$(id -u)" = 0 ] && [ -z "${LF_BENCH_ISOLATED:-}" ]; then
  exec unshare -n env LF_BENCH_ISOLATED=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
for ranks in 64 256 1024 4096; do
  case $ranks in 64) steady=10 ;; 256) steady=20 ;; 1024) steady=60 ;; 4096) steady=160 ;; esac  # two periods or more
  "$build/bin/bench_store_scale" "$ranks" "$steady" 2>/dev/null
done
for ranks in 64 256 1024 4096; do
  "$root/.venv/bin/python" "$root/scripts/bench_store_scale_python.py" "$ranks" 2>/dev/null
done
