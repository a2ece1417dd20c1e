#!/usr/bin/env bash
# Rendezvous time across real hosts (docs/benchmarks.md, "Rendezvous across hosts"): 2, 3 and 4
# hosts of the hosts harness (tests/hosts/hosts.sh, as root), 2 workers each, all nodes started
# at once; the time until every node has exited, when each worker has formed the process group and
# passed one barrier (lf_test_worker barrier). The same with torchrun's elastic agent and its c10d
# rendezvous (--rdzv-backend c10d, from the project's .venv) on the same hosts, side by side.
#   scripts/bench-hosts-rendezvous.sh [BUILD_DIR] [REPEATS]
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeats=${2:-3}
source "$root/tests/hosts/hosts.sh"
hosts_test_setup
torchrun=$root/.venv/bin/torchrun
worker=$build/bin/lf_test_worker

# run_all N LAUNCHER: starts one node per host, prints the seconds until all have exited.
run_all() {
  local count=$1 launcher=$2 k pids=() start
  start=$(hosts_now)
  for ((k = 0; k < count; ++k)); do
    if [ "$launcher" = lightning-run ]; then
      host_run "$k" "$build/bin/lightning-run" model --accelerator cpu --num-nodes "$count" --node-rank "$k" \
        --main-address host0 --main-port 29400 --devices 2 "$worker" barrier >"$HOSTS_TEST_DIR/n$k.log" 2>&1 &
    else
      host_run "$k" "$torchrun" --nnodes "$count" --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint host0:29401 \
        --rdzv-id bench --no-python "$worker" barrier >"$HOSTS_TEST_DIR/n$k.log" 2>&1 &
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "FAIL: a $launcher node failed:"; cat "$HOSTS_TEST_DIR"/n*.log; exit 1; }; done
  awk -v a="$(hosts_now)" -v b="$start" 'BEGIN { printf "%.2f", a - b }'
}

median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for count in 2 3 4; do
  hosts_up "$count"
  ours=() theirs=()
  for ((r = 0; r < repeats; ++r)); do
    ours+=("$(run_all "$count" lightning-run)")
    theirs+=("$(run_all "$count" torchrun)")
  done
  hosts_down
  printf '{"hosts": %d, "workers": %d, "lightning_run_s": [%s], "torchrun_c10d_s": [%s], "median_ratio": %s}\n' \
    "$count" $((2 * count)) "$(IFS=,; echo "${ours[*]}")" "$(IFS=,; echo "${theirs[*]}")" \
    "$(awk -v a="$(echo "${ours[*]}" | median)" -v b="$(echo "${theirs[*]}" | median)" 'BEGIN { printf "%.2f", a / b }')"
done
