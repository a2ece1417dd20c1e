# Sourced by scripts/test.sh and scripts/sanitize.sh: phase times as each phase ends, and ctest
# with a closing line that counts the skipped tests and says why they skipped.
#   phase_start; ...; phase_end NAME     prints "phase NAME: N s"
#   run_ctest NAME ctest-arguments...    runs ctest, then prints its phase time and the skip line
# A build folder without CTest's own timing record gets tests/ctest-costs.txt (each test's time in
# an earlier run), so that even a fresh clone's first run starts the longest tests first instead
# of finishing on a long test alone; it only orders the tests.
phase_start() { phase_started=$SECONDS; }
phase_end() {
  echo "phase $1: $((SECONDS - phase_started)) s"
  phase_started=$SECONDS
}
run_ctest() {
  local name="$1" status=0 log
  shift
  log="$(mktemp)"
  local costs="$(dirname "${BASH_SOURCE[0]}")/../tests/ctest-costs.txt"
  if [ ! -f Testing/Temporary/CTestCostData.txt ] && [ -f "$costs" ]; then
    mkdir -p Testing/Temporary && cp "$costs" Testing/Temporary/CTestCostData.txt
  fi
  ctest "$@" 2>&1 | tee "$log" || status=$?
  phase_end "$name"
  # CTest marks a test that exited with its SKIP_RETURN_CODE (77) "***Skipped"; only the gpu
  # label may skip under CI=true (docs/testing.md).
  local skipped
  skipped="$(sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .*\*\*\*Skipped.*/\1/p' "$log" | sort -u)"
  if [ -z "$skipped" ]; then
    echo "skipped: none"
  else
    local other
    other="$(grep -v '^gpu[.]' <<<"$skipped" || true)"
    echo "skipped: $(wc -l <<<"$skipped") ($(tr '\n' ' ' <<<"$skipped" | sed 's/ $//')): $([ -z "$other" ] && echo "no GPU on this machine" || echo "see each test's output")"
    if [ -n "$other" ] && [ "${CI:-}" = true ]; then
      echo "FAIL: under CI=true only the gpu label may skip; these skipped: $(tr '\n' ' ' <<<"$other")"
      status=1
    fi
  fi
  rm -f "$log"
  return "$status"
}
