#!/usr/bin/env bash
# lightning-run's end-of-job summary: each rank's step-time percentiles, from the ranks' own timing
# of the intervals between optimizer steps.   step_times.sh LIGHTNING_RUN PROFILE_JOB
set -uo pipefail
run="$1"; job="$2"
fail() { echo "FAIL: $*"; exit 1; }
out="$("$run" model --accelerator cpu --devices 2 "$job" 2>&1)" || fail "the job failed: $out"
line="$(grep "step times (between optimizer steps) on node 0: " <<<"$out")" || fail "no step-time summary: $out"
for rank in 0 1; do
  grep -Eq "rank $rank: p50 [0-9.]+ ms, p90 [0-9.]+ ms, p99 [0-9.]+ ms, max [0-9.]+ ms over 4 steps" <<<"$line" ||
    fail "rank $rank's percentiles are missing or wrong (5 optimizer steps give 4 intervals): $line"
done
echo "$line"
echo "step times: all checks passed"
