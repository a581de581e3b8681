"""A custom setup for specs/custom-factory.yaml: model, batch maker and loss in one file.

The batch maker is called as ``f(batch_size, device)`` and returns ``(inputs, targets)``;
a dict of inputs is passed to the model as keyword arguments. The loss is called as
``f(output, targets)`` and returns a scalar tensor.
"""

import torch
from torch import nn
from torch.nn import functional as F

#: Tokens per query and per document: the batch maker uses the longest, the worst case.
LENGTH = 64
VOCABULARY = 30000


class Tower(nn.Module):
    """Token embeddings, a two-layer transformer encoder and mean pooling."""

    def __init__(self, vocabulary: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)

    def forward(self, ids):
        return self.encoder(self.embed(ids)).mean(dim=1)


class TwoTower(nn.Module):
    def __init__(self, vocabulary: int, width: int):
        super().__init__()
        self.query = Tower(vocabulary, width)
        self.document = Tower(vocabulary, width)

    def forward(self, query, document):
        return F.normalize(self.query(query), dim=-1), F.normalize(self.document(document), dim=-1)


def two_tower(vocabulary: int = VOCABULARY, width: int = 256) -> nn.Module:
    return TwoTower(vocabulary, width)


def query_document_batch(batch_size: int, device):
    """Queries and documents at the maximum length; the i-th document answers the i-th query."""
    query = torch.randint(0, VOCABULARY, (batch_size, LENGTH), device=device)
    document = torch.randint(0, VOCABULARY, (batch_size, LENGTH), device=device)
    return {"query": query, "document": document}, torch.arange(batch_size, device=device)


def in_batch_contrastive_loss(output, targets):
    """Every other document in the batch is a negative: a (batch x batch) similarity matrix."""
    query, document = output
    return F.cross_entropy(query @ document.T / 0.05, targets)
