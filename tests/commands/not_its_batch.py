"""A training script that does not train at the batch it is given: test material for ``child.command_trial.trained_batch``.

    python tests/commands/not_its_batch.py --mode fixed --batch-size 512
    python tests/commands/not_its_batch.py --mode halving --batch-size 4096
    python tests/commands/not_its_batch.py --mode accelerate --batch-size 4096

``fixed`` ignores ``--batch-size`` and trains 24 samples a step (a hard-coded batch); ``halving`` starts at
``--batch-size`` and halves it whenever a step runs out of memory, catching the error (the hand-written finder of
many research scripts); ``accelerate`` does the same with Accelerate's ``find_executable_batch_size`` (which
retries at 90 % of the batch). Each then trains ``--max-steps`` steps at the batch it settled on. An MLP on
3x64x64 inputs: activations of about 1 MiB a sample, so a 1 GiB cap runs out in the hundreds. Nothing of isoprobe
is imported.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

FIXED_BATCH = 24


def build_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 256), nn.ReLU(), nn.Linear(256, 10))


def train(model, optimizer, batch: int, steps: int) -> None:
    for _ in range(steps):
        images = torch.randn(batch, 3, 64, 64)
        images = images * 1.0 + 0.0  # a second copy of the input: more memory per sample, like augmentations
        labels = torch.randint(10, (batch,))
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()


def out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "out of memory" in str(exc)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("fixed", "halving", "accelerate"), required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--max-steps", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.mode == "fixed":
        train(model, optimizer, FIXED_BATCH, args.max_steps)
    elif args.mode == "halving":
        batch = args.batch_size
        while batch >= 1:
            try:
                train(model, optimizer, batch, 1)
                break
            except (RuntimeError, MemoryError) as exc:
                if not out_of_memory(exc):
                    raise
                batch //= 2
        print(f"settled on batch {batch}", flush=True)
        train(model, optimizer, batch, args.max_steps)
    else:
        from accelerate.utils import find_executable_batch_size

        @find_executable_batch_size(starting_batch_size=args.batch_size)
        def loop(batch_size):
            train(model, optimizer, batch_size, 1)
            print(f"settled on batch {batch_size}", flush=True)
            train(model, optimizer, batch_size, args.max_steps)

        loop()
    print("done", flush=True)


if __name__ == "__main__":
    main()
