"""Datasets and collate functions for the tests of ``data:`` under hostile input (issue 34).

Referenced from specs as '<this file>:<function>' and called directly by the unit tests; not shipped with
the package. Each is the smallest user code that shows one class of failure:

- ``hungry_collate`` / ``bytes_collate``: a collate_fn whose memory grows with the batch (a decoded image,
  a scratch buffer per sample), so that a large enough batch runs out of memory *in the collate_fn*:
  torch's allocator (RuntimeError "can't allocate memory") or Python's (MemoryError).
- ``key_error_collate``: a collate_fn with a bug (a KeyError): the user's error, named as theirs.
- ``wobbly``: ``__getitem__`` returns a random length on every read (a random crop without a seed).
- ``unseeded``: each build draws its lengths anew (an unseeded factory); reads of one build agree.
- ``huge``: a dataset of 10**9 samples (or ``samples``); ``slow_huge``: the same, each read taking ``seconds``.
"""

from __future__ import annotations

import random
import time

import torch
from torch.utils.data import Dataset

#: What ``hungry_collate`` allocates per sample, in MiB: against a 1.25 GiB cap and torch's ~0.7 GiB import,
#: a handful of samples run out of memory in the collate_fn, long before the tiny model's step would.
HUNGRY_MIB = 45


class Tokens(Dataset):
    """Sample i is ``lengths[i]`` token ids drawn from a generator seeded with i: the same every read."""

    def __init__(self, lengths: list[int]):
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, 1000, (self.lengths[index],), generator=generator)


def fixed(samples: int = 200, length: int = 32) -> Tokens:
    """Every sample ``length`` tokens long: any batch of B is the worst one."""
    return Tokens([length] * samples)


def varied(samples: int = 64) -> Tokens:
    """Seeded lengths from 1 to 101 tokens: the same in every build and process."""
    return Tokens([(index * 37) % 101 + 1 for index in range(samples)])


def pad_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    """Pads to the batch's longest sequence, as a language model's DataLoader does."""
    return torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=0)


def hungry_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    """Stacks the samples after filling a scratch buffer of HUNGRY_MIB MiB per sample (torch's allocator)."""
    scratch = torch.ones(len(batch), HUNGRY_MIB * 2**20 // 4)
    stacked = torch.stack(batch) + scratch[:, :1].long() * 0
    del scratch
    return stacked


def bytes_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    """The same with Python's allocator: a full batch raises MemoryError, not torch's RuntimeError."""
    scratch = [bytearray(HUNGRY_MIB * 2**20) for _ in batch]  # the cap counts the address space
    stacked = torch.stack(batch)
    del scratch
    return stacked


def memory_error_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    """What ``bytes_collate`` raises under a cap, raised outright (for tests in one process, without a cap)."""
    raise MemoryError()


def key_error_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    """A collate_fn with a bug: it returns a field it never made."""
    fields = {"input_ids": torch.stack(batch)}
    return fields["labels"]


def memory_error_dataset() -> Tokens:
    """A factory that runs out of memory while it builds the dataset (in every trial's process)."""
    raise MemoryError()


class Wobbly(Dataset):
    """Each read of an index returns a sequence of a random length up to ``longest`` (a random crop, no seed)."""

    def __init__(self, samples: int, longest: int):
        self.samples, self.longest = samples, longest

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(random.randint(1, self.longest), dtype=torch.long)


def wobbly(samples: int = 64, longest: int = 512) -> Wobbly:
    return Wobbly(samples, longest)


def unseeded(samples: int = 64, longest: int = 512) -> Tokens:
    """Lengths drawn when the dataset is built, without a seed: every build (every process) differs."""
    return Tokens([random.randint(1, longest) for _ in range(samples)])


class Huge(Dataset):
    """``samples`` samples (a memory-mapped corpus, say), sample i being 8 + i % 57 tokens; ``seconds`` per read."""

    def __init__(self, samples: int, seconds: float):
        self.samples, self.seconds = samples, seconds

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return torch.zeros(8 + index % 57, dtype=torch.long)


def huge(samples: int = 10**9) -> Huge:
    return Huge(samples, 0.0)


def slow_huge(samples: int = 10**9, seconds: float = 0.05) -> Huge:
    return Huge(samples, seconds)


def raising_item(samples: int = 10) -> "RaisingItem":
    return RaisingItem(samples)


class RaisingItem(Dataset):
    """Sample 3 cannot be read: a KeyError, as a dataset indexing a missing record raises."""

    def __init__(self, samples: int):
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 3:
            raise KeyError(f"record {index}")
        return torch.zeros(4, dtype=torch.long)


def key_error_from_4(batch: list[torch.Tensor]) -> torch.Tensor:
    """A collate_fn with a bug that shows only from 4 samples on (the environment check collates two)."""
    fields = {"input_ids": torch.stack(batch)}
    return fields["labels"] if len(batch) >= 4 else fields["input_ids"]
