#!/usr/bin/env bash
# The doc-reference check must fail on a doc that shows a function no installed header declares
# (here the library's private install_error_file_handler), and on one that names a field its type
# no longer has (DDPOptions::timeout, now DDPOptions::process_group.timeout).
#   reference_check_refuses_private_call.sh PYTHON CHECK_SCRIPT
set -uo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
expect_refused() {  # FILE_TEXT EXPECTED_MESSAGE
  printf '%s\n' "$1" > "$dir/doc.md"
  output=$("$PYTHON" "$CHECK" "$dir/doc.md")
  code=$?
  echo "$output"
  [[ $code == 1 ]] || { echo "FAIL: the check exited $code on: $1 (expected 1)"; exit 1; }
  grep -qF "$2" <<<"$output" || { echo "FAIL: the check did not say: $2"; exit 1; }
}
PYTHON=$1 CHECK=$2
expect_refused 'Call `lightning::fabric::install_error_file_handler()` first.' \
  "'lightning::fabric::install_error_file_handler' is not declared in an installed header (lib/include)"
expect_refused 'Set `lf::DDPOptions::timeout` in code.' "'DDPOptions::timeout' is not a member of DDPOptions"
printf 'Set `DDPOptions::process_group` and call `lf::ddp_strategy`.\n' > "$dir/fine.md"
"$PYTHON" "$CHECK" "$dir/fine.md" || { echo "FAIL: the check refused existing names"; exit 1; }
echo "the check refuses a private function and a removed field"
