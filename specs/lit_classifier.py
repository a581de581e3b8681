"""A LightningModule and a LightningDataModule, probed as they are (used by specs/lightning-classifier.yaml).

The module has its own ``training_step`` and ``configure_optimizers`` (with a
scheduler); the data module's ``train_dataloader()`` reads ``self.batch_size``,
which each trial sets where Lightning's own BatchSizeFinder would.
"""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class LitClassifier(L.LightningModule):
    """Three convolutions on 64x64 images (specs/tiny_models.py's small_cnn), AdamW with cosine decay."""

    def __init__(self, channels: int = 32, classes: int = 10, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()  # the init arguments: what IsolatedBatchSizeFinder rebuilds it with
        self.net = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, classes))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)]


class RandomImages(Dataset):
    """Images made when read (in place of a real dataset on disk)."""

    def __init__(self, samples: int, size: int, classes: int):
        self.samples, self.size, self.classes = samples, size, classes

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, self.size, self.size, generator=generator), index % self.classes


class ImageData(L.LightningDataModule):
    def __init__(self, samples: int = 4096, size: int = 64, classes: int = 10):
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = 32  # Lightning's finder, and each trial, set this

    def train_dataloader(self):
        data = RandomImages(self.hparams.samples, self.hparams.size, self.hparams.classes)
        return DataLoader(data, batch_size=self.batch_size, shuffle=True)
