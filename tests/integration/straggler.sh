#!/usr/bin/env bash
# A planted slow rank is named while the job runs, and a balanced job names no one: on one node by
# lightning-run (from the shared recorders), across nodes by rank 0 (from the store).
#   straggler.sh LIGHTNING_RUN STRAGGLER_JOB
set -uo pipefail
run="$1"; job="$2"
fail() { echo "FAIL: $*"; exit 1; }
source "$(dirname "$0")/expect_straggler.sh"

out="$("$run" model --accelerator cpu --devices 3 "$job" 60 2 120 2>&1)" || fail "the slow job failed: $out"
expect_straggler "$out" "lightning-run: rank 2 on $(hostname)"

out="$("$run" model --accelerator cpu --devices 3 "$job" 60 -1 0 2>&1)" || fail "the balanced job failed: $out"
! grep -q "arrives last" <<<"$out" || fail "a balanced job named a straggler: $out"
out="$("$run" model --accelerator cpu --devices 3 --straggler-threshold 0 "$job" 60 2 120 2>&1)" || fail "$out"
! grep -q "arrives last" <<<"$out" || fail "--straggler-threshold 0 still named one: $out"
out="$("$run" model --accelerator cpu --devices 3 --straggler-threshold 0.3 "$job" 60 2 120 2>&1)" || fail "$out"
! grep -q "arrives last" <<<"$out" || fail "a 120 ms lag was named under --straggler-threshold 0.3: $out"

# Two nodes of two workers on this machine: the ranks judge through the store, rank 0 names rank 3.
two_nodes() {  # two_nodes SLOW_RANK SLEEP_MS: both nodes' output
  local port pids=()
  port=$("${LF_PYTHON:-python3}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  for node in 0 1; do
    timeout 120 "$run" model --accelerator cpu --num-nodes 2 --node-rank $node --main-port "$port" --devices 2 \
      "$job" 60 "$1" "$2" >"$tmp/node$node" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}" || fail "node 0 failed: $(cat "$tmp/node0")"
  wait "${pids[1]}" || fail "node 1 failed: $(cat "$tmp/node1")"
  cat "$tmp/node0" "$tmp/node1"
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out="$(two_nodes 3 120)" || fail "$out"
expect_straggler "$out" "[rank 0]: lightning-fabric: rank 3 on $(hostname)"
out="$(two_nodes -1 0)" || fail "$out"
! grep -q "arrives last" <<<"$out" || fail "a balanced job across nodes named a straggler: $out"
echo "stragglers: all checks passed"
