"""A script that trains without a ``torch.optim.Optimizer``: a hand-written update, forever.

    python tests/commands/never_steps.py --batch-size 8

Mirrors the textbook "SGD from scratch" loop (``with torch.no_grad(): p -= lr * p.grad``, here
``p.data -= lr * p.grad``), which no optimizer step hook can see. It never stops on its own unless
``--max-steps`` is given (default: run forever); a probe must time it out and say that no optimizer
step was seen. ``--sleep`` (default 0.05 s per update) keeps it from taking a whole core on a shared
machine. Nothing of isoprobe is imported.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description="Hand-written SGD updates, no torch optimizer (test material).")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=0, help="0: run forever (the default)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds to wait after each update")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    g = torch.Generator().manual_seed(0)
    steps = itertools.count(1) if args.max_steps <= 0 else range(1, args.max_steps + 1)
    for step in steps:
        x = torch.randn(args.batch_size, 64, generator=g)
        y = torch.randint(10, (args.batch_size,), generator=g)
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.data -= args.lr * p.grad
        if step % 100 == 0:
            print(f"update {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
