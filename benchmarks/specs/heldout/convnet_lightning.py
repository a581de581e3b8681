"""The held-out convnet (``convnet.py``) as a LightningModule: the same model, data, optimizer and step.

``model.lightning`` of ``convnet-lightning.yaml``, and what benchmarks/studies/peers.py gives Lightning's own
``BatchSizeFinder`` (``Tuner.scale_batch_size``). ``training_step`` is the model's own loss on the batches
of ``train_dataloader()`` (a shuffling DataLoader over ``convnet.Images`` at ``self.batch_size``, where the
finder and each trial set it); ``configure_optimizers`` is ``convnet.optimizer`` (fused AdamW, lr 1e-3, no
weight decay). The clipping to norm 1.0 is the Trainer's argument (the spec's ``lightning`` section), as it is
in a Lightning user's run.

Loaded by file path in the trial processes (isoprobe's and the harness's), hence the path import.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convnet import SAMPLES, SIZE, ConvNet, Images, optimizer  # noqa: E402 - the model and data, defined once


class LitConvNet(L.LightningModule):
    def __init__(self, width: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.model = ConvNet(width)
        self.batch_size = 2

    def training_step(self, batch, batch_idx):
        return self.model(pixel_values=batch["pixel_values"], labels=batch["labels"])["loss"]

    def configure_optimizers(self):
        return optimizer(self.model)

    def train_dataloader(self):
        return DataLoader(Images(SAMPLES, SIZE), batch_size=self.batch_size, shuffle=True)
