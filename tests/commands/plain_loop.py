"""A plain PyTorch training script, as the PyTorch tutorials and most research code write it.

    python tests/commands/plain_loop.py --batch-size 32 --max-steps 30

Mirrors the everyday idiom: ``argparse`` flags, a ``Dataset`` + ``DataLoader`` with two worker
processes, a small convnet, AdamW, ``clip_grad_norm_`` and a plain ``for`` loop calling
``optimizer.step()`` until ``--max-steps``. The data are synthetic and seeded (each sample is drawn
from a generator seeded with its index), so every run sees the same batches.

Memory grows with the batch through the activations: full-resolution 96x96 feature maps with 16
channels (about 0.6 MiB per map per sample, several kept for backward), while the weights are tiny.
Nothing of isoprobe is imported: this is test material for probing a command as it is.
At the end it prints ``steps_run=N step_time_s=T`` (T: mean seconds per step after the first).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Deterministic images and labels: sample i comes from a generator seeded with i."""

    def __init__(self, length: int, size: int, num_classes: int) -> None:
        self.length, self.size, self.num_classes = length, size, num_classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        image = torch.randn(3, self.size, self.size, generator=g)
        label = int(torch.randint(self.num_classes, (1,), generator=g))
        return image, label


class ConvNet(nn.Module):
    def __init__(self, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train a small convnet on synthetic images.")
    p.add_argument("--batch-size", type=int, default=32, help="samples per optimizer step")
    p.add_argument("--max-steps", type=int, default=100, help="stop after this many optimizer steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--width", type=int, default=16, help="channels of the first conv layers")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--dataset-size", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    dataset = SyntheticImages(args.dataset_size, args.image_size, args.num_classes)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        drop_last=True, persistent_workers=args.num_workers > 0,
                        generator=torch.Generator().manual_seed(args.seed))
    model = ConvNet(args.num_classes, args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    model.train()

    step, started = 0, None
    while step < args.max_steps:
        for images, labels in loader:
            optimizer.zero_grad(set_to_none=True)
            outputs = model(images)
            loss = F.cross_entropy(outputs, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()
            step += 1
            if step == 1:
                started = time.perf_counter()
            if step % 10 == 0 or step == args.max_steps:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= args.max_steps:
                break
    per_step = (time.perf_counter() - started) / (step - 1) if step > 1 else float("nan")
    print(f"steps_run={step} step_time_s={per_step:.3f}", flush=True)


if __name__ == "__main__":
    main()
