#!/usr/bin/env bash
# A program built against a CUDA LibTorch must start on a machine without a GPU or driver: neither
# it nor anything it loads may need the driver library libcuda.so.1 at load time.
# Usage: no_driver_needed.sh FILE...   (executables and shared libraries of the build)
# Each tool's output is read whole before it is searched: `ldd | grep -q` under pipefail fails
# when grep stops early and ldd dies of SIGPIPE, which happened under load.
set -uo pipefail
status=0
for file in "$@"; do
  dynamic="$(readelf -d "$file")" || { echo "FAIL: readelf -d $file failed"; status=1; continue; }
  loaded="$(ldd "$file")" || { echo "FAIL: ldd $file failed"; status=1; continue; }
  if grep -q 'NEEDED.*libcuda\.so' <<<"$dynamic"; then
    echo "FAIL: $file names libcuda.so in its dynamic section:"; grep NEEDED <<<"$dynamic"
    status=1
  fi
  if grep -q 'libcuda\.so' <<<"$loaded"; then
    echo "FAIL: $file loads libcuda.so through a dependency:"; grep -i cuda <<<"$loaded"
    status=1
  fi
  # The CUDA LibTorch is really linked (else this test would pass for a CPU build by accident).
  if grep -q 'libtorch_cuda\.so' <<<"$loaded"; then echo "$file: links libtorch_cuda.so, no driver needed"; fi
done
exit $status
