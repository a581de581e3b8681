"""A script for torchrun one of whose ranks stops stepping while the others go on: test material (issue 56, item 6,
"messages that mislead").

    torchrun --standalone --nproc-per-node 2 tests/commands/ranks_apart.py --batch-size 4 --mode hang --at-step 2

Each rank prints ``rank R step K`` on stdout and on stderr after each optimizer step. Rank ``--rank`` (1 by
default), before its optimizer step ``--at-step`` (1: before its first):

- ``hang``: says on stderr that it waits for its data and sleeps for good; its peers train a DistributedDataParallel
  model (gloo) and wait for it in the gradients' all-reduce: the trial times out, and the hung rank is the one
  whose steps lag;
- ``no-step``: says on stderr that it has nothing to train and exits 0; its peers train a model of their own (no
  collective) for ``--max-steps`` steps and exit 0.

A tiny linear model; nothing of isoprobe is imported.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--mode", choices=("hang", "no-step"), default="hang")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at-step", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=1000)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Linear(32, 4)
    if args.mode == "hang":
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, args.max_steps + 1):
        if rank == args.rank and step == args.at_step:
            if args.mode == "hang":
                print(f"rank {rank}: waiting for the data server", file=sys.stderr, flush=True)
                time.sleep(3600)
            print(f"rank {rank}: nothing to train on this rank", file=sys.stderr, flush=True)
            return
        model(torch.randn(args.batch_size, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} step {step}", flush=True)
        print(f"rank {rank} step {step}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
