"""Python's own composition of the model_parallel job (tests/integration/model_parallel_checks.cpp):
the same GPT (examples/common/tensor_parallel_gpt.h: same parameter names, same operations) built
with torch.distributed's FSDP2 (`fully_shard`) and tensor parallelism (`parallelize_module`), from
the same initial weights, trained on the same batches with the same SGD and gradient clipping.

Configurations (4 ranks, gloo on CPU):
  fsdp_tp  mesh ("dp" 2, "tp" 2): q, k, v, fc1 ColwiseParallel; projection, fc2 RowwiseParallel;
           the token embedding split by vocabulary (RowwiseParallel, ids replicated); the head
           ColwiseParallel with its logits left split by vocabulary for `loss_parallel()`; then
           `fully_shard` on each block and on the root over "dp" (torch's default
           reshard_after_forward: the blocks reshard after forward, the root keeps its parameters).
  hsdp     mesh ("replicate" 2, "shard" 2): `fully_shard` on each block and on the root with the
           2-D mesh (HSDP: placements (Replicate(), Shard(0))), no tensor parallelism.
Data rank d of S takes rows [d 4/S, (d+1) 4/S) of each step's global batch of 4.

Every configuration is compared with a one-process Python model trained on the whole batches (that
checks the composition itself), and with the C++ job where given: each step's global mean loss
within 1e-5 and every parameter after the last step within 1e-5.
Any mismatch prints "FAIL: ..." and every rank exits 1.

  python -m torch.distributed.run --standalone --nproc-per-node 4 python_twin.py \
      --init INIT.ckpt --cpp fsdp_tp LOSSES FINAL.ckpt --cpp hsdp LOSSES FINAL.ckpt
  python -m torch.distributed.run --standalone --nproc-per-node 4 python_twin.py --python-only fsdp_tp hsdp
(without --init the weights are drawn from a fixed seed: the one-process comparison only)
"""
import argparse
import contextlib
import logging
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

VOCAB, SEQ, D_MODEL, HEADS, LAYERS = 32, 8, 16, 4, 2
BATCH, STEPS, LR, MOMENTUM, MAX_NORM, TOLERANCE = 4, 20, 0.5, 0.9, 1.0, 1e-5
CONFIGS = ("fsdp_tp", "hsdp")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        d = D_MODEL
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.q, self.k, self.v, self.projection = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.ln1(x)
        queries = self.q(h)  # [B, L, D/T] under tensor parallelism: this rank's heads
        batch, length = queries.shape[0], queries.shape[1]

        def heads_of(t):
            return t.view(batch, length, -1, D_MODEL // HEADS).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads_of(queries), heads_of(self.k(h)), heads_of(self.v(h)),
                                                  is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, length, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Embedding(SEQ, D_MODEL)
        for i in range(LAYERS):
            self.add_module(f"block{i}", Block())
        self.ln_f = nn.LayerNorm(D_MODEL, eps=1e-5)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def blocks(self):
        return [getattr(self, f"block{i}") for i in range(LAYERS)]

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks():
            x = block(x)
        return self.head(self.ln_f(x))


def batch(step):
    """tensor_parallel_gpt_batch(settings, 4, step): ids from a CPU generator seeded 1000 + step."""
    ids = torch.randint(VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1000 + step))
    before = torch.cat([torch.zeros(BATCH, 1, dtype=ids.dtype), ids[:, :-1]], dim=1)
    return ids, (ids * 7 + before + 3) % VOCAB


