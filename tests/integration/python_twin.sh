#!/usr/bin/env bash
# The model_parallel job against Python's own composition (python_twin.py): the checks program
# writes its initial weights, then trains 20 steps on 4 ranks under fsdp x tensor (mesh shard 2 x
# tensor 2) and under HSDP (replicate 2 x shard 2, no tensor parallelism), writing each step's
# global mean loss and its final whole parameters. torch.distributed's fully_shard +
# parallelize_module on mesh ("dp" 2, "tp" 2), and fully_shard on mesh ("replicate" 2, "shard" 2),
# start from those weights in one 4-rank Python launch and must match every loss and every
# parameter within 1e-5 (and the one-process Python model, which checks the composition itself).
#   python_twin.sh LIGHTNING_RUN CHECKS_BINARY   (LF_PYTHON: torch's python)
set -euo pipefail
run="$1" checks="$2" python="${LF_PYTHON:-python3}"
twin="$(dirname "${BASH_SOURCE[0]}")/python_twin.py"
source "$(dirname "${BASH_SOURCE[0]}")/../missing.sh"
"$python" -c "import torch.distributed.tensor.parallel, torch.distributed.fsdp" 2>/dev/null ||
  missing "$python has no torch with torch.distributed (scripts/install-deps.sh installs it into .venv)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$checks" --plain --steps 0 --save "$work/init.ckpt" --save-type full || fail "writing the initial weights failed"
[ -f "$work/init.ckpt" ] || fail "no initial weights at $work/init.ckpt"
cpp() {  # NAME FLAGS...: 20 steps on 4 ranks, the losses and the final whole parameters under NAME
  local name="$1"
  shift
  "$run" model --accelerator cpu --devices 4 --process-group-backend gloo "$checks" "$@" --steps 20 \
    --losses "$work/$name.losses" --save "$work/$name.ckpt" --save-type full || fail "the C++ job $name failed"
  [ -s "$work/$name.losses" ] && [ -f "$work/$name.ckpt" ] || fail "the C++ job $name wrote no losses or checkpoint"
}
cpp fsdp_tp --tensor 2 --fsdp FULL_SHARD
cpp hsdp --tensor 1 --fsdp HYBRID_SHARD --shard 2

# torchrun --standalone takes a free port, so parallel tests do not collide.
OMP_NUM_THREADS=1 timeout 240 "$python" -m torch.distributed.run --standalone --nproc-per-node 4 "$twin" \
  --init "$work/init.ckpt" --cpp fsdp_tp "$work/fsdp_tp.losses" "$work/fsdp_tp.ckpt" \
  --cpp hsdp "$work/hsdp.losses" "$work/hsdp.ckpt" || fail "the Python twin differs from the C++ job (above)"
echo "python twin passed"
