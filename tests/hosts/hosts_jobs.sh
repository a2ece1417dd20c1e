#!/usr/bin/env bash
# Multi-node jobs across real hosts (hosts.sh): one lightning-run node per host, 2 workers each.
#   hosts_jobs.sh LIGHTNING_RUN HOSTS_JOB CASE
# CASE:
#   train-2 / train-3  2 or 3 hosts train the classifier; every rank is bitwise equal to the others
#                      and within 1e-6 of one process on the whole batch; --main-address is the
#                      host name host0, resolved through each host's own /etc/hosts; shm+gloo
#                      carries the job: every rank maps its host's shm segment, and the last
#                      host's loopback carries (almost) nothing, so no gradient went between
#                      its ranks by TCP; nothing is left on any host.
#   unequal            2 hosts with 1 and 3 workers: ranks 0 and 1-3, trained as above on gloo
#                      (no rank maps an shm segment; host 1's three ranks talk over loopback)
#   unequal-shm-gloo   the same hosts with LT_PROCESS_GROUP_BACKEND=shm+gloo: every node stops,
#                      naming each host's count
#   vote               the same-host vote: ranks on two hosts with different names use gloo; on
#                      two namespaces with one name (one kernel, so one machine) they use shm, on
#                      purpose; one lightning-run node with 2 workers uses shm.
#   interface          GLOO_SOCKET_IFNAME=eth0 picks the interface; a name that no host has stops
#                      every node, with an error naming it and the host's interfaces (on a node
#                      that node 0's announcement stops first: node 0's failure). Then host 1
#                      gets a second interface and announces its address with --local-addr:
#                      node 0 names node 1 by it, and the job runs as before.
set -u
launcher=$1 job=$2 case=$3
LOOPBACK_LIMIT=${LOOPBACK_LIMIT:-65536}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_test_setup
dir=$HOSTS_TEST_DIR

# run_nodes N STEPS [ENV=VALUE...]: one lightning-run node per host, devices[K] workers on host K
# (default 2) and the extra lightning-run flags node_flags[K] (words; default none); exit codes in
# code[K], output in $dir/node<K>.log.
devices=()
node_flags=()
run_nodes() {
  local count=$1 steps=$2 k
  shift 2
  local pids=()
  for ((k = 0; k < count; ++k)); do
    # shellcheck disable=SC2086  # node_flags[K] is a list of words
    host_run "$k" env "$@" "$launcher" model --accelerator cpu --num-nodes "$count" --node-rank "$k" \
      --main-address host0 --main-port 29400 --devices "${devices[$k]:-2}" --rdzv-timeout 60 --shutdown-grace 2 \
      ${node_flags[$k]:-} "$job" "$steps" >"$dir/node$k.log" 2>&1 &
    pids[$k]=$!
  done
  for ((k = 0; k < count; ++k)); do wait "${pids[$k]}"; code[$k]=$?; done
}

show_logs() {
  local k
  for ((k = 0; k < $1; ++k)); do echo "--- node $k (exit ${code[$k]})"; grep -v "step [0-9]*$" "$dir/node$k.log"; done
}


# loopback_bytes K: what host K's loopback interface has sent so far.
loopback_bytes() { ip netns exec "$(host_ns "$1")" cat /sys/class/net/lo/statistics/tx_bytes; }

# train COUNT BACKEND SEGMENT: COUNT hosts train; every rank reports BACKEND and SEGMENT.
train() {
  local count=$1 backend=$2 segment=$3 world=0 first=0 k last=$(($1 - 1))
  for ((k = 0; k < count; ++k)); do world=$((world + ${devices[$k]:-2})); done
  hosts_up "$count"
  local loopback_before loopback
  loopback_before=$(loopback_bytes "$last")
  run_nodes "$count" 30
  loopback=$(($(loopback_bytes "$last") - loopback_before))
  show_logs "$count"
  echo "host$last's loopback sent $loopback bytes during the job"
  for ((k = 0; k < count; ++k)); do
    [ "${code[$k]}" = 0 ] || fail "node $k exited ${code[$k]}"
    grep -q "rendezvous at host0:29400" "$dir/node$k.log" || fail "node $k did not rendezvous at host0:29400"
    for ((local = 0; local < ${devices[$k]:-2}; ++local)); do
      rank=$((first + local))
      grep -Eq "rank $rank of $world on host$k: backend ${backend//+/\\+}, 30 steps, bitwise equal to rank 0: yes, reference error [0-9.e-]+, shm segment: $segment" \
        "$dir/node$k.log" || fail "rank $rank on host$k did not report $backend, bitwise equality and shm segment: $segment"
    done
    first=$((first + ${devices[$k]:-2}))
  done
  # The last host runs no store: its loopback carries only what its own ranks send each other by
  # TCP. 30 steps on gloo move 450 KB between two ranks (0.9 MB among 3); shm+gloo's connection
  # set-up and barriers, 25 KB, stay under LOOPBACK_LIMIT.
  if [ "$backend" = "shm+gloo" ]; then
    [ "$loopback" -lt "$LOOPBACK_LIMIT" ] || fail "host$last's ranks sent $loopback bytes over loopback (limit $LOOPBACK_LIMIT): gradients went by TCP"
  else
    [ "$loopback" -ge "$LOOPBACK_LIMIT" ] || fail "host$last's gloo ranks sent only $loopback bytes over loopback"
  fi
  hosts_expect_nothing_left
}

