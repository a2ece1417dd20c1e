#!/usr/bin/env bash
# Copies the header-only libraries the build needs from this machine's Debian packages into a
# folder (default third_party/, ignored by git) for machines without them: configure there with
# -DLF_THIRD_PARTY_DIR=<folder> (scripts/device-check.sh does). Usage: vendor-headers.sh [FOLDER]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/third_party}"
"$root/scripts/install-deps.sh" >/dev/null
rm -rf "$out"
mkdir -p "$out/include" "$out/cmake"
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/catch2 "$out/include/"
cp /usr/include/zlib.h /usr/include/zconf.h "$out/include/"
cp /usr/lib/cmake/Catch2/Catch.cmake /usr/lib/cmake/Catch2/CatchAddTests.cmake "$out/cmake/"

echo "vendor-headers: $(du -sh "$out" | cut -f1) in $out"
