#!/usr/bin/env bash
# Streaming-read throughput side by side (issue #48): one shuffled epoch, batches of 256, over the
# same dataset folder in LitData's layout, by lf::StreamingDataLoader (2 reading threads) and by
# Python litdata's StreamingDataLoader with the DataLoader's default num_workers=0, and with 2.
# Two datasets of ITEMS (default 20000) items, each a 3 x 64 x 64 image and an int label: float32
# tensors (47 KiB an item) and JPEGs (about 1.4 KiB). As root, the page cache is dropped before
# every read (cold: data from disk), else reads are warm. Prints one JSON line per read.
# Usage: [ITEMS=N] [REPEATS=R] [DIR=folder] scripts/bench-streaming.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
python="${LF_PYTHON:-$root/.venv/bin/python}"
items="${ITEMS:-20000}"
dir="${DIR:-$(mktemp -d)}"
[ -n "${DIR:-}" ] || trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
cold() { if [ "$(id -u)" -eq 0 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; echo cold; else echo warm; fi; }
for kind in tensor jpeg; do
  [ -f "$dir/$kind/index.json" ] || "$bin/bench_streaming" write "$dir/$kind" "$kind" "$items"
  echo "# $kind: $(du -sh "$dir/$kind" | cut -f1), $items items"
  for _ in $(seq "${REPEATS:-2}"); do
    cache=$(cold); echo "{\"dataset\": \"$kind\", \"cache\": \"$cache\"} $("$bin/bench_streaming" read "$dir/$kind" --threads 2)"
    for workers in 0 2; do
      cache=$(cold)
      echo "{\"dataset\": \"$kind\", \"cache\": \"$cache\"} $("$python" "$root/scripts/bench_streaming_python.py" "$dir/$kind" --workers $workers 2>/dev/null | tail -1)"
    done
  done
done
