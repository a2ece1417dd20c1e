"""A Python Lightning Fabric program with no arguments to Fabric(): run under
`lightning-run model --accelerator cpu --devices 2 python3 python_fabric_ddp.py`, it must take its
accelerator, devices and ranks from the launcher's LT_* and torchrun variables, form a 2-rank DDP
group through the launcher's store, and average gradients."""
import lightning as L
import torch

fabric = L.Fabric()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
for step in range(3):
    x = torch.full((2, 4), float(fabric.global_rank + 1) * (step + 1))  # every rank its own batch
    optimizer.zero_grad()
    fabric.backward(model(x).sum())
    optimizer.step()
weights = fabric.all_gather(model.module.weight.detach())
equal = bool((weights[0] == weights[-1]).all())
# One process on the mean of the ranks' batches takes the same steps (gradients are averaged).
torch.manual_seed(0)
reference = torch.nn.Linear(4, 1)
sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(3):
    sgd.zero_grad()
    sum(reference(torch.full((2, 4), float(r + 1) * (step + 1))).sum() for r in range(fabric.world_size)).div(
        fabric.world_size).backward()
    sgd.step()
close = torch.allclose(model.module.weight.detach(), reference.weight.detach(), atol=1e-6)
print(f"rank {fabric.global_rank} of {fabric.world_size}: strategy {type(fabric.strategy).__name__}, "
      f"weights equal across ranks: {equal}, match the averaged reference: {close}")
if not (equal and close and fabric.world_size == 2):
    raise SystemExit("FAIL: the Python Fabric program did not train as one 2-rank DDP job")
