"""P9's Python peer: the time a training loop is blocked per checkpoint, torch.distributed.checkpoint
save against async_save, under FSDP2 (fully_shard) on gloo, on the CPU. Run under torchrun with 2
processes: the model and the checkpoint match background_save_checks' bench mode (square 4096
Linear layers + Tanh, Adam after one step).

  torchrun --standalone --nproc-per-node 2 scripts/bench_background_save_python.py DIR MB REPEATS
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard


def slowest(seconds):
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def main(folder, megabytes, repeats):
    dist.init_process_group("gloo")
    width, layers = 4096, max(1, megabytes // 64)
    torch.manual_seed(1)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.linspace(-1, 1, 4 * width).reshape(4, width)
    torch.nn.functional.mse_loss(model(x), torch.zeros(4, width)).backward()
    optimizer.step()
    for repeat in range(repeats):
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dist.barrier()
        start = time.perf_counter()
        dcp.save(state, checkpoint_id=f"{folder}/sync")
        sync = slowest(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=f"{folder}/background")
        blocked = slowest(time.perf_counter() - start)
        start = time.perf_counter()
        future.result()
        rest = slowest(time.perf_counter() - start)
        if dist.get_rank() == 0:
            print(f"P9 python-dcp {layers * 64} MiB weights, repeat {repeat + 1}: save {sync:.3f} s, "
                  f"async_save blocked {blocked:.3f} s (ratio {blocked / sync:.3f}), then complete after {rest:.3f} s more",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
