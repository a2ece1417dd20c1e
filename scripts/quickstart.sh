#!/usr/bin/env bash
# Quickstart on a fresh Debian 12 machine: installs only what building and running needs
# (scripts/install-deps.sh --build), builds only lightning-run and the image classifier, and trains
# the Fashion-MNIST classifier for one epoch on 2 CPU worker processes through lightning-run (DDP
# over the shared-memory backend). Rank 0 prints one JSON line per epoch. Extra arguments go to
# the example (e.g. --epochs 3, --max-steps 100); WORKERS=1 trains in one process.
# scripts/test.sh later adds the test dependencies and builds everything in the same build folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

"$root/scripts/install-deps.sh" --build
TARGETS="lightning-run image_classifier" "$root/scripts/build.sh" -DLF_BUILD_TESTS=OFF -DLF_BUILD_BENCHMARKS=OFF
workers="${WORKERS:-2}"
echo "quickstart: training the Fashion-MNIST classifier for one epoch on $workers CPU worker(s)"
"$build_dir/bin/lightning-run" model --accelerator cpu --devices "$workers" \
  "$build_dir/bin/image_classifier" --epochs 1 "$@"
