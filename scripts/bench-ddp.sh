#!/usr/bin/env bash
# P3: 2-rank CPU DDP step time, Fabric C++ (lightning-run) against Python torch DDP (torchrun),
# same model, batch per rank, one thread per rank, SGD, synthetic data; also 1 rank. Runs the
# two implementations alternately REPEATS times and prints every JSON line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-3}"
export OMP_NUM_THREADS=1
free_port() { /usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
for config in "784-1024-1024-10 64" "32-64-10 16"; do
  set -- $config
  for _ in $(seq "$repeats"); do
    for ranks in 1 2; do
      "$bin/lightning-run" model --accelerator cpu --devices "$ranks" "$bin/bench_ddp_step" "$1" "$2" 300 30 2>/dev/null \
        | sed 's/^\[rank 0\]: //'
      /usr/bin/python3 "$root/scripts/torchrun_fixed.py" --nproc_per_node "$ranks" --monitor_interval 0.1 \
        --master_addr 127.0.0.1 --master_port "$(free_port)" "$root/scripts/bench_ddp_python.py" "$1" "$2" 300 30 2>/dev/null
    done
  done
done
