#!/usr/bin/env bash
# Quickstart on a fresh Debian 12 machine: installs the dependencies, builds, and trains the
# Fashion-MNIST image classifier for one epoch on 2 CPU worker processes through lightning-run
# (DDP over gloo). Rank 0 prints one JSON line per epoch. Extra arguments go to the example
# (e.g. --epochs 3, --max-steps 100); WORKERS=1 trains in one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
workers="${WORKERS:-2}"
echo "quickstart: training the Fashion-MNIST classifier for one epoch on $workers CPU worker(s)"
"$build_dir/bin/lightning-run" model --accelerator cpu --devices "$workers" \
  "$build_dir/bin/image_classifier" --epochs 1 "$@"
