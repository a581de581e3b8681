"""A held-out convnet in a Hugging Face Trainer, for the long-run survival check (benchmarks/long_run_survival.py).

Not used by any test and not tuned to isoprobe: a user's small image classifier (three conv blocks with
batch norm, global pooling, a linear head) trained by ``transformers.Trainer`` on random 3x64x64 images,
the same ones every run. ``build_trainer`` is what ``model.hf_trainer`` names.
"""

from __future__ import annotations

import tempfile

import torch
import transformers
from torch import nn
from torch.utils.data import Dataset


class Images(Dataset):
    def __init__(self, samples: int, size: int, classes: int):
        self.samples, self.size, self.classes = samples, size, classes

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        return {"pixel_values": torch.randn(3, self.size, self.size, generator=generator),
                "labels": int(torch.randint(0, self.classes, (1,), generator=generator))}


class ConvNet(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, pixel_values=None, labels=None):
        logits = self.head(self.features(pixel_values).mean(dim=(2, 3)))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def build_trainer(batch_size: int, width: int = 32, size: int = 64, samples: int = 4096):
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="heldout-convnet-"), per_device_train_batch_size=batch_size,
        learning_rate=1e-3, report_to="none", save_strategy="no", logging_steps=10, seed=0,
    )
    return transformers.Trainer(model=ConvNet(width), args=args, train_dataset=Images(samples, size, 10))
