"""The tiny GPT-2 of tests/support/hf_trainers.py as a LightningModule: the same model, data, loss and optimizer as its
Trainer.

benchmarks/studies/frameworks_table.py puts the Lightning finders and the Hugging Face finders side by
side on one model. The Hugging Face side is ``tests/support/hf_trainers.py:build_trainer`` as it is (a
GPT-2 built from a config, nothing downloaded; ``TokenIds``; the Trainer's defaults: fused AdamW at
lr 1e-3 without weight decay, clipping to norm 1.0, fp32). This module is the same loop written
the Lightning way: ``training_step`` is the model's own causal-LM loss on the same batches, and
``configure_optimizers`` the optimizer the Trainer makes (``adamw_torch_fused``, its default from
torch 2.8). Clipping and precision are the Trainer's arguments (the spec's ``lightning`` section).
The batch size is a plain attribute ``batch_size`` that ``train_dataloader`` reads, where
Lightning's BatchSizeFinder sets it. The Trainer's linear learning-rate schedule is left out: it
holds no tensor.

Loaded by file path in the trial processes (isoprobe's and the harness's), hence the path import.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "support"))
from hf_trainers import TokenIds, gpt2  # noqa: E402 - the Hugging Face side's own model and data


class LitGPT2(L.LightningModule):
    """``build_trainer``'s model and data under ``trainer.fit``; the init arguments are ``build_trainer``'s."""

    def __init__(self, layers: int = 2, width: int = 64, sequence: int = 64, vocabulary: int = 4000,
                 samples: int = 4096, learning_rate: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = gpt2(layers, width, sequence, vocabulary)
        self.batch_size = 2

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate, weight_decay=0.0, fused=True)

    def train_dataloader(self):
        data = TokenIds(self.hparams.samples, self.hparams.sequence, self.hparams.vocabulary)
        return DataLoader(data, batch_size=self.batch_size, shuffle=True)
