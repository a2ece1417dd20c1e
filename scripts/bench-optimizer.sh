#!/usr/bin/env bash
# The optimizer-step baseline (issue #25): one AdamW step over examples/gpt's parameter shapes on
# the CPU, one thread. Alternates, REPEATS times: the C++ driver (LibTorch's AdamW::step and
# ATen's fused kernel, build/bin/bench_optimizer_step) and Python's torch.optim.AdamW with
# fused=True, foreach=True and foreach=False (scripts/bench_optimizer_python.py), from the same
# PyTorch 2.11. Prints every JSON line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
python="${LF_PYTHON:-$root/.venv/bin/python}"
export OMP_NUM_THREADS=1
for _ in $(seq "${REPEATS:-3}"); do
  "$bin/bench_optimizer_step" --steps 5 --warmup 2
  "$python" "$root/scripts/bench_optimizer_python.py" --steps 5 --warmup 2
done
