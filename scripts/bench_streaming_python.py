"""One epoch of Python litdata's StreamingDataLoader over a dataset folder (the peer of
apps/bench_streaming.cpp): one JSON line with samples per second.
Usage: bench_streaming_python.py DIR [--batch B] [--workers W]"""
import argparse
import json
import time

from litdata import StreamingDataLoader, StreamingDataset

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--batch", type=int, default=256)
parser.add_argument("--workers", type=int, default=0)  # the DataLoader's default
args = parser.parse_args()
loader = StreamingDataLoader(StreamingDataset(args.dir, shuffle=True), batch_size=args.batch, num_workers=args.workers)
start = time.perf_counter()
samples, label_sum = 0, 0.0
for images, labels in loader:
    samples += images.shape[0]
    label_sum += float(labels.sum())
seconds = time.perf_counter() - start
print(json.dumps({"reader": "python", "workers": args.workers, "batch": args.batch, "samples": samples,
                  "seconds": seconds, "samples_per_s": samples / seconds, "label_sum": label_sum}))
