"""One epoch of Python litdata's StreamingDataLoader over a dataset folder or an s3:// URL (the
peer of apps/bench_streaming.cpp): one JSON line with samples per second.
Usage: bench_streaming_python.py DIR|s3://... [--batch B] [--workers W] [--max-cache-bytes N]"""
import argparse
import json
import os
import time

if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
    # litdata's obstore client refuses plain HTTP unless told (the benchmark's server is local).
    import litdata.streaming.downloader as _downloader

    _downloader._OBSTORE_CLIENT_OPTIONS = {**_downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}

from litdata import StreamingDataLoader, StreamingDataset

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--batch", type=int, default=256)
parser.add_argument("--workers", type=int, default=0)  # the DataLoader's default
parser.add_argument("--max-cache-bytes", type=int, default=None)  # litdata's max_cache_size (s3:// only)
args = parser.parse_args()
extra = {"max_cache_size": args.max_cache_bytes} if args.max_cache_bytes else {}
loader = StreamingDataLoader(StreamingDataset(args.dir, shuffle=True, **extra), batch_size=args.batch,
                             num_workers=args.workers)
start = time.perf_counter()
samples, label_sum = 0, 0.0
for images, labels in loader:
    samples += images.shape[0]
    label_sum += float(labels.sum())
seconds = time.perf_counter() - start
print(json.dumps({"reader": "python", "source": "s3" if args.dir.startswith("s3://") else "disk", "workers": args.workers, "batch": args.batch, "samples": samples,
                  "seconds": seconds, "samples_per_s": samples / seconds, "label_sum": label_sum}))
