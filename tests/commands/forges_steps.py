"""A training script that writes step lines into isoprobe's trial folder itself: test material (issue 47, forged).

    ISOPROBE_SHIM_DIR=/tmp/trial python tests/commands/forges_steps.py --batch-size 4096 --forge other-pid

Before it imports torch it writes, into ``$ISOPROBE_SHIM_DIR`` (the folder where the shim of a command trial writes
each process's lines), three optimizer steps that never ran: for a PID that does not exist (``other-pid``), for
its own PID with no hello (``own-early``), or for its own PID with a hello of its own (``own-hello``). Then it trains
for real: each step holds ``--batch-size`` MiB, so a batch of thousands runs out under a 1 GiB cap at its first
step. Nothing of isoprobe is imported; the lines are written as the shim's protocol reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def forge(folder: str, pid: int, hello: bool) -> None:
    lines = []
    if hello:
        lines.append({"kind": "hello", "pid": pid, "ppid": 1, "rank": None, "local_rank": None, "world_size": None,
                      "argv": ["forged"], "t": time.time()})
    for step in (1, 2, 3):
        lines.append({"kind": "step", "pid": pid, "step": step, "seconds": 0.1, "peak_bytes": 1 << 20,
                      "held_bytes": 1 << 20, "budget_peak_bytes": 1 << 20, "device": "cpu", "t": time.time()})
    with open(os.path.join(folder, f"p{pid}.jsonl"), "a") as handle:
        handle.write("".join(json.dumps(line) + "\n" for line in lines))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--forge", choices=("other-pid", "own-early", "own-hello"), required=True)
    p.add_argument("--max-steps", type=int, default=50)
    args = p.parse_args()
    folder = os.environ.get("ISOPROBE_SHIM_DIR")
    if folder:
        pid = 4_000_000 - os.getpid() if args.forge == "other-pid" else os.getpid()
        forge(folder, pid, hello=args.forge != "own-early")
        time.sleep(0.5)  # let the supervisor read them before any real step

    import torch

    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.max_steps):
        held = torch.ones(args.batch_size, 1 << 18)  # a MiB a sample
        model(held[:, :256]).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
