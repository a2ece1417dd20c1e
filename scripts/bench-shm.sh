#!/usr/bin/env bash
# The shm backend against gloo (docs/benchmarks.md, "shm backend"):
#   P5  all-reduce bandwidth and latency, shm against gloo, 2 ranks and 4 ranks (bench_shm);
#   P3  the 2-rank DDP step on shm and on gloo (bench_ddp_step under lightning-run) against
#       Python torch DDP under torchrun (gloo, the only CPU choice there), big and tiny MLP;
#   the FSDP FULL_SHARD step (big MLP, 2 ranks) on shm and on gloo.
# The implementations alternate REPEATS times; every JSON line is printed, tagged with the run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
tag() { sed -n "s/^\(\[rank 0\]: \)\{0,1\}\({.*}\)$/{\"run\":\"$1\",\"result\":\2}/p"; }
for ranks in 2 4; do
  "$bin/lightning-run" model --accelerator cpu --devices "$ranks" "$bin/bench_shm" 9 2>/dev/null | tag "P5 $ranks ranks"
done
for _ in $(seq "$repeats"); do
  for config in "784-1024-1024-10 64" "32-64-10 16"; do
    set -- $config
    for backend in shm gloo; do
      "$bin/lightning-run" model --accelerator cpu --devices 2 --process-group-backend "$backend" \
        "$bin/bench_ddp_step" "$1" "$2" 300 30 2>/dev/null | tag "P3 ddp $backend"
    done
    "$torchrun" --nproc-per-node 2 --monitor-interval 0.1 --master-addr 127.0.0.1 --master-port "$(free_port)" \
      "$root/scripts/bench_ddp_python.py" --ddp "$1" "$2" 300 30 2>/dev/null | tag "P3 python ddp"
  done
  for backend in shm gloo; do
    "$bin/lightning-run" model --accelerator cpu --devices 2 --strategy fsdp --process-group-backend "$backend" \
      "$bin/bench_ddp_step" 784-1024-1024-10 64 100 10 2>/dev/null | tag "fsdp FULL_SHARD $backend"
  done
done
