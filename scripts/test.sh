#!/usr/bin/env bash
# The project's test command (README): installs whatever is missing, builds, runs every CTest
# test with output on failure. Extra arguments go to ctest (e.g. -R connector, -L gpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
cd "$build_dir"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
