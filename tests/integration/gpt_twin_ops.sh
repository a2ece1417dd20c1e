#!/usr/bin/env bash
# examples/gpt is its Python twin (scripts/p8_python_fabric.py) op for op: one CPU forward of each
# issues the same ATen operators in the same counts. gpt_twin_ops.txt beside this script is the
# list the Python side printed (scripts/gpt_twin_ops.py); the C++ forward must print it exactly,
# and the Python twin must still print it, so neither side can drift.
#   gpt_twin_ops.sh GPT_BINARY REPO_ROOT
set -uo pipefail
gpt=$1 root=$2
python=${LF_PYTHON:-python3}
shape=(--layers 2 --d-model 64 --heads 4 --seq 16 --batch-size 2 --vocab 100)
expected="$root/tests/integration/gpt_twin_ops.txt"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$gpt" --list-forward-ops "${shape[@]}" > "$dir/cpp.txt" || { echo "FAIL: gpt --list-forward-ops failed"; exit 1; }
"$python" "$root/scripts/gpt_twin_ops.py" "${shape[@]}" > "$dir/python.txt" 2>"$dir/python.err" ||
  { cat "$dir/python.err"; echo "FAIL: the Python twin's operator list failed"; exit 1; }
status=0
if ! diff -u "$expected" "$dir/cpp.txt"; then
  echo "FAIL: the C++ forward's operators differ from the Python twin's (above: - Python, + C++)"
  status=1
fi
if ! diff -u "$expected" "$dir/python.txt"; then
  echo "FAIL: the Python twin's operators changed; regenerate $expected with scripts/gpt_twin_ops.py ${shape[*]}"
  status=1
fi
[[ $status == 0 ]] && echo "gpt twins issue the same $(wc -l < "$expected") operators in the same counts"
exit $status
