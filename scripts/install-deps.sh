#!/usr/bin/env bash
# Installs every Debian package the build, tests, examples and benchmarks need.
# Idempotent: packages already present are skipped, apt-get runs only when something is missing.
set -euo pipefail

packages=(
  cmake ninja-build clang g++ ccache
  libtorch-dev libgloo-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  catch2
  libopenblas0-pthread zlib1g-dev
  dataset-fashion-mnist
  procps iproute2
  python3-torch   # tests: Python's torch.load reads our checkpoint files
  protobuf-compiler  # tests: protoc --decode_raw reads our TensorBoard event files
  libstb-dev      # examples/dcgan writes PNG grids with stb_image_write
  gnuplot-nox     # scripts/plot_metrics.sh
)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
