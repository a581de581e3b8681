"""A training script that sets torch's thread count before it imports torch: held-out test material (issue 55).

    python tests/commands/threads_first.py --batch-size 32 --max-steps 30

Its first lines set ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` to 2, as scripts do to pin their threads; torch
reads them once, when it is imported. Each torch thread then gets a scratch buffer of the batch (a per-thread
augmentation buffer, held for the whole run), so the memory a batch needs depends on the thread count being the
one set here: in a process that had imported torch before this file's first line (with the environment's
``OMP_NUM_THREADS=1``), every batch would need less, and the edge would be higher than this script's own.

A small MLP on synthetic, seeded data (each step's batch drawn from a generator seeded with the step), AdamW, a
plain loop until ``--max-steps``. With ``$HELDOUT_RECORD`` set, it appends one JSON line of what it saw at its
start (the batch, torch's threads, whether torch was loaded before its first line) to that file. Nothing of
isoprobe is imported. At the end it prints ``steps_run=N``.
"""

import os
import sys

TORCH_BEFORE = "torch" in sys.modules  # what this script's first line finds: never torch in a cold start
os.environ["OMP_NUM_THREADS"] = "2"
os.environ["MKL_NUM_THREADS"] = "2"

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Net(nn.Module):
    """A learned per-feature gain and bias over wide rows, a narrow projection of each row, then a small MLP:
    memory grows with the batch through the wide activations (1 MiB a sample each), the weights are small."""

    def __init__(self, rows: int, width: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.project = nn.Linear(width, 16)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(rows * 16, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.head(torch.relu(self.project(torch.tanh(x * self.gain + self.bias))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train a small MLP with torch's threads pinned before torch loads.")
    p.add_argument("--batch-size", type=int, default=32, help="samples per optimizer step")
    p.add_argument("--max-steps", type=int, default=100, help="stop after this many optimizer steps")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def record(entry: dict) -> None:
    path = os.environ.get("HELDOUT_RECORD")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(entry) + "\n")


def main(argv=None) -> None:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    record({"script": "threads_first", "pid": os.getpid(), "batch": args.batch_size, "threads": threads,
            "torch_before_first_line": TORCH_BEFORE})
    torch.manual_seed(args.seed)
    # A scratch copy of the batch for each of torch's threads, kept for the whole run.
    scratch = [torch.zeros(args.batch_size, args.rows, args.width) for _ in range(threads)]
    model = Net(args.rows, args.width, args.hidden, args.classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    while step < args.max_steps:
        g = torch.Generator().manual_seed(args.seed + step)
        x = torch.randn(args.batch_size, args.rows, args.width, generator=g)
        y = torch.randint(args.classes, (args.batch_size,), generator=g)
        for buffer in scratch:
            buffer.copy_(x)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0 or step == args.max_steps:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    print(f"steps_run={step}", flush=True)


if __name__ == "__main__":
    main()
