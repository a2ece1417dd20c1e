#!/usr/bin/env bash
# A lost host, recovered from in-memory replicas against the disk, on the hosts harness
# (tests/hosts): 3 hosts x 2 workers train tests/hosts/hosts_job under fsdp with a model whose
# state (parameters and SGD momentum) is STATE_MB; after step KILL_AT host 2 is SIGKILLed, and
# the two hosts left go on as a group of 4. Side by side, REPEATS times each:
#   memory    lightning-run --num-nodes 2:3 --in-memory-replicas 1 (a snapshot every step, no files)
#   disk      lightning-run --num-nodes 2:3, a checkpoint every 10 steps to a folder all hosts see
#   torchrun  torchrun --nnodes 1:3 --rdzv-backend c10d, the same checkpoints every 10 steps
#   plain     lightning-run with neither (the step time without snapshots or checkpoints; the job
#             starts again from step 0 after the kill)
# Per run: the restart (the kill until rank 0 logs its first step in the new group), the steps
# redone (rank 0's steps done when killed, from its log, less the step it started again from), the
# median step time of rank 0 in the new group (lightning-run's own report, of the last attempt:
# the same world size in every configuration), and the memory each
# node's lightning-run held at most (own snapshots and copies for other nodes). Needs root.
#   scripts/bench-hosts-memory.sh [BUILD_DIR] [REPEATS]     (STATE_MB=512 KILL_AT=24 STEPS=40;
#   BENCH_LOGS=DIR keeps each run's node logs; CONFIGS="memory disk" runs only those)
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeats=${2:-1}
state_mb=${STATE_MB:-512} kill_at=${KILL_AT:-24} steps=${STEPS:-40}
source "$root/tests/hosts/hosts.sh"
hosts_test_setup
dir=$HOSTS_TEST_DIR
# Parameters and momentum: 2 x 4 bytes x (20 + 1 + 5) x hidden, about 208 bytes per hidden unit.
hidden=$((state_mb * 1048576 / 208))
job=("$build/bin/lf_hosts_job" "$steps" --strategy fsdp --hidden "$hidden" --log-every 1 --tolerance -1)

# one_run CONFIG: prints one JSON line.
one_run() {
  local config=$1 k launch=() job_args=("${job[@]}") start first done_steps restarted step_ms memory
  rm -rf "$dir/ck"
  case "$config" in
    memory) job_args+=(--snapshot) ;;
    disk | torchrun) job_args+=(--checkpoint-dir "$dir/ck") ;;
  esac
  hosts_up 3
  for k in 0 1 2; do
    if [ "$config" = torchrun ]; then
      launch=("$root/.venv/bin/torchrun" --nnodes 1:3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint host0:29400
              --rdzv-id bench --max-restarts 1 --monitor-interval 0.5 --rdzv-conf last_call_timeout=3 --no-python)
    else
      launch=("$build/bin/lightning-run" model --accelerator cpu --num-nodes 2:3 --main-address host0 --main-port 29400
              --devices 2 --max-restarts 1 --node-timeout 5 --rdzv-last-call 3 --shutdown-grace 2)
      [ "$config" = memory ] && launch+=(--in-memory-replicas 1)
    fi
    host_run "$k" "${launch[@]}" "${job_args[@]}" >"$dir/node$k.log" 2>&1 &
    pid[$k]=$!
  done
  until grep -q "rank 0 of 6 on host0: backend [a-z+]*, step $kill_at$" "$dir/node0.log"; do
    kill -0 "${pid[0]}" 2>/dev/null || { echo "bench-hosts-memory: $config: node 0 ended early" >&2; tail "$dir/node0.log" >&2; return 1; }
    sleep 0.05
  done
  start=$(hosts_now)
  host_kill_all 2
  done_steps=$(($(grep -E "rank 0 of 6 on host0: backend [a-z+]*, step [0-9]+$" "$dir/node0.log" | tail -1 | sed -E 's/.* step //') + 1))
  wait "${pid[2]}" 2>/dev/null
  until grep -Eq "rank 0 of 4 on host0: backend [a-z+]*, step [0-9]+$" "$dir/node0.log"; do
    kill -0 "${pid[0]}" 2>/dev/null || { echo "bench-hosts-memory: $config: node 0 ended without a new group" >&2; tail "$dir/node0.log" >&2; return 1; }
    sleep 0.02
  done
  first=$(hosts_now)
  for k in 0 1; do wait "${pid[$k]}" || { echo "bench-hosts-memory: $config: node $k failed" >&2; tail -20 "$dir/node$k.log" >&2; }; done
  wait "${pid[2]}" 2>/dev/null
  restarted=$(grep -Eo "rank 0 of 4 on host0: backend [a-z+]*, restart count 1, starting at step [0-9]+" "$dir/node0.log" | sed -E 's/.* step //')
  [ -n "$restarted" ] || restarted=0
  step_ms=$(grep -m1 -Eo "step times \(between optimizer steps\) on node 0: .*" "$dir/node0.log" | grep -Eo "rank 0: p50 [0-9.]+ ms" | sed "s/rank 0: //" | head -1)
  memory=$(grep -Eo "in-memory replicas on node [0-9]: .*" "$dir"/node[01].log | sed -E 's/.*node ([0-9]).*at most ([0-9]+ MB).*/node \1 \2/' | sort -u | tr '\n' ',' | sed 's/,$//')
  printf '{"config": "%s", "state_mb": %s, "restart_s": %s, "steps_done_at_kill": %s, "restarted_at_step": %s, "steps_redone": %s, "step_time_after_restart": "%s", "memory_held_at_most": "%s"}\n' \
    "$config" "$state_mb" \
    "$(awk -v a="$first" -v b="$start" 'BEGIN { printf "%.2f", a - b }')" \
    "${done_steps:-null}" "${restarted:-null}" \
    "$([ -n "${restarted:-}" ] && echo $((done_steps - restarted)) || echo null)" "$step_ms" "$memory"
  [ -z "${BENCH_LOGS:-}" ] || { mkdir -p "$BENCH_LOGS"; for k in 0 1 2; do cp "$dir/node$k.log" "$BENCH_LOGS/$config-node$k.log"; done; }
  hosts_down
}

for ((r = 0; r < repeats; ++r)); do
  for config in ${CONFIGS:-plain memory disk torchrun}; do one_run "$config"; done
done
