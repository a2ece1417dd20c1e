#!/usr/bin/env bash
# lf::StreamingDataLoader behind Fabric (fabric.setup_dataloaders) in lightning-run jobs that train
# a model on it (streaming_checks train: each rank logs the sample ids of every batch it takes,
# and its losses and final parameters exactly):
#   1. 1, 2 and 4 ranks, and 2 nodes x 2 ranks (two lightning-runs): each rank's batches, over two
#      shuffled epochs, are the ones the loader plans for that rank (which litdata_interop.sh
#      proves equal to Python litdata's), and every sample is seen once per epoch across ranks;
#      the 1-rank job rolls back after batch 3 with the loader in the rollback State, and reads on;
#   2. exact resume: a 2-rank job (and a 1-rank one, without drop_last) saves model, optimizer and fabric.resume_state() after 5
#      batches and is killed (SIGKILL on rank 0, so lightning-run exits 137); resumed on 2 ranks
#      each rank continues with exactly the batches the uninterrupted job took next, through the
#      next epoch, with the same losses and final parameters bit for bit; resumed
#      on 3 ranks and on 1 the job takes each sample it had not taken exactly once, dropping
#      fewer than world_size x batch_size of them at the end (drop_last), and none it had taken.
# Usage: streaming_resume.sh LIGHTNING_RUN STREAMING_CHECKS [--two-ranks-only]   (LF_PYTHON: a Python)
# --two-ranks-only: only the 2-rank job of 1. (the loader's threads under the sanitizer pass).
set -uo pipefail
run="$1"; checks="$2"; only="${3:-}"
python="${LF_PYTHON:-python3}"
dir="$(mktemp -d)"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
[ -n "${LF_KEEP:-}" ] && trap - EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
"$checks" write ids "$dir/ids" || fail "the writer"
items=203; batch=4

job() {  # job RANKS LOG [train flags...]: one lightning-run, its exit code checked by the caller
  local ranks=$1 log=$2; shift 2
  mkdir -p "$log"
  timeout 120 "$run" model --accelerator cpu --devices "$ranks" "$checks" train "$dir/ids" "$log" --batch $batch "$@" \
    > "$log.out" 2>&1
}
planned() {  # planned WORLD RANK EPOCHS: the batches the loader plans, as train logs them
  "$checks" order "$dir/ids" "$1,$2,2,$batch,1,$3" | sed 's/^[^ ]* epoch/epoch/'
}
ids_of() { cat "$@" | sed 's/^epoch [0-9]*://' | tr ' ' '\n' | grep -v '^$'; }

# 1. whole jobs: the planned order on every rank; each epoch covers the dataset once.
check_job() {  # check_job WORLD LOG
  local world=$1 log=$2
  for ((r = 0; r < world; r++)); do
    planned "$world" "$r" 2 > "$log.plan$r"
    cmp -s "$log.plan$r" "$log/rank-$r.log" || { diff "$log.plan$r" "$log/rank-$r.log" | head -3; fail "rank $r of $world did not take its planned batches"; }
  done
  for epoch in 1 2; do
    local seen dupes
    seen=$(cat "$log"/rank-*.log | grep "^epoch $epoch:" | ids_of | sort -n | uniq | wc -l)
    dupes=$(cat "$log"/rank-*.log | grep "^epoch $epoch:" | ids_of | sort -n | uniq -d | wc -l)
    (( dupes == 0 )) || fail "$world ranks: $dupes samples seen twice in epoch $epoch"
    (( items - seen < world * batch )) || fail "$world ranks: only $seen of $items samples seen in epoch $epoch"
  done
  echo "ok: $world ranks took their planned batches over 2 epochs"
}
worlds="1 2 4"
[ "$only" = "--two-ranks-only" ] && worlds=2
for world in $worlds; do
  extra=(); (( world == 1 )) && extra=(--roll-back-at 3)
  job $world "$dir/whole$world" --workers 2 --shuffle --epochs 2 "${extra[@]}" || fail "the $world-rank job exited with $? ($(tail -3 "$dir/whole$world.out"))"
  check_job $world "$dir/whole$world"
  if (( world == 1 )); then
    grep -q "Rolled back to" "$dir/whole1.out" || fail "the 1-rank job did not roll back ($(tail -3 "$dir/whole1.out"))"
    echo "ok: rolled back after batch 3 with the loader in the rollback State; it read on through its plan"
  fi
