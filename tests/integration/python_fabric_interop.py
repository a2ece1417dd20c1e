"""Python Lightning Fabric's side of the checkpoint interop test (python_fabric_interop.sh).

  continue CKPT AFTER   fabric.load a C++ checkpoint (model, Adam, step) into the same model,
                        take one step, compare with the C++ run's own next step (AFTER)
  write CKPT AFTER      train 3 steps, fabric.save (model, Adam, step), take one more step and
                        save the weights to AFTER, for the C++ side to compare with

The model, optimizer and batch mirror checkpoint_tool.cpp's interop mode.
"""
import sys

import lightning as L
import torch


def interop_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def interop_step(model, optimizer):
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    y = x[:, :2] * 0.5 + 0.1
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    fabric.backward(loss)
    optimizer.step()


mode, checkpoint, after = sys.argv[1:4]
fabric = L.Fabric(accelerator="cpu", devices=1)
model = interop_model()
optimizer = torch.optim.Adam(model.parameters(), lr=0.5 if mode == "continue" else 0.01)
model, optimizer = fabric.setup(model, optimizer)
if mode == "continue":
    rest = fabric.load(checkpoint, {"model": model, "optimizer": optimizer})
    assert rest == {"step": 3}, rest
    assert optimizer.param_groups[0]["lr"] == 0.01, optimizer.param_groups[0]
    interop_step(model, optimizer)
    expected = torch.load(after)["model"]
    worst = max((p - expected[name]).abs().max().item() for name, p in model.module.named_parameters())
    print("continued the C++ checkpoint in Python Fabric: one more step differs by", worst)
    assert worst <= 1e-6, "FAIL: Python's next step differs from C++'s"
elif mode == "write":
    for _ in range(3):
        interop_step(model, optimizer)
    fabric.save(checkpoint, {"model": model, "optimizer": optimizer, "step": 3})
    interop_step(model, optimizer)
    fabric.save(after, {"model": model})
    print("Python Fabric wrote its checkpoint")
else:
    sys.exit("usage: python_fabric_interop.py continue|write CKPT AFTER")
