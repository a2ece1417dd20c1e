#!/usr/bin/env bash
# Configures and builds the project (Release) into build/. Prefers clang++ (with the precompiled
# LibTorch header it compiles ~2.5x faster here); CXX=g++ scripts/build.sh uses g++.
# Extra arguments go to cmake's configure step, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch.
# TARGETS="a b" builds only those targets (and what they need); the default builds everything.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
jobs="${JOBS:-$(nproc)}"

if [ -z "${CXX:-}" ] && command -v clang++ >/dev/null 2>&1; then
  export CXX=clang++
fi
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build_dir/Makefile" ]; then
  generator=(-G Ninja)
fi

cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
target_args=()
for target in ${TARGETS:-}; do target_args+=(--target "$target"); done
cmake --build "$build_dir" -j "$jobs" "${target_args[@]}"
