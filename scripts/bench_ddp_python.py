#!/usr/bin/python3
"""P3's Python twin of apps/bench_ddp_step.cpp: torch DistributedDataParallel on gloo, same model,
data and thread count; run under torchrun. Rank 0 prints one JSON object."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    layout = sys.argv[1] if len(sys.argv) > 1 else "784-1024-1024-10"
    batch, steps, warmup = (int(v) for v in (sys.argv[2:5] or ["64", "200", "30"]))
    sizes = [int(v) for v in layout.split("-")]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if multi:
        dist.init_process_group("gloo")
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    if multi:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, sizes[0])
    y = torch.randint(sizes[-1], (batch,))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    if not multi or dist.get_rank() == 0:
        print(json.dumps({"impl": "python-torch-ddp", "layout": layout, "batch_per_rank": batch,
                          "world_size": int(os.environ.get("WORLD_SIZE", "1")), "steps": steps,
                          "median_step_ms": times[len(times) // 2]}))


if __name__ == "__main__":
    main()
