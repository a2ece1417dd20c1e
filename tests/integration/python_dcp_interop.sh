#!/usr/bin/env bash
# Sharded checkpoints cross between C++ fsdp and Python's torch.distributed.checkpoint (FSDP2 on
# gloo, Lightning Fabric's layout: DCP folder + meta.pt), in both directions and across world
# sizes: Python saves on 2 ranks, C++ continues on 1, 2 and 4; Python saves on 1, C++ continues on
# 2; Python saves on 4 (its trailing ranks hold empty chunks), C++ continues on 3; C++ saves on 2 (FULL_SHARD) and on 3
# (SHARD_GRAD_OP: shards that split rows, empty trailing shards), Python continues on 2. The next
# two steps' losses match the saving run's within 1e-6. The same both ways through Python Lightning
# Fabric's own FSDPStrategy.save_checkpoint / load_checkpoint (FSDP1). `lightning-run model
# consolidate` merges both folders into files equal to Python's dcp_to_torch_save (+ meta.pt).
# Usage: python_dcp_interop.sh LIGHTNING_RUN FSDP_CHECKS BACKEND   (LF_PYTHON: a Python with torch)
set -euo pipefail
run="$1"; checks="$2"; backend="$3"
python="${LF_PYTHON:-python3}"
peer="$(dirname "${BASH_SOURCE[0]}")/python_dcp_peer.py"
"$python" -c "import torch.distributed.checkpoint" 2>/dev/null || { echo "FAIL: $python has no torch (scripts/install-deps.sh)"; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/python" "$dir/python1" "$dir/python4" "$dir/lightning" "$dir/cpp" "$dir/cpp3"
torchrun() { local ranks=$1; shift; OMP_NUM_THREADS=1 timeout 180 "$python" -m torch.distributed.run --standalone --nproc-per-node "$ranks" "$@" 2>&1 | grep -v "^W[0-9]"; }
cpp() { local ranks=$1; shift; "$run" model --accelerator cpu --devices "$ranks" --process-group-backend "$backend" "$checks" "$@"; }

echo "== Python saves on 2 ranks, C++ continues on 1, 2 and 4"
torchrun 2 "$peer" write "$dir/python"
for ranks in 1 2 4; do cpp "$ranks" interop_continue "$dir/python/ck" "$dir/python/python-next.txt"; done
echo "== Python saves on 1 rank, C++ continues on 2"
torchrun 1 "$peer" write "$dir/python1"
cpp 2 interop_continue "$dir/python1/ck" "$dir/python1/python-next.txt"
echo "== Python saves on 4 ranks, C++ continues on 3"
torchrun 4 "$peer" write "$dir/python4"
cpp 3 interop_continue "$dir/python4/ck" "$dir/python4/python-next.txt"
echo "== C++ saves on 2 ranks, Python continues on 2"
cpp 2 interop_save "$dir/cpp" FULL_SHARD
ls -a "$dir/cpp/ck"
[ -f "$dir/cpp/ck/.metadata" ] && [ -f "$dir/cpp/ck/__0_0.distcp" ] && [ -f "$dir/cpp/ck/__1_0.distcp" ] &&
  [ -f "$dir/cpp/ck/meta.pt" ] || { echo "FAIL: the C++ folder lacks a file of DCP's layout"; exit 1; }
torchrun 2 "$peer" continue "$dir/cpp/ck" "$dir/cpp/cpp-next.txt"
echo "== C++ saves on 3 ranks under SHARD_GRAD_OP, Python continues on 2"
cpp 3 interop_save "$dir/cpp3" SHARD_GRAD_OP
torchrun 2 "$peer" continue "$dir/cpp3/ck" "$dir/cpp3/cpp-next.txt"
echo "== Lightning's FSDPStrategy saves on 2 ranks, C++ continues on 1 and 3; it continues C++'s on 2"
torchrun 2 "$peer" lightning-write "$dir/lightning" | grep -v "Warning\|tensor_numel\|tensor = tensor"
for ranks in 1 3; do cpp "$ranks" interop_continue "$dir/lightning/ck" "$dir/lightning/python-next.txt"; done
torchrun 2 "$peer" lightning-continue "$dir/cpp/ck" "$dir/cpp/cpp-next.txt" | grep -v "Warning\|tensor_numel\|tensor = tensor"
echo "== consolidate every folder; Python reads them with weights_only=True"
for side in python python1 python4 lightning cpp cpp3; do
  "$run" model consolidate "$dir/$side/ck"
  "$python" - "$dir/$side/ck" <<'PY'
import sys, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
folder = sys.argv[1]
dcp_to_torch_save(folder, folder + ".reference")
expected = torch.load(folder + ".reference", weights_only=False)
expected.update(torch.load(folder + "/meta.pt"))
merged = torch.load(folder + ".consolidated", weights_only=True)
def same(a, b, path):
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for key in a:
            same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, (path, a, b)
same(merged, expected, "")
print("consolidated", folder, "equals dcp_to_torch_save + meta.pt:", sorted(merged))
PY
done
echo "dcp interop checks passed"
