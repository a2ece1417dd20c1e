#!/usr/bin/env bash
# The project's test command (README): installs whatever is missing, builds, runs every CTest
# test with output on failure. Extra arguments go to ctest (e.g. -R connector, -L gpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

"$root/scripts/install-deps.sh"
# The CUDA code paths are compiled and linked on every run (LF_WITH_CUDA=OFF for a CPU LibTorch).
"$root/scripts/build.sh" -DLF_WITH_CUDA="${LF_WITH_CUDA:-ON}" -DLF_BUILD_TESTS=ON -DLF_BUILD_BENCHMARKS=ON -DLF_BUILD_EXAMPLES=ON
cd "$build_dir"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
