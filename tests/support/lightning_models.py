"""LightningModules and a DataModule for the Lightning tests: real Lightning code with predictable memory.

Referenced from specs as '<this file>:<Name>'. Not shipped with the package. Each module
has its own ``training_step``, ``configure_optimizers`` (with a scheduler) and reads the
batch size from an attribute, as the modules Lightning's BatchSizeFinder tunes do.
"""

from __future__ import annotations

import json

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomFeatures(Dataset):
    """``samples`` random vectors with class labels, each made when it is read (a dataset held in memory would
    weigh on the cap as much as the model): the batches are real DataLoader batches."""

    def __init__(self, samples: int, features: int, classes: int):
        self.samples, self.features, self.classes = samples, features, classes

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(self.features, generator=generator), index % self.classes


class ModelOnly(L.LightningModule):
    """Lots of activation memory per sample for almost no compute (as tests/support/models.py's MemoryHog).

    ``training_step`` is the module's own; ``configure_optimizers`` has a StepLR scheduler. No data
    of its own: a data module gives the batches and holds the batch size. ``check_batch``: the
    batch size every batch must have (a test that the trial set it where the loader reads it);
    ``count_file``: where ``on_train_end`` writes what this rank ran (``count_file.RANK``, JSON): how many
    batches ``training_step`` got, the Trainer's world size, and what the strategy wrapped the module in.
    """

    def __init__(self, features: int = 65536, depth: int = 8, classes: int = 10, fail: bool = False,
                 check_batch: int | None = None, count_file: str | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(features)) for _ in range(depth)])
        self.head = nn.Linear(features, classes)

    def forward(self, x):
        for scale in self.scales:
            x = torch.tanh(x * scale)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        if self.hparams.fail:
            raise ValueError("the user's training_step is broken")
        x, y = batch
        self.batches = getattr(self, "batches", 0) + 1
        if self.hparams.check_batch is not None and len(x) != self.hparams.check_batch:
            raise AssertionError(f"a batch of {len(x)}, not {self.hparams.check_batch}")
        return nn.functional.cross_entropy(self(x), y)

    def on_train_end(self) -> None:
        if self.hparams.count_file:
            ran = {"batches": self.batches, "world_size": self.trainer.world_size,
                   "wrapped": type(self.trainer.strategy.model).__name__}
            with open(f"{self.hparams.count_file}.{self.trainer.global_rank}", "w") as file:
                json.dump(ran, file)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)}


class HogModule(ModelOnly):
    """``ModelOnly`` with its own data: the batch size a hyperparameter (``self.hparams.batch_size``) that
    ``train_dataloader`` reads, as Lightning's BatchSizeFinder expects."""

    def __init__(self, features: int = 65536, depth: int = 8, classes: int = 10, batch_size: int = 2,
                 samples: int = 4096, fail: bool = False, check_batch: int | None = None,
                 count_file: str | None = None):
        super().__init__(features, depth, classes, fail, check_batch, count_file)
        self.save_hyperparameters()

    def train_dataloader(self):
        data = RandomFeatures(self.hparams.samples, self.hparams.features, self.hparams.classes)
        return DataLoader(data, batch_size=self.hparams.batch_size, shuffle=True)


class HogData(L.LightningDataModule):
    """The data in a data module: ``batch_size`` a plain attribute here, so Lightning's finder sets it on the data module."""

    def __init__(self, features: int = 65536, classes: int = 10, samples: int = 4096):
        super().__init__()
        self.features, self.classes, self.samples = features, classes, samples
        self.batch_size = 2
        self.data = None

    def setup(self, stage: str) -> None:
        self.data = RandomFeatures(self.samples, self.features, self.classes)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


def hog_module(**kwargs) -> HogModule:
    """A factory, as a spec may name one in place of the class."""
    return HogModule(**kwargs)


class NoBatchSize(L.LightningModule):
    """A module whose loader has a fixed batch: nothing a finder could set."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(RandomFeatures(64, 4, 2), batch_size=8)


class IgnoresBatchSize(HogModule):
    """Issue 34: ``batch_size`` is a hyperparameter (the environment check finds it, the trial sets it), but
    ``train_dataloader`` builds its loader with a batch of its own: every batch has ``loader_batch`` samples."""

    def __init__(self, loader_batch: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.save_hyperparameters()

    def train_dataloader(self):
        data = RandomFeatures(self.hparams.samples, self.hparams.features, self.hparams.classes)
        return DataLoader(data, batch_size=self.hparams.loader_batch, shuffle=True)


class IgnoringData(HogData):
    """The same mistake in a data module: its ``batch_size`` attribute is set, its loader reads ``fixed``."""

    def __init__(self, fixed: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.fixed = fixed

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.fixed, shuffle=True)


class ValidatedPlateau(HogModule):
    """A module validated as its real fit validates: ``validation_step`` logs ``val_loss``, which a
    ReduceLROnPlateau (stepped at each epoch's end, Lightning's default) monitors."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def val_dataloader(self):
        return DataLoader(RandomFeatures(8, self.hparams.features, self.hparams.classes), batch_size=4)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}


class LogsToItsLogger(HogModule):
    """A ``training_step`` that writes to its logger's experiment (TensorBoard's ``add_scalar``), as real
    modules do for images and histograms: the real fit has a logger."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.logger.experiment.add_scalar("loss", loss.item(), self.global_step)
        return loss


class ValidatesLarger(HogModule):
    """``HogModule`` whose validation (``validation_step`` and its own ``val_dataloader``) runs at ``eval_factor``
    times the training batch, and keeps every logit of the pass for its metric, as real validation loops do: its
    first validation needs more memory than its training steps (issue 55)."""

    def __init__(self, eval_factor: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.kept = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.kept.append(self(x))

    def on_validation_epoch_end(self) -> None:
        self.kept.clear()

    def val_dataloader(self):
        data = RandomFeatures(4 * self.hparams.eval_factor * self.hparams.batch_size, self.hparams.features,
                              self.hparams.classes)
        return DataLoader(data, batch_size=self.hparams.eval_factor * self.hparams.batch_size)
