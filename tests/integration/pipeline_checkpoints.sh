#!/usr/bin/env bash
# Pipeline checkpoints through the sharded-checkpoint engine: a 4-stage 1F1B job (AdamW, so step
# counts are in the optimizer state) saves a folder after 10 steps; jobs of other shapes resume it
# (2 pipe x 2 data under GPipe, 2 ranks x 2 stages each under Interleaved1F1B) and train 10 more
# steps equal to the unbroken 20 in one process (lf_pipeline_checks compares every step); the
# same across fsdp and tensor-parallel shapes; then `lightning-run model consolidate` makes one file, which
# one process resumes the same way.
# Usage: pipeline_checkpoints.sh LIGHTNING_RUN PIPELINE_CHECKS
set -uo pipefail
run="$1"; checks="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
failed=0
job() {  # job DEVICES FLAGS...: one job that must exit 0
  local devices="$1"; shift
  local output
  if ! output="$("$run" model --accelerator cpu --devices "$devices" --process-group-backend gloo "$checks" "$@" 2>&1)"; then
    echo "FAIL: $devices devices, $*:"; echo "$output" | tail -n 15; failed=1; return
  fi
  echo "ok: $devices devices, $*"
}
job 4 --adam --pipe 4 --schedule 1F1B --steps 10 --save "$dir/ck"
job 4 --adam --pipe 2 --schedule GPipe --steps 10 --resume "$dir/ck"
job 2 --adam --pipe 2 --schedule Interleaved1F1B --stages-per-rank 2 --steps 10 --resume "$dir/ck"
# SGD without momentum: no per-parameter state, only the groups.
job 4 --no-momentum --pipe 4 --steps 10 --save "$dir/ck-sgd"
job 4 --no-momentum --pipe 2 --steps 10 --resume "$dir/ck-sgd"
# fsdp on the data dimension: (2 pipe, 2 data) FULL_SHARD saves; ddp over 4 stages and
# SHARD_GRAD_OP over 4 data ranks in one stage resume it.
job 4 --adam --fsdp FULL_SHARD --pipe 2 --steps 10 --save "$dir/ck-fsdp"
job 4 --adam --pipe 4 --steps 10 --resume "$dir/ck-fsdp"
job 4 --adam --fsdp SHARD_GRAD_OP --pipe 1 --steps 10 --resume "$dir/ck-fsdp"
# With tensor parallelism inside the stages: ddp's (2 pipe, 2 tensor) saves and fsdp's (2 data,
# 2 tensor) resumes it; fsdp's saves, and (4 pipe) unsplit and ddp's (2 pipe, 2 tensor) resume it.
job 4 --adam --tensor 2 --pipe 2 --steps 10 --save "$dir/ck3d"
job 4 --adam --tensor 2 --pipe 1 --fsdp FULL_SHARD --steps 10 --resume "$dir/ck3d"
job 4 --adam --tensor 2 --pipe 1 --fsdp FULL_SHARD --steps 10 --save "$dir/ck3d-fsdp"
job 4 --adam --tensor 1 --pipe 4 --steps 10 --resume "$dir/ck3d-fsdp"
job 4 --adam --tensor 2 --pipe 2 --steps 10 --resume "$dir/ck3d-fsdp"
if "$run" model consolidate "$dir/ck" --output-file "$dir/one.pt" >/dev/null; then
  if output="$("$checks" --adam --steps 10 --resume "$dir/one.pt" 2>&1)"; then
    echo "ok: one process resumed the consolidated file"
  else
    echo "FAIL: one process on the consolidated file:"; echo "$output" | tail -n 15; failed=1
  fi
else
  echo "FAIL: consolidate"; failed=1
fi
exit $failed
