"""A timm-style training loop whose validation, every K steps, needs more memory than its training steps.

    python tests/commands/validates_every_k.py --batch-size 32 --max-steps 30 --eval-every 12

As timm's train.py and many research loops write it: AdamW on a small convnet, an EMA copy of the model (kept in
eval mode, updated after every optimizer step), and every ``--eval-every`` steps a validation pass of the EMA model
under ``torch.no_grad()`` at an eval batch ``--eval-factor`` times the training batch (eval batches are usually
larger: nothing is kept for a backward pass), collecting every logit for the metric. A batch that trains its
first steps can still run out of memory at the first validation: the job's edge is the whole cycle's.

Synthetic, seeded data (sample i from a generator seeded with i). Nothing of isoprobe is imported. At the end it
prints ``steps_run=N step_time_s=T`` as the other scripts of this folder do; each validation prints
``validated at step S``.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    def __init__(self, length: int, size: int, num_classes: int, offset: int = 0) -> None:
        self.length, self.size, self.num_classes, self.offset = length, size, num_classes, offset

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.offset + index)
        return torch.randn(3, self.size, self.size, generator=g), int(torch.randint(self.num_classes, (1,), generator=g))


class ConvNet(nn.Module):
    def __init__(self, num_classes: int, width: int) -> None:
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
    p = argparse.ArgumentParser(description="Train a small convnet with EMA validation every K steps.")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=12, help="validate the EMA model every K optimizer steps")
    p.add_argument("--eval-factor", type=int, default=4, help="eval batch = this times the training batch")
    p.add_argument("--eval-batches", type=int, default=2, help="validation batches per pass")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--ema-decay", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


@torch.no_grad()
def validate(model: nn.Module, loader: DataLoader, batches: int) -> float:
    logits, labels = [], []
    for index, (images, target) in enumerate(loader):
        if index >= batches:
            break
        logits.append(model(images))
        labels.append(target)
    return float((torch.cat(logits).argmax(1) == torch.cat(labels)).float().mean())


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    train = DataLoader(SyntheticImages(4096, args.image_size, args.num_classes), batch_size=args.batch_size,
                       shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(args.seed))
    val = DataLoader(SyntheticImages(4096, args.image_size, args.num_classes, offset=10**6),
                     batch_size=args.batch_size * args.eval_factor)
    model = ConvNet(args.num_classes, args.width)
    ema = copy.deepcopy(model).eval()
    for parameter in ema.parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    model.train()
    step, started = 0, None
    while step < args.max_steps:
        for images, labels in train:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for kept, live in zip(ema.parameters(), model.parameters()):
                    kept.mul_(args.ema_decay).add_(live, alpha=1 - args.ema_decay)
            step += 1
            if step == 1:
                started = time.perf_counter()
            if step % args.eval_every == 0:
                accuracy = validate(ema, val, args.eval_batches)
                print(f"validated at step {step}: accuracy {accuracy:.3f}", flush=True)
            if step >= args.max_steps:
                break
    per_step = (time.perf_counter() - started) / (step - 1) if step > 1 else float("nan")
    print(f"steps_run={step} step_time_s={per_step:.3f}", flush=True)


if __name__ == "__main__":
    main()
