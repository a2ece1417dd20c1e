#!/usr/bin/env bash
# Checkpoints cross between C++ fabric.save/load and Python Lightning Fabric's fabric.save/load
# (model, Adam, step), and training continues identically on the other side; also from optimizer
# state that C++ wrote after steps through the fused Adam kernel.
# Usage: python_fabric_interop.sh CHECKPOINT_TOOL   (LF_PYTHON: a Python with torch and lightning)
set -euo pipefail
tool="$1"
python="${LF_PYTHON:-python3}"
script="$(dirname "${BASH_SOURCE[0]}")/python_fabric_interop.py"
"$python" -c "import lightning" 2>/dev/null || { echo "FAIL: $python has no lightning (scripts/install-deps.sh)"; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
echo "== C++ writes, Python Fabric continues"
"$tool" interop-save "$dir/cpp.ckpt" "$dir/cpp-after.ckpt"
"$python" "$script" continue "$dir/cpp.ckpt" "$dir/cpp-after.ckpt"
echo "== C++ writes after fused Adam steps, Python Fabric continues"
"$tool" interop-save-fused "$dir/fused.ckpt" "$dir/fused-after.ckpt"
"$python" "$script" continue "$dir/fused.ckpt" "$dir/fused-after.ckpt"
echo "== Python Fabric writes, C++ continues"
"$python" "$script" write "$dir/python.ckpt" "$dir/python-after.ckpt"
"$tool" interop-load "$dir/python.ckpt" "$dir/python-after.ckpt"
echo "interop checks passed"
