#!/usr/bin/env bash
# The GPU check (issue #8), run on the borrowed GPU machine through the device tool:
#   (here, once)  scripts/vendor-headers.sh          # third_party/: header-only deps, git-ignored
#   (device)      run(command="bash scripts/device-check.sh", carry=["third_party"], timeout_s=580)
# It configures the project against the machine's Python PyTorch LibTorch (with CUDA), builds the
# library, the launcher and the GPU tests, runs the `gpu`-labelled tests, NCCL with world size 1
# under lightning-run, the GPU step-time benchmark per precision, and P8 (examples/gpt against
# scripts/p8_python_fabric.py under Python Lightning Fabric), within 10 minutes.
# Logs and results.md go to $OUT (when set), else build-device/out.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/build-device/out}"
build="$root/build-device"
mkdir -p "$out"
results="$out/results.md"
say() { echo "$*" | tee -a "$results"; }
deadline=$((SECONDS + ${DEVICE_CHECK_BUDGET_S:-560}))
left() { echo $((deadline - SECONDS)); }

say "# device-check $(date -u +%Y-%m-%dT%H:%MZ)"
say "- machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
python="$(command -v python3 || true)"
[ -n "$python" ] || { say "- FAIL: no python3, so no PyTorch LibTorch to build against"; exit 1; }
prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
say "- torch: $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch.compiled_with_cxx11_abi())' 2>&1)"
say "- lightning: $("$python" -c 'import lightning; print(lightning.__version__)' 2>&1 | tail -n 1)"
[ -d "$root/third_party/include" ] || { say "- FAIL: third_party/ missing: run scripts/vendor-headers.sh here and carry it"; exit 1; }

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
compiler="${CXX:-$(command -v g++ || command -v clang++)}"
timeout "$(left)" cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DLF_THIRD_PARTY_DIR="$root/third_party" -DLF_WITH_CUDA=ON \
  -DLF_BUILD_EXAMPLES=OFF -DCMAKE_CXX_COMPILER="$compiler" >"$out/configure.log" 2>&1
status=$?
say "- configure: exit $status (configure.log)"
[ "$status" -eq 0 ] || { tail -n 30 "$out/configure.log" | tee -a "$results"; exit 1; }

targets=(lightning_fabric lightning-run lf_gpu_tests bench_step_time gpt)
timeout "$(left)" cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1
status=$?
say "- build: exit $status (build.log)"
if [ "$status" -ne 0 ]; then
  grep -m 40 -E "error|Error" "$out/build.log" | tee -a "$results"
  exit 1
fi

bin="$build/bin"
run_step() {  # run_step NAME COMMAND...: runs with the time left, records exit status
  local name="$1"; shift
  timeout "$(left)" "$@" >"$out/$name.log" 2>&1
  local status=$?
  say "- $name: exit $status ($name.log)"
  return $status
}
run_step gpu-tests "$bin/lf_gpu_tests" --reporter compact
run_step nccl-world-1 "$bin/lightning-run" model --accelerator cuda --devices 1 --strategy ddp "$bin/lf_gpu_tests" "[nccl]"
for precision in 32-true bf16-mixed 16-mixed; do
  run_step "step-time-$precision" "$bin/bench_step_time" --steps 200 --warmup 20 --batch-size 256 \
    --precision "$precision" --accelerator cuda
  grep -h '"benchmark"' "$out/step-time-$precision.log" | tee -a "$results"
done
# P8: the same GPT-style model and batch, bf16-mixed, ours and Python Lightning Fabric's, alternated.
for round in 1 2; do
  run_step "p8-cpp-$round" "$bin/gpt" --accelerator cuda --precision bf16-mixed
  grep -h '"P8' "$out/p8-cpp-$round.log" | tee -a "$results"
  run_step "p8-python-$round" "$python" "$root/scripts/p8_python_fabric.py" --accelerator cuda --precision bf16-mixed
  grep -h '"P8' "$out/p8-python-$round.log" | tee -a "$results"
done
say "- not run here yet: two ranks sharing the GPU over gloo (needs a --devices mapping of 2 ranks to one GPU)"
