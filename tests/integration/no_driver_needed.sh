#!/usr/bin/env bash
# A program built against a CUDA LibTorch must start on a machine without a GPU or driver: neither
# it nor anything it loads may need the driver library libcuda.so.1 at load time.
# Usage: no_driver_needed.sh FILE...   (executables and shared libraries of the build)
set -uo pipefail
status=0
for file in "$@"; do
  if readelf -d "$file" | grep -q 'NEEDED.*libcuda\.so'; then
    echo "FAIL: $file names libcuda.so in its dynamic section:"; readelf -d "$file" | grep NEEDED
    status=1
  fi
  if ldd "$file" | grep -q 'libcuda\.so'; then
    echo "FAIL: $file loads libcuda.so through a dependency:"; ldd "$file" | grep -i cuda
    status=1
  fi
  # The CUDA LibTorch is really linked (else this test would pass for a CPU build by accident).
  if ldd "$file" | grep -q 'libtorch_cuda\.so'; then echo "$file: links libtorch_cuda.so, no driver needed"; fi
done
exit $status
