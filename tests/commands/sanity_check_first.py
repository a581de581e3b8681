"""A training script that runs a short sanity check in a subprocess before it trains: test material (issue 47).

    python tests/commands/sanity_check_first.py --batch-size 64

The check (this file with ``--sanity``) trains two steps at batch 2 in a process of its own and exits; the
script then trains ``--max-steps`` steps at ``--batch-size``. The helper steps with a real optimizer, so a
supervisor that counts every process that stepped as a rank waits for it forever. A small MLP; nothing of
isoprobe is imported.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def train(batch: int, steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        images, labels = torch.randn(batch, 3, 32, 32), torch.randint(10, (batch,))
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--sanity", action="store_true")
    args = p.parse_args()
    if args.sanity:
        train(2, 2)
        return
    subprocess.run([sys.executable, __file__, "--sanity"], check=True)
    train(args.batch_size, args.max_steps)
    print("done", flush=True)


if __name__ == "__main__":
    main()
