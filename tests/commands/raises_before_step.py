"""A script that fails in its own setup, before any optimizer step: the everyday "bad config" crash.

    python tests/commands/raises_before_step.py --batch-size 8 --max-steps 5

Mirrors the common pattern of validating the data against the model after ``import torch`` and
after building both: here the synthetic data have 4 channels and the model expects 3, so the script
raises ``ValueError`` (exit code 1, traceback on stderr) whatever the batch. Nothing of isoprobe is
imported.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def main() -> None:
    parser = argparse.ArgumentParser(description="Fails in setup with a ValueError (test material).")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images = torch.randn(args.batch_size, 4, 32, 32)
    expected = model[0].in_channels
    if images.shape[1] != expected:
        raise ValueError(f"the data have {images.shape[1]} channels but the model expects {expected}: "
                         "check --data-format")
    for _ in range(args.max_steps):  # never reached
        optimizer.zero_grad()
        model(images).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
