"""Small models for trying isoprobe on a CPU in about a minute (used by specs/small-cnn.yaml).

A factory is any function returning a torch.nn.Module; the spec passes its
``kwargs``. This file also shows the 'path/to/file.py:function' form, which
resolves against the spec's folder.
"""

from torch import nn


def small_cnn(channels: int = 32, classes: int = 10) -> nn.Module:
    """Three convolutions on 64x64 images: a few MiB of activations per sample, as real CNNs have."""
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * channels, classes),
    )


class GruLanguageModel(nn.Module):
    """Token ids -> embedding -> GRU -> logits over the vocabulary (used by specs/gru-lm.yaml).

    The logits, (batch, tokens, vocabulary), are the step's largest tensor, as in
    every language model: whether the step keeps them through the backward pass
    (training.output_lifetime) moves the edge most here.
    """

    def __init__(self, vocabulary: int, embedding: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embedding)
        self.gru = nn.GRU(embedding, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocabulary)

    def forward(self, ids):
        states, _ = self.gru(self.embed(ids))
        return self.head(states)


def gru_lm(vocabulary: int = 8000, embedding: int = 128, hidden: int = 256) -> nn.Module:
    return GruLanguageModel(vocabulary, embedding, hidden)


class TokenLanguageModel(nn.Module):
    """Token ids -> embedding -> one hidden layer per token -> logits (used by specs/lm-data.yaml).

    No recurrence, so a step takes milliseconds a sample on a CPU; the logits, (batch, tokens,
    vocabulary), are most of the step's memory, as in every language model, so a batch's memory
    follows its padded length.
    """

    def __init__(self, vocabulary: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, ids):
        return self.head(self.hidden(self.embed(ids)).tanh())


def token_lm(vocabulary: int = 8000, width: int = 64) -> nn.Module:
    return TokenLanguageModel(vocabulary, width)
