"""A training script that vendors a fork of an installed package first on ``sys.path``: held-out test material
(issue 55).

    python tests/commands/vendored_first.py --batch-size 32 --max-steps 30

Its first lines put ``vendored/`` (next to this file) first on ``sys.path`` and then import ``tqdm`` from there: a
fork of the ``tqdm`` installed in the environment, whose progress bar keeps the last few batches it yielded (see
``vendored/tqdm/__init__.py``). So each batch needs more memory than with the installed ``tqdm``: in a process that
had imported the installed ``tqdm`` before this file's first line, ``sys.modules`` would answer the import with it,
and the edge would be higher than this script's own.

A small MLP on synthetic, seeded data (each step's batch drawn from a generator seeded with the step), looped over
through the progress bar, AdamW, until ``--max-steps``. With ``$HELDOUT_RECORD`` set, it appends one JSON line of
what it saw at its start (the batch, the file ``tqdm`` came from, whether ``tqdm`` was loaded before its first
line) to that file. Nothing of isoprobe is imported. At the end it prints ``steps_run=N``.
"""

import os
import sys

TQDM_BEFORE = "tqdm" in sys.modules  # what this script's first line finds: never tqdm in a cold start
VENDORED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendored")
sys.path.insert(0, VENDORED)

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import tqdm as tqdm_package  # noqa: E402
from tqdm import tqdm  # noqa: E402


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
    p = argparse.ArgumentParser(description="Train a small MLP, its progress shown by a vendored tqdm.")
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


def batches(args):
    """Seeded synthetic batches, one per step, for ever: the loop stops at --max-steps."""
    step = 0
    while True:
        g = torch.Generator().manual_seed(args.seed + step)
        yield (torch.randn(args.batch_size, args.rows, args.width, generator=g),
               torch.randint(args.classes, (args.batch_size,), generator=g))
        step += 1


def main(argv=None) -> None:
    args = parse_args(argv)
    record({"script": "vendored_first", "pid": os.getpid(), "batch": args.batch_size,
            "tqdm_file": os.path.abspath(tqdm_package.__file__), "tqdm_version": tqdm_package.__version__,
            "vendored_dir": VENDORED, "tqdm_before_first_line": TQDM_BEFORE})
    torch.manual_seed(args.seed)
    model = Net(args.rows, args.width, args.hidden, args.classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    progress = tqdm(batches(args), desc="train", total=args.max_steps, mininterval=30)
    for x, y in progress:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:
            progress.set_postfix(loss=f"{loss.item():.4f}")
        if step >= args.max_steps:
            break
    progress.close()
    print(f"steps_run={step}", flush=True)


if __name__ == "__main__":
    main()
