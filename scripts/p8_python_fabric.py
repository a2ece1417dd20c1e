"""P8's Python twin of examples/gpt: the same GPT-style model, batch and synthetic tokens, trained
with Python Lightning Fabric (precision as given) on the same GPU; prints the same JSON fields.
    python3 scripts/p8_python_fabric.py --accelerator cuda --precision bf16-mixed --steps 60
--plain runs the loop in plain PyTorch without Lightning (autocast by hand for bf16-mixed, else float32).
--fused builds torch.optim.AdamW(fused=True) (default: AdamW's own default, foreach on CUDA).
--fsdp runs Lightning's FSDPStrategy with one unit per block (auto_wrap_policy={Block});
--activation-checkpointing adds activation_checkpointing_policy={Block} (with --fsdp).
--profile-step profiles one more step with torch.profiler and prints a second JSON line with its
GPU kernels, kernel launches and ATen operators, counted as examples/gpt --profile-step counts them."""
import argparse, json, sys, time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.projection = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):  # [B, T, D]
        batch, length, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(batch, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, length, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(a.vocab, a.d_model), nn.Embedding(a.seq, a.d_model)
        self.blocks = nn.ModuleList(Block(a.d_model, a.heads) for _ in range(a.layers))
        self.ln_f, self.head = nn.LayerNorm(a.d_model), nn.Linear(a.d_model, a.vocab, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("vocab", 8192), ("seq", 512), ("d-model", 768), ("heads", 12), ("layers", 12),
                          ("batch-size", 16), ("steps", 60), ("warmup", 10)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--fused", action="store_true")
    p.add_argument("--profile-step", action="store_true")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--activation-checkpointing", action="store_true")
    a = p.parse_args()
    if a.accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        print("SKIPPED: no CUDA GPU (p8_python_fabric.py --accelerator %s)" % a.accelerator)  # device-check --dry-run
        sys.exit(77)
    torch.manual_seed(0)
    model = Gpt(a)
    parameters = sum(t.numel() for t in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, **({"fused": True} if a.fused else {}))
    if a.plain:
        device = torch.device("cuda" if a.accelerator in ("cuda", "gpu") else "cpu")
        model.to(device)
        # bf16-mixed by hand: autocast around the forward, as Lightning's plugin does.
        autocast = a.precision == "bf16-mixed"

        def forward(ids):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                return model(ids)

        backward = lambda loss: loss.backward()
    else:
        import lightning as L
        strategy = "auto"
        if a.fsdp:
            from lightning.fabric.strategies import FSDPStrategy
            strategy = FSDPStrategy(auto_wrap_policy={Block},
                                    activation_checkpointing_policy={Block} if a.activation_checkpointing else None)
        fabric = L.Fabric(accelerator=a.accelerator, devices=1, precision=a.precision, strategy=strategy)
        fabric.launch()  # FSDP needs its process group (of one) even on one device
        model, optimizer = fabric.setup(model, optimizer)
        device, backward, forward = fabric.device, fabric.backward, model
    times = []
    from lightning.fabric.utilities.throughput import measure_flops
    raw = getattr(model, "module", model)  # the unwrapped module: measure_flops runs its own backward
    sample = torch.randint(a.vocab, (a.batch_size, a.seq + 1), device=device)
    step_flops = None
    if not a.fsdp:  # FSDP's wrapped module runs its own hooks; not counted there
        step_flops = measure_flops(raw, lambda: raw(sample[:, :-1]), lambda logits: nn.functional.cross_entropy(
            logits.reshape(-1, a.vocab).float(), sample[:, 1:].reshape(-1)))
    raw.zero_grad(set_to_none=True)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def train_step(batch):
        optimizer.zero_grad()
        logits = forward(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, a.vocab).float(), batch[:, 1:].reshape(-1))
        backward(loss)
        optimizer.step()

    for step in range(a.warmup + a.steps):
        batch = torch.randint(a.vocab, (a.batch_size, a.seq + 1), device=device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        train_step(batch)
        if cuda:
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    median = sorted(times)[len(times) // 2]
    tokens = a.batch_size * a.seq
    flops = tokens * (6.0 * parameters + 12.0 * a.layers * a.seq * a.d_model)
    implementation = "plain-pytorch" if a.plain else "python-lightning-fabric"
    optimizer_step = "fused" if a.fused else "default"
    print(json.dumps({"benchmark": "P8 gpt", "implementation": implementation, "optimizer_step": optimizer_step,
                      "device": str(device), "precision": a.precision if a.precision == "bf16-mixed" or not a.plain else "32-true",
                      "parameters": parameters, "batch_size": a.batch_size, "seq": a.seq, "median_step_ms": median,
                      "measured_flops_per_step": step_flops,
                      "tokens_per_s": tokens / (median / 1e3), "model_tflops": flops / (median / 1e3) / 1e12,
                      "fraction_of_peak": flops / (median / 1e3) / (a.peak_tflops * 1e12),
                      "strategy": "fsdp" if a.fsdp else "single", "activation_checkpointing": a.activation_checkpointing,
                      "cuda_peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 1e6 if cuda else None}))
    if a.profile_step:
        print_step_profile(train_step, torch.randint(a.vocab, (a.batch_size, a.seq + 1), device=device), cuda,
                           implementation, optimizer_step)


def print_step_profile(train_step, batch, cuda, implementation, optimizer_step):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        train_step(batch)
        if cuda:
            torch.cuda.synchronize()
    kernels = launches = operators = 0
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            kernels += not event.name.startswith(("Memcpy", "Memset"))
        elif "LaunchKernel" in event.name:
            launches += 1
        elif event.name.startswith("aten::"):
            operators += 1
    print(json.dumps({"benchmark": "P8 kernels", "implementation": implementation, "optimizer_step": optimizer_step,
                      "gpu_kernels": kernels, "kernel_launches": launches, "aten_operators": operators}))


if __name__ == "__main__":
    main()
