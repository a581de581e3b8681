"""A dataset whose collate_fn builds big batches (a decoded volume a sample), and a model that costs little beside
them: the input's memory decides the edge, and how long a loop keeps the previous batch decides the answer.

Standard library and torch only: a test's plain DataLoader loop imports it as isoprobe's trials do.
"""

from __future__ import annotations

import torch

#: A sample's decoded volume: 4 MiB of float32.
VOLUME = 1 << 20


class Volumes(torch.utils.data.Dataset):
    """``samples`` compressed volumes (a seed each, as a file on disk would hold a few bytes of header)."""

    def __init__(self, samples: int = 256):
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        return torch.tensor([index], dtype=torch.int64)  # decoded in the collate, as a loader of clips does


def decode_collate(batch):
    """Decode each sample into its volume, then stack them: the decoded list and the batch live at once."""
    volumes = []
    for item in batch:
        generator = torch.Generator().manual_seed(int(item[0]))
        volumes.append(torch.rand(1, VOLUME, generator=generator))
    inputs = torch.stack(volumes)
    labels = torch.tensor([int(item[0]) % 10 for item in batch])
    return inputs, labels


def volume_model():
    """Pools each volume to 1024 values, then classifies: activations of a few KiB a sample."""
    return torch.nn.Sequential(torch.nn.AvgPool1d(VOLUME // 1024), torch.nn.Flatten(), torch.nn.Linear(1024, 10))
