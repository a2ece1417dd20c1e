#!/usr/bin/env bash
# The sanitizer pass: builds the library, the launcher and the programs of the chosen tests with
# AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer into build-sanitize/ (at -O1, the
# level ASan is made for, which also compiles faster than Release's -O3), then runs the labels
# unit and launcher (every Catch2 case) and sanitize (one or two multi-process tests per subsystem,
# and the planted leak that proves a leak of ours is reported); docs/testing.md lists them and why.
#   scripts/sanitize.sh                 # the targeted pass (CI runs this)
#   scripts/sanitize.sh -R connector    # extra arguments go to ctest
# LibTorch itself is not instrumented: ASan sees our code's memory errors and the uses of LibTorch
# memory from it; UBSan checks our code. Every test runs through tests/run_checked.sh, which
# gathers the reports of every process a test starts and fails the test on any.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export BUILD_DIR="${SANITIZE_BUILD_DIR:-$root/build-sanitize}"
source "$root/scripts/phase-times.sh"
phase_start
"$root/scripts/install-deps.sh" >/dev/null
phase_end "sanitize.sh install"
# The programs the selected tests run.
export TARGETS="${SANITIZE_TARGETS:-lightning-run lightning-run-launcher lf_unit_tests lf_launcher_unit_tests
  lf_launcher_tests lf_collective_checks lf_ddp_checks lf_fsdp_checks lf_shm_checks lf_hang_program
  lf_checkpoint_tool lf_background_save_checks lf_model_parallel_checks lf_planted_leak lf_sync_batch_norm_checks
  lf_pipeline_checks lf_research_loop_checks lf_streaming_checks}"
"$root/scripts/build.sh" -DLF_SANITIZE=address,undefined -DLF_BUILD_EXAMPLES=OFF -DLF_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DLF_WITH_CUDA="${LF_WITH_CUDA:-ON}"
phase_end "sanitize.sh build"
# container-overflow: std::vector annotations differ between our code and LibTorch's, so ASan would
# report false overflows at the boundary. handle_segv=0: the crash tests raise SIGSEGV on purpose
# and expect the launcher, not ASan, to report it. Leaks: tests/sanitizer/lsan.supp names the
# LibTorch-internal leaks it suppresses; any other leak fails the test.
export ASAN_OPTIONS="detect_container_overflow=0:handle_segv=0:detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizer/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
# Instrumented programs start and run slower: tests with a time bound widen it by this factor.
export LF_TEST_TIME_SCALE="${LF_TEST_TIME_SCALE:-3}"
cd "$BUILD_DIR"
run_ctest "sanitize.sh ctest" --output-on-failure -j "${JOBS:-$(nproc)}" -L '^(unit|launcher|sanitize)$' "$@"
