#!/usr/bin/env bash
# shm+gloo against gloo across real hosts (docs/benchmarks.md, "shm+gloo across hosts"): 2 hosts
# of the hosts harness (tests/hosts/hosts.sh, as root), 2 workers each, one lightning-run node per
# host.
#   P5   all-reduce bus bandwidth and latency, 4 KB to 256 MB (bench_shm REPEATS shm+gloo): both
#        groups over the same 4 ranks, timed alternately.
#   DDP  the 784-1024-1024-10 MLP's median step (bench_ddp_step, 64 rows per rank, 60 steps after
#        10), with the default backend (shm+gloo) and with LT_PROCESS_GROUP_BACKEND=gloo, one after
#        the other REPEATS times, and the bytes host 1 sent over its network link (eth0) and over
#        its loopback during each run.
#   scripts/bench-hosts-shm-gloo.sh [BUILD_DIR] [REPEATS]
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeats=${2:-3}
source "$root/tests/hosts/hosts.sh"
hosts_test_setup
hosts_up 2

# on_hosts ENV... -- PROGRAM ARGS...: one node per host; prints node 0's output.
on_hosts() {
  local k pids=() envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  for k in 0 1; do
    host_run "$k" env "${envs[@]}" "$build/bin/lightning-run" model --accelerator cpu --num-nodes 2 --node-rank "$k" \
      --main-address host0 --main-port 29400 --devices 2 "$@" >"$HOSTS_TEST_DIR/n$k.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "FAIL: a node failed:" >&2; cat "$HOSTS_TEST_DIR"/n*.log >&2; exit 1; }; done
  grep -o '{".*' "$HOSTS_TEST_DIR/n0.log"
}

sent() { ip netns exec "$(host_ns 1)" cat "/sys/class/net/$1/statistics/tx_bytes"; }

on_hosts LT_UNUSED=1 -- "$build/bin/bench_shm" "$repeats" shm+gloo
for ((r = 0; r < repeats; ++r)); do
  for backend in default gloo; do
    variable=LT_UNUSED=1
    [ "$backend" = gloo ] && variable=LT_PROCESS_GROUP_BACKEND=gloo
    link=$(sent eth0) loopback=$(sent lo)
    result=$(on_hosts "$variable" -- "$build/bin/bench_ddp_step" 784-1024-1024-10 64 60 10)
    echo "{\"backend\":\"$backend\",\"run\":$r,\"host1_link_MB\":$(( ($(sent eth0) - link) / 1000000 )),\"host1_loopback_MB\":$(( ($(sent lo) - loopback) / 1000000 )),\"result\":$result}"
  done
done
