#!/usr/bin/env bash
# lf::SpikeDetection against Python Lightning Fabric's SpikeDetection (LF_PYTHON's lightning and
# torchmetrics) on the same loss sequences: the batch each case throws at and the running mean
# must agree. Then 2 ranks under lightning-run, where one rank's spike stops both, or, with
# rollback on, sends both back to the last checkpoint while the job goes on.
# Usage: spike_detection.sh LIGHTNING_RUN SPIKE_CHECKS
set -euo pipefail
run="$1"; program="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$program" cases "$dir" >"$dir/ours.txt"
"${LF_PYTHON:-python3}" - "$dir" >"$dir/python.txt" <<'PY'
import math, os, sys
import torch
from lightning.fabric.utilities.spike import SpikeDetection, TrainingSpikeException
nan = float("nan")
class Strategy:
    root_device = torch.device("cpu")
    def barrier(self): pass
    def reduce_boolean_decision(self, decision, all=True): return decision
class Fabric:
    strategy = Strategy()
    global_rank = 0
CASES = [  # kept in step with cases() in spike_checks.cpp
    ({}, [1, 1, 1, 5]),
    ({}, [5, 4, 3, 2, 1]),
    ({}, [1, nan]),
    ({"finite_only": False}, [1, nan, 1, 5]),
    ({"mode": "max", "rtol": 0.5}, [1, 2, 3, 1]),
    ({"rtol": None, "atol": 0.5}, [1, 1, 1.4, 1.8]),
    ({"window": 2}, [5, 1, 1, 3.5]),
    ({}, [5, 1, 1, 3.5]),
    ({"warmup": 3}, [1, 10, 1, 1]),
    ({"warmup": 2}, [1, nan, 1, 10]),
]
for index, (options, losses) in enumerate(CASES):
    detector = SpikeDetection(exclude_batches_path=os.path.join(sys.argv[1], "py%d.json" % index), **options)
    found = "none"
    for batch, loss in enumerate(losses):
        try:
            detector.on_train_batch_end(Fabric(), torch.tensor(loss, dtype=torch.float64), None, batch)
        except TrainingSpikeException:
            found = str(batch)
            break
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean = float(detector.running_mean.compute())
    print("case %d: spike %s mean %.6f" % (index, found, 0.0 if math.isnan(mean) else mean))
PY
if ! diff "$dir/python.txt" "$dir/ours.txt"; then
  echo "FAIL: the spike decisions differ from Python's (< Python, > ours)"; exit 1
fi
echo "the same decisions as Python's SpikeDetection in $(wc -l <"$dir/ours.txt") cases"
mkdir -p "$dir/ranks"
"$run" model --accelerator cpu --devices 2 "$program" ranks "$dir/ranks"
# Rollback instead of the exception: the job ends normally and rank 0 says where it went back to.
mkdir -p "$dir/rollback"
"$run" model --accelerator cpu --devices 2 "$program" rollback "$dir/rollback" 2>&1 | tee "$dir/rollback.out"
grep -q "SpikeDetection: training spike detected in batch 5 (loss 1.5 on rank 0: a spike on another rank, running mean" "$dir/rollback.out" ||
  { echo "FAIL: rank 0's rollback warning does not name the spike"; exit 1; }
grep -q "Rolled back to $dir/rollback/rollback.ckpt" "$dir/rollback.out" || { echo "FAIL: the rollback warning does not name the checkpoint"; exit 1; }
echo "spike detection checks passed"
