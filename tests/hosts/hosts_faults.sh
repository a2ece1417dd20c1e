#!/usr/bin/env bash
# Network faults across real hosts (hosts.sh), one lightning-run node per host, 2 workers each,
# with --hang-timeout 20 and --node-timeout 10 (60 and 30 on the degraded links). Every case checks every node's exit code and
# message, that nothing of the job is left on any host, and prints how long after the fault each
# surviving node exited ("fault CASE: node K exited C after S s").
#   hosts_faults.sh LIGHTNING_RUN HOSTS_JOB CASE
# CASE:
#   link-down   2 hosts; host 1's link goes down mid-training: node 0 names node 1 as lost, node 1
#               names node 0 (the store it cannot reach); both exit 1 within the hang timeout + 10 s
#   kill-host   3 hosts; every process of host 2 is SIGKILLed mid-training: nodes 0 and 1 stop
#               within the limit, each naming node 2 (host2)
#   partition   3 hosts; host 0, which hosts the store, is cut off mid-training: node 0 names nodes
#               1 and 2, they name node 0; all exit 1 within the limit
#   delay       2 hosts; what host 1 sends is delayed 200 ms: the job is slower than on the clean
#               link (run first, side by side) but trains exactly
#   loss        2 hosts; 30 % of what host 1 sends is lost: slower, but trains exactly
set -u
launcher=$1 job=$2 case=$3
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_test_setup
dir=$HOSTS_TEST_DIR
hang_timeout=20
limit=$((hang_timeout + 10))
limit_note=" (limit $limit s)"

# start_nodes N STEPS SLEEP_MS: one node per host in the background; pids in pid[K].
node_timeout=10
start_nodes() {
  local count=$1 k
  for ((k = 0; k < count; ++k)); do
    host_run "$k" "$launcher" model --accelerator cpu --num-nodes "$count" --node-rank "$k" --main-address host0 \
      --main-port 29400 --devices 2 --rdzv-timeout 60 --hang-timeout "$hang_timeout" --node-timeout "$node_timeout" \
      --shutdown-grace 2 "$job" "$2" --sleep-ms "$3" >"$dir/node$k.log" 2>&1 &
    pid[$k]=$!
  done
}

# Waits until every node's rank prints step 50: the job is training.
wait_for_training() {
  local k deadline=$((SECONDS + 60))
  for ((k = 0; k < $1; ++k)); do
    until grep -q "backend shm+gloo, step 50$" "$dir/node$k.log"; do
      [ $SECONDS -lt $deadline ] || { fail "node $k did not reach step 50"; return 1; }
      sleep 0.2
    done
  done
}

# wait_nodes FAULT_TIME K...: waits for the nodes, records code[K] and after[K] (seconds since the fault).
wait_nodes() {
  local start=$1 k
  shift
  for k in "$@"; do
    wait "${pid[$k]}"; code[$k]=$?
    after[$k]=$(awk -v a="$(hosts_now)" -v b="$start" 'BEGIN { printf "%.1f", a - b }')
    echo "fault $case: node $k exited ${code[$k]} after ${after[$k]} s${limit_note-}"
  done
}

show_logs() {
  local k
  for ((k = 0; k < $1; ++k)); do
    echo "--- node $k"
    grep -v "step [0-9]*$" "$dir/node$k.log" | grep -v "client socket cannot be retrieved"
  done
}

expect_exit() {  # NODE CODE MESSAGE-REGEX
  [ "${code[$1]}" = "$2" ] || fail "node $1 exited ${code[$1]}, expected $2"
  awk -v a="${after[$1]}" -v l="$limit" 'BEGIN { exit !(a <= l) }' || fail "node $1 took ${after[$1]} s, over $limit s"
  grep -Eq "$3" "$dir/node$1.log" || fail "node $1 did not say: $3"
}


# strike N FAULT...: N hosts training, then the fault; every node waited for.
strike() {
  local count=$1 k nodes=()
  shift
  hosts_up "$count"
  start_nodes "$count" 100000 20
  wait_for_training "$count" || exit 1
  local start
  start=$(hosts_now)
  "$@"
  for ((k = 0; k < count; ++k)); do nodes+=("$k"); done
  wait_nodes "$start" "${nodes[@]}"
  show_logs "$count"
}

lost_contact="lost contact with the rendezvous store at host0:29400 \(node 0's lightning-run\): no answer for 10s"
case "$case" in
  link-down)
    strike 2 host_link_down 1
    expect_exit 0 1 "node 1 \(host1\) stopped answering: no heartbeat from its lightning-run"
    expect_exit 1 1 "$lost_contact"
    ;;
  kill-host)
    hosts_up 3
    start_nodes 3 100000 20
    wait_for_training 3 || exit 1
    start=$(hosts_now)
    host_kill_all 2
    wait "${pid[2]}" 2>/dev/null
    wait_nodes "$start" 0 1
    show_logs 3
    for k in 0 1; do
      # A survivor's worker fails in its collective and aborts (134), or, when the launcher sees
      # the lost node first, it stops its workers and exits 1.
      [[ ${code[$k]} == 134 || ${code[$k]} == 1 ]] || fail "node $k exited ${code[$k]} after host 2 was killed, expected 134 or 1"
      expect_exit "$k" "${code[$k]}" "node 2, host2|node 2 \(host2\)"
    done
    ;;
  partition)
    strike 3 host_isolate 0
    expect_exit 0 1 "node 1 \(host1\), node 2 \(host2\) stopped answering.*this node's own network may be the one that is down"
    expect_exit 1 1 "$lost_contact"
    expect_exit 2 1 "$lost_contact"
    ;;
  delay | loss)
    # A lossy link stalls TCP for seconds (13 s once): the default node timeout, not the short one.
    node_timeout=30 hang_timeout=60
    hosts_up 2
    limit_note=" on a clean link"
    start=$(hosts_now)
    start_nodes 2 20 0
    wait_nodes "$start" 0 1
    for k in 0 1; do [ "${code[$k]}" = 0 ] || fail "clean run: node $k exited ${code[$k]}"; done
    clean=${after[0]}
    if [ "$case" = delay ]; then host_impair 1 200 0; else host_impair 1 0 30; fi
    limit_note=" on the impaired link"
    start=$(hosts_now)
    start_nodes 2 20 0
    wait_nodes "$start" 0 1
    show_logs 2
    awk -v a="${after[0]}" -v b="$clean" 'BEGIN { exit !(a > b) }' || fail "the impaired link did not slow the job"
    for k in 0 1; do
      [ "${code[$k]}" = 0 ] || fail "node $k exited ${code[$k]} on the impaired link"
      [ "$(grep -c "20 steps, bitwise equal to rank 0: yes" "$dir/node$k.log")" = 2 ] || fail "node $k's ranks did not train exactly"
    done
    ;;
  *) echo "FAIL: unknown case $case"; exit 2 ;;
esac
hosts_expect_nothing_left
[ "$HOSTS_FAILURES" = 0 ] || exit 1
echo "hosts fault $case: passed"
