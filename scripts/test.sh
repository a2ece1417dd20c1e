#!/usr/bin/env bash
# The project's test command (README): installs whatever is missing, builds, runs every CTest
# test with output on failure. Extra arguments go to ctest (e.g. -R connector, -L gpu).
# Prints each phase's time as it ends, and one line naming the skipped tests and why.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
source "$root/scripts/phase-times.sh"

phase_start
"$root/scripts/install-deps.sh"
phase_end "test.sh install"
# The CUDA code paths are compiled and linked on every run (LF_WITH_CUDA=OFF for a CPU LibTorch).
"$root/scripts/build.sh" -DLF_WITH_CUDA="${LF_WITH_CUDA:-ON}" -DLF_BUILD_TESTS=ON -DLF_BUILD_BENCHMARKS=ON -DLF_BUILD_EXAMPLES=ON
phase_end "test.sh build"
cd "$build_dir"
run_ctest "test.sh ctest" --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
