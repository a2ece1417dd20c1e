#!/usr/bin/env bash
# The profiler switch end to end: lightning-run --profile writes one valid Chrome trace per rank
# with Fabric's forward, backward and optimizer-step ranges and the collectives under their flight
# recorder names; --profile-ranks limits the ranks; bad values are refused before anything starts.
#   profile_traces.sh LIGHTNING_RUN PROFILE_JOB   (LF_PYTHON: the Python that reads the traces)
set -uo pipefail
run="$1"; job="$2"; python="${LF_PYTHON:-python3}"
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$run" model --accelerator cpu --devices 2 --log-dir "$dir/all" --profile 2-3 "$job" >"$dir/all.out" 2>&1 ||
  { cat "$dir/all.out"; fail "the profiled job failed"; }
for rank in 0 1; do
  [ -s "$dir/all/profile/trace-rank$rank.json" ] || { ls -R "$dir/all"; fail "no trace for rank $rank"; }
done
"$python" - "$dir/all/profile" <<'PY' || fail "the traces lack what they should hold"
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("trace-rank*.json")):
    events = json.loads(path.read_text())["traceEvents"]
    names = [e.get("name", "") for e in events]
    for wanted in ("lf::forward", "lf::backward", "lf::optimizer_step"):
        count = names.count(wanted)
        # steps 2 and 3: the forward and backward of both, the optimizer step of both
        assert count == 2, f"{path.name}: {wanted} appears {count} times, expected 2"
    collectives = [n for n in names if "all_reduce" in n and " on " in n]
    assert collectives, f"{path.name}: no collective range named like the flight recorder's"
    print(f"{path.name}: {len(events)} events, collectives e.g. {collectives[0]!r}")
PY

"$run" model --accelerator cpu --devices 2 --log-dir "$dir/one" --profile 1 --profile-ranks 1 "$job" >"$dir/one.out" 2>&1 ||
  { cat "$dir/one.out"; fail "the job profiling rank 1 failed"; }
[ -s "$dir/one/profile/trace-rank1.json" ] || fail "--profile-ranks 1 wrote no trace for rank 1"
[ ! -e "$dir/one/profile/trace-rank0.json" ] || fail "--profile-ranks 1 also traced rank 0"

out="$("$run" model --accelerator cpu --devices 2 --profile 5-2 "$job" 2>&1)"; status=$?
[ "$status" -eq 2 ] || fail "--profile 5-2 exited $status, expected 2"
grep -q -- "--profile=5-2 is not a step range" <<<"$out" || fail "unclear refusal: $out"
out="$("$run" model --accelerator cpu --devices 2 --profile-ranks 0 "$job" 2>&1)"; status=$?
[ "$status" -eq 2 ] && grep -q -- "give --profile too" <<<"$out" || fail "--profile-ranks alone: $out"
echo "profile traces: all checks passed"
