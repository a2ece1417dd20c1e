#!/usr/bin/env bash
# Elastic membership across real hosts (hosts.sh): --num-nodes MIN:MAX, one launcher per host, 2
# workers each, training hosts_job with a checkpoint every 10 steps in a folder every host sees
# (the job resumes from the newest after each restart). Every case checks every node's exit code,
# that the job finished with the expected world size, and that nothing is left on any host, and
# prints "elastic CASE: restart S s after the fault" (the fault until the first logged step of the
# new group: detection, re-rendezvous, workers started, first step again).
#   hosts_elastic.sh LIGHTNING_RUN HOSTS_JOB CASE
# CASE:
#   shrink    3 hosts, --num-nodes 2:3 --max-restarts 1; host 2 dies mid-training (every process
#             SIGKILLed): hosts 0 and 1 restart as a group of 2 (world 4, restart count 1) and finish
#   join      hosts 0 and 1 start with --num-nodes 2:3; host 2 starts mid-training: the group re-forms
#             with it (world 6) without using a restart (restart count 0), and all three finish
#   example   the image classifier example (examples/image_classifier) on 2 hosts, 1 worker each,
#             --num-nodes 1:2 and --resume last; host 1 dies in epoch 2: host 0 restarts alone,
#             resumes from the end of epoch 1 and finishes epoch 2 in a world of 1
#   memory    4 hosts x 1 worker, fsdp, --num-nodes 1:4 --max-restarts 3 --in-memory-replicas 1:
#             host 2 is lost while its copy to its buddy is in flight: hosts 0, 1, 3 go on from the
#             newest snapshot whole in the memory of the lightning-runs that remain (host 2's part
#             from its buddy), the torn newer one skipped; a replacement host 2 joins and the group
#             goes on from memory again; host 3's link is cut: hosts 0-2 go on from memory and host
#             3's lightning-run exits 1 on its own; hosts 1 and 2 die together (a part and its only
#             copy): host 0 falls back to the newest checkpoint on disk, and rank 0 names what was lost
#   torchrun  shrink under torchrun's own elastic agent (--nnodes 1:3 --rdzv-backend c10d
#             --max-restarts 1 --no-python), with the same binary: Fabric takes the new world size
#             and the restart count from torchrun's environment
# Knobs for scripts/bench-hosts-restart.sh: ELASTIC_NODE_TIMEOUT (lightning-run's --node-timeout,
# default 5), ELASTIC_LAST_CALL (lightning-run's --rdzv-last-call, default 3; empty: the flag left
# out, lightning-run's own default) and ELASTIC_TORCHRUN_CONF (torchrun's --rdzv-conf, default none).
set -u
launcher=$1 job=$2 case=$3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_test_setup
dir=$HOSTS_TEST_DIR
steps=400 sleep_ms=40
last_call=${ELASTIC_LAST_CALL-3}
# The world size changes midway, so from then on the gradients are reduced in another order.
job_args=("$job" "$steps" --sleep-ms "$sleep_ms" --checkpoint-dir "$dir/ck" --tolerance 1e-5)
nodes=2:3 devices=2 max_restarts=1 memory_flags=() backend='shm\+gloo'
if [ "$case" = memory ]; then
  # Sharded (each rank's part on its node and its buddy), one worker per host; the disk checkpoint
  # is only the fallback for a node lost together with its buddy.
  job_args+=(--strategy fsdp --snapshot)
  nodes=1:4 devices=1 max_restarts=3 memory_flags=(--in-memory-replicas 1)
fi

# start_node K: host K's launcher in the background (pid[K], log $dir/node<K>.log).
start_node() {
  local k=$1
  if [ "$case" = torchrun ]; then
    host_run "$k" "$root/.venv/bin/torchrun" --nnodes 1:3 --nproc-per-node 2 --rdzv-backend c10d \
      --rdzv-endpoint host0:29400 --rdzv-id elastic --max-restarts 1 --monitor-interval 0.5 \
      ${ELASTIC_TORCHRUN_CONF:+--rdzv-conf "$ELASTIC_TORCHRUN_CONF"} --no-python \
      "${job_args[@]}" >"$dir/node$k.log" 2>&1 &
  else
    host_run "$k" "$launcher" model --accelerator cpu --num-nodes "$nodes" --main-address host0 --main-port 29400 \
      --devices "$devices" --max-restarts "$max_restarts" --node-timeout "${ELASTIC_NODE_TIMEOUT:-5}" \
      ${last_call:+--rdzv-last-call "$last_call"} --shutdown-grace 2 "${memory_flags[@]}" \
      "${job_args[@]}" >"$dir/node$k.log" 2>&1 &
  fi
  pid[$k]=$!
}