done
if [ "$only" = "--two-ranks-only" ]; then echo "streaming resume checks passed (2 ranks only)"; exit 0; fi
port=$("$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
mkdir -p "$dir/nodes"
for node in 1 0; do
  timeout 120 "$run" model --accelerator cpu --num-nodes 2 --node-rank $node --main-port "$port" --devices 2 \
    "$checks" train "$dir/ids" "$dir/nodes" --batch $batch --workers 2 --shuffle --epochs 2 > "$dir/node$node.out" 2>&1 &
  pids+=($!)
done
wait "${pids[0]}"; code1=$?
wait "${pids[1]}"; code0=$?
pids=()
(( code0 == 0 && code1 == 0 )) || fail "the two-node job exited with $code0 (node 0) and $code1 (node 1) ($(tail -3 "$dir/node0.out"))"
check_job 4 "$dir/nodes"

# 2. exact resume after a kill.
job 2 "$dir/first" --workers 2 --shuffle --save-after 5 "$dir/ck" --kill; code=$?
(( code == 137 )) || fail "the killed job exited with $code, expected 137 (SIGKILL) ($(tail -3 "$dir/first.out"))"
[ -f "$dir/ck" ] || fail "the killed job left no checkpoint"
for r in 0 1; do (( $(wc -l < "$dir/first/rank-$r.log") == 5 )) || fail "rank $r took $(wc -l < "$dir/first/rank-$r.log") batches before the kill, expected 5"; done
job 2 "$dir/same" --workers 2 --shuffle --epochs 2 --resume "$dir/ck" || fail "the resumed 2-rank job exited with $?"
for r in 0 1; do
  cat "$dir/first/rank-$r.log" "$dir/same/rank-$r.log" > "$dir/joined$r"
  cmp -s "$dir/joined$r" "$dir/whole2/rank-$r.log" || { diff "$dir/joined$r" "$dir/whole2/rank-$r.log" | head -3; fail "rank $r resumed on 2 ranks did not continue as the uninterrupted job"; }
  cat "$dir/first/rank-$r.loss" "$dir/same/rank-$r.loss" > "$dir/joined$r.loss"
  cmp -s "$dir/joined$r.loss" "$dir/whole2/rank-$r.loss" || { diff "$dir/joined$r.loss" "$dir/whole2/rank-$r.loss" | head -3; fail "rank $r resumed on 2 ranks did not reach the uninterrupted job's losses and parameters bit for bit"; }
done
echo "ok: resumed on the same 2 ranks, every rank continued with the uninterrupted job's batches, losses and parameters, bit for bit"
# Without drop_last (one rank's default): the resumed job ends the epoch with the short batch, as the
# uninterrupted one did (its batches equal; its losses differ from whole1's, which rolled back).
job 1 "$dir/first1" --workers 2 --shuffle --save-after 5 "$dir/ck1" --kill; code=$?
(( code == 137 )) || fail "the killed 1-rank job exited with $code, expected 137 ($(tail -3 "$dir/first1.out"))"
job 1 "$dir/same1" --workers 2 --shuffle --epochs 2 --resume "$dir/ck1" || fail "the resumed 1-rank job exited with $?"
cat "$dir/first1/rank-0.log" "$dir/same1/rank-0.log" > "$dir/joined1"
cmp -s "$dir/joined1" "$dir/whole1/rank-0.log" || { diff "$dir/joined1" "$dir/whole1/rank-0.log" | head -3; fail "the 1-rank job (no drop_last) resumed did not continue as the uninterrupted job"; }
echo "ok: resumed without drop_last on 1 rank, the job continued with the uninterrupted job's batches, the short last one included"
for world in 3 1; do
  job $world "$dir/other$world" --workers 2 --shuffle --resume "$dir/ck" || fail "the job resumed on $world ranks exited with $?"
  ids_of "$dir"/first/rank-*.log "$dir"/other$world/rank-*.log | sort -n > "$dir/all$world"
  dupes=$(uniq -d < "$dir/all$world" | wc -l)
  (( dupes == 0 )) || fail "resumed on $world ranks: $dupes samples taken twice"
  # The first epoch of 2 ranks serves 200 of 203 samples (drop_last); the resumed job drops fewer than world x batch more.
  taken=$(wc -l < "$dir/all$world")
  (( taken <= 200 && 200 - taken < world * batch )) || fail "resumed on $world ranks: $taken samples taken in the epoch, expected 200 less fewer than $((world * batch))"
  echo "ok: resumed on $world ranks, $taken samples taken once each, none twice"
done
echo "streaming resume checks passed"
