#!/usr/bin/env bash
# lightning-run names a planted slow rank while the job runs, and says nothing about a balanced one.
#   straggler.sh LIGHTNING_RUN STRAGGLER_JOB
set -uo pipefail
run="$1"; job="$2"
fail() { echo "FAIL: $*"; exit 1; }

out="$("$run" model --accelerator cpu --devices 3 "$job" 60 2 120 2>&1)" || fail "the slow job failed: $out"
line="$(grep "arrives last" <<<"$out")" || fail "the slow rank was not named: $out"
grep -q "lightning-run: rank 2 on $(hostname) arrives last at" <<<"$line" || fail "wrong rank or host: $line"
lag="$(sed -n 's/.*median \([0-9]*\) ms behind.*/\1/p' <<<"$line")"
[ -n "$lag" ] && [ "$lag" -ge 80 ] && [ "$lag" -le 400 ] || fail "median lag $lag ms for a 120 ms sleep: $line"
[ "$(grep -c "arrives last" <<<"$out")" -eq 1 ] || fail "named more than once: $out"
echo "slow job: $line"

out="$("$run" model --accelerator cpu --devices 3 "$job" 60 -1 0 2>&1)" || fail "the balanced job failed: $out"
! grep -q "arrives last" <<<"$out" || fail "a balanced job named a straggler: $out"
out="$("$run" model --accelerator cpu --devices 3 --straggler-threshold 0 "$job" 60 2 120 2>&1)" || fail "$out"
! grep -q "arrives last" <<<"$out" || fail "--straggler-threshold 0 still named one: $out"
echo "stragglers: all checks passed"
