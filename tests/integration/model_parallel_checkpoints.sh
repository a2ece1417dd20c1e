#!/usr/bin/env bash
# model_parallel checkpoints move between meshes, processes and Python. Under mesh (2, 2) the
# checks program trains 10 steps and saves a checkpoint of the given type (full: one file of whole
# tensors; sharded: a distributed checkpoint folder). It then resumes for 10 more steps under mesh
# (1, 4) and in one process without model_parallel (the sharded folder after `lightning-run model
# consolidate`), each run matching the unsplit model trained all 20 steps within 1e-5: the
# parameters and the momentum buffers were re-split right. Python's torch reads the file (and
# torch.distributed.checkpoint the folder) and finds every tensor whole and equal to the
# consolidated one's. A checkpoint of another vocabulary size is refused with a clear error.
# With "fsdp" the data dimension is fully sharded (each tensor-parallel slice sharded again over the
# data group): the checkpoint saved under (2, 2) also resumes under (4, 1) and, with ddp on the data
# dimension, under (2, 2), all through the one sharded-checkpoint engine.
# With "context", checkpoints of context-parallel jobs move between (shard 2, context 2),
# (context 2, tensor 2) and (shard 4) (sharded folders).
#   model_parallel_checkpoints.sh full|sharded LIGHTNING_RUN CHECKS_BINARY [ddp|fsdp|context]   (LF_PYTHON: torch's python)
set -euo pipefail
type="$1" run="$2" checks="$3" data_parallel="${4:-ddp}" python="${LF_PYTHON:-python3}"
dp=()
[ "$data_parallel" = fsdp ] && dp=(--fsdp FULL_SHARD)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
if [ "$data_parallel" = context ]; then
  # Context parallelism: (shard 2, context 2) saves at step 10; (context 2, tensor 2) under ddp
  # resumes it and saves at 15; (shard 4) without context resumes that to step 20. Each run
  # matches the unsplit model trained every step within 1e-5.
  launch() { "$run" model --accelerator cpu --devices 4 --process-group-backend gloo "$checks" "$@"; }
  expect_resumed() {  # LOG STEP
    [ "$(grep -c "from step $2, largest difference" "$1")" = 4 ] || fail "not every rank resumed at step $2: $(cat "$1")"
  }
  launch --fsdp FULL_SHARD --tensor 1 --context 2 --steps 10 --save "$work/at10" || fail "(shard 2, context 2) failed"
  launch --tensor 2 --context 2 --steps 5 --resume "$work/at10" --save "$work/at15" | tee "$work/15.log" ||
    fail "(context 2, tensor 2) did not resume (shard 2, context 2)'s checkpoint"
  expect_resumed "$work/15.log" 10
  launch --fsdp FULL_SHARD --tensor 1 --steps 5 --resume "$work/at15" | tee "$work/20.log" ||
    fail "(shard 4) did not resume (context 2, tensor 2)'s checkpoint"
  expect_resumed "$work/20.log" 15
  echo "context parallel checkpoints passed"
  exit 0
fi
saved="$work/saved.ckpt"
[ "$type" = sharded ] && saved="$work/saved"

"$run" model --accelerator cpu --devices 4 --process-group-backend gloo "$checks" --tensor 2 --steps 10 "${dp[@]}" \
  --save "$saved" --save-type "$type" || fail "training under (2, 2) and saving failed"
if [ "$type" = sharded ]; then
  [ -f "$saved/.metadata" ] && [ -f "$saved/meta.pt" ] || fail "the folder lacks .metadata or meta.pt: $(ls -a "$saved")"
  "$run" model consolidate "$saved" --output-file "$work/whole.ckpt" || fail "consolidate failed"
else
  [ -f "$saved" ] || fail "no checkpoint file at $saved"
  cp "$saved" "$work/whole.ckpt"
fi

resume_under() {  # NAME TENSOR_SIZE [FLAGS...]
  local name="$1" tensor="$2"
  shift 2
  "$run" model --accelerator cpu --devices 4 --process-group-backend gloo "$checks" --tensor "$tensor" --steps 10 \
    --resume "$saved" "$@" | tee "$work/$name.log" || fail "resuming under $name failed"
  [ "$(grep -c 'from step 10, largest difference' "$work/$name.log")" = 4 ] || fail "not every $name rank resumed at step 10"
}
resume_under "mesh (1, 4)" 4 "${dp[@]}"
if [ "$data_parallel" = fsdp ]; then
  resume_under "mesh (4, 1)" 1 "${dp[@]}"
  resume_under "mesh (2, 2) with ddp" 2
fi
"$checks" --plain --steps 10 --resume "$work/whole.ckpt" | tee "$work/one.log" || fail "resuming in one process failed"
grep -q "from step 10" "$work/one.log" || fail "the one-process run did not resume at step 10"

# A checkpoint of another model is refused with the entry, both shapes and the tensor size.
"$run" model --accelerator cpu --devices 4 --process-group-backend gloo "$checks" --tensor 4 --vocab 64 "${dp[@]}" \
  --resume "$saved" | tee "$work/other.log" || fail "loading into another model crashed"
grep -q "load refused: .*'model/tokens.weight' has shape \[32, 16\] in the checkpoint, but this model's tensor is \[64, 16\] whole (this rank holds \[[0-9]*\(, 16\)\?\] of it)" "$work/other.log" \
  || fail "loading a checkpoint of another model did not name the entry and both shapes"

# Python: torch.load reads the whole file; the sharded folder through torch.distributed.checkpoint.
"$python" - "$type" "$saved" "$work/whole.ckpt" <<'PY' || fail "Python could not read the checkpoint"
import sys, torch
kind, saved, whole_path = sys.argv[1:]
whole = torch.load(whole_path, map_location="cpu", weights_only=True)
model = whole["model"]
assert model["block0.fc1.weight"].shape == (64, 16), model["block0.fc1.weight"].shape
assert model["block0.projection.weight"].shape == (16, 16), model["block0.projection.weight"].shape
assert model["tokens.weight"].shape == (32, 16) and model["head.weight"].shape == (32, 16)
assert int(whole["step"]) == 10, whole["step"]
if kind == "sharded":
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(saved, whole_path + ".python")
    python = torch.load(whole_path + ".python", map_location="cpu", weights_only=False)
    for name, tensor in model.items():
        assert torch.equal(python["model"][name], tensor), name
    state = python["optimizer"]["state"]
    assert sorted(state) == sorted(model), sorted(state)
    for name in model:
        assert torch.equal(state[name]["momentum_buffer"], whole["optimizer"]["state"][name]["momentum_buffer"]), name
print("python read", len(model), "whole tensors")
PY
echo "model parallel $type checkpoints passed ($data_parallel on the data dimension)"
