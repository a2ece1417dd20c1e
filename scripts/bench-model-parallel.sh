#!/usr/bin/env bash
# Tensor parallelism on this CPU (docs/benchmarks.md, "Tensor parallelism"): the examples'
# tensor-parallel GPT (build/bin/tensor_parallel_gpt) under the model_parallel strategy.
#   memory: parameter and AdamW bytes on rank 0 with tensor size 2 and 4, next to the formula's
#   step time: meshes (1, 2) and (2, 1) against ddp on 2 ranks, at the same global batch, the
#              three run in turn REPEATS times (default 3)
#   2-d:       on 4 ranks, fsdp x tp on mesh (2, 2) against ddp x tp on (2, 2) and fsdp alone, in
#              turn REPEATS times; then fsdp x tp's bytes on meshes (2, 2), (1, 4) and (4, 1)
# Prints one JSON line per run (the example's). MODEL="--d-model D ..." picks the model;
# SECTIONS="memory steps 2d" (the default) picks the parts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-3}"
read -r -a model <<<"${MODEL:---vocab 2048 --seq 128 --d-model 256 --heads 8 --layers 4 --batch-size 8}"
export OMP_NUM_THREADS=1
run() {  # devices, then the example's flags
  "$bin/lightning-run" model --accelerator cpu --devices "$1" --no-tag-output \
    "$bin/tensor_parallel_gpt" "${model[@]}" --log-every 1000 --no-progress "${@:2}" | grep '^{"example"'
}
sections="${SECTIONS:-memory steps 2d}"
if [[ " $sections " == *" memory "* ]]; then
  echo "# memory"
  run 2 --tensor-parallel-size 2 --steps 2 --warmup 0
  run 4 --tensor-parallel-size 4 --steps 2 --warmup 0
fi
if [[ " $sections " == *" steps "* ]]; then
  echo "# step time"
  for _ in $(seq "$repeats"); do
    run 2 --strategy ddp --steps 30
    run 2 --tensor-parallel-size 2 --steps 30
    run 2 --tensor-parallel-size 1 --steps 30
  done
fi
if [[ " $sections " == *" 2d "* ]]; then
  echo "# 2-d step time: fsdp x tp (2, 2), ddp x tp (2, 2), fsdp alone, 4 ranks"
  for _ in $(seq "$repeats"); do
    run 4 --tensor-parallel-size 2 --data-parallel fsdp --steps 30
    run 4 --tensor-parallel-size 2 --data-parallel ddp --steps 30
    run 4 --strategy fsdp --steps 30
  done
  echo "# 2-d memory: fsdp x tp on (2, 2), (1, 4), (4, 1)"
  for tensor in 2 4 1; do run 4 --tensor-parallel-size "$tensor" --data-parallel fsdp --steps 2 --warmup 0; done
fi
