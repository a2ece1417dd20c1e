#!/usr/bin/env bash
# lf::StreamingDataset, StreamingWriter and StreamingDataLoader against Python's litdata (PyPI):
#   1. datasets written by litdata.optimize (tuples of every common leaf, dicts with JPEG and PNG
#      images, lists and nested dicts): every item read in C++ equals what litdata's
#      StreamingDataset returns for the same index (canonical lines, byte for byte);
#   2. a dataset written by lf::StreamingWriter: Python reads every item as C++ does;
#   3. the loader's batches equal litdata's StreamingDataLoader's, for 1, 2, 3 and 4 ranks, with
#      and without shuffling, several DataLoader worker counts and batch sizes, drop_last both
#      ways, over two epochs.
# Usage: litdata_interop.sh STREAMING_CHECKS   (LF_PYTHON: a Python with litdata)
set -euo pipefail
checks="$1"
python="${LF_PYTHON:-python3}"
peer="$(dirname "${BASH_SOURCE[0]}")/litdata_peer.py"
"$python" -c "import litdata" 2>/dev/null || { echo "FAIL: $python has no litdata (scripts/install-deps.sh)"; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
py() { "$python" "$peer" "$@"; }
same() {  # same FILE_A FILE_B WHAT
  if [ ! -s "$1" ] || ! cmp -s "$1" "$2"; then
    echo "FAIL: $3 differ ($(wc -l < "$1") lines from Python, $(wc -l < "$2") from C++); first difference:"
    diff "$1" "$2" | head -4 | cut -c1-300
    exit 1
  fi
  echo "ok: $3 equal ($(wc -l < "$1") lines)"
}

for kind in mixed dicts ids; do
  py write "$kind" "$dir/$kind" > "$dir/write-$kind.log" 2>&1 || { tail -20 "$dir/write-$kind.log"; echo "FAIL: litdata.optimize ($kind)"; exit 1; }
done
for kind in mixed dicts; do
  py dump "$dir/$kind" > "$kind.python.txt"
  "$checks" dump "$dir/$kind" > "$kind.cpp.txt"
  same "$kind.python.txt" "$kind.cpp.txt" "items of litdata.optimize's '$kind' dataset read by Python and C++"
done

"$checks" write mixed "$dir/cpp-mixed"
"$checks" dump "$dir/cpp-mixed" > cpp-mixed.cpp.txt
py dump "$dir/cpp-mixed" > cpp-mixed.python.txt
same cpp-mixed.python.txt cpp-mixed.cpp.txt "items of lf::StreamingWriter's dataset read by Python and C++"

configs=(1,0,0,4,1,2 1,0,3,7,1,1 1,0,2,5,0,1,1)
for r in 0 1; do configs+=(2,$r,2,3,1,2 2,$r,0,8,1,1,0); done
for r in 0 1 2; do configs+=(3,$r,2,4,1,1); done
for r in 0 1 2 3; do configs+=(4,$r,1,2,0,1 4,$r,0,5,1,2); done
py order "$dir/ids" "${configs[@]}" > order.python.txt 2> order.python.err || { tail -20 order.python.err; echo "FAIL: litdata's loader"; exit 1; }
"$checks" order "$dir/ids" "${configs[@]}" > order.cpp.txt
same order.python.txt order.cpp.txt "batches of litdata's StreamingDataLoader and lf::StreamingDataLoader in ${#configs[@]} configurations"
echo "litdata interop checks passed"
