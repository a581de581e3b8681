"""A DDP script (gloo) one of whose ranks is killed by a signal mid-training: test material (issue 47).

    torchrun --standalone --nproc-per-node 2 tests/commands/killed_rank.py --batch-size 4 --kill-with KILL --at-step 1

Rank ``--rank`` (1 by default) sends itself ``--kill-with`` before optimizer step ``--at-step`` (0: before its
first), as the kernel's OOM killer or a crash in native code would end it: no exception, no last words. Its peer then
fails in a collective with gloo's "Connection reset by peer". A tiny linear model; nothing of isoprobe imported.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--kill-with", default="KILL", help="the signal, without SIG")
    p.add_argument("--at-step", type=int, default=1)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=1000)
    args = p.parse_args()
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.max_steps):
        if step == args.at_step and dist.get_rank() == args.rank:
            os.kill(os.getpid(), getattr(signal, f"SIG{args.kill_with}"))
        model(torch.randn(args.batch_size, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
