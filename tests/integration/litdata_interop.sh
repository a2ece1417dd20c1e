#!/usr/bin/env bash
# lf::StreamingDataset, StreamingWriter and StreamingDataLoader against Python's litdata (PyPI):
#   1. datasets written by litdata.optimize (tuples of every common leaf, dicts with JPEG and PNG
#      images, lists and nested dicts; litdata's typed leaves: a PNG as its bytes, a list of JPEGs,
#      text, a file): every item read in C++ equals what litdata's
#      StreamingDataset returns for the same index (canonical lines, byte for byte);
#      and zstd-compressed ones (frames, the default; per item; whole files) read alike too;
#   2. datasets written by lf::StreamingWriter, plain and zstd-compressed: Python reads every item
#      as C++ does;
#   3. the loader's batches equal litdata's StreamingDataLoader's, for 1, 2, 3 and 4 ranks, with
#      and without shuffling, several DataLoader worker counts and batch sizes, drop_last both
#      ways, over two epochs; and shuffled with seeds 1234 and 7 over chunks of 600 items, larger
#      than the 256-item shuffle window.
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
source "$(dirname "${BASH_SOURCE[0]}")/compare_lines.sh"  # same FILE_A FILE_B WHAT

for kind in mixed dicts media ids ids-big ids-batch mixed-sample ids-chunk; do
  py write "$kind" "$dir/$kind" > "$dir/write-$kind.log" 2>&1 || { tail -20 "$dir/write-$kind.log"; echo "FAIL: litdata.optimize ($kind)"; exit 1; }
done
grep -q '"compression_level": "batch"' "$dir/ids-batch/index.json" || { echo "FAIL: litdata did not compress ids-batch in frames"; exit 1; }
for kind in mixed dicts media ids-batch mixed-sample ids-chunk; do
  "$checks" dump "$dir/$kind" > "$kind.cpp.txt"
  cp -r "$dir/$kind" "$dir/$kind-copy"  # Python inflates whole-file chunks in place and deletes them
  py dump "$dir/$kind-copy" > "$kind.python.txt"
  same "$kind.python.txt" "$kind.cpp.txt" "items of litdata.optimize's '$kind' dataset read by Python and C++"
done

for kind in mixed ids-zstd; do
  "$checks" write $kind "$dir/cpp-$kind"
  "$checks" dump "$dir/cpp-$kind" > cpp-$kind.cpp.txt
  py dump "$dir/cpp-$kind" > cpp-$kind.python.txt
  same cpp-$kind.python.txt cpp-$kind.cpp.txt "items of lf::StreamingWriter's '$kind' dataset read by Python and C++"
done

configs=(1,0,0,4,1,2 1,0,3,7,1,1 1,0,2,5,0,1,1)
for r in 0 1; do configs+=(2,$r,2,3,1,2 2,$r,0,8,1,1,0); done
for r in 0 1 2; do configs+=(3,$r,2,4,1,1); done
for r in 0 1 2 3; do configs+=(4,$r,1,2,0,1 4,$r,0,5,1,2); done
py order "$dir/ids" "${configs[@]}" > order.python.txt 2> order.python.err || { tail -20 order.python.err; echo "FAIL: litdata's loader"; exit 1; }
"$checks" order "$dir/ids" "${configs[@]}" > order.cpp.txt
same order.python.txt order.cpp.txt "batches of litdata's StreamingDataLoader and lf::StreamingDataLoader in ${#configs[@]} configurations"
# Chunks of 600 items (larger than the 256-item shuffle window), shuffled with two other seeds.
big=(1,0,0,8,1,2,-,1234 1,0,2,8,1,1,-,1234 3,2,1,5,1,1,-,7)
for r in 0 1; do big+=(2,$r,2,8,1,2,-,1234 2,$r,0,8,1,1,-,7); done
py order "$dir/ids-big" "${big[@]}" > big.python.txt 2> big.python.err || { tail -20 big.python.err; echo "FAIL: litdata's loader (ids-big)"; exit 1; }
"$checks" order "$dir/ids-big" "${big[@]}" > big.cpp.txt
same big.python.txt big.cpp.txt "shuffled batches over chunks larger than the shuffle window, seeds 1234 and 7, in ${#big[@]} configurations"
echo "litdata interop checks passed"
