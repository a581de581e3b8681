"""A script that ends on its own after one optimizer step, exit code 0: its data are shorter than asked.

    python tests/commands/exits_early.py --batch-size 8 --max-steps 30

Mirrors the common loop ``for epoch in range(epochs): for batch in loader: ...`` with one epoch over
a dataset that holds exactly one batch (``--batch-size`` samples, ``drop_last=True``): whatever
``--max-steps`` says, it makes one optimizer step, prints ``steps_run=1`` and exits 0. A trial that
needs more steps must call this an error, never a fit. Nothing of isoprobe is imported.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description="Stops after one step: the data hold one batch (test material).")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(args.batch_size, 3, 32, 32, generator=g),
                         torch.randint(10, (args.batch_size,), generator=g))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False, drop_last=True)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    for _ in range(args.epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            step += 1
            if step >= args.max_steps:
                break
    print(f"steps_run={step}", flush=True)


if __name__ == "__main__":
    main()
