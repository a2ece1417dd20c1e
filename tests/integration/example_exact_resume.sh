#!/usr/bin/env bash
# The image classifier with dropout on 2 ranks under STRATEGY (ddp or fsdp): one job runs 60
# steps straight; another, saving every 10 steps, has a worker killed (SIGKILL) once its step-20
# checkpoint exists, is restarted by lightning-run (--max-restarts 1) and resumes from its newest
# checkpoint (--resume last, whose state holds fabric.resume_state()). Both must end with the
# same weights and optimizer state, bit for bit. A third job is killed the same way under
# --in-memory-replicas 1 and must go on from the snapshot in lightning-run's memory, not the disk,
# with the same result and nothing left in /dev/shm. Then, under ddp, the step-20 checkpoint resumed on
# 1 rank must warn that the resume is not exact and still finish.
# Usage: example_exact_resume.sh STRATEGY LAUNCHER EXAMPLE CHECKPOINT_TOOL
set -euo pipefail
strategy="$1"; launcher="$2"; example="$3"; tool="$4"
dir="$(mktemp -d)"
job=""
cleanup() {
  [ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
flags=(--batch-size 32 --dropout 0.3 --max-steps 60 --no-progress --checkpoint-every 10)
"$launcher" model --accelerator cpu --devices 2 --strategy "$strategy" "$example" "${flags[@]}" \
  --checkpoint-dir "$dir/straight" >"$dir/straight.log" 2>&1 || { cat "$dir/straight.log"; echo "FAIL: the straight run failed"; exit 1; }

# kill_and_restart NAME [LAUNCHER_FLAGS...] -- [PROGRAM_FLAGS...]: runs the job (2 ranks,
# --max-restarts 1, checkpoints in $dir/NAME, its output in $dir/NAME.log), SIGKILLs a worker once
# the step-20 checkpoint exists, and requires the restarted job to finish.
kill_and_restart() {
  local name="$1" launcher_flags=()
  shift
  while [ "$1" != -- ]; do launcher_flags+=("$1"); shift; done
  shift
  setsid "$launcher" model --accelerator cpu --devices 2 --strategy "$strategy" --max-restarts 1 "${launcher_flags[@]}" \
    "$example" "${flags[@]}" "$@" --checkpoint-dir "$dir/$name" >"$dir/$name.log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    [ -e "$dir/$name/epoch=1-step=20.ckpt" ] && break
    sleep 0.05
  done
  [ -e "$dir/$name/epoch=1-step=20.ckpt" ] || { cat "$dir/$name.log"; echo "FAIL: no step-20 checkpoint after 30 s ($name)"; exit 1; }
  local worker status=0
  worker="$(pgrep -P "$job" | tail -1)"
  [ -n "$worker" ] || { cat "$dir/$name.log"; echo "FAIL: no worker left to kill ($name)"; exit 1; }
  kill -9 "$worker"
  wait "$job" || status=$?
  job=""
  cat "$dir/$name.log"
  [ "$status" = 0 ] || { echo "FAIL: the restarted job ($name) exited with $status"; exit 1; }
  grep -q "restart 1 of the job" "$dir/$name.log" || { echo "FAIL: the job ($name) was not restarted (killed too late?)"; exit 1; }
}

kill_and_restart killed -- --resume last
grep -q "resumed from" "$dir/killed.log" || { echo "FAIL: the restarted job did not resume"; exit 1; }

straight="$dir/straight/epoch=1-step=60.ckpt"
killed="$dir/killed/epoch=1-step=60.ckpt"
if [ -d "$straight" ]; then  # fsdp: sharded folders, merged into one file each
  "$launcher" model consolidate "$straight" --output-file "$dir/straight.pt"
  "$launcher" model consolidate "$killed" --output-file "$dir/killed.pt"
  straight="$dir/straight.pt"; killed="$dir/killed.pt"
fi
"$tool" same "$straight" "$killed" model || { echo "FAIL: weights differ from the uninterrupted run"; exit 1; }
"$tool" same "$straight" "$killed" optimizer || { echo "FAIL: optimizer state differs from the uninterrupted run"; exit 1; }

# The same kill under --in-memory-replicas 1, without --resume: the restarted workers go on from the
# snapshot in lightning-run's memory (taken every step, so at most one step back), not from the disk.
shm_before="$(ls /dev/shm | grep -c lightning || true)"
kill_and_restart memory --in-memory-replicas 1 --
restored="$(sed -n 's/.*restored the in-memory snapshot at epoch [0-9]* step \([0-9]*\).*/\1/p' "$dir/memory.log" | head -1)"
[ -n "$restored" ] || { echo "FAIL: the restarted job did not restore the in-memory snapshot"; exit 1; }
[ "$restored" -ge 20 ] || { echo "FAIL: restored step $restored, but the step-20 snapshot existed before the kill"; exit 1; }
grep -q "resumed from" "$dir/memory.log" && { echo "FAIL: the memory job read a checkpoint from disk"; exit 1; }
memory="$dir/memory/epoch=1-step=60.ckpt"
if [ -d "$memory" ]; then
  "$launcher" model consolidate "$memory" --output-file "$dir/memory.pt"
  memory="$dir/memory.pt"
fi
"$tool" same "$straight" "$memory" model || { echo "FAIL: weights differ after the in-memory restore"; exit 1; }
"$tool" same "$straight" "$memory" optimizer || { echo "FAIL: optimizer state differs after the in-memory restore"; exit 1; }
shm_after="$(ls /dev/shm | grep -c lightning || true)"
[ "$shm_after" -le "$shm_before" ] || { ls -la /dev/shm; echo "FAIL: the memory job left files in /dev/shm"; exit 1; }
echo "restored bit for bit from memory at step $restored after a killed worker ($strategy)"

if [ "$strategy" = ddp ]; then
  mkdir "$dir/one"
  cp "$dir/straight/epoch=1-step=20.ckpt" "$dir/one/"
  "$launcher" model --accelerator cpu --devices 1 "$example" "${flags[@]}" --checkpoint-dir "$dir/one" --resume last \
    >"$dir/one.log" 2>&1 || { cat "$dir/one.log"; echo "FAIL: resuming on 1 rank failed"; exit 1; }
  grep -q "the resume is not exact" "$dir/one.log" || { cat "$dir/one.log"; echo "FAIL: no warning for another world size"; exit 1; }
fi
echo "resumed bit for bit after a killed worker ($strategy)"
