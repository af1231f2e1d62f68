"""Tensor basics on the "neuron" device: create, compute, move, print, read back.

The first thing to run after installing OpenNeuron; each step mirrors what one does with "cuda".
Not a test (tests/python/ checks these behaviours); 02_train_mlp.py is the next example.
"""

import argparse

import torch

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="neuron")
device = torch.device(parser.parse_args().device)
dev = torch.get_device_module(device)

if hasattr(dev, "device_count"):
    print(f"{device.type}: {dev.device_count()} device(s), current {dev.current_device()}")

# Create directly on the device, or on the host and move it.
a = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
b = torch.ones(2, 3).to(device)
print("a =", a)
print("a.device:", a.device, "| shape", tuple(a.shape), "|", a.dtype)

# Ops run on the device (asynchronously); printing or .item() waits for the result.
c = a * 2 + b
print("a * 2 + b =", c)
print("sum as a Python float:", c.sum().item())
print("matmul a @ a.T =", a @ a.T)

# Views share device memory, just as on a GPU.
row = c[1]
row.zero_()
print("after c[1].zero_(): c =", c)

# Back to the host: .cpu(), .tolist(), numpy.
print("c.cpu():", c.cpu(), "| tolist:", c.tolist(), "| numpy:", c.cpu().numpy().tolist())

# Random numbers come from the device's own generator; manual_seed makes them repeatable.
torch.manual_seed(0)
r1 = torch.rand(3, device=device)
torch.manual_seed(0)
r2 = torch.rand(3, device=device)
print("same seed, same numbers:", torch.equal(r1, r2))

# Everything enqueued so far has finished after synchronize().
dev.synchronize()
if hasattr(dev, "memory_allocated"):
    print(f"device memory in use: {dev.memory_allocated(device)} bytes")
