#!/usr/bin/env bash
# Pipeline checkpoints through the sharded-checkpoint engine: a 4-stage 1F1B job (AdamW, so step
# counts are in the optimizer state) saves a folder after 10 steps; jobs of other shapes resume it
# (2 pipe x 2 data under GPipe, 2 ranks x 2 stages each under Interleaved1F1B) and train 10 more
# steps equal to the unbroken 20 in one process (lf_pipeline_checks compares every step); the
# same across fsdp and tensor-parallel shapes; then `lightning-run model consolidate` makes one file, which
# one process resumes the same way, under the pipeline strategy and without it (a plain LibTorch
# AdamW over every parameter); Python's torch.load(weights_only=True) reads that file, its
# optimizer groups listing every stage's parameters in the model's order, exactly the state's.
# Usage: pipeline_checkpoints.sh LIGHTNING_RUN PIPELINE_CHECKS   (LF_PYTHON: torch's python; without
# torch the test skips after the rest passed, exit 77, and fails under CI=true)
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
one_process() {  # one_process WHAT FLAGS...: lf_pipeline_checks without lightning-run, which must exit 0
  local what="$1"; shift
  local output
  if output="$("$checks" "$@" 2>&1)"; then
    echo "ok: one process, $what, resumed the consolidated file"
  else
    echo "FAIL: one process, $what, on the consolidated file:"; echo "$output" | tail -n 15; failed=1
  fi
}
consolidated=0
if "$run" model consolidate "$dir/ck" --output-file "$dir/one.pt" >/dev/null; then
  consolidated=1
  one_process "the pipeline strategy" --adam --steps 10 --resume "$dir/one.pt"
  # No pipeline strategy: a plain LibTorch AdamW over every parameter takes the optimizer state.
  one_process "single_device" --single-device --adam --steps 10 --resume "$dir/one.pt"
else
  echo "FAIL: consolidate"; failed=1
fi
[ "$consolidated" = 1 ] || exit 1
python="${LF_PYTHON:-python3}"
if ! "$python" -c "import torch" 2>/dev/null; then
  [ "$failed" = 0 ] || exit 1
  source "$(dirname "${BASH_SOURCE[0]}")/../missing.sh"
  missing "$python has no torch, so Python did not check the consolidated file (scripts/install-deps.sh installs it into .venv)"
fi
# Python: torch.load(weights_only=True) reads the file; each optimizer group lists every stage's
# parameters, in the model's order, covering exactly the state's keys; a Python AdamW over the
# model's parameters in that order loads it.
if ! output="$("$python" - "$dir/one.pt" 2>&1 <<'PY'
import sys, torch
checkpoint = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
model, optimizer = checkpoint["model"], checkpoint["optimizer"]
state = optimizer["state"]
listed = [name for group in optimizer["param_groups"] for name in group["params"]]
# The model's order: its layers' ("0.", "1.", ...), within a layer the order the file lists.
order = sorted(model, key=lambda name: int(name.split(".")[0]))
problems = []
if len(set(listed)) != len(listed):
    problems.append(f"the groups list a parameter twice: {listed}")
if set(listed) != set(state):
    problems.append(f"the groups' params {sorted(listed)} are not the state's keys {sorted(state)}")
if listed != order:
    problems.append(f"the groups list {listed}, expected every stage's parameters in the model's order {order}")
if not problems:
    parameters = [torch.nn.Parameter(torch.zeros_like(model[name])) for name in order]
    adamw = torch.optim.AdamW(parameters, lr=0.01, eps=1e-3)
    adamw.load_state_dict(optimizer)
    for name, parameter in zip(order, parameters):
        if not torch.equal(adamw.state[parameter]["exp_avg"], state[name]["exp_avg"]):
            problems.append(f"Python's AdamW took another parameter's exp_avg for {name}")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"python read the consolidated file: {len(listed)} parameters of {len({n.split('.')[0] for n in listed})} layers in its groups")
PY
)"; then
  echo "FAIL: Python's check of the consolidated file:"; echo "$output" | tail -n 15; failed=1
else
  echo "ok: $output"
fi
exit $failed
