#!/usr/bin/env bash
# The pipeline strategy's failures and refusals in real 4-rank jobs, each job's exit code exact: a
# stage that throws ends the job with the stage and rank named (no hang: the job ends within the
# timeout, the flight recorder shows the point-to-point operations), a failed step refuses the
# next, a loss of several values is named, and bad input is refused with a clear error on every
# rank before any process blocks. (The refusals that leave a job usable are tried inside training
# jobs: lf_pipeline_checks --refusals.)
# Usage: pipeline_failures.sh LIGHTNING_RUN PIPELINE_CHECKS
set -uo pipefail
run="$1"; checks="$2"
failed=0
# expect CODE RANKS TEXT -- FLAGS...: the job exits with exactly CODE, well before the timeout (a
# blocked rank would run into it: 124), and TEXT is on a line of each rank in RANKS ("all": every
# rank of the 4; "0,2": those; "any": one line at least). A rank's uncaught error aborts it (134),
# and lightning-run exits with that code.
expect() {
  local code="$1" ranks="$2" text="$3"; shift 4
  local output status missing="" catch=() refusals
  # Refusals on every rank: each rank prints its own and exits 4 once every rank has
  # (lf_pipeline_checks --catch-refusals, which meet in LF_TEST_REFUSAL_DIR).
  [ "$ranks" = all ] && [ "$code" = 4 ] && catch=(--catch-refusals)
  refusals="$(mktemp -d)"
  output="$(LF_TEST_REFUSAL_DIR="$refusals" timeout 60 "$run" model --accelerator cpu --devices 4 \
    --process-group-backend gloo "$checks" "$@" "${catch[@]}" 2>&1)"
  status=$?
  rm -rf "$refusals"
  case "$ranks" in
    all) ranks="0,1,2,3" ;;
    any) ranks="" ;;
  esac
  if [ -z "$ranks" ]; then
    grep -qF -- "$text" <<<"$output" || missing="any rank"
  else
    for rank in ${ranks//,/ }; do
      grep -F -- "[rank $rank]: " <<<"$output" | grep -qF -- "$text" || missing="$missing rank $rank"
    done
  fi
  if [ "$status" -ne "$code" ] || [ -n "$missing" ]; then
    echo "FAIL: $* exited $status (expected $code); expected on${missing:- every named rank}: $text"
    echo "$output" | tail -n 20
    failed=1
    return
  fi
  echo "ok ($status): $* -> $(grep -F -m1 -- "$text" <<<"$output")"
}
# A stage that throws ends the job naming it; its neighbour's pending receive is in the flight record.
expect 134 any "pipeline stage 2 (global rank 2, pipe rank 2) failed in the forward of micro-batch 2: injected fault" \
  -- --pipe 4 --fail-stage 2
expect 134 any "recv float32[4, 8, 16] on mesh-0-pipe" -- --pipe 4 --fail-stage 2
# A failed step refuses the next one (on the rank that caught it: the others wait in a receive
# until lightning-run ends them).
expect 3 2 "the next step: lf::Pipeline forward: an earlier step of this pipeline failed" \
  -- --pipe 4 --fail-stage 2 --retry-after-failure
# A loss that is not one value: the last stage names it.
expect 134 any "pipeline stage 3 (global rank 3, pipe rank 3) failed in the forward of micro-batch 0" \
  -- --pipe 4 --loss-per-sample
expect 134 3 "the loss function returned shape [4]; it must return one value" -- --pipe 4 --loss-per-sample
# A stage output the boundary cannot carry, named by the stage that makes it: more than 8
# dimensions, and a shape other than the one agreed at the first step.
expect 134 0 "Pipeline stage 0's output has 9 dimensions; the pipeline carries tensors of at most 8" \
  -- --pipe 4 --shape-fault nine-dims --stage-starts 0,2,4,6
expect 134 0 "Pipeline stage 0 (global rank 0) outputs float32[4, 7, 16] for micro-batch 0, but the stages agreed on" \
  -- --pipe 4 --shape-fault shrink --stage-starts 0,2,4,6
# Bad input, refused on every rank before anything blocks: each rank prints its refusal and exits 4.
expect 4 all "stage_starts has 3 entries [0, 3, 6], but the pipeline runs 4 stages" -- --pipe 4 --stage-starts 0,3,6
expect 4 all "stage_starts [0, 3, 3, 6] cannot split 8 layers" -- --pipe 4 --stage-starts 0,3,3,6
expect 4 all "3 layers cannot make 4 stages" -- --pipe 4 --blocks 1
expect 4 all "a batch of 18 samples cannot be split into micro_batches=4" -- --pipe 4 --batch 18
expect 4 all "this batch [8, 8] makes micro-batches of shape [2, 8], but the first step's were [4, 8]" \
  -- --pipe 4 --halve-batch-after 1
expect 4 all "pipeline_size=3, data_parallel_size=unset and tensor_parallel_size=1 do not make the world size 4" -- --pipe 3
expect 4 all "schedule=\"Interleaved1F1B\" takes micro-batches 4 at a time" \
  -- --pipe 4 --schedule Interleaved1F1B --stages-per-rank 2 --micro-batches 6 --blocks 10
expect 4 all "schedule=\"1F1B\" runs one stage per rank, but stages_per_rank=2" -- --pipe 2 --stages-per-rank 2
expect 4 all "schedule=\"ZeroBubble\" is not valid" -- --schedule ZeroBubble
expect 4 all "fully_sharded.sharding_strategy=HYBRID_SHARD needs a replica dimension" -- --pipe 2 --fsdp HYBRID_SHARD
# A precision with a loss scaler: refused at setup on every rank, which then meet at a barrier.
expect 0 all "refused on rank" -- --pipe 4 --loss-scaler
exit $failed
