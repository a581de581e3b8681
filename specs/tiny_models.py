"""Small models for trying isoprobe on a CPU in seconds (used by specs/tiny-mlp.yaml)."""

from torch import nn


def mlp(features: int = 4096, hidden: int = 2048, classes: int = 10) -> nn.Module:
    """A three-layer perceptron: activations of ~(features + 2·hidden)·4 bytes per sample per layer."""
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )
