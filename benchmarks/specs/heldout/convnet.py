"""The held-out convnet, defined once: the model, its data, its optimizer and its training step (torch only).

A user's small image classifier, not tuned to isoprobe: three conv blocks with batch norm, global pooling
and a linear head, trained on random 3xSIZExSIZE images (the same ones every run: each sample is seeded by
its index) with 10 classes, by fused AdamW at lr 1e-3 without weight decay and gradient clipping to norm
1.0 (what a Hugging Face Trainer does by default). ``benchmarks/studies/peers.py`` runs it three ways, each the
same model, data, optimizer and clipping:

- a plain PyTorch loop: ``build`` (``model.factory``), ``batch`` (``model.batch``) and ``train_step``
  (``model.step``) in ``convnet-plain.yaml`` for isoprobe, and ``train`` (a DataLoader over ``Images`` and
  the same ``train_step``) for Accelerate's ``find_executable_batch_size`` and the plain loop's true edge;
- a LightningModule: ``convnet_lightning.py`` (``model.lightning``, ``convnet-lightning.yaml``);
- a Hugging Face Trainer: ``convnet_trainer.py:build_trainer`` (``model.hf_trainer``).

This file imports torch only, so that the plain loop pays for no framework's import (under the CPU cap
the imports take part of the memory).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

#: The images' side in pixels, for every framing (the Hugging Face one through ``convnet_trainer.build_peers_trainer``):
#: chosen so that the edge under peers.py's 1.25 GiB cap is a few tens of samples.
SIZE = 112
#: Samples in the dataset every framing draws its batches from.
SAMPLES = 4096
CLASSES = 10
#: The optimizer the Hugging Face Trainer builds by default (``adamw_torch_fused``, weight decay 0.0) at lr 1e-3.
LEARNING_RATE = 1e-3
#: The Trainer's default ``max_grad_norm``.
MAX_GRAD_NORM = 1.0


class Images(Dataset):
    """Random images, each seeded by its index (the same sample on every read, in every process)."""

    def __init__(self, samples: int, size: int, classes: int = CLASSES):
        self.samples, self.size, self.classes = samples, size, classes

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        return {"pixel_values": torch.randn(3, self.size, self.size, generator=generator),
                "labels": int(torch.randint(0, self.classes, (1,), generator=generator))}


class ConvNet(nn.Module):
    def __init__(self, width: int = 32, classes: int = CLASSES):
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


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """The Trainer's default optimizer, as the plain loop and the LightningModule build it."""
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0, fused=True)


# --- the plain loop, as isoprobe's spec names it (model.factory, model.batch, model.step) ---

def build(width: int = 32) -> nn.Module:
    """``model.factory``: the model."""
    return ConvNet(width)


def batch(batch_size: int, device):
    """``model.batch``: ``(images, labels)`` as the plain loop's DataLoader collates them (float32
    ``batch_size x 3 x SIZE x SIZE``, int64 ``batch_size``), which is all that memory depends on. Made by torch
    operations alone, not read from ``Images``: isoprobe's estimate calls this on fake tensors, where reading a
    sample (``int()`` of a tensor) cannot be traced and would leave the search without an estimate."""
    return (torch.randn(batch_size, 3, SIZE, SIZE, device=device),
            torch.randint(0, CLASSES, (batch_size,), device=device))


def train_step(model, optimizer, batch, device) -> None:
    """``model.step`` and the plain loop's step: forward, the model's own loss, backward, clipping, AdamW."""
    inputs, labels = batch
    optimizer.zero_grad(set_to_none=True)
    loss = model(pixel_values=inputs.to(device), labels=labels.to(device))["loss"]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()


def train(batch_size: int, steps: int, width: int = 32) -> int:
    """The plain PyTorch loop a user writes: model, optimizer, a shuffling DataLoader over ``Images``, ``steps``
    steps of ``train_step``. Returns the steps run."""
    model = ConvNet(width)
    model.train()
    adamw = optimizer(model)
    loader = DataLoader(Images(SAMPLES, SIZE), batch_size=batch_size, shuffle=True)
    done = 0
    while done < steps:
        for sample in loader:
            train_step(model, adamw, (sample["pixel_values"], sample["labels"]), "cpu")
            done += 1
            if done == steps:
                break
    return done
