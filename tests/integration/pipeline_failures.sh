#!/usr/bin/env bash
# The pipeline strategy's failures and refusals in real 4-rank jobs: a stage that throws ends the
# job with the stage and rank named (no hang: the job ends within the timeout, the flight recorder
# shows the point-to-point operations), and bad input is refused with a clear error on every rank
# before any process blocks.
# Usage: pipeline_failures.sh LIGHTNING_RUN PIPELINE_CHECKS
set -uo pipefail
run="$1"; checks="$2"
failed=0
expect() {  # expect TEXT -- FLAGS...: the job fails (not by the timeout) and its output has TEXT
  local text="$1"; shift 2
  local output status
  output="$(timeout 60 "$run" model --accelerator cpu --devices 4 --process-group-backend gloo "$checks" "$@" 2>&1)"
  status=$?
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || ! grep -qF -- "$text" <<<"$output"; then
    echo "FAIL: $* exited $status (expected a failure, not 0 or the timeout's 124), expected to mention: $text"
    echo "$output" | tail -n 20
    failed=1
    return
  fi
  echo "ok ($status): $* -> $(grep -F -m1 -- "$text" <<<"$output")"
}
expect "pipeline stage 2 (global rank 2, pipe rank 2) failed in the forward of micro-batch 2: injected fault" \
  -- --pipe 4 --fail-stage 2
expect "recv float32[4, 8, 16] on mesh-0-pipe" -- --pipe 4 --fail-stage 2
expect "stage_starts has 3 entries [0, 3, 6], but the pipeline runs 4 stages" -- --pipe 4 --stage-starts 0,3,6
expect "stage_starts [0, 3, 3, 6] cannot split 8 layers" -- --pipe 4 --stage-starts 0,3,3,6
expect "3 layers cannot make 4 stages" -- --pipe 4 --blocks 1
expect "a batch of 18 samples cannot be split into micro_batches=4" -- --pipe 4 --batch 18
expect "this batch [8, 8] makes micro-batches of shape [2, 8], but the first step's were [4, 8]" \
  -- --pipe 4 --halve-batch-after 1
expect "pipeline_size=3, data_parallel_size=unset and tensor_parallel_size=1 do not make the world size 4" -- --pipe 3
expect "schedule=\"Interleaved1F1B\" takes micro-batches 4 at a time" \
  -- --pipe 4 --schedule Interleaved1F1B --stages-per-rank 2 --micro-batches 6 --blocks 10
expect "schedule=\"1F1B\" runs one stage per rank, but stages_per_rank=2" -- --pipe 2 --stages-per-rank 2
expect "schedule=\"ZeroBubble\" is not valid" -- --schedule ZeroBubble
expect "fully_sharded.sharding_strategy=HYBRID_SHARD needs a replica dimension" -- --pipe 2 --fsdp HYBRID_SHARD
expect "with fsdp and tensor_parallel_size=2 is not supported yet" -- --pipe 2 --fsdp FULL_SHARD --tensor 2 --meta
exit $failed
