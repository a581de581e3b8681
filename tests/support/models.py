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


# --------------------------------------------------------------------------- issue 5: fidelity


class Residual(nn.Module):
    """A wide residual MLP block: its hidden activations are what checkpointing drops."""

    def __init__(self, width: int, expansion: int):
        super().__init__()
        self.up = nn.Linear(width, width * expansion)
        self.act = nn.GELU()
        self.down = nn.Linear(width * expansion, width)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


def deep_mlp(width: int = 256, depth: int = 12, expansion: int = 8, classes: int = 10) -> nn.Module:
    """A deep stack of blocks in one nn.Sequential stage (what the generic checkpointing wraps)."""
    return nn.Sequential(nn.Sequential(*[Residual(width, expansion) for _ in range(depth)]), nn.Linear(width, classes))


class EvalHeavy(nn.Module):
    """Uses more memory in eval mode than in training: eval runs a 'test-time augmentation' of 16 copies."""

    def __init__(self, features: int = 4096, classes: int = 10):
        super().__init__()
        self.body = nn.Linear(features, features)
        self.head = nn.Linear(features, classes)

    def forward(self, x):
        if not self.training:
            x = x.unsqueeze(1).expand(-1, 16, -1).reshape(-1, x.shape[-1]).contiguous()
            return self.head(torch.relu(self.body(x))).reshape(-1, 16, self.head.out_features).mean(1)
        return self.head(torch.relu(self.body(x)))


def eval_heavy(features: int = 4096, classes: int = 10) -> nn.Module:
    return EvalHeavy(features, classes)


class PairScorer(nn.Module):
    """Takes two named inputs (a query and a document): the built-in batches cannot express that."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.query = nn.Linear(width, width)
        self.document = nn.Linear(width, width)

    def forward(self, query, document):
        return (self.query(query) * self.document(document)).sum(-1)


def pair_scorer(width: int = 64) -> nn.Module:
    return PairScorer(width)


def pair_batch(batch_size: int, device) -> tuple:
    """model.batch for pair_scorer: dict inputs, and a score per pair as the target."""
    inputs = {"query": torch.randn(batch_size, 64, device=device), "document": torch.randn(batch_size, 64, device=device)}
    return inputs, torch.randn(batch_size, device=device)


def pair_loss(output, targets):
    """model.loss for pair_scorer: a margin-free squared error on the scores."""
    return ((output - targets) ** 2).mean()


def tiny_lm(vocabulary: int = 1000, width: int = 64, layers: int = 2) -> nn.Module:
    """A small causal language model (embedding, transformer encoder with a causal mask, head)."""
    return TinyLM(vocabulary, width, layers)


class TinyLM(nn.Module):
    def __init__(self, vocabulary: int, width: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        layer = nn.TransformerEncoderLayer(width, 4, width * 4, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.blocks(self.embed(ids), mask=mask, is_causal=True))


class CompiledOnly(nn.Module):
    """Refuses to run eagerly: a trial with it fits only if torch.compile really traced its forward.

    Under torch.compile the forward runs once, while dynamo traces it (is_compiling() is True there);
    later calls run the captured graph. Called eagerly, it raises.
    """

    def __init__(self, width: int, classes: int):
        super().__init__()
        self.linear = nn.Linear(width, classes)

    def forward(self, x):
        if not torch.compiler.is_compiling():
            raise RuntimeError("compiled_only ran eagerly: torch.compile was not applied")
        return self.linear(x)


def compiled_only(width: int = 16, classes: int = 10) -> nn.Module:
    return CompiledOnly(width, classes)


# --------------------------------------------------------------------------- the real loop (issue 15)


class LanguageModelHead(nn.Module):
    """Token ids -> embedding -> one hidden layer -> logits over the vocabulary.

    The logits, (batch, sequence, vocabulary), are most of the step's memory, as in a real language
    model: how long the step keeps them (training.output_lifetime) moves the edge.
    """

    def __init__(self, vocabulary: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, ids):
        return self.head(torch.tanh(self.hidden(self.embed(ids))))


def lm_head(vocabulary: int = 8000, width: int = 64) -> nn.Module:
    return LanguageModelHead(vocabulary, width)


class LeakyHog(MemoryHog):
    """memory_hog that keeps ``leak_mib`` MiB more after every forward pass, as a leak in user code does."""

    def __init__(self, features: int, depth: int, classes: int, leak_mib: int):
        super().__init__(features, depth, classes)
        self.leak_elements = leak_mib * 2**20 // 4
        self.__dict__["leaked"] = []  # not a buffer: nothing torch knows about, like a list in user code

    def forward(self, x):
        self.leaked.append(torch.ones(self.leak_elements))  # written, so resident
        return super().forward(x)


def leaky_hog(features: int = 524288, depth: int = 8, classes: int = 10, leak_mib: int = 48) -> nn.Module:
    return LeakyHog(features, depth, classes, leak_mib)


def step_without_batch(model, optimizer):
    """model.step with a signature that cannot take (model, optimizer, batch, device): a spec error."""


class StatefulHog(MemoryHog):
    """memory_hog plus tables of weights that cost memory but no compute: the fixed part the strategies split.

    ``tables`` embeddings of ``rows`` x ``width`` (dense gradients, Adam state for
    every row), in a ModuleList of blocks that FSDP shards one by one. Per sample
    the activations are memory_hog's; the fixed part is mostly the tables'
    parameters, gradients and optimizer state, which DDP keeps whole on every
    rank (plus its gradient buckets), ZeRO-1 shards the state of, and FSDP shards
    all of: so each strategy has its own edge, in a few seconds a trial.
    """

    def __init__(self, features: int, depth: int, classes: int, rows: int, width: int, tables: int):
        super().__init__(features, depth, classes)
        self.tables = nn.ModuleList([nn.Embedding(rows, width) for _ in range(tables)])

    def forward(self, x):
        index = torch.zeros(x.shape[0], 1, dtype=torch.long, device=x.device)
        offset = sum(table(index).sum(dim=(1, 2)) for table in self.tables)
        return super().forward(x) + offset.unsqueeze(1) * 0.0


def stateful_hog(features: int = 262144, depth: int = 8, classes: int = 10, rows: int = 16384, width: int = 128,
                 tables: int = 2) -> nn.Module:
    return StatefulHog(features, depth, classes, rows, width, tables)


def threads_must_be(expected: int, classes: int = 4) -> nn.Module:
    """A tiny classifier that refuses to be built unless the process runs ``expected`` intra-op threads.

    So a rank started with the wrong threads is an error of the probe (exit 4), not a quiet difference.
    """
    import os

    found = torch.get_num_threads()
    if found != expected:
        raise RuntimeError(f"this rank runs {found} intra-op threads (OMP_NUM_THREADS="
                           f"{os.environ.get('OMP_NUM_THREADS')}), expected {expected}")
    return nn.Sequential(nn.Flatten(), nn.Linear(16, classes))
