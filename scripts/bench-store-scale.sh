#!/usr/bin/env bash
# The store at scale (docs/benchmarks.md, "Store at scale"): bench_store_scale with every rank on
# its own store connection (torchrun, srun, mpirun; lightning-run with --no-store-relay) at 1024
# and 4096 simulated ranks, and through store relays of 128 ranks per simulated node (lightning-run
# across nodes) at 1024, 4096 and 16,384; each over at least two hang-watch periods, then a hang
# whose report is timed (bench_store_scale exits non-zero when it comes later than the hang
# timeout plus two periods). Then the same rendezvous pattern with Python torch's TCPStore
# (torchrun's store) at 1024 ranks for comparison. Runs in a network namespace of its own when root
# (unshare -n): c10d looks up the name of every store connection, and a host whose DNS server does
# not answer stalls those lookups in 5 s steps. 16,384 simulated ranks are 16,384 threads: the
# script raises kernel.pid_max when it is lower than 65536.
#   scripts/bench-store-scale.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
if [ "$(id -u)" = 0 ] && [ -z "${LF_BENCH_ISOLATED:-}" ]; then
  if [ "$(cat /proc/sys/kernel/pid_max)" -lt 65536 ]; then echo 65536 > /proc/sys/kernel/pid_max; fi
  exec unshare -n env LF_BENCH_ISOLATED=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
hang=30  # seconds
# ranks nodes(0: no relay) steady-seconds (two periods or more)
while read -r ranks nodes steady; do
  "$build/bin/bench_store_scale" "$ranks" "$steady" --nodes "$nodes" --hang-timeout "$hang" 2>/dev/null
done <<'ROWS'
1024 0 50
4096 0 155
1024 8 10
4096 32 10
16384 128 25
ROWS
"$root/.venv/bin/python" "$root/scripts/bench_store_scale_python.py" 1024 2>/dev/null
