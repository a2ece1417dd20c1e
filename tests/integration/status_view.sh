#!/usr/bin/env bash
# `lightning-run status HOST:PORT` against real jobs: lf_hang_program trains until told, with
# rank 1 held in hold_on_purpose() while the test looks (so rank 0 waits in an all_reduce). The
# status must name every rank's step, collective and native stack, the job must then finish
# normally (exit code 0 from every launcher), and bad addresses must get a clear error at once.
# Usage: status_view.sh LIGHTNING_RUN HANG_PROGRAM PYTHON CASE
#   CASE: two_ranks, without_hang_detection, two_nodes, bad_addresses
set -uo pipefail
run="$1"; program="$2"; python="$3"; case="$4"
dir="$(mktemp -d)"
pids=()
cleanup() {
  # SIGTERM: timeout passes it on to lightning-run, which stops its workers (SIGKILL would leave
  # lightning-run and its workers running, held in hold_on_purpose).
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1
scale="${LF_TEST_TIME_SCALE:-1}"
fail() {
  echo "FAIL: $*"
  for file in "$dir"/*.out "$dir"/status*; do [[ -f "$file" ]] && { echo "--- $file"; cat "$file"; }; done
  exit 1
}
expect() { grep -qE -- "$2" "$1" || fail "$1 lacks /$2/"; }
hold_line=$(grep -n "if (rank == 1) hold_on_purpose(hold);" "$(dirname "$0")/hang_program.cpp" | cut -d: -f1)

wait_for() {  # wait_for FILE PATTERN: until FILE has a line matching PATTERN (60 s at most)
  for _ in $(seq 1 $(( 600 * scale ))); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 never showed /$2/"
}

# status ADDRESS [FLAGS]: runs the command, sets code and elapsed_ms.
status() {
  local start; start=$(date +%s%3N)
  timeout 60 "$run" status "$@" >"$dir/status" 2>"$dir/status.err"
  code=$?
  elapsed_ms=$(( $(date +%s%3N) - start ))
  echo "status $*: exit code $code after ${elapsed_ms} ms"
}

# start_held_job [FLAGS]: a 2-rank job with rank 1 held, in the background (pids), once both ranks
# trained; sets address to its rendezvous.
start_held_job() {
  touch "$dir/hold"
  timeout 120 "$run" model --devices 2 "$@" "$program" train_until_told "$dir/go" "$dir/hold" >"$dir/job.out" 2>&1 &
  pids+=($!)
  wait_for "$dir/job.out" "rendezvous at [^ ]+:[0-9]+"
  address=$(grep -oE "rendezvous at [^ ]+:[0-9]+" "$dir/job.out" | head -1 | cut -d' ' -f3)
  wait_for "$dir/job.out" "rank 1 trained"
}

# Checks the status of a held job: rank 0 waits in the all_reduce, rank 1 is in hold_on_purpose.
check_held_status() {
  [[ $code == 0 ]] || fail "status exited with $code, expected 0: $(cat "$dir/status.err")"
  expect "$dir/status" "^lightning-run status: job [^ ]+ at $address, $1$"
  expect "$dir/status" "^  rank 0 \(pid [0-9]+ on [^)]+\): step [1-9][0-9]* \(last [0-9.]+ s ago\); waiting [0-9.]+ s in #[0-9]+ all_reduce float32\[1\] on world"
  expect "$dir/status" "^  rank 1 \(pid [0-9]+ on [^)]+\): step [1-9][0-9]* \(last [0-9.]+ s ago\); not in a collective for [0-9.]+ s"
  [[ $(grep -c "^    native stack of thread [0-9]* (it issued rank [01]'s collectives), innermost frame first" "$dir/status") == 2 ]] ||
    fail "the status does not show both ranks' native stacks"
  # Rank 0's stack (between its heading and rank 1's line) shows the collective it waits in.
  sed -n '/^  rank 0 /,/^  rank 1 /p' "$dir/status" | grep -q "Collective::all_reduce" || fail "rank 0's stack lacks Collective::all_reduce"
  sed -n '/^  rank 1 /,$p' "$dir/status" | grep -q "hold_on_purpose" || fail "rank 1's stack lacks hold_on_purpose"
  if [[ "${LF_TEST_HAVE_LIBDW:-OFF}" == ON ]]; then
    # Built with -g: the frame that called hold_on_purpose names its file and line (libdw).
    sed -n '/^  rank 1 /,$p' "$dir/status" | grep -A1 "hold_on_purpose" | grep -q "main.* at .*hang_program.cpp:$hold_line\b" ||
      fail "rank 1's stack does not name hang_program.cpp:$hold_line below hold_on_purpose"
  elif [[ "${CI:-}" == true ]]; then
    fail "built without libdw (Debian: libdw-dev, installed by scripts/install-deps.sh): stacks name no file and line"
  fi
}

case "$case" in
  two_ranks)
    start_held_job --hang-timeout 60 --log-dir "$dir/logs"
    sleep 0.5  # a few steps in: rank 1 holds, rank 0 waits in the all_reduce
    status "$address"
    check_held_status "1 node"
    expect "$dir/status" "^node 0 \([^)]+\): ranks 0-1 of 2, attempt 0$"
    first_step=$(grep -oE "^  rank 0 .*: step [0-9]+" "$dir/status" | grep -oE "[0-9]+$")
    [[ -z "$(ls -A "$dir/logs/attempt_0/status" 2>/dev/null)" ]] || fail "the status files were left in $dir/logs/attempt_0/status"
    # The job goes on: released, it trains further, and a second look shows later steps.
    rm "$dir/hold"
    sleep 0.5
    status "$address"
    [[ $code == 0 ]] || fail "the second status exited with $code"
    second_step=$(grep -oE "^  rank 0 .*: step [0-9]+" "$dir/status" | grep -oE "[0-9]+$")
    (( second_step > first_step )) || fail "rank 0's step did not advance after the status: $first_step then $second_step"
    touch "$dir/go"
    wait "${pids[0]}"; job_code=$?
    [[ $job_code == 0 ]] || fail "the job exited with $job_code after the status, expected 0"
    expect "$dir/job.out" "rank 0 stopped when told after"
    expect "$dir/job.out" "rank 1 stopped when told after"
    # Once the job has ended, nothing listens there: said at once.
    status "$address"
    [[ $code == 1 ]] || fail "status against an ended job exited with $code, expected 1"
    expect "$dir/status.err" "^lightning-run status: nothing listens at $address: the job has ended, or this is not its address"
    (( elapsed_ms < 5000 * scale )) || fail "status against an ended job took ${elapsed_ms} ms"
    ;;
  without_hang_detection)
    # --hang-timeout 0: no watchdog thread, so no stacks, said at once; and no false "no heartbeat".
    start_held_job --hang-timeout 0
    sleep 6  # longer than the 5 s after which a silent heartbeat is reported
    status "$address"
    [[ $code == 0 ]] || fail "status exited with $code, expected 0"
    [[ $(grep -c "^    no stack: hang detection is off for this rank (hang timeout 0)" "$dir/status") == 2 ]] ||
      fail "the status does not say, for both ranks, that hang detection is off"
    ! grep -q "no heartbeat" "$dir/status" || fail "a rank without a watchdog is reported as silent"
    (( elapsed_ms < 3000 * scale )) || fail "the status waited ${elapsed_ms} ms for stacks nobody captures"
    rm "$dir/hold"
    touch "$dir/go"
    wait "${pids[0]}"; job_code=$?
    [[ $job_code == 0 ]] || fail "the job exited with $job_code after the status, expected 0"
    ;;
  two_nodes)
    # Two lightning-runs as two nodes of one job (one rank each): the ranks judge hangs through the
    # store, and each node's lightning-run answers for its own rank.
    port=$("$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
    address="127.0.0.1:$port"
    touch "$dir/hold"
    for node in 1 0; do
      timeout 120 "$run" model --num-nodes 2 --node-rank $node --main-port "$port" --devices 1 --hang-timeout 60 \
        --log-dir "$dir/node$node" "$program" train_until_told "$dir/go" "$dir/hold" >"$dir/node$node.out" 2>&1 &
      pids+=($!)
    done
    wait_for "$dir/node1.out" "rank 1 trained"
    wait_for "$dir/node0.out" "rank 0 trained"
    sleep 0.5
    status "$address"
    check_held_status "2 nodes"
    expect "$dir/status" "^node 0 \([^)]+\): ranks 0-0 of 2, attempt 0$"
    expect "$dir/status" "^node 1 \([^)]+\): ranks 1-1 of 2, attempt 0$"
    rm "$dir/hold"
    touch "$dir/go"
    wait "${pids[0]}"; code1=$?
    wait "${pids[1]}"; code0=$?
    [[ $code0 == 0 && $code1 == 0 ]] || fail "the launchers exited with $code0 (node 0) and $code1 (node 1), expected 0 and 0"
    expect "$dir/node0.out" "rank 0 stopped when told after"
    expect "$dir/node1.out" "rank 1 stopped when told after"
    ;;
  bad_addresses)
    status
    [[ $code == 2 ]] || fail "status without an address exited with $code, expected 2"
    expect "$dir/status.err" "lightning-run status needs the job's address: lightning-run status HOST:PORT"
    status 127.0.0.1:99999
    [[ $code == 2 ]] || fail "a bad port exited with $code, expected 2"
    expect "$dir/status.err" "port '99999' in '127.0.0.1:99999' is not valid: give a number from 1 to 65535"
    status 127.0.0.1:29400 --timeout 0
    [[ $code == 2 ]] || fail "--timeout 0 exited with $code, expected 2"
    expect "$dir/status.err" "--timeout=0 is not valid"
    # Something listens but never answers (not a store): the command gives up at its --timeout.
    "$python" -c "
import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
time.sleep(60)" >"$dir/silent.port" &
    pids+=($!)
    wait_for "$dir/silent.port" "^[0-9]+$"
    status "127.0.0.1:$(cat "$dir/silent.port")" --timeout 2
    [[ $code == 1 ]] || fail "a silent listener: exit code $code, expected 1"
    expect "$dir/status.err" "accepted the connection but did not answer as a store within the --timeout"
    (( elapsed_ms < 8000 * scale )) || fail "a silent listener held the command ${elapsed_ms} ms (--timeout 2)"
    # A store that is not a lightning-run job's (torch's own TCPStore, as under torchrun).
    "$python" -c "
import time, torch.distributed as dist
store = dist.TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(60)" >"$dir/store.port" 2>"$dir/store.err" &
    pids+=($!)
    wait_for "$dir/store.port" "^[0-9]+$"
    status "127.0.0.1:$(cat "$dir/store.port")" --timeout 5
    [[ $code == 1 ]] || fail "a foreign store: exit code $code, expected 1"
    expect "$dir/status.err" "is a store but not a lightning-run job's rendezvous"
    status no-such-host.invalid:29400 --timeout 2
    [[ $code == 1 ]] || fail "an unknown host: exit code $code, expected 1"
    expect "$dir/status.err" "cannot resolve host 'no-such-host.invalid'"
    ;;
  *) fail "unknown case $case" ;;
esac
echo "status view case $case passed"
