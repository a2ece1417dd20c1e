#!/usr/bin/env bash
# Hang detection end to end: lf_hang_program plants one kind of hang (or an edge) on rank 1 and
# the job must end with the documented report, files and exit code, within the hang timeout plus
# a few seconds. lightning-run judges from the ranks' shared recorders; under torchrun the ranks
# judge each other through the store.
# Usage: hang_detection.sh LIGHTNING_RUN HANG_PROGRAM TORCHRUN CASE
set -uo pipefail
run="$1"; program="$2"; torchrun="$3"; case="$4"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; echo "--- output"; cat "$dir/out" 2>/dev/null; exit 1; }
timeout_s=3
# The job runs under a second since start; detection may take the timeout plus a few checks and
# the dumps (up to 3 s): 12 s bounds it without depending on this machine's speed.
# LF_TEST_TIME_SCALE widens it for instrumented builds (scripts/sanitize.sh).
scale="${LF_TEST_TIME_SCALE:-1}"
limit_s=$(( (timeout_s + 9) * scale ))

launch() {  # launch MODE [extra lightning-run flags...]
  local mode="$1"; shift
  local start; start=$(date +%s%3N)
  timeout 120 "$run" model --devices 2 --hang-timeout "$timeout_s" --log-dir "$dir/logs" "$@" "$program" "$mode" >"$dir/out" 2>&1
  code=$?
  elapsed_ms=$(( $(date +%s%3N) - start ))
  echo "$mode: exit code $code after ${elapsed_ms} ms"
}
expect_hang_files() {
  local hang="$dir/logs/attempt_0/hang"
  for file in report.txt rank_0.flight.txt rank_1.flight.txt rank_0.stack.txt rank_1.stack.txt; do
    [[ -s "$hang/$file" ]] || fail "missing or empty $hang/$file"
  done
  grep -q "dumps: $hang/" "$dir/out" || fail "the report does not say where the dumps are"
  grep -q "^# seq  op  group" "$hang/rank_0.flight.txt" || fail "the recorder dump has no header"
  grep -q "Collective::all_reduce\|Collective::barrier" "$hang/rank_0.stack.txt" || fail "rank 0's stack does not show the collective it waits in: $(cat "$hang/rank_0.stack.txt")"
}
in_time() { (( elapsed_ms < limit_s * 1000 )) || fail "took ${elapsed_ms} ms, more than ${limit_s} s"; }
expect() { grep -qF -- "$1" "$dir/out" || fail "the output lacks: $1"; }

