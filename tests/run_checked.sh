#!/usr/bin/env bash
# Every CTest test runs through this (lf_add_test in tests/CMakeLists.txt, the Catch2 binaries' tests
# included):
#   run_checked.sh [--pass REGEX]... [--exit CODE] [--] COMMAND [ARG...]
# The test passes only when all of these hold:
#   - COMMAND exits with CODE (default 0); 77 (a skip) passes through when CODE is 0;
#   - every --pass REGEX (grep -E) is found in its output (stdout and stderr together);
#   - no process it started, however deep, wrote a sanitizer report by the time COMMAND ended:
#     ASAN_OPTIONS and UBSAN_OPTIONS get a log_path in a folder of this run's own, so a report from
#     a worker whose exit status a test expects to be non-zero still fails the test.
# A pass pattern is added to the exit-code check, never put in its place (docs/testing.md).
set -uo pipefail

patterns=()
expected=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pass) patterns+=("$2"); shift 2 ;;
    --exit) expected="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if ! [[ $expected =~ ^[0-9]+$ ]]; then
  echo "run_checked.sh: --exit takes an exit code (0-255), not '$expected'" >&2
  exit 2
fi
if [ $# -eq 0 ]; then
  echo "run_checked.sh: no command given; usage: run_checked.sh [--pass REGEX]... [--exit CODE] [--] COMMAND [ARG...]" >&2
  exit 2
fi

reports="$(mktemp -d "${TMPDIR:-/tmp}/lf-checked.XXXXXX")"
trap 'rm -rf "$reports"' EXIT
# A later log_path overrides an earlier one, so a nested run_checked.sh collects its own reports.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$reports/report"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}log_path=$reports/report"

if [ ${#patterns[@]} -gt 0 ]; then
  "$@" 2>&1 | tee "$reports/output"
  status=${PIPESTATUS[0]}
else
  "$@"
  status=$?
fi

failed=0
for report in "$reports"/report.*; do
  [ -e "$report" ] || continue
  echo "FAIL: a process of this test wrote a sanitizer report ($(basename "$report")):"
  cat "$report"
  failed=1
done
skipped=0
[ "$status" -eq 77 ] && [ "$expected" -eq 0 ] && skipped=1
if [ "$skipped" -eq 0 ] && [ "$status" -ne "$expected" ]; then
  echo "FAIL: '$*' exited with $status, expected $expected"
  failed=1
fi
[ "$skipped" -eq 1 ] && patterns=()
for pattern in "${patterns[@]}"; do
  if ! grep -E -q -- "$pattern" "$reports/output"; then
    echo "FAIL: the output of '$*' lacks the pass pattern: $pattern"
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1
[ "$skipped" -eq 1 ] && exit 77
exit 0
