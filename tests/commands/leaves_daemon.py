"""A script that leaves processes behind: DataLoader workers and a daemon of its own.

    python tests/commands/leaves_daemon.py --batch-size 8 --max-steps 5

Mirrors scripts that start a helper at start-up (a metrics agent, a data server, a TensorBoard) with
``subprocess.Popen([...], start_new_session=True)`` and never stop it, and that train with a
``DataLoader`` of two persistent workers. Here the helper is ``sleep 600`` in a session of its own,
so killing the script's process group does not reach it: only a containment that follows every
descendant does. It trains normally with AdamW until ``--max-steps``, prints
``daemon_pid=P`` at start and ``steps_run=N`` at the end, and exits 0 with the daemon still running.
Nothing of isoprobe is imported.
"""

from __future__ import annotations

import argparse
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, 32, 32, generator=g), int(torch.randint(10, (1,), generator=g))


def main() -> None:
    parser = argparse.ArgumentParser(description="Trains normally but leaves a daemon behind (test material).")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args()

    daemon = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"daemon_pid={daemon.pid}", flush=True)

    torch.manual_seed(0)
    loader = DataLoader(Synthetic(), batch_size=args.batch_size, shuffle=True, num_workers=2,
                        persistent_workers=True, drop_last=True)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.max_steps:
        for images, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            step += 1
            if step >= args.max_steps:
                break
    print(f"steps_run={step}", flush=True)


if __name__ == "__main__":
    main()
