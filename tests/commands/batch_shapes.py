"""A training script that trains at the batch it is given, in one of the shapes real scripts feed their models:
test material for the batch check (``isoprobe.report.batch_check``, issue 56).

    python tests/commands/batch_shapes.py --mode views --batch-size 16
    python tests/commands/batch_shapes.py --mode packed --batch-size 16

``views``: two augmented views of each sample in one forward ([2B, 3, 28, 28], contrastive learning); ``images``:
a detection-style model given a list of B images; ``micro``: micro-batches of 2 summed into one optimizer step;
``packed``: B sequences of 24 to 72 tokens packed into one row ([1, tokens], no offsets: the check cannot tell,
and answers); ``first_only``: the first step at B, every later one at 8 (a warm-up at the batch given, then the
script's own). Activations of about 0.2 MiB a sample (a 32-channel convolution at 28x28; 256-wide tokens), so a
1 GiB cap runs out in the low thousands. ``--max-steps`` ends it (a job's own run). Nothing of isoprobe is
imported.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn as nn


class Pixels(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, images):
        if isinstance(images, (list, tuple)):
            images = torch.stack(list(images))
        return self.head(self.conv(images).mean(dim=(2, 3)))


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 256)
        self.mix = nn.Linear(256, 256)

    def forward(self, ids):
        return self.mix(self.embed(ids)).pow(2).mean()


def step_input(mode: str, batch: int, step: int, rng: random.Random):
    if mode == "views":
        x = torch.randn(batch, 3, 28, 28)
        return torch.cat([x, x.flip(3)])
    if mode == "images":
        return [torch.randn(3, 28, 28) for _ in range(batch)]
    if mode == "packed":
        return torch.randint(1000, (1, sum(rng.randint(24, 72) for _ in range(batch))))
    if mode == "first_only":
        return torch.randn(batch if step == 0 else 8, 3, 28, 28)
    raise ValueError(mode)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("views", "images", "micro", "packed", "first_only"), required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--max-steps", type=int, default=1000)
    args = p.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Tokens() if args.mode == "packed" else Pixels()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.max_steps):
        optimizer.zero_grad(set_to_none=True)
        if args.mode == "micro":
            for _ in range(max(1, args.batch_size // 2)):
                model(torch.randn(2, 3, 28, 28)).sum().backward()
        else:
            output = model(step_input(args.mode, args.batch_size, step, rng))
            output.sum().backward()
        optimizer.step()
    print("done", flush=True)


if __name__ == "__main__":
    main()
