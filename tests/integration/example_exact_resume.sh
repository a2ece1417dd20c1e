#!/usr/bin/env bash
# The image classifier with dropout on 2 ranks under STRATEGY (ddp or fsdp): one job runs 60
# steps straight; another, saving every 10 steps, has a worker killed (SIGKILL) once its step-20
# checkpoint exists, is restarted by lightning-run (--max-restarts 1) and resumes from its newest
# checkpoint (--resume last, whose state holds fabric.resume_state()). Both must end with the
# same weights and optimizer state, bit for bit. Then, under ddp, the step-20 checkpoint resumed on
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

setsid "$launcher" model --accelerator cpu --devices 2 --strategy "$strategy" --max-restarts 1 "$example" "${flags[@]}" \
  --checkpoint-dir "$dir/killed" --resume last >"$dir/killed.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  [ -e "$dir/killed/epoch=1-step=20.ckpt" ] && break
  sleep 0.05
done
[ -e "$dir/killed/epoch=1-step=20.ckpt" ] || { cat "$dir/killed.log"; echo "FAIL: no step-20 checkpoint after 30 s"; exit 1; }
worker="$(pgrep -P "$job" | tail -1)"
[ -n "$worker" ] || { cat "$dir/killed.log"; echo "FAIL: no worker left to kill"; exit 1; }
kill -9 "$worker"
status=0
wait "$job" || status=$?
job=""
cat "$dir/killed.log"
[ "$status" = 0 ] || { echo "FAIL: the restarted job exited with $status"; exit 1; }
grep -q "restart 1 of the job" "$dir/killed.log" || { echo "FAIL: the job was not restarted (killed too late?)"; exit 1; }
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

if [ "$strategy" = ddp ]; then
  mkdir "$dir/one"
  cp "$dir/straight/epoch=1-step=20.ckpt" "$dir/one/"
  "$launcher" model --accelerator cpu --devices 1 "$example" "${flags[@]}" --checkpoint-dir "$dir/one" --resume last \
    >"$dir/one.log" 2>&1 || { cat "$dir/one.log"; echo "FAIL: resuming on 1 rank failed"; exit 1; }
  grep -q "the resume is not exact" "$dir/one.log" || { cat "$dir/one.log"; echo "FAIL: no warning for another world size"; exit 1; }
fi
echo "resumed bit for bit after a killed worker ($strategy)"
