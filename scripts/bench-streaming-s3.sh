#!/usr/bin/env bash
# Streaming from object storage side by side (docs/benchmarks.md, "Streaming from s3://"): one
# shuffled epoch, batches of 256, of the bench-streaming.sh datasets (ITEMS items of a 3 x 64 x 64
# image and an int label: float32 tensors, JPEGs) read
#   - by lf::StreamingDataLoader (2 reading threads) from the local disk (page cache dropped first
#     when root),
#   - by lf::StreamingDataLoader from a local S3 server (moto's, from PyPI, on 127.0.0.1), a fresh
#     cache each read, the fetch ahead on (prefetch_chunks 2) and off,
#   - by Python litdata's StreamingDataLoader from the same server, with 2 workers (and 0), a
#     fresh cache each read,
# both with the same cache budget (BUDGET bytes, default a third of the dataset, at least two of
# its chunks), and Python's 2 workers once more without a budget (litdata's default, 100 GB);
#   - and the server's own ceiling: every chunk fetched with curl, one at a time and two at once.
# One JSON line per read; the C++ lines carry the cache's peak bytes.
# Usage: [ITEMS=N] [REPEATS=R] [BUDGET=bytes] scripts/bench-streaming-s3.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
python="${LF_PYTHON:-$root/.venv/bin/python}"
items="${ITEMS:-20000}"
dir="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
cold() { if [ "$(id -u)" -eq 0 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; echo cold; else echo warm; fi; }

port=$("$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
"$(dirname "$python")/moto_server" -H 127.0.0.1 -p "$port" > "$dir/server.log" 2>&1 &
server=$!
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_DEFAULT_REGION=us-east-1 AWS_ENDPOINT_URL="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -s -o /dev/null "$AWS_ENDPOINT_URL" && break; sleep 0.1; done

for kind in tensor jpeg; do
  "$bin/bench_streaming" write "$dir/$kind" "$kind" "$items"
  "$python" - "$dir/$kind" "$kind" <<'PY'
import os, sys
import boto3
folder, kind = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
if kind == "tensor":
    s3.create_bucket(Bucket="bench")
for name in sorted(os.listdir(folder)):
    s3.upload_file(os.path.join(folder, name), "bench", kind + "/" + name)
PY
  size=$(du -sb "$dir/$kind" | cut -f1)
  largest=$(find "$dir/$kind" -name 'chunk-*' -printf '%s\n' | sort -n | tail -1)
  budget="${BUDGET:-$(( size / 3 > 2 * largest ? size / 3 : 2 * largest ))}"
  chunks=$(cd "$dir/$kind" && ls chunk-*)
  echo "# $kind: $size bytes, $items items, cache budget $budget bytes"
  for _ in $(seq "${REPEATS:-2}"); do
    cache=$(cold); echo "{\"dataset\": \"$kind\", \"source\": \"disk\", \"cache\": \"$cache\"} $("$bin/bench_streaming" read "$dir/$kind" --threads 2)"
    for ahead in 2 0; do
      rm -rf "$dir/cache"
      echo "{\"dataset\": \"$kind\", \"source\": \"s3\", \"prefetch_chunks\": $ahead} $(LT_STREAMING_CACHE_DIR="$dir/cache" "$bin/bench_streaming" read "s3://bench/$kind" --threads 2 --max-cache-bytes "$budget" --prefetch-chunks $ahead)"
    done
    for workers in 2 0 2-unbounded; do
      rm -rf "$dir/home"; mkdir -p "$dir/home"
      limit=(--max-cache-bytes "$budget"); [ "$workers" != 2-unbounded ] || limit=()
      echo "{\"dataset\": \"$kind\", \"source\": \"s3\", \"budget\": \"${limit[*]:-none}\"} $(HOME="$dir/home" "$python" "$root/scripts/bench_streaming_python.py" "s3://bench/$kind" --workers ${workers%-*} "${limit[@]}" 2>/dev/null | tail -1)"
    done
    start=$(date +%s.%N)
    for chunk in $chunks; do curl -s -o /dev/null "$AWS_ENDPOINT_URL/bench/$kind/$chunk"; done
    one=$(echo "$size $start $(date +%s.%N)" | awk '{printf "%.0f", $1 / ($3 - $2) / 1e6}')
    start=$(date +%s.%N)
    printf '%s\n' $chunks | xargs -P 2 -I{} curl -s -o /dev/null "$AWS_ENDPOINT_URL/bench/$kind/{}"
    two=$(echo "$size $start $(date +%s.%N)" | awk '{printf "%.0f", $1 / ($3 - $2) / 1e6}')
    echo "{\"dataset\": \"$kind\", \"source\": \"s3\", \"reader\": \"curl\", \"MB_per_s_one_at_a_time\": $one, \"MB_per_s_two_at_once\": $two}"
  done
  rm -rf "$dir/$kind"
done
