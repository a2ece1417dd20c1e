"""The Python side of the optimizer-step benchmark (scripts/bench-optimizer.sh): one AdamW step over
examples/gpt's parameter shapes (98 M parameters in 149 tensors) on the CPU, with
torch.optim.AdamW(fused=True), (foreach=True) and (foreach=False), alternated; median of --steps
after --warmup. Prints one JSON line."""
import argparse, json, statistics, time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=2)
a = p.parse_args()
vocab, seq, d, layers = 8192, 512, 768, 12
shapes = [(vocab, d), (seq, d)]
for _ in range(layers):
    shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
shapes += [(d,), (d,), (vocab, d)]


def parameters():
    torch.manual_seed(0)
    result = []
    for shape in shapes:
        t = torch.randn(shape, requires_grad=True)
        t.grad = torch.randn(shape) * 1e-2
        result.append(t)
    return result


variants = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for_loop": dict(foreach=False)}
optimizers = {name: torch.optim.AdamW(parameters(), lr=3e-4, **kwargs) for name, kwargs in variants.items()}
times = {name: [] for name in variants}
for step in range(a.warmup + a.steps):
    for name, optimizer in optimizers.items():
        start = time.perf_counter()
        optimizer.step()
        if step >= a.warmup:
            times[name].append((time.perf_counter() - start) * 1e3)
print(json.dumps({"benchmark": "optimizer step", "implementation": "python-torch", "tensors": len(shapes),
                  "threads": torch.get_num_threads(),
                  **{f"adamw_{name}_ms": round(statistics.median(values), 3) for name, values in times.items()}}))
