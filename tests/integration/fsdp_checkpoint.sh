#!/usr/bin/env bash
# A sharded fsdp checkpoint saved on 2 ranks loads bitwise on 1 and on 4 ranks, and
# `lightning-run model consolidate` turns it into one file equal to the unsharded state.
# Usage: fsdp_checkpoint.sh LIGHTNING_RUN FSDP_CHECKS CHECKPOINT_TOOL
set -euo pipefail
run="$1"; checks="$2"; tool="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$run" model --accelerator cpu --devices 2 "$checks" save FULL_SHARD "$dir"
ls "$dir/ck"
for ranks in 1 4; do
  "$run" model --accelerator cpu --devices "$ranks" "$checks" load "$dir"
done
"$run" model consolidate "$dir/ck"
"$tool" same "$dir/ck.consolidated" "$dir/reference.pt" model
# Python's torch.load reads the spliced file, and every tensor equals the unsharded reference.
python="${LF_PYTHON:-python3}"
if "$python" -c "import torch" 2>/dev/null; then
  "$python" - "$dir/ck.consolidated" "$dir/reference.pt" <<'PY'
import sys, torch
merged, reference = torch.load(sys.argv[1]), torch.load(sys.argv[2])
def tensors(value, path=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from tensors(item, f"{path}/{key}")
    elif isinstance(value, torch.Tensor):
        yield path, value
found = dict(tensors(merged["model"]))
expected = dict(tensors(reference["model"]))
assert found.keys() == expected.keys(), (found.keys(), expected.keys())
for path, tensor in expected.items():
    assert torch.equal(found[path], tensor), path
print("python read the consolidated file:", len(found), "model tensors equal")
PY
else
  echo "FAIL: $python has no torch: the Python read-back was not checked (scripts/install-deps.sh)"; exit 1
fi