# The unequal hosts with shm+gloo asked for: every node fails, naming the counts.
unequal_shm_gloo() {
  hosts_up 2
  run_nodes 2 10 LT_PROCESS_GROUP_BACKEND=shm+gloo
  show_logs 2
  local named='needs the same number of ranks on every host, but the job has host0: 1 rank, host1: 3 ranks'
  for k in 0 1; do
    [ "${code[$k]}" = 134 ] || fail "node $k exited ${code[$k]} with shm+gloo on unequal hosts, expected 134 (the workers' ValueError, uncaught)"
    grep -q "$named" "$dir/node$k.log" || grep -q "on node [01] failed first" "$dir/node$k.log" ||
      fail "node $k neither named the hosts' counts nor reported the other node's failure"
  done
  grep -q "$named" "$dir/node0.log" "$dir/node1.log" || fail "no node named the hosts' counts"
  hosts_expect_nothing_left
}

# vote_pair NAME0 NAME1 BACKEND SEGMENT: one rank on each of hosts 0 and 1, started by hand as a
# launcher that does not say how many nodes there are would start them, so the ranks vote.
vote_pair() {
  local k name
  for k in 0 1; do
    name=$1; [ "$k" = 1 ] && name=$2
    ip netns exec "$(host_ns "$k")" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$name" \
      env TORCHELASTIC_RUN_ID=vote RANK=$k GROUP_RANK=0 LOCAL_RANK=$k LOCAL_WORLD_SIZE=2 WORLD_SIZE=2 \
      MASTER_ADDR=host0 MASTER_PORT=29411 "$job" 20 >"$dir/vote$k.log" 2>&1 &
    pids[$k]=$!
  done
  for k in 0 1; do
    name=$1; [ "$k" = 1 ] && name=$2
    wait "${pids[$k]}" || fail "rank $k on a host named $name exited non-zero"
    cat "$dir/vote$k.log"
    grep -q "rank $k of 2 on $name: backend $3, 20 steps, bitwise equal to rank 0: yes, .*shm segment: $4" "$dir/vote$k.log" ||
      fail "rank $k on $name did not use $3 (shm segment: $4)"
  done
}

vote() {
  hosts_up 2
  echo "== two hosts with different names"
  vote_pair host0 host1 gloo no
  echo "== two network namespaces with one host name"
  vote_pair twin twin shm yes
  echo "== one lightning-run node with 2 workers"
  host_run 0 "$launcher" model --accelerator cpu --devices 2 "$job" 20 >"$dir/one.log" 2>&1 || fail "the one-node job failed"
  cat "$dir/one.log"
  [ "$(grep -c "backend shm, 20 steps, bitwise equal to rank 0: yes, .*shm segment: yes" "$dir/one.log")" = 2 ] ||
    fail "the one-node job's 2 ranks did not both use shm"
  hosts_expect_nothing_left
}

interface() {
  hosts_up 2
  echo "== GLOO_SOCKET_IFNAME=eth0"
  run_nodes 2 10 GLOO_SOCKET_IFNAME=eth0
  show_logs 2
  [ "${code[0]}" = 0 ] && [ "${code[1]}" = 0 ] || fail "the job with GLOO_SOCKET_IFNAME=eth0 failed"
  echo "== GLOO_SOCKET_IFNAME=eth7 (no host has it)"
  run_nodes 2 10 GLOO_SOCKET_IFNAME=eth7
  show_logs 2
  # Node 0's workers name the interface. Node 1's do too, unless node 0's announcement stops them
  # first; node 1 then reports node 0's failure.
  local named='GLOO_SOCKET_IFNAME (process_group.socket_interface)="eth7" names no network interface of this host. Its interfaces: lo, eth0'
  for k in 0 1; do
    [ "${code[$k]}" = 134 ] || fail "node $k exited ${code[$k]} with a missing interface, expected 134 (the workers' ValueError, uncaught)"
  done
  grep -q "$named" "$dir/node0.log" || fail "node 0 did not name the missing interface and the host's interfaces"
  grep -q "$named" "$dir/node1.log" || grep -q "on node 0 failed first" "$dir/node1.log" ||
    fail "node 1 neither named the missing interface nor reported node 0's failure"
  hosts_expect_nothing_left
  echo "== host 1 with a second interface announces it: --local-addr 10.77.1.11"
  host_add_addr 1 10.77.1.11
  node_flags=("" "--local-addr 10.77.1.11")
  run_nodes 2 10
  node_flags=()
  show_logs 2
  [ "${code[0]}" = 0 ] && [ "${code[1]}" = 0 ] || fail "the job with --local-addr on node 1 failed"
  grep -q "nodes by rank: host0, 10.77.1.11$" "$dir/node0.log" ||
    fail "node 0 did not name node 1 by the address it announced (--local-addr 10.77.1.11)"
  hosts_expect_nothing_left
}

case "$case" in
  train-2) train 2 shm+gloo yes ;;
  train-3) train 3 shm+gloo yes ;;
  unequal) devices=(1 3); train 2 gloo no ;;
  unequal-shm-gloo) devices=(1 3); unequal_shm_gloo ;;
  vote) vote ;;
  interface) interface ;;
  *) echo "FAIL: unknown case $case"; exit 2 ;;
esac
[ "$HOSTS_FAILURES" = 0 ] || exit 1
echo "hosts $case: passed"
