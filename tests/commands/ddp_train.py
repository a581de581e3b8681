"""A DistributedDataParallel script for torchrun, as the PyTorch DDP tutorial and its examples write it.

    torchrun --standalone --nproc-per-node 2 tests/commands/ddp_train.py --batch-size 32 --max-steps 30

Mirrors the DDP idiom: torchrun sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the script calls
``init_process_group`` (gloo: CPU), wraps the model in ``DistributedDataParallel``, shards the data
with a ``DistributedSampler`` (``set_epoch`` each epoch), and steps SGD with momentum in a plain loop.
``--batch-size`` is the per-rank batch (the global batch is ``world_size`` times it), as in the
tutorial. The data are synthetic and seeded by sample index, so every run sees the same batches.

Memory per rank grows with the batch through the activations of a small convnet at 96x96 resolution.
Nothing of isoprobe is imported. At the end each rank prints
``rank=R steps_run=N step_time_s=T`` (T: mean seconds per step after the first).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticImages(Dataset):
    def __init__(self, length: int, size: int, num_classes: int) -> None:
        self.length, self.size, self.num_classes = length, size, num_classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, self.size, self.size, generator=g), int(torch.randint(self.num_classes, (1,), generator=g))


def make_model(num_classes: int, width: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=False),
        nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, num_classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP training of a small convnet on synthetic images (CPU, gloo).")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--max-steps", type=int, default=100, help="stop after this many optimizer steps")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--dataset-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)

    dataset = SyntheticImages(args.dataset_size, args.image_size, num_classes=10)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                        drop_last=True)
    model = DDP(make_model(10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    step, epoch, started = 0, 0, None
    while step < args.max_steps:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step == 1:
                started = time.perf_counter()
            if rank == 0 and (step % 10 == 0 or step == args.max_steps):
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= args.max_steps:
                break
        epoch += 1
    per_step = (time.perf_counter() - started) / (step - 1) if step > 1 else float("nan")
    print(f"rank={rank} steps_run={step} step_time_s={per_step:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
