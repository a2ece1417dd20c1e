#!/usr/bin/env bash
# Installs what the project needs, in two profiles:
#   scripts/install-deps.sh --build   what building the library, the launcher and the examples and
#                                     running them needs (scripts/quickstart.sh uses this);
#   scripts/install-deps.sh           that plus what the tests and benchmarks need (scripts/test.sh).
# Each installs
#   1. Debian packages (apt-get), only those missing;
#   2. the project's own Python environment .venv (git-ignored, reused by later runs) with PyTorch
#      2.11.0 from PyPI (its LibTorch is what the build links: CUDA 13.0, NCCL 2.28) and, for the
#      tests, Python Lightning and tensorboard (peers and readers).
# Idempotent: a second run checks and changes nothing. LF_VENV=DIR puts the environment elsewhere.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LF_VENV:-$root/.venv}"
profile=all
case "${1:-}" in
  --build) profile=build ;;
  "") ;;
  *) echo "install-deps: unknown argument '$1'; use --build (build and run only) or no argument (tests too)" >&2
     exit 2 ;;
esac

# The versions the project is built and tested with (docs/decisions.md, "Build and dependencies").
python_packages=(torch==2.11.0)
packages=(
  cmake ninja-build clang g++ ccache
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  libjpeg62-turbo-dev libpng-dev libzstd-dev  # JPEG and PNG leaves, zstd chunks of streaming datasets (docs/data.md)
  libcurl4-openssl-dev  # s3:// datasets: HTTP(S) with AWS Signature Version 4 (docs/data.md)
  dataset-fashion-mnist  # the examples' data set
  procps
  python3 python3-venv   # the project's Python environment (when no other python3 is on PATH)
)
if [ "$profile" = all ]; then
  # litdata pulls torchvision; torch==2.11.0 in the same pip command keeps the LibTorch the build links.
  # zstd: litdata's compression (the tests write compressed datasets with it).
  # moto[server]: the S3-compatible server the s3:// tests start on 127.0.0.1.
  python_packages+=(lightning==2.6.6 tensorboard==2.21.0 litdata==0.2.76 zstd==1.5.7.2 "moto[server]==5.2.6")
  packages+=(
    catch2
    iproute2 ethtool util-linux  # tests/hosts: namespaces, veth, offloads off for the link emulator
    protobuf-compiler  # tests: protoc --decode_raw reads our TensorBoard event files
    gnuplot-nox        # scripts/plot_metrics.sh
    libdw-dev          # file and line in the native stacks of hang reports (tested)
    slurm-wlm munge openmpi-bin  # the engines tests: a one-node Slurm (tests/engines) and mpirun
  )
fi

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python environment: complete when every pinned version is installed.
venv_complete() {
  [ -x "$venv/bin/python" ] || return 1
  "$venv/bin/python" - "${python_packages[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, wanted = spec.split("==")
    have = version(name)
    if have.split("+")[0] != wanted:
        sys.exit(1)
EOF
}
if venv_complete; then
  echo "install-deps: $venv has ${python_packages[*]}"
  exit 0
fi
python="$(command -v python3)"
echo "install-deps: installing ${python_packages[*]} into $venv (a 2.8 GB download with the CUDA runtime wheels, 4.8 GB installed)"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
started=$SECONDS
# No pip cache: the wheels are installed once into .venv, and a cached copy would double the disk
# this needs (a CI machine ran out of space with it). A failure says how much room was left.
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --progress-bar off --no-cache-dir \
       "${python_packages[@]}"; then
  echo "install-deps: pip could not install ${python_packages[*]} into $venv; free space there and in" \
       "${TMPDIR:-/tmp} (pip unpacks into it):" >&2
  df -h "$venv" "${TMPDIR:-/tmp}" >&2 || true
  exit 1
fi
echo "install-deps: Python environment ready in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1))"
