#!/usr/bin/env bash
# The flight recorder's cost (docs/benchmarks.md, "Flight recorder"): ns per recorded collective
# (bench_flight_recorder), then the P3 tiny-MLP 2-rank DDP step with the recorder on (default) and
# off (LT_FLIGHT_RECORDS=0), alternating REPEATS times; prints every JSON line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-5}"
export OMP_NUM_THREADS=1
"$bin/bench_flight_recorder" 1000000 7
for _ in $(seq "$repeats"); do
  for records in 2048 0; do
    echo -n "{\"flight_records\":$records,"
    LT_FLIGHT_RECORDS=$records "$bin/lightning-run" model --accelerator cpu --devices 2 --process-group-backend gloo "$bin/bench_ddp_step" 32-64-10 16 2000 200 \
      2>/dev/null | sed 's/^\[rank 0\]: {//'
  done
done
