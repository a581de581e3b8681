"""Dataset factories and functions referenced by the bad data specs next to this file."""

import torch
from torch.utils.data import IterableDataset


def raising_dataset():
    raise RuntimeError("this dataset is broken on purpose")


def empty_dataset():
    return []


def token_dataset():
    return [torch.zeros(4 + i, dtype=torch.long) for i in range(8)]


def text_length(sample):
    return "long"  # not a number


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(4, dtype=torch.long)


def streaming_dataset():
    return Stream()


def keyword_collate(samples):
    return {"input_ids": torch.stack([sample[:4].float() for sample in samples])}  # Linear takes no keywords
