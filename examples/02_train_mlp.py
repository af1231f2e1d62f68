"""Train a tiny MLP classifier on "neuron": two interleaved spirals, SGD with momentum.

The smallest complete training loop (model.to(device), loss.backward(), opt.step()); the data is
generated here. Next: 03_train_gpt.py trains a transformer on text.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn


def spirals(n: int, generator: torch.Generator):
    """n points per class on two noisy interleaved spirals; returns (x [2n, 2], labels [2n])."""
    t = torch.rand(n, generator=generator) * 3 * math.pi + 0.5
    arm = torch.stack([t * torch.cos(t), t * torch.sin(t)], dim=1) / (3 * math.pi)
    noise = 0.03 * torch.randn(2 * n, 2, generator=generator)
    x = torch.cat([arm, -arm]) + noise
    return x, torch.cat([torch.zeros(n), torch.ones(n)]).long()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)

    x, y = spirals(500, torch.Generator().manual_seed(0))
    x, y = x.to(device), y.to(device)
    model = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)

    for step in range(args.steps + 1):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % (args.steps // 5) == 0:
            acc = (logits.argmax(dim=1) == y).float().mean()
            print(f"step {step:5d}  loss {loss.item():.4f}  accuracy {acc.item():.1%}")


if __name__ == "__main__":
    main()
