"""Synthetic variable-length text for trying ``data:`` (used by specs/lm-data.yaml and the tests).

Token sequences whose lengths follow a long tail, as real text does: most are
short, a few are many times the mean. ``pad_collate`` pads a batch to its
longest sequence, as a language model's DataLoader does, so a batch's memory
follows its longest sample. Everything is seeded: the same dataset every time
it is built (isoprobe builds it in the environment check and in every trial).
"""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset


class TokenSequences(Dataset):
    """Sample i is ``lengths[i]`` token ids drawn from a generator seeded with i: nothing is stored but lengths."""

    def __init__(self, lengths: list[int], vocabulary: int):
        self.lengths = lengths
        self.vocabulary = vocabulary

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, self.vocabulary, (self.lengths[index],), generator=generator)


def long_tailed_lengths(samples: int, shortest: int, longest: int, alpha: float, seed: int) -> list[int]:
    """Pareto-tailed lengths in [shortest, longest]: the mean stays near shortest * alpha / (alpha - 1)."""
    draw = random.Random(seed)
    return [min(longest, int(shortest * draw.paretovariate(alpha))) for _ in range(samples)]


def text_dataset(samples: int = 2000, vocabulary: int = 8000, shortest: int = 24, longest: int = 512,
                 alpha: float = 1.5, seed: int = 0, shortest_first: bool = False) -> TokenSequences:
    """A long-tailed text dataset: lengths from ``shortest`` up, a Pareto tail cut at ``longest``.

    ``shortest_first``: stored sorted by length, as a dataset written in length order is, so that its first
    samples are its shortest and the longest are at the end.
    """
    lengths = long_tailed_lengths(samples, shortest, longest, alpha, seed)
    return TokenSequences(sorted(lengths) if shortest_first else lengths, vocabulary)


def rare_long_dataset(samples: int = 10_000, vocabulary: int = 8000, typical: int = 48, longest: int = 512,
                      seed: int = 0) -> TokenSequences:
    """Lengths within a few tokens of ``typical``, except one sample in the dataset of ``longest`` tokens."""
    draw = random.Random(seed)
    lengths = [typical + draw.randint(-8, 8) for _ in range(samples)]
    lengths[draw.randrange(samples)] = longest
    return TokenSequences(lengths, vocabulary)


def pad_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    """Pad to the batch's longest sequence with token 0: (batch, longest)."""
    return torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=0)
