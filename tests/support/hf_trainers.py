"""Hugging Face Trainers for the tests: ``model.hf_trainer`` functions, f(batch_size, **kwargs) -> Trainer.

A tiny GPT-2 built from a config (random weights, nothing downloaded) over a
synthetic dataset of token ids: a language model's memory (the logits over the
vocabulary are the largest tensors of a step) with trials of a second or two.
Not shipped with the package.
"""

from __future__ import annotations

import os
import tempfile

import torch
import transformers
from torch.utils.data import Dataset


class TokenIds(Dataset):
    """``samples`` sequences of random token ids, the same ones on every run; labels are the inputs (causal LM)."""

    def __init__(self, samples: int, sequence: int, vocabulary: int):
        self.samples, self.sequence, self.vocabulary = samples, sequence, vocabulary

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, self.vocabulary, (self.sequence,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def _output_dir() -> str:
    """One output folder for every test Trainer, in the temporary folder: the Trainer makes it (empty) and writes
    nothing there (save_strategy="no", report_to="none"). A folder per Trainer (mkdtemp) left one in /tmp per trial,
    ~490 after a whole-suite run: the trials leave with ``os._exit``, so no exit hook could remove them."""
    return os.path.join(tempfile.gettempdir(), "isoprobe-tests-hf-trainer-output")


def gpt2(layers: int = 2, width: int = 64, sequence: int = 64, vocabulary: int = 4000):
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, n_positions=sequence,
                                     vocab_size=vocabulary)
    return transformers.GPT2LMHeadModel(config)


def build_trainer(batch_size: int, layers: int = 2, width: int = 64, sequence: int = 64, vocabulary: int = 4000,
                  samples: int = 4096, accumulation: int = 1, eval_samples: int = 0):
    """The user's setup as they would write it: model, TrainingArguments, dataset (and an eval set)."""
    args = transformers.TrainingArguments(
        output_dir=_output_dir(), per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size, gradient_accumulation_steps=accumulation, learning_rate=1e-3,
        max_grad_norm=1.0, report_to="none", save_strategy="no", logging_steps=1, seed=0,
    )
    model = gpt2(layers, width, sequence, vocabulary)
    eval_dataset = TokenIds(eval_samples, sequence, vocabulary) if eval_samples else None
    return transformers.Trainer(model=model, args=args, train_dataset=TokenIds(samples, sequence, vocabulary),
                                eval_dataset=eval_dataset)


class Broken(torch.nn.Module):
    """A user's model with a bug in its forward pass (not about memory)."""

    def __init__(self):
        super().__init__()
        self.inner = gpt2()

    def forward(self, input_ids=None, labels=None, **kwargs):
        raise ValueError("the user's forward pass is broken: no such head 'lm_hed'")


def broken_trainer(batch_size: int):
    args = transformers.TrainingArguments(output_dir=_output_dir(),
                                          per_device_train_batch_size=batch_size, report_to="none",
                                          save_strategy="no")
    return transformers.Trainer(model=Broken(), args=args, train_dataset=TokenIds(256, 64, 4000))


def ignores_the_batch(batch_size: int):
    """A function that does not pass its batch_size on: the trial must refuse it, not measure batch 8."""
    return build_trainer(8)


def evaluating_trainer(batch_size: int, eval_factor: int = 4, eval_steps: int = 3, samples: int = 4096):
    """A Trainer that evaluates every ``eval_steps`` steps at an eval batch ``eval_factor`` times the training batch
    (eval batches are usually larger: no backward pass to keep for): its first evaluation needs more memory than its
    training steps (issue 55: a probe that never saw it answered the training steps' edge)."""
    args = transformers.TrainingArguments(
        output_dir=_output_dir(), per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=eval_factor * batch_size, eval_strategy="steps", eval_steps=eval_steps,
        learning_rate=1e-3, report_to="none", save_strategy="no", logging_steps=1, seed=0,
    )
    return transformers.Trainer(model=gpt2(), args=args, train_dataset=TokenIds(samples, 64, 4000),
                                eval_dataset=TokenIds(4 * eval_factor * batch_size, 64, 4000))
