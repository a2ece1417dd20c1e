"""P3's Python twins of apps/bench_ddp_step.cpp, run under torchrun: torch DistributedDataParallel
(--ddp) or Python Lightning Fabric's ddp strategy (--fabric), on gloo, same model, data and thread
count. Rank 0 prints one JSON object. A sixth argument "bn" puts a BatchNorm1d after every hidden
Linear (DDP's default broadcast_buffers=True then sends the buffers before each forward), as
bench_ddp_step's "bn" mode.
    torchrun --nproc-per-node 2 scripts/bench_ddp_python.py --fabric 784-1024-1024-10 64 300 30"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def build(sizes, batch_norm):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i + 2 < len(sizes) and batch_norm:
            layers.append(torch.nn.BatchNorm1d(b))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    impl, layout = sys.argv[1], sys.argv[2]
    batch, steps, warmup = (int(v) for v in sys.argv[3:6])
    mode = sys.argv[6] if len(sys.argv) > 6 else "sync"
    sizes = [int(v) for v in layout.split("-")]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(sizes, mode == "bn")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    backward = torch.Tensor.backward
    if impl == "--fabric":
        import lightning as L
        fabric = L.Fabric(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                          strategy="ddp" if world > 1 else "auto")
        fabric.launch()  # under torchrun: joins the group, starts nothing
        model, optimizer = fabric.setup(model, optimizer)
        backward = fabric.backward
        name = "python-lightning-fabric"
    else:
        if world > 1:
            dist.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(model)
        name = "python-torch-ddp"
    x = torch.randn(batch, sizes[0])
    y = torch.randint(sizes[-1], (batch,))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        backward(torch.nn.functional.cross_entropy(model(x), y))
        optimizer.step()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"impl": name, "layout": layout, "batch_per_rank": batch, "world_size": world,
                          "mode": mode, "steps": steps, "median_step_ms": times[len(times) // 2]}))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
