#!/usr/bin/env bash
# In-memory replicas against the disk: the image classifier (examples/image_classifier, dropout on)
# on 2 CPU ranks under STRATEGY (default ddp), a worker SIGKILLed once the step-20 checkpoint is on
# disk, restarted by lightning-run (--max-restarts 1). Two ways, alternating, REPEATS (default 3)
# times each:
#   memory: --in-memory-replicas 1 (a snapshot every step), no --resume;
#   disk:   a checkpoint every 10 steps, --resume last (the usual way: up to 10 steps redone).
# For each run it prints the time from the kill to the restarted job's restore line (the first
# step follows it at once) and the step it went on from. Then, without a kill, the step time p50
# (lightning-run's step-time report, rank 0) with and without --in-memory-replicas 1: the cost of a
# snapshot every step. docs/benchmarks.md, "In-memory replicas".
# Usage: scripts/bench-memory-restore.sh [BUILD_DIR]   (REPEATS=3 STRATEGY=ddp)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build}/bin"
repeats="${REPEATS:-3}"
strategy="${STRATEGY:-ddp}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/memory-restore.XXXXXX")"
job=""
trap '[ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null; rm -rf "$dir"' EXIT
flags=(--batch-size 32 --dropout 0.3 --max-steps 60 --no-progress)

one_run() {  # $1: memory | disk
  local mode="$1" out="$dir/$1" extra=() run=()
  rm -rf "$out"
  if [ "$mode" = memory ]; then extra=(--in-memory-replicas 1); run=(--checkpoint-every 20)
  else run=(--checkpoint-every 10 --resume last); fi
  setsid "$bin/lightning-run" model --accelerator cpu --devices 2 --strategy "$strategy" --max-restarts 1 \
    --timestamp-output "${extra[@]}" "$bin/image_classifier" "${flags[@]}" --checkpoint-dir "$out" "${run[@]}" \
    >"$out.log" 2>&1 &
  job=$!
  for _ in $(seq 1 1200); do [ -e "$out/epoch=1-step=20.ckpt" ] && break; sleep 0.02; done
  local worker killed_at
  worker="$(pgrep -P "$job" | tail -1)"
  killed_at="$(date +%s.%N)"
  kill -9 "$worker"
  wait "$job" || { cat "$out.log"; echo "FAIL: the $mode job failed"; exit 1; }
  job=""
  local line stamp step
  line="$(grep -E "restored the in-memory snapshot|resumed from" "$out.log" | head -1)"
  [ -n "$line" ] || { cat "$out.log"; echo "FAIL: the $mode job did not restore"; exit 1; }
  stamp="$(echo "$line" | awk '{print $1}')"
  step="$(echo "$line" | grep -o 'step [0-9]*' | tail -1 | awk '{print $2}')"
  python3 -c "
import datetime
t = datetime.datetime.fromisoformat('$stamp').timestamp()
print(f'$mode: kill to restore {t - $killed_at:.2f} s, went on from step $step')"
}

for _ in $(seq 1 "$repeats"); do
  one_run memory
  one_run disk
done

step_p50() {  # extra flags...
  "$bin/lightning-run" model --accelerator cpu --devices 2 --strategy "$strategy" "$@" "$bin/image_classifier" \
    --batch-size 32 --dropout 0.3 --max-steps 150 --no-progress 2>&1 | grep -o "rank 0: p50 [0-9.]* ms" | awk '{print $4}'
}
for _ in $(seq 1 "$repeats"); do
  off="$(step_p50)"
  on="$(step_p50 --in-memory-replicas 1)"
  python3 -c "print(f'step p50: {$off} ms without snapshots, {$on} ms with one every step ({$on / $off:.2f}x)')"
done
