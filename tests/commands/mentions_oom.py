"""A script whose start-up note mentions ``torch.OutOfMemoryError`` and which later fails for another reason: test
material (issue 56, item 6, "messages that mislead").

    python tests/commands/mentions_oom.py --batch-size 8 --fail-at-step 2

As it starts it says, on stderr and on stdout, that it will catch ``torch.OutOfMemoryError`` (as a script with a
retry handler of its own announces it), trains a tiny linear model, and before optimizer step ``--fail-at-step``
(0: never) says why it stops (a missing checkpoint folder) and exits 1, or, with ``--silent``, exits 1 saying
nothing more. It never runs out of memory: a verdict of out of memory read the note, not how it ended. Nothing of
isoprobe is imported.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--fail-at-step", type=int, default=2)
    p.add_argument("--silent", action="store_true", help="exit 1 without a word of why")
    p.add_argument("--max-steps", type=int, default=1000)
    args = p.parse_args()
    note = "note: catching torch.OutOfMemoryError to retry at a smaller batch"
    print(note, flush=True)
    print(note, file=sys.stderr, flush=True)
    model = nn.Linear(32, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, args.max_steps + 1):
        if step == args.fail_at_step:
            if not args.silent:
                print("error: checkpoint folder /nonexistent/ckpt is not writable", file=sys.stderr, flush=True)
            sys.exit(1)
        model(torch.randn(args.batch_size, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}", flush=True)


if __name__ == "__main__":
    main()