case "$case" in
  launcher_infinite_loop)
    launch infinite_loop
    [[ $code == 86 ]] || fail "exit code $code, expected 86"
    in_time
    expect "hang detected: rank 0 has waited"
    expect "likely cause: rank 1 never entered collective #9 all_reduce float32[4] on world that rank 0 waits in"
    expect_hang_files
    grep -q "spin_forever_on_purpose" "$dir/logs/attempt_0/hang/rank_1.stack.txt" || fail "rank 1's stack does not show its loop"
    # Built with -g: the frame names its file and line (elfutils' libdw), as the loop's line is.
    loop_line=$(grep -n "while (true) counter = counter + 1;" "$(dirname "$0")/hang_program.cpp" | cut -d: -f1)
    if [[ "${LF_TEST_HAVE_LIBDW:-OFF}" == ON ]]; then
      grep -q "spin_forever_on_purpose.* at .*hang_program.cpp:$loop_line\b" "$dir/logs/attempt_0/hang/rank_1.stack.txt" ||
        fail "rank 1's stack does not name hang_program.cpp:$loop_line: $(cat "$dir/logs/attempt_0/hang/rank_1.stack.txt")"
    elif [[ "${CI:-}" == true ]]; then
      fail "built without libdw (Debian: libdw-dev, installed by scripts/install-deps.sh): stacks name no file and line"
    fi
    ;;
  launcher_skip_all_reduce)
    # gloo: the ranks block in different ops (shm would refuse the pair at once: shm_* below).
    launch skip_all_reduce --process-group-backend gloo
    [[ $code == 86 ]] || fail "exit code $code, expected 86"
    in_time
    expect "likely cause: the ranks are inside different collectives (rank 0 in #9 all_reduce, rank 1 in #9 barrier)"
    expect_hang_files
    ;;
  launcher_stuck_before_barrier)
    launch stuck_before_barrier
    [[ $code == 86 ]] || fail "exit code $code, expected 86"
    in_time
    expect "likely cause: rank 1 never entered collective #9 barrier on world that rank 0 waits in"
    expect_hang_files
    grep -q "sleep_forever_on_purpose" "$dir/logs/attempt_0/hang/rank_1.stack.txt" || fail "rank 1's stack does not show where it sleeps"
    ;;
  launcher_recv_never_sent|launcher_recv_never_sent_gloo)
    # A recv whose peer never sends is named like any collective (shm: over the pair's gloo group).
    if [[ $case == *_gloo ]]; then launch recv_never_sent --process-group-backend gloo; else launch recv_never_sent; fi
    [[ $code == 86 ]] || fail "exit code $code, expected 86"
    in_time
    expect "likely cause: the ranks are inside different collectives (rank 0 in #9 barrier, rank 1 in #9 recv)"
    expect_hang_files
    ;;
  launcher_mismatched_shapes)
    # gloo aborts the rank that receives more than it expects; the report says why.
    launch mismatched_shapes --process-group-backend gloo
    [[ $code == 134 ]] || fail "exit code $code, expected 134 (the rank's uncaught error aborts it)"
    expect "collective #9 differs across ranks (rank 0: all_reduce float32[4]; rank 1: all_reduce float32[8])"
    ;;
  launcher_check_collectives)
    # With the check on, every rank stops with a typed error before any data moves.
    launch mismatched_shapes --check-collectives
    [[ $code == 134 ]] || fail "exit code $code, expected 134 (the rank's uncaught error aborts it)"
    expect "Collective mismatch on group world at collective #9 (rank 0: all_reduce float32[4]; rank 1: all_reduce float32[8])"
    ! grep -q "gloo::EnforceNotMet" "$dir/out" || fail "gloo saw the mismatch first"
    ;;
  shm_skip_all_reduce|shm_mismatched_shapes)
    # The shm backend (the CPU default on one machine) compares every rank's op before any data
    # moves: a skipped or mis-sized collective is a typed error on every rank within a second.
    mode="${case#shm_}"
    launch "$mode"
    [[ $code == 134 ]] || fail "exit code $code, expected 134 (the rank's uncaught error aborts it)"
    (( elapsed_ms < 10000 * scale )) || fail "took ${elapsed_ms} ms"
    if [[ $mode == skip_all_reduce ]]; then
      expect "Collective mismatch in the shm group (rank 0: #9 allreduce Float[4 elements] (sum); rank 1: #9 barrier)"
    else
      expect "Collective mismatch in the shm group (rank 0: #9 allreduce Float[4 elements] (sum); rank 1: #9 allreduce Float[8 elements] (sum))"
    fi
    ;;
  launcher_no_hang)
    launch ok
    [[ $code == 0 ]] || fail "exit code $code"
    [[ -s "$dir/logs/attempt_0/rank_0.flight" ]] || fail "no recorder file"
    [[ ! -e "$dir/logs/attempt_0/hang" ]] || fail "a hang folder after a clean run"
    ;;
  torchrun_infinite_loop|torchrun_skip_all_reduce)
    mode="${case#torchrun_}"
    start=$(date +%s%3N)
    # gloo, so that skip_all_reduce hangs (shm refuses it at once; see shm_*).
    LT_PROCESS_GROUP_BACKEND=gloo LT_HANG_TIMEOUT=$timeout_s LT_HANG_DUMP_DIR="$dir/dumps" timeout 120 "$torchrun" --standalone --nproc-per-node 2 \
      --monitor-interval 0.1 --no-python "$program" "$mode" >"$dir/out" 2>&1
    code=$?
    elapsed_ms=$(( $(date +%s%3N) - start ))
    echo "$case: exit code $code after ${elapsed_ms} ms"
    [[ $code == 1 ]] || fail "torchrun exited with $code, expected 1 (its code for a failed worker)"
    limit_s=$((limit_s + 5 * scale))  # torchrun's own start
    in_time
    expect "exitcode  : 86"
    expect "traceback : HangError: hang detected"
    if [[ $mode == infinite_loop ]]; then expect "likely cause: rank 1 never entered collective #9"; else expect "inside different collectives"; fi
    for file in report.txt rank_0.flight.txt rank_1.flight.txt rank_0.stack.txt rank_1.stack.txt; do
      [[ -s "$dir/dumps/$file" ]] || fail "missing $dir/dumps/$file"
    done
    ;;
  launcher_two_nodes)
    # Two lightning-runs as two nodes: the ranks judge through the store, rank 0 exits with 86,
    # and both launchers end with 86 (node 0 keeps its store until node 1 has read the failure).
    port=$("${LF_PYTHON:-python3}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
    start=$(date +%s%3N)
    for node in 1 0; do
      timeout 120 "$run" model --num-nodes 2 --node-rank $node --main-port "$port" --devices 1 --hang-timeout "$timeout_s" \
        --log-dir "$dir/node$node" "$program" infinite_loop >"$dir/node$node.out" 2>&1 &
      eval "pid$node=\$!"
    done
    wait "$pid0"; code0=$?
    wait "$pid1"; code1=$?
    elapsed_ms=$(( $(date +%s%3N) - start ))
    cat "$dir/node0.out" "$dir/node1.out" >"$dir/out"
    echo "two nodes: exit codes $code0 and $code1 after ${elapsed_ms} ms"
    [[ $code0 == 86 && $code1 == 86 ]] || fail "exit codes $code0 (node 0) and $code1 (node 1), expected 86 and 86"
    in_time
    expect "its error file says: HangError: hang detected"
    expect "likely cause: rank 1 never entered collective #9"
    [[ -s "$dir/node0/attempt_0/hang/report.txt" && -s "$dir/node0/attempt_0/hang/rank_0.stack.txt" ]] || fail "node 0's dumps are missing"
    [[ -s "$dir/node1/attempt_0/hang/rank_1.flight.txt" && -s "$dir/node1/attempt_0/hang/rank_1.stack.txt" ]] || fail "node 1's dumps are missing"
    grep -q spin_forever_on_purpose "$dir/node1/attempt_0/hang/rank_1.stack.txt" || fail "rank 1's stack does not show its loop"
    ! grep -q "lost contact" "$dir/out" || fail "node 1 lost contact instead of reading the failure"
    ;;
  edges)
    launch unset_model
    [[ $code == 134 ]] || fail "exit code $code, expected 134 (backward on a model never set up throws, uncaught)"
    expect "fabric.backward: the loss does not depend on any model set up with fabric.setup"
    rm -rf "$dir/logs"
    launch rank_zero_first_throws
    [[ $code == 5 ]] || fail "exit code $code, expected 5 (rank 0 returns 5 after catching)"
    expect "rank 0 caught: preparing the data failed on rank 0"
    ! grep -q "terminate called" "$dir/out" || fail "rank_zero_first terminated the program"
    ;;
  *) fail "unknown case $case" ;;
esac
cat "$dir/out"
echo "hang detection case $case passed"
