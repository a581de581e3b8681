"""A training script whose own module is edited while a probe runs it (issue 55: never an answer mixed from two
versions). Its second run (a counter file beside it) appends a line to ``edited_module.py``, as a user saving an
edit between two trials would; the first run and every run from the third on leave it alone.

    python edits_its_module.py --batch-size 8 --max-steps 100

Copied into a test's own folder first (it edits the file beside it). Nothing of isoprobe is imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import edited_module

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-steps", type=int, default=100)
    args = parser.parse_args()
    counter = HERE / "runs"
    runs = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(runs))
    model = edited_module.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.max_steps):
        optimizer.zero_grad()
        model(torch.randn(args.batch_size, 256)).sum().backward()
        optimizer.step()
        if step == 0 and runs == 2:
            with open(HERE / "edited_module.py", "a") as module:
                module.write("# edited while the probe ran\n")


if __name__ == "__main__":
    main()
