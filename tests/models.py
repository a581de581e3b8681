"""Model factories for the integration tests: real torch modules with predictable memory.

Referenced from specs as '<this file>:<function>'. Not shipped with the package.
"""

from __future__ import annotations

import resource

import torch
from torch import nn


class MemoryHog(nn.Module):
    """Lots of activation memory per sample for almost no compute, so trials near the edge stay fast.

    Each layer saves two activations of ``features`` floats per sample for the backward pass.
    """

    def __init__(self, features: int, depth: int, classes: int):
        super().__init__()
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(features)) for _ in range(depth)])
        self.head = nn.Linear(features, classes)

    def forward(self, x):
        for scale in self.scales:
            x = torch.tanh(x * scale)
        return self.head(x)


def memory_hog(features: int = 262144, depth: int = 8, classes: int = 10) -> nn.Module:
    return MemoryHog(features, depth, classes)


class Broken(nn.Module):
    """A bug in the user's model: the forward pass raises an exception that is not about memory."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x):
        raise ValueError("deliberate bug in the model's forward pass")


def broken() -> nn.Module:
    return Broken()


class AmbiguousUnderCap(nn.Module):
    """Raises oneDNN's ambiguous 'could not create a primitive' while the data limit is below ``threshold``.

    With ``threshold`` above the budget and below twice the budget, the error is caused by the cap (as
    the real oneDNN failure is); with ``threshold`` = 0 it happens whatever the memory (a genuine error).
    """

    def __init__(self, threshold: int):
        super().__init__()
        self.threshold = threshold
        self.linear = nn.Linear(16, 4)

    def forward(self, x):
        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        if self.threshold == 0 or (soft != resource.RLIM_INFINITY and soft < self.threshold):
            raise RuntimeError("could not create a primitive")
        return self.linear(x)


def ambiguous_under_cap(threshold: int = 0) -> nn.Module:
    return AmbiguousUnderCap(threshold)


def big_linear(features: int = 4096) -> nn.Module:
    """64 MiB of weights: optimizer state (none for plain SGD, two buffers for Adam) shows in the peak."""
    return nn.Linear(features, features)


class EmbeddingRegressor(nn.Module):
    """Token ids in, a vector out: needs integer inputs (input.dtype int64) and an MSE target."""

    def __init__(self, vocabulary: int, width: int, outputs: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.head = nn.Linear(width, outputs)

    def forward(self, tokens):
        return self.head(self.embedding(tokens).mean(dim=1))


def embedding_regressor(vocabulary: int = 1000, width: int = 16, outputs: int = 4) -> nn.Module:
    return EmbeddingRegressor(vocabulary, width, outputs)
