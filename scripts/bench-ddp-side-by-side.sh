#!/usr/bin/env bash
# P3 side by side: the C++ DDP step (2 ranks, gloo, one thread per rank) of this build and another
# one (e.g. a worktree of the commit before a change, built with its own scripts/build.sh),
# alternately, REPEATS times per model; prints each run and the new/old ratio of medians.
# Usage: scripts/bench-ddp-side-by-side.sh OTHER_BUILD_DIR
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
new="${BUILD_DIR:-$root/build}/bin"
old="${1:?usage: scripts/bench-ddp-side-by-side.sh OTHER_BUILD_DIR}/bin"
repeats="${REPEATS:-5}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for _ in $(seq "$repeats"); do
  for side in old new; do
    bin="$new"; [ "$side" = old ] && bin="$old"
    for config in "32-64-10 16" "784-1024-1024-10 64"; do
      set -- $config
      ms=$(OMP_NUM_THREADS=1 "$bin/lightning-run" model --accelerator cpu --devices 2 --process-group-backend gloo \
             "$bin/bench_ddp_step" "$1" "$2" 300 30 2>/dev/null | grep -o '"median_step_ms":[0-9.]*' | cut -d: -f2)
      echo "$side $1 $ms" | tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, layout, ms = line.split()
    runs[(layout, side)].append(float(ms))
for layout in ("32-64-10", "784-1024-1024-10"):
    old, new = statistics.median(runs[(layout, "old")]), statistics.median(runs[(layout, "new")])
    print(f"{layout}: old median {old:.3f} ms, new median {new:.3f} ms, new/old {new / old:.3f}")
PY
