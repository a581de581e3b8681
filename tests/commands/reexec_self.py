"""A training script that re-executes itself once at its top: held-out test material (issue 55).

    python tests/commands/reexec_self.py --batch-size 32 --max-steps 30

Its first lines fix the hash seed for the run, which Python reads only when it starts: if ``REEXEC_SELF_DONE`` is
not set, it sets it and ``PYTHONHASHSEED=0`` and replaces itself (``os.execv``) with a fresh interpreter running
the same script and arguments. The same process (the same PID) then runs the script again from its first line,
and trains. Whatever a process had loaded before this file's first line is gone after the exec; what it had
reported of itself (a step, a hello) came from an image that no longer exists.

A small MLP on synthetic, seeded data (each step's batch drawn from a generator seeded with the step), AdamW, a
plain loop until ``--max-steps``. With ``$HELDOUT_RECORD`` set, each image appends one JSON line to that file (the
first before its exec, the second before it trains: the PID, the stage, the batch, the modules loaded before the
first line). Nothing of isoprobe is imported. At the end it prints ``steps_run=N``.
"""

import os
import sys

TORCH_BEFORE = "torch" in sys.modules  # what this image's first line finds: never torch in a cold start


def record(entry: dict) -> None:
    path = os.environ.get("HELDOUT_RECORD")
    if path:
        import json

        with open(path, "a") as handle:
            handle.write(json.dumps(entry) + "\n")


if os.environ.get("REEXEC_SELF_DONE") != "1":
    record({"script": "reexec_self", "stage": "before_exec", "pid": os.getpid(), "argv": sys.argv[1:],
            "torch_before_first_line": TORCH_BEFORE})
    os.environ["REEXEC_SELF_DONE"] = "1"
    os.environ["PYTHONHASHSEED"] = "0"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable] + sys.argv)

import argparse  # noqa: E402

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
    p = argparse.ArgumentParser(description="Train a small MLP after re-executing itself with a fixed hash seed.")
    p.add_argument("--batch-size", type=int, default=32, help="samples per optimizer step")
    p.add_argument("--max-steps", type=int, default=100, help="stop after this many optimizer steps")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    record({"script": "reexec_self", "stage": "after_exec", "pid": os.getpid(), "batch": args.batch_size,
            "hash_seed": os.environ.get("PYTHONHASHSEED"), "torch_before_first_line": TORCH_BEFORE})
    torch.manual_seed(args.seed)
    model = Net(args.rows, args.width, args.hidden, args.classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    while step < args.max_steps:
        g = torch.Generator().manual_seed(args.seed + step)
        x = torch.randn(args.batch_size, args.rows, args.width, generator=g)
        y = torch.randint(args.classes, (args.batch_size,), generator=g)
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
