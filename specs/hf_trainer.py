"""A Hugging Face training setup for model.hf_trainer (used by specs/gpt2-trainer.yaml).

isoprobe calls ``build_trainer(batch_size, **model.kwargs)`` in each trial's
fresh process and runs the returned Trainer's ``train()`` for the trial's steps:
write it as your training script builds its Trainer, with the batch size as the
one argument isoprobe chooses. Here a small GPT-2 built from a config (random
weights, nothing downloaded) over synthetic token ids; in a real script, your
model, tokenized dataset, collator and TrainingArguments.
"""

import tempfile

import torch
import transformers
from torch.utils.data import Dataset


class TokenIds(Dataset):
    """Random token ids of the full sequence length (the worst case of a real corpus), labels = inputs."""

    def __init__(self, samples: int, sequence: int, vocabulary: int):
        self.samples, self.sequence, self.vocabulary = samples, sequence, vocabulary

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        ids = torch.randint(0, self.vocabulary, (self.sequence,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def build_trainer(batch_size, layers=4, width=256, sequence=256, vocabulary=8000, accumulation=1):
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, n_positions=sequence,
                                     vocab_size=vocabulary)
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="gpt2-trainer-"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        learning_rate=3e-4,
        max_grad_norm=1.0,
        report_to="none",
    )
    return transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                train_dataset=TokenIds(100_000, sequence, vocabulary))
