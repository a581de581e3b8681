"""Factories referenced by the bad specs next to this file."""

from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(4, 2)


def raising_model() -> nn.Module:
    raise RuntimeError("this factory is broken on purpose")


def train_step(model, optimizer, batch, device):
    """A model.step that the bad specs pair with options it cannot take."""
