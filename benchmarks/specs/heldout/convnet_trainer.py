"""A held-out convnet in a Hugging Face Trainer, for the long-run survival check (benchmarks/studies/long_run_survival.py)
and the peers benchmark (benchmarks/studies/peers.py).

Not used by any test and not tuned to isoprobe: a user's small image classifier (``convnet.py``: three conv
blocks with batch norm, global pooling, a linear head) trained by ``transformers.Trainer`` on random images,
the same ones every run. ``build_trainer`` is what ``model.hf_trainer`` names (3x64x64 images:
``convnet-trainer.yaml``); ``build_peers_trainer`` is the same Trainer on ``convnet.SIZE`` images, as
peers.py's other framings train it (``convnet-peers-trainer.yaml``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by file path: convnet.py beside it
from convnet import SIZE, ConvNet, Images  # noqa: E402 - the model and data, defined once


def build_trainer(batch_size: int, width: int = 32, size: int = 64, samples: int = 4096):
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="heldout-convnet-"), per_device_train_batch_size=batch_size,
        learning_rate=1e-3, report_to="none", save_strategy="no", logging_steps=10, seed=0,
    )
    return transformers.Trainer(model=ConvNet(width), args=args, train_dataset=Images(samples, size, 10))


def build_peers_trainer(batch_size: int):
    """``build_trainer`` on the images every framing of benchmarks/studies/peers.py trains on (``convnet.SIZE``)."""
    return build_trainer(batch_size, size=SIZE)
