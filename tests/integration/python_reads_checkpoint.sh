#!/usr/bin/env bash
# Python's torch.load (the project environment's torch, LF_PYTHON) reads a checkpoint written by fabric.save as plain
# dicts, lists, numbers, strings and tensors. Usage: python_reads_checkpoint.sh CHECKPOINT_TOOL
set -euo pipefail
tool="$1"
python="${LF_PYTHON:-python3}"
source "$(dirname "${BASH_SOURCE[0]}")/../missing.sh"
"$python" -c "import torch" 2>/dev/null || missing "$python has no torch (scripts/install-deps.sh installs it into .venv)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
expected="$("$tool" write "$dir/demo.ckpt" | sed -n 's/weight_sum //p')"
"$python" - "$dir/demo.ckpt" "$expected" <<'PY'
import sys, torch
checkpoint = torch.load(sys.argv[1])
assert isinstance(checkpoint, dict), type(checkpoint)
assert checkpoint["step"] == 7 and checkpoint["name"] == "demo" and checkpoint["loss"] == 0.5, checkpoint
assert checkpoint["nested"] == {"epoch": 2}, checkpoint["nested"]
model = checkpoint["model"]
assert set(model) == {"weight", "bias"}, model.keys()
assert abs(model["weight"].sum().item() - float(sys.argv[2])) < 1e-5
# The optimizer state has PyTorch's layout: Python's Adam accepts it.
net = torch.nn.Linear(3, 2)
net.load_state_dict(model)
adam = torch.optim.Adam(net.parameters(), lr=0.5)
adam.load_state_dict(checkpoint["optimizer"])
assert adam.param_groups[0]["lr"] == 0.01, adam.param_groups[0]
assert int(adam.state[net.weight]["step"]) == 1
print("python read the checkpoint:", sorted(checkpoint))
PY