def local_of(tensor):
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def clip_gradients(parameters):
    """torch's clip_grad_norm_ rule (coefficient max_norm / (norm + 1e-6), at most 1) over gradients
    that are DTensors on different meshes (clip_grad_norm_ stacks their norms, which needs one mesh):
    the norm of each whole gradient. Every rank calls it alike (full_tensor is a collective)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norms = [torch.linalg.vector_norm(local_of(g)) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coefficient = torch.clamp(MAX_NORM / (total + 1e-6), max=1.0).item()
    for g in grads:
        g.mul_(coefficient)
    return total.item()


def initial_weights(init_path):
    if init_path:
        return torch.load(init_path, map_location="cpu", weights_only=True)["model"]
    torch.manual_seed(3)
    return {name: tensor.detach().clone() for name, tensor in Gpt().state_dict().items()}


def reference_run(weights):
    """The unsplit model in this process on the whole batches (torch's own clip_grad_norm_)."""
    model = Gpt()
    model.load_state_dict(weights)
    sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, foreach=False)
    losses = []
    for step in range(STEPS):
        ids, targets = batch(step)
        sgd.zero_grad()
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        sgd.step()
        losses.append(loss.item())
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def build(config, weights):
    """The model split over its mesh; returns (model, data rank, data size, tensor parallel?)."""
    model = Gpt()
    model.load_state_dict(weights)
    if config == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        for block in model.blocks():
            parallelize_module(block, mesh["tp"], {
                "q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                "projection": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        parallelize_module(model, mesh["tp"], {
            "tokens": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
        data_mesh = mesh["dp"]
        data_rank, data_size = data_mesh.get_local_rank(), data_mesh.size()
    else:
        data_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        data_rank = data_mesh.get_local_rank("replicate") * 2 + data_mesh.get_local_rank("shard")
        data_size = data_mesh.size()
    for block in model.blocks():
        fully_shard(block, mesh=data_mesh)
    fully_shard(model, mesh=data_mesh)
    return model, data_rank, data_size, config == "fsdp_tp"


def mesh_problems(config, model):
    """The split the configuration promises: mesh names, placements and this rank's shapes."""
    problems = []

    def expect(name, mesh_names, placements, local_shape):
        p = dict(model.named_parameters())[name]
        if not isinstance(p, DTensor):
            problems.append(f"{name} is a plain tensor, not a DTensor on mesh {mesh_names}")
            return
        got = (p.device_mesh.mesh_dim_names, tuple(type(x).__name__ + str(getattr(x, "dim", "")) for x in p.placements),
               tuple(p.to_local().shape))
        if got != (mesh_names, placements, local_shape):
            problems.append(f"{name}: mesh, placements and local shape {got}, expected {(mesh_names, placements, local_shape)}")

    d = D_MODEL
    if config == "fsdp_tp":  # tensor split, then each slice split again over "dp"
        expect("block0.q.weight", ("dp", "tp"), ("_StridedShard0", "Shard0"), (d // 4, d))
        expect("block1.fc1.weight", ("dp", "tp"), ("_StridedShard0", "Shard0"), (4 * d // 4, d))
        expect("block0.projection.weight", ("dp", "tp"), ("Shard0", "Shard1"), (d // 2, d // 2))
        expect("tokens.weight", ("dp", "tp"), ("_StridedShard0", "Shard0"), (VOCAB // 4, d))
        expect("head.weight", ("dp", "tp"), ("_StridedShard0", "Shard0"), (VOCAB // 4, d))
        expect("positions.weight", ("dp",), ("Shard0",), (SEQ // 2, d))
    else:
        expect("block0.q.weight", ("replicate", "shard"), ("Replicate", "Shard0"), (d // 2, d))
        expect("block1.fc2.weight", ("replicate", "shard"), ("Replicate", "Shard0"), (d // 2, 4 * d))
    return problems


def train(model, data_rank, data_size, tensor_parallel):
    sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, foreach=False)
    rows = BATCH // data_size
    world = dist.get_world_size()
    losses = []
    for step in range(STEPS):
        ids, targets = batch(step)
        ids, targets = ids[data_rank * rows:(data_rank + 1) * rows], targets[data_rank * rows:(data_rank + 1) * rows]
        sgd.zero_grad()
        # Logits split by vocabulary: loss_parallel's cross-entropy, forward and backward under it.
        with loss_parallel() if tensor_parallel else contextlib.nullcontext():
            loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
            loss.backward()
        # The global mean: every rank's share mean (the tensor ranks of a data rank hold the same).
        total = local_of(loss.detach()).clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
        clip_gradients(list(model.parameters()))
        sgd.step()
    return losses, {name: local_of(p.detach()) for name, p in model.named_parameters()}


def read_losses(path):
    """The C++ job's --losses file: one line "STEP LOSS" per step."""
    losses = {}
    with open(path) as file:
        for number, line in enumerate(file, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                step, loss = int(fields[0]), float(fields[1])
                if len(fields) != 2:
                    raise ValueError
            except (ValueError, IndexError):
                raise SystemExit(f"FAIL: {path} line {number} is {line.strip()!r}, not 'STEP LOSS'")
            losses[step] = loss
    return losses


def compare(config, against, losses, parameters, expected_losses, expected_parameters, report):
    """Appends a FAIL line per mismatch to report; returns the largest loss and parameter differences."""
    worst_loss, worst_parameter = 0.0, 0.0
    if sorted(expected_losses) != list(range(STEPS)):
        report.append(f"FAIL: {config}: {against} lists the steps {sorted(expected_losses)}, not 0..{STEPS - 1}")
    for step, loss in enumerate(losses):
        if step not in expected_losses:
            continue
        difference = abs(loss - expected_losses[step])
        worst_loss = max(worst_loss, difference)
        if not difference <= TOLERANCE:
            report.append(f"FAIL: {config}: step {step}'s loss {loss:.10g} differs from {against}'s "
                          f"{expected_losses[step]:.10g} by {difference:.3g}")
    if set(parameters) != set(expected_parameters):
        report.append(f"FAIL: {config}: the parameter names differ from {against}'s: "
                      f"{sorted(set(parameters) ^ set(expected_parameters))}")
    for name in sorted(set(parameters) & set(expected_parameters)):
        ours, theirs = parameters[name], expected_parameters[name]
        if ours.shape != theirs.shape:
            report.append(f"FAIL: {config}: {name} has the shape {tuple(ours.shape)}, {against}'s {tuple(theirs.shape)}")
            continue
        difference = (ours - theirs).abs().max().item()
        worst_parameter = max(worst_parameter, difference)
        if not difference <= TOLERANCE:
            report.append(f"FAIL: {config}: {name} differs from {against}'s by {difference:.3g} after {STEPS} steps")
    return worst_loss, worst_parameter


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", help="the C++ program's initial weights (--plain --steps 0 --save-type full)")
    parser.add_argument("--cpp", nargs=3, action="append", default=[], metavar=("CONFIG", "LOSSES", "FINAL"),
                        help="a configuration with the C++ job's --losses file and final full checkpoint")
    parser.add_argument("--python-only", nargs="+", default=[], choices=CONFIGS,
                        help="configurations checked against the one-process Python model only")
    args = parser.parse_args()
    runs = [(config, losses, final) for config, losses, final in args.cpp] + [(c, None, None) for c in args.python_only]
    for config, _, _ in runs:
        if config not in CONFIGS:
            parser.error(f"--cpp {config}: the configuration must be one of {', '.join(CONFIGS)}")
    if not runs:
        parser.error("name a configuration: --cpp CONFIG LOSSES FINAL or --python-only CONFIG")
    if args.cpp and not args.init:
        parser.error("--cpp needs --init: the C++ job's initial weights")

    # full_tensor of a gradient split over "dp" and "tp" warns that it takes two all-gathers.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo")
    if dist.get_world_size() != 4:
        raise SystemExit(f"FAIL: python_twin.py runs on 4 ranks, not {dist.get_world_size()}")
    rank = dist.get_rank()
    weights = initial_weights(args.init)
    report = []
    reference = reference_run(weights) if rank == 0 else None
    for config, losses_path, final_path in runs:
        start = time.perf_counter()
        model, data_rank, data_size, tensor_parallel = build(config, weights)
        problems = mesh_problems(config, model)
        report += [f"FAIL: {config} on rank {rank}: {problem}" for problem in problems]
        losses, parameters = train(model, data_rank, data_size, tensor_parallel)
        seconds = time.perf_counter() - start
        if rank != 0:
            continue
        worst = compare(config, "the one-process Python model", losses, parameters, dict(enumerate(reference[0])),
                        reference[1], report)
        print(f"{config}: against the one-process Python model, largest loss difference {worst[0]:.3g}, "
              f"parameter difference {worst[1]:.3g} ({seconds:.1f} s)", flush=True)
        if losses_path:
            final = torch.load(final_path, map_location="cpu", weights_only=True)["model"]
            worst = compare(config, "the C++ job", losses, parameters, read_losses(losses_path), final, report)
            print(f"{config}: against the C++ job, largest loss difference {worst[0]:.3g}, "
                  f"parameter difference {worst[1]:.3g}", flush=True)
    for line in report:
        print(line, flush=True)
    failed = torch.tensor([1 if report else 0])
    dist.all_reduce(failed)
    dist.destroy_process_group()
    if failed.item():
        sys.exit(1)
    if rank == 0:
        print("python twin checks passed: " + ", ".join(config for config, _, _ in runs), flush=True)


if __name__ == "__main__":
    main()
