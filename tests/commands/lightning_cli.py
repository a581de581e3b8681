"""A LightningCLI entry point, as the Lightning docs ("Configure hyperparameters from the CLI") write it.

    python tests/commands/lightning_cli.py fit --data.batch_size 32 --trainer.max_steps 30

Mirrors the LightningCLI idiom: a ``LightningModule`` and a ``LightningDataModule`` whose ``__init__``
arguments become command-line flags (``--model.lr``, ``--data.batch_size``), ``--trainer.*`` for the
Trainer, and ``LightningCLI(Model, DataModule)`` as the whole ``__main__``. The trainer defaults for
a quiet CPU run (``accelerator="cpu"``, ``devices=1``, no logger, no checkpointing, no progress bar,
no model summary) are set in the script through ``trainer_defaults``, and ``save_config_callback=None``
keeps it from writing ``config.yaml`` into the working directory (a second run would otherwise refuse
to overwrite it), so the command line needs only ``fit``, the batch and the steps; any trainer
default can still be overridden there (``--trainer.accelerator``, ...).

Needs ``jsonargparse[signatures]`` (LightningCLI's parser). The data are synthetic and seeded.
Memory grows with the batch through the activations of a small convnet at 96x96 resolution.
Nothing of isoprobe is imported. After ``fit`` it prints ``steps_run=N step_time_s=T`` (N: the
trainer's ``global_step``, its optimizer steps; T: mean seconds per training batch after the first).
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    def __init__(self, length: int, size: int, num_classes: int) -> None:
        self.length, self.size, self.num_classes = length, size, num_classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, self.size, self.size, generator=g), int(torch.randint(self.num_classes, (1,), generator=g))


class ImageDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 32, image_size: int = 96, dataset_size: int = 2048,
                 num_workers: int = 0, num_classes: int = 10) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train_set = SyntheticImages(self.hparams.dataset_size, self.hparams.image_size, self.hparams.num_classes)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True, drop_last=True,
                          num_workers=self.hparams.num_workers)


class ConvClassifier(LightningModule):
    def __init__(self, width: int = 16, num_classes: int = 10, lr: float = 1e-3, weight_decay: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.GELU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.GELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.GELU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(8 * width, num_classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


class StepTimer(Callback):
    """Mean seconds per training batch after the first, for the closing line."""

    def __init__(self) -> None:
        self.first = None
        self.last = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now


def cli_main() -> None:
    timer = StepTimer()
    cli = LightningCLI(
        ConvClassifier, ImageDataModule, seed_everything_default=0, save_config_callback=None,
        trainer_defaults={
            "accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
            "enable_progress_bar": False, "enable_model_summary": False, "callbacks": [timer],
            "max_epochs": -1,
        },
    )
    if cli.subcommand == "fit":
        steps = cli.trainer.global_step
        per_step = (timer.last - timer.first) / (steps - 1) if steps > 1 else float("nan")
        print(f"steps_run={steps} step_time_s={per_step:.3f}", flush=True)


if __name__ == "__main__":
    cli_main()
