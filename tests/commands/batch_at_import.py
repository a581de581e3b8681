"""A training script whose batch comes from a configuration module that reads the environment at import:
held-out test material (issue 55).

    ISOPROBE_BATCH_SIZE=32 python tests/commands/batch_at_import.py --max-steps 30

The batch is ``batch_env_module.BATCH_SIZE``: ``$ISOPROBE_BATCH_SIZE`` as the module found it when it was imported
(its default 16 without it); ``--batch-size`` overrides it when given. Probed with ``batch_from: env`` and no
placeholder, so the environment is the only way the batch reaches it: in a process that had imported the module
before the batch was in its environment, every trial would train at 16.

A small MLP on synthetic, seeded data (each step's batch drawn from a generator seeded with the step), AdamW, a
plain loop until ``--max-steps``. With ``$HELDOUT_RECORD`` set, it appends one JSON line of what it saw at its
start (the batch it trains at, what the module read, the variable now, whether the module was loaded before its
first line) to that file. Nothing of isoprobe is imported. At the end it prints ``steps_run=N``.
"""

import os
import sys

MODULE_BEFORE = "batch_env_module" in sys.modules  # what this script's first line finds: never in a cold start

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import batch_env_module as config  # noqa: E402  - this folder is sys.path[0]: the script's own module


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
    p = argparse.ArgumentParser(description="Train a small MLP at the batch its configuration module read.")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per optimizer step (default: batch_env_module.BATCH_SIZE, read at its import)")
    p.add_argument("--max-steps", type=int, default=100, help="stop after this many optimizer steps")
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
    batch = args.batch_size if args.batch_size is not None else config.BATCH_SIZE
    record({"script": "batch_at_import", "pid": os.getpid(), "batch": batch,
            "module_read": config.FROM_ENVIRONMENT, "env_now": os.environ.get("ISOPROBE_BATCH_SIZE"),
            "module_before_first_line": MODULE_BEFORE})
    torch.manual_seed(args.seed)
    model = Net(config.ROWS, config.WIDTH, config.HIDDEN, config.CLASSES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    while step < args.max_steps:
        g = torch.Generator().manual_seed(args.seed + step)
        x = torch.randn(batch, config.ROWS, config.WIDTH, generator=g)
        y = torch.randint(config.CLASSES, (batch,), generator=g)
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