# await_line FILE REGEX SECONDS: waits for a line; prints when it appeared (hosts_now).
await_line() {
  local deadline=$((SECONDS + $3))
  until grep -Eq "$2" "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { fail "no line /$2/ in $1 within $3 s" >&2; cat "$1" >&2; return 1; }
    sleep 0.1
  done
  hosts_now
}

show_logs() {
  local k
  for k in "$@"; do echo "--- node $k (exit ${code[$k]-?})"; grep -v "step [0-9]*$" "$dir/node$k.log" | grep -v "^ *|"; done
}

# expect_finish K WORLD RESTARTS: node K exited 0, and its ranks finished in a world of WORLD after
# RESTARTS restarts.
expect_finish() {
  local k=$1 world=$2 restarts=$3
  [ "${code[$k]}" = 0 ] || fail "node $k exited ${code[$k]}"
  [ "$(grep -Ec "rank [0-9]+ of $world on host$k: backend $backend, $steps steps, bitwise equal to rank 0: yes" "$dir/node$k.log")" = "$devices" ] ||
    fail "node $k's $devices ranks did not finish in a world of $world, bitwise equal"
  grep -Eq "rank [0-9]+ of $world on host$k: backend $backend, restart count $restarts, starting at step [1-9]" "$dir/node$k.log" ||
    fail "node $k's ranks did not resume in a world of $world with restart count $restarts"
}

# lose_host K: 3 hosts train; host K dies (every process SIGKILLed) after step 50; the other two
# restart as a group of 2 (world 4, restart count 1) and finish (expect_finish).
lose_host() {
  local lost=$1 k survivors=()
  for k in 0 1 2; do [ "$k" = "$lost" ] || survivors+=("$k"); done
  hosts_up 3
  for k in 0 1 2; do start_node "$k"; done
  for k in 0 1 2; do await_line "$dir/node$k.log" "of 6 on host$k: backend shm\+gloo, step 50$" 90 >/dev/null || exit 1; done
  start=$(hosts_now)
  host_kill_all "$lost"
  wait "${pid[$lost]}" 2>/dev/null
  report_restart "$start" 4
  for k in "${survivors[@]}"; do wait "${pid[$k]}"; code[$k]=$?; done
  show_logs 0 1 2
  for k in "${survivors[@]}"; do expect_finish "$k" 4 1; done
}

report_restart() {  # FAULT_TIME WORLD
  local first
  # await_line's own fail() runs in the command substitution's subshell: count the failure here.
  first=$(await_line "$dir/node0.log" "rank 0 of $2 on host0: backend shm\+gloo, step [1-9]" 120) ||
    { fail "rank 0 did not resume training in a world of $2"; return; }
  echo "elastic $case: restart $(awk -v a="$first" -v b="$1" 'BEGIN { printf "%.1f", a - b }') s after the fault"
}

