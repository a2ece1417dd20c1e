#!/usr/bin/env bash
# P3: CPU DDP step time, Fabric C++ (lightning-run) against Python torch DDP and Python Lightning
# Fabric (both under torchrun, from the project's environment: torch 2.11, lightning), same model,
# batch per rank, one thread per rank, SGD, synthetic data; 2 ranks and 1 rank. Runs the three
# implementations alternately REPEATS times and prints every JSON line.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
backend="${BACKEND:-gloo}"  # the C++ side's transport: gloo as Python's, or shm (scripts/bench-shm.sh)
for config in "784-1024-1024-10 64" "32-64-10 16"; do
  set -- $config
  for _ in $(seq "$repeats"); do
    for ranks in 1 2; do
      "$bin/lightning-run" model --accelerator cpu --devices "$ranks" --process-group-backend "$backend" "$bin/bench_ddp_step" "$1" "$2" 300 30 2>/dev/null \
        | sed 's/^\[rank 0\]: //'
      for impl in --ddp --fabric; do
        "$torchrun" --nproc-per-node "$ranks" --monitor-interval 0.1 --master-addr 127.0.0.1 --master-port "$(free_port)" \
          "$root/scripts/bench_ddp_python.py" "$impl" "$1" "$2" 300 30 2>/dev/null | grep '^{'
      done
    done
  done
done
