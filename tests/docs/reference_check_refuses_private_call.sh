#!/usr/bin/env bash
# The doc-reference check must fail on a doc that shows a function no installed header declares
# (here the library's private install_error_file_handler).
#   reference_check_refuses_private_call.sh PYTHON CHECK_SCRIPT
set -uo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'Call `lightning::fabric::install_error_file_handler()` first.\n' > "$dir/private_call.md"
"$1" "$2" "$dir/private_call.md"
code=$?
[[ $code == 1 ]] || { echo "FAIL: the check exited $code on a doc naming a private function, expected 1"; exit 1; }
echo "the check refuses a private function"