case "$case" in
  shrink | torchrun)
    [ "$case" != torchrun ] || [ -x "$root/.venv/bin/torchrun" ] || hosts_skip "no torchrun in $root/.venv"
    lose_host 2
    ;;
  memory)
    backend='[a-z+]+'
    command -v ethtool >/dev/null || hosts_skip "ethtool is not installed (the slowed copy needs segmentation offload off)"
    command -v tc >/dev/null || hosts_skip "tc (iproute2) is not installed"
    hosts_up 4
    for k in 0 1 2 3; do start_node "$k"; done
    for k in 0 1 2 3; do await_line "$dir/node$k.log" "of 4 on host$k: backend $backend, step 50$" 90 >/dev/null || exit 1; done
    # 1. Host 2 lost while a copy to its buddy is in flight: host 2's connection to its buddy's
    #    memory port (its copier's) is slowed to 2 KB/s (tc: htb with a tbf class), so its next
    #    snapshot part (some 15 KB with the copier's framing) is still on the way (bytes unacknowledged: its Send-Q) when host 2 goes (link down,
    #    then every process killed: nothing more leaves it). Hosts 0, 1, 3 go on from the newest
    #    snapshot whole in memory; the torn newer one is skipped, never loaded.
    buddy_at=$(sed -n 's/.*node [0-9]* copies its snapshots to node [0-9]* (\(.*\))$/\1/p' "$dir/node2.log" | tail -1)
    [ -n "$buddy_at" ] || { fail "host 2 did not say where its copies go"; cat "$dir/node2.log"; exit 1; }
    buddy_ip=${buddy_at%:*}
    buddy=$((${buddy_ip##*.} - 10))
    copier_ports=$(ip netns exec "$(host_ns 2)" ss -tnH state established | awk -v peer="$buddy_at" '$4 == peer { sub(/.*:/, "", $3); print $3 }')
    [ -n "$copier_ports" ] || { fail "host 2 has no connection to its buddy at $buddy_at"; exit 1; }
    # htb sorts the copier's packets into class 1:10, whose tbf passes 2 KB/s (whole frames: no
    # segmentation offload, so that no frame is larger than the bucket).
    shape="ethtool -K eth0 tso off gso off >/dev/null && tc qdisc add dev eth0 root handle 1: htb default 20 &&
      tc class add dev eth0 parent 1: classid 1:10 htb rate 10gbit && tc class add dev eth0 parent 1: classid 1:20 htb rate 10gbit &&
      tc qdisc add dev eth0 parent 1:10 handle 10: tbf rate 16kbit burst 1600 latency 60s"
    for port in $copier_ports; do
      shape+=" && tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst $buddy_ip/32 match ip sport $port 0xffff flowid 1:10"
    done
    ip netns exec "$(host_ns 2)" sh -c "$shape" 2>/dev/null ||
      hosts_skip "this kernel cannot slow one connection (tc htb with a tbf class and a u32 filter)"
    unsent=0
    for _ in $(seq 100); do
      unsent=$(ip netns exec "$(host_ns 2)" ss -tnH state established |
        awk -v peer="$buddy_at" '$4 == peer && $2 > most { most = $2 } END { print most + 0 }')
      [ "$unsent" -gt 1000 ] && break
      sleep 0.05
    done
    start=$(hosts_now)
    host_link_down 2
    host_kill_all 2
    wait "${pid[2]}" 2>/dev/null
    ip netns exec "$(host_ns 2)" tc qdisc del dev eth0 root 2>/dev/null
    echo "elastic memory: host 2 lost with $unsent bytes of its copy to host $buddy ($buddy_at) unacknowledged"
    [ "$unsent" -gt 1000 ] || fail "host 2's copy to host $buddy was not in flight when host 2 was lost"
    first=$(await_line "$dir/node0.log" "rank 0 of 3 on host0: backend $backend, step [0-9]+$" 120) || exit 1
    echo "elastic memory: restart $(awk -v a="$first" -v b="$start" 'BEGIN { printf "%.1f", a - b }') s after host 2 was lost"
    for k in 0 1 3; do
      grep -Eq "of 3 on host$k: backend $backend, restored snapshot ([5-9][0-9]|[1-9][0-9][0-9])$" "$dir/node$k.log" ||
        fail "host $k did not restore a snapshot of step 50 or later from memory"
    done
    grep -Eq "restoring snapshot [0-9]+, the newest whole one; skipped snapshot [0-9]+: " "$dir/node0.log" ||
      fail "rank 0 did not name the torn snapshot it skipped"
    # 2. A replacement host 2 joins: the group re-forms (not a restart) and goes on from memory again.
    await_line "$dir/node0.log" "rank 0 of 3 on host0: backend $backend, step 1[5-9]0$" 90 >/dev/null || exit 1
    ip -n "$(hosts_switch)" link set h2 up
    start_node 2
    await_line "$dir/node2.log" "rank [0-9] of 4 on host2: backend $backend, restored snapshot [0-9]+$" 90 >/dev/null || exit 1
    # 3. Host 3's link is cut (its processes live on): hosts 0-2 go on from memory, host 3's part
    #    read from its buddy; host 3's lightning-run loses the store, stops its worker and exits 1.
    await_line "$dir/node0.log" "rank 0 of 4 on host0: backend $backend, step 2[2-9]0$" 90 >/dev/null || exit 1
    host_link_down 3
    for _ in $(seq 600); do kill -0 "${pid[3]}" 2>/dev/null || break; sleep 0.1; done
    kill -0 "${pid[3]}" 2>/dev/null && { fail "host 3's lightning-run did not end within 60 s of its link being cut"; host_kill_all 3; }
    wait "${pid[3]}"; code[3]=$?
    [ "${code[3]}" = 1 ] && grep -q "lost contact with the rendezvous store" "$dir/node3.log" ||
      fail "host 3, cut off, exited ${code[3]} without naming the store it lost (expected 1)"
    for k in 0 1 2; do  # (await_line names a host that did not)
      await_line "$dir/node$k.log" "of 3 on host$k: backend $backend, restored snapshot [2-9][0-9][0-9]$" 60 >/dev/null || exit 1
    done
    # 4. Hosts 1 and 2 lost together: in a group of three, one of them holds the other's only copy,
    #    so host 0 falls back to the newest whole checkpoint on disk, as restore_snapshot's fallback.
    await_line "$dir/node0.log" "rank 0 of 3 on host0: backend $backend, step 3[2-9]0$" 90 >/dev/null || exit 1
    host_kill_all 1 &
    killer=$!
    host_kill_all 2
    wait "$killer" "${pid[1]}" "${pid[2]}" 2>/dev/null
    wait "${pid[0]}"; code[0]=$?
    show_logs 0 1 2 3
    expect_finish 0 1 3
    grep -Eq "of 1 on host0: backend $backend, no whole snapshot: fell back to $dir/ck/step-[0-9]+0.ckpt$" "$dir/node0.log" ||
      fail "host 0 did not fall back to the disk checkpoint"
    grep -q "snapshots were taken, but none survived whole on the nodes that remain" "$dir/node0.log" ||
      fail "rank 0 did not say what was lost"
    ;;
  join)
    hosts_up 3
    for k in 0 1; do start_node "$k"; done
    for k in 0 1; do await_line "$dir/node$k.log" "of 4 on host$k: backend shm\+gloo, step 50$" 90 >/dev/null || exit 1; done
    start=$(hosts_now)
    start_node 2
    report_restart "$start" 6
    for k in 0 1 2; do wait "${pid[$k]}"; code[$k]=$?; done
    show_logs 0 1 2
    for k in 0 1 2; do expect_finish "$k" 6 0; done
    grep -q "node(s) waiting to join (host2): re-forming the group" "$dir/node0.log" || fail "node 0 did not name host2 as waiting"
    grep -q "this restart does not count against --max-restarts" "$dir/node1.log" || fail "node 1 did not say the regroup is free"
    ;;
  example)
    example=$(dirname "$job")/image_classifier
    [ -x "$example" ] || hosts_skip "no $example (configure with -DLF_BUILD_EXAMPLES=ON)"
    hosts_up 2
    for k in 0 1; do
      host_run "$k" "$launcher" model --accelerator cpu --num-nodes 1:2 --main-address host0 --main-port 29400 \
        --devices 1 --max-restarts 1 --rdzv-last-call 3 --shutdown-grace 2 "$example" --epochs 2 --batch-size 64 \
        --checkpoint-dir "$dir/ck" --resume last >"$dir/node$k.log" 2>&1 &
      pid[$k]=$!
    done
    until [ -e "$dir/ck/epoch=1-step=469.ckpt" ]; do
      kill -0 "${pid[0]}" 2>/dev/null || { fail "node 0 ended before epoch 1's checkpoint"; break; }
      sleep 0.2
    done
    sleep 2
    start=$(hosts_now)
    host_kill_all 1
    wait "${pid[1]}" 2>/dev/null
    wait "${pid[0]}"; code[0]=$?
    after=$(awk -v a="$(hosts_now)" -v b="$start" 'BEGIN { printf "%.1f", a - b }')
    echo "elastic $case: node 0 finished $after s after the fault"
    show_logs 0 1
    [ "${code[0]}" = 0 ] || fail "node 0 exited ${code[0]}"
    grep -q "restart 1 of the job, world size 1" "$dir/node0.log" || fail "the example did not report restart 1 in a world of 1"
    grep -q "resumed from $dir/ck/epoch=1-step=469.ckpt at epoch 2" "$dir/node0.log" || fail "the example did not resume from epoch 1's checkpoint"
    grep -q '"epoch":2,.*"world_size":1' "$dir/node0.log" || fail "epoch 2 did not finish in a world of 1"
    ;;
  *) echo "FAIL: unknown case $case"; exit 2 ;;
esac
hosts_expect_nothing_left
[ "$HOSTS_FAILURES" = 0 ] || exit 1
echo "hosts elastic $case: passed"
