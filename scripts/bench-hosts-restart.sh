#!/usr/bin/env bash
# Restart time of an elastic job after a host is lost, on the hosts harness (tests/hosts): 3 hosts
# x 2 workers train tests/hosts/hosts_job; host 2 is SIGKILLed mid-training; the time runs from the
# kill until node 0 logs the first step of the new group of 2 hosts (detection, re-rendezvous,
# workers started, checkpoint loaded, first step). lightning-run (--num-nodes 2:3) with its default
# --node-timeout and --rdzv-last-call and with 5 s and 3 s; torchrun's elastic agent (--nnodes 1:3 --rdzv-backend c10d) with its
# defaults and with last_call_timeout=3; side by side, REPEATS times each. Needs root.
#   scripts/bench-hosts-restart.sh [BUILD_DIR] [REPEATS]
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeats=${2:-2}
test=$root/tests/hosts/hosts_elastic.sh
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# restart_time CASE ENV...: one run; prints the seconds.
restart_time() {
  local case=$1 line
  shift
  line=$(env "$@" bash "$test" "$build/bin/lightning-run" "$build/bin/lf_hosts_job" "$case" 2>&1 | grep -E "^elastic $case: restart|FAIL")
  case "$line" in
    *FAIL*) echo "bench-hosts-restart: $case ($*) failed: $line" >&2; echo nan ;;
    *) echo "$line" | sed -E 's/.*restart ([0-9.]+) s.*/\1/' ;;
  esac
}

declare -A times
for ((r = 0; r < repeats; ++r)); do
  times[ours_default]+="$(restart_time shrink ELASTIC_NODE_TIMEOUT=30 ELASTIC_LAST_CALL=) "
  times[torchrun_default]+="$(restart_time torchrun ELASTIC_TORCHRUN_CONF=) "
  times[ours_5s]+="$(restart_time shrink ELASTIC_NODE_TIMEOUT=5 ELASTIC_LAST_CALL=3) "
  times[torchrun_last_call_3s]+="$(restart_time torchrun ELASTIC_TORCHRUN_CONF=last_call_timeout=3) "
done
for config in ours_default torchrun_default ours_5s torchrun_last_call_3s; do
  printf '{"config": "%s", "restart_s": [%s], "median_s": %s}\n' "$config" \
    "$(echo ${times[$config]} | tr ' ' ',')" "$(echo ${times[$config]} | median)"
done
printf '{"median_ratio_default": %s, "median_ratio_tuned": %s}\n' \
  "$(awk -v a="$(echo ${times[ours_default]} | median)" -v b="$(echo ${times[torchrun_default]} | median)" 'BEGIN { printf "%.3f", a / b }')" \
  "$(awk -v a="$(echo ${times[ours_5s]} | median)" -v b="$(echo ${times[torchrun_last_call_3s]} | median)" 'BEGIN { printf "%.3f", a / b }')"
