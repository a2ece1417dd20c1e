"""Python's side of the sharded-checkpoint interop test (python_dcp_interop.sh), run under torchrun
on gloo, on the CPU.

  write DIR       3 Adam steps under FSDP2 (fully_shard), then torch.distributed.checkpoint.save of
                  {"model", "optimizer"} to DIR/ck with {"step": 3} in DIR/ck/meta.pt, the layout
                  Lightning Fabric's FSDP strategy writes; the losses of 2 more steps to
                  DIR/python-next.txt
  continue CK NEXT  build the same model under another seed, torch.distributed.checkpoint.load CK
                  (written by C++), take 2 steps: the losses equal NEXT's within 1e-6

  lightning-write DIR, lightning-continue CK NEXT
                  the same through Python Lightning Fabric's own FSDPStrategy.save_checkpoint and
                  load_checkpoint over FSDP1 (use_orig_params)

Lightning Fabric refuses FSDPStrategy on the CPU when it builds the strategy ("FSDP is only
available on GPU"), but the strategy's checkpoint methods run on CPU with gloo, so the lightning-*
modes call them directly with a LightningEnvironment giving the rank. The model, optimizer and
batch mirror fsdp_checks.cpp's interop modes: every rank steps on the whole batch.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard


def interop(seed, lr):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def lightning_interop(seed, lr):
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = FullyShardedDataParallel(model, use_orig_params=True, device_id=torch.device("cpu"))
    strategy = FSDPStrategy(state_dict_type="sharded")
    environment = LightningEnvironment()
    environment.set_global_rank(dist.get_rank())
    environment.set_world_size(dist.get_world_size())
    strategy.cluster_environment = environment
    return model, torch.optim.Adam(model.parameters(), lr=lr), strategy


def step(model, optimizer):
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    y = x[:, :2] * 0.5 + 0.1
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def save_dcp(model, optimizer, folder):
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    if dist.get_rank() == 0:
        torch.save({"step": 3}, f"{folder}/meta.pt")


def load_dcp(model, optimizer, folder):
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)  # every key of Python's own state must be there
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    meta = torch.load(os.path.join(folder, "meta.pt"))
    assert meta == {"step": 3}, meta


def write(model, optimizer, save, folder):
    """3 steps, save to folder/ck, then the losses of 2 more steps to folder/python-next.txt."""
    for _ in range(3):
        step(model, optimizer)
    save(f"{folder}/ck")
    losses = [step(model, optimizer) for _ in range(2)]
    if dist.get_rank() == 0:
        with open(f"{folder}/python-next.txt", "w") as out:
            out.write("".join(f"{loss!r}\n" for loss in losses))
    print(f"rank {dist.get_rank()}: Python wrote {folder}/ck")


def continue_from(model, optimizer, load, checkpoint, next_file):
    """Load checkpoint, take 2 steps: their losses equal next_file's within 1e-6."""
    load(checkpoint)
    assert optimizer.param_groups[0]["lr"] == 0.01, optimizer.param_groups[0]
    expected = [float(line) for line in open(next_file)]
    losses = [step(model, optimizer) for _ in range(2)]
    worst = max(abs(a - b) for a, b in zip(losses, expected))
    print(f"rank {dist.get_rank()}: continued the C++ checkpoint in Python: losses {losses}, C++'s {expected}")
    assert worst <= 1e-6, f"FAIL: Python's next steps differ from C++'s by {worst}"


def lightning_load(strategy, model, optimizer, folder):
    state = {"model": model, "optimizer": optimizer, "step": 0}
    rest = strategy.load_checkpoint(folder, state)
    assert state["step"] == 3 and rest == {}, (state["step"], rest)


def main():
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    if mode == "write":
        model, optimizer = interop(0, 0.01)
        write(model, optimizer, lambda folder: save_dcp(model, optimizer, folder), sys.argv[2])
    elif mode == "continue":
        model, optimizer = interop(7, 0.5)
        continue_from(model, optimizer, lambda folder: load_dcp(model, optimizer, folder), *sys.argv[2:4])
    elif mode == "lightning-write":
        model, optimizer, strategy = lightning_interop(0, 0.01)
        save = lambda folder: strategy.save_checkpoint(folder, {"model": model, "optimizer": optimizer, "step": 3})
        write(model, optimizer, save, sys.argv[2])
    elif mode == "lightning-continue":
        model, optimizer, strategy = lightning_interop(7, 0.5)
        continue_from(model, optimizer, lambda folder: lightning_load(strategy, model, optimizer, folder), *sys.argv[2:4])
    else:
        sys.exit("usage: python_dcp_peer.py write DIR | continue CK NEXT | lightning-write DIR | lightning-continue CK NEXT")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
