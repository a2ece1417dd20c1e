#!/usr/bin/env bash
# The sanitizer run: builds the library, the launcher and the tests with AddressSanitizer and
# UndefinedBehaviorSanitizer (leak checks on) into build-sanitize/, then runs CTest there.
#   scripts/sanitize.sh                 # every test that does not need the examples (CI runs this)
#   scripts/sanitize.sh -R connector    # extra arguments go to ctest
# LibTorch itself is not instrumented: ASan sees our code's memory errors and the uses of LibTorch
# memory from it; UBSan checks our code. Examples and benchmarks are left out (they add build time
# and no code of the library). docs/testing.md lists what runs and the options below.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export BUILD_DIR="${SANITIZE_BUILD_DIR:-$root/build-sanitize}"
"$root/scripts/install-deps.sh" >/dev/null
"$root/scripts/build.sh" -DLF_SANITIZE=address,undefined -DLF_BUILD_EXAMPLES=OFF -DLF_BUILD_BENCHMARKS=OFF \
  -DLF_WITH_CUDA="${LF_WITH_CUDA:-ON}"
# container-overflow: std::vector annotations differ between our code and LibTorch's, so ASan would
# report false overflows at the boundary. handle_segv=0: the crash tests raise SIGSEGV on purpose
# and expect the launcher, not ASan, to report it. Leaks: LibTorch's own allocations at exit are
# suppressed by tests/sanitizer/lsan.supp; any leak of ours fails the run.
export ASAN_OPTIONS="detect_container_overflow=0:handle_segv=0:detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizer/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
# Instrumented programs start and run slower: tests with a time bound widen it by this factor.
export LF_TEST_TIME_SCALE="${LF_TEST_TIME_SCALE:-3}"
cd "$BUILD_DIR"
# install.*: a consumer project built without sanitizers cannot link an instrumented library.
ctest --output-on-failure -j "${JOBS:-$(nproc)}" -E '^install[.]' "$@"
