#!/usr/bin/env bash
# The profiler trace of a pipeline job shows its schedule: with lightning-run --profile, each of
# the 2 ranks' traces holds a range for the forward and the backward of every micro-batch of its
# stage, in the schedule's order (1F1B: stage 0 runs its first forwards before its first backward).
# Usage: pipeline_profile.sh LIGHTNING_RUN PIPELINE_CHECKS
set -uo pipefail
run="$1"; checks="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
if ! output="$("$run" model --accelerator cpu --devices 2 --process-group-backend gloo --log-dir "$dir" \
    --profile 3-3 "$checks" --pipe 2 --steps 4 2>&1)"; then
  echo "FAIL: the job failed:"; echo "$output" | tail -n 15; exit 1
fi
failed=0
for rank in 0 1; do
  trace="$dir/profile/trace-rank$rank.json"
  [ -f "$trace" ] || { echo "FAIL: no $trace"; failed=1; continue; }
  for kind in forward backward; do
    for mb in 0 1 2 3; do
      grep -qF "lf::pipeline $kind stage $rank micro-batch $mb" "$trace" ||
        { echo "FAIL: rank $rank's trace has no range 'lf::pipeline $kind stage $rank micro-batch $mb'"; failed=1; }
    done
  done
done
# The order on stage 0 under 1F1B with 2 stages: F0, F1, then B0 before F2 (by start time).
order="$(python3 - "$dir/profile/trace-rank0.json" <<'PY'
import json, re, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
ranges = sorted((e["ts"], e["name"]) for e in events
                if re.fullmatch(r"lf::pipeline (forward|backward) stage 0 micro-batch \d", e.get("name", "")))
print(" ".join(("F" if "forward" in n else "B") + n[-1] for _, n in ranges))
PY
)"
if [ "$order" = "F0 F1 B0 F2 B1 F3 B2 B3" ]; then
  echo "ok: stage 0 ran $order"
else
  echo "FAIL: stage 0's ranges in the trace run in the order '$order', expected 1F1B's 'F0 F1 B0 F2 B1 F3 B2 B3'"
  failed=1
fi
exit $failed
