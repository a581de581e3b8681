"""A Hugging Face Accelerate script, as the Accelerate quick tour and its nlp_example.py write it.

    accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no --cpu \
        tests/commands/accelerate_script.py --batch-size 16 --max-steps 30

Mirrors the Accelerate idiom: an ordinary PyTorch loop where ``Accelerator()`` decides the device
and the processes, ``accelerator.prepare(model, optimizer, dataloader, scheduler)`` wraps them,
``accelerator.backward(loss)`` replaces ``loss.backward()`` and ``optimizer.step()`` stays as it is.
Run under ``accelerate launch`` (its ``--cpu`` sets ``ACCELERATE_USE_CPU``) or plain ``python``.
Like nlp_example.py, the script has its own ``--cpu`` (``Accelerator(cpu=args.cpu)``): that is what
makes two CPU processes one gang, since ``accelerate launch --cpu --num_processes 2`` starts ONE
process (its simple launcher; several CPU processes need mpirun), while

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
        --dynamo_backend no tests/commands/accelerate_script.py --cpu --batch-size 16 --max-steps 30

starts two ranks through torchrun's launcher, and ``cpu=True`` makes them MULTI_CPU over gloo.
``--batch-size`` is the per-process batch. The data are synthetic and seeded by sample index.

The model is a small text encoder (embedding, two transformer encoder layers, mean pooling, a
classifier): memory grows with the batch through the activations (per sample, ``seq_len`` tokens of
hidden states and the attention scores of every layer), while the weights are small.
Nothing of isoprobe is imported. At the end each process prints
``rank=R steps_run=N step_time_s=T`` (T: mean seconds per step after the first).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset


class SyntheticSentences(Dataset):
    def __init__(self, length: int, seq_len: int, vocab_size: int, num_labels: int) -> None:
        self.length, self.seq_len, self.vocab_size, self.num_labels = length, seq_len, vocab_size, num_labels

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        ids = torch.randint(self.vocab_size, (self.seq_len,), generator=g)
        return ids, int(torch.randint(self.num_labels, (1,), generator=g))


class TextClassifier(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, nhead: int, num_layers: int, num_labels: int, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2 * d_model, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_labels)

    def forward(self, ids):
        h = self.encoder(self.embed(ids) + self.pos[:, : ids.shape[1]])
        return self.head(h.mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description="Accelerate training of a small text classifier on synthetic tokens.")
    parser.add_argument("--batch-size", type=int, default=16, help="per-process batch size")
    parser.add_argument("--max-steps", type=int, default=100, help="stop after this many optimizer steps")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--nhead", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--dataset-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is there")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=args.cpu)
    set_seed(args.seed)
    dataset = SyntheticSentences(args.dataset_size, args.seq_len, args.vocab_size, num_labels=2)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = TextClassifier(args.vocab_size, args.d_model, args.nhead, args.num_layers, 2, args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    step, started = 0, None
    while step < args.max_steps:
        for ids, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(ids), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            step += 1
            if step == 1:
                started = time.perf_counter()
            if step % 10 == 0 or step == args.max_steps:
                accelerator.print(f"step {step} loss {loss.item():.4f}")
            if step >= args.max_steps:
                break
    per_step = (time.perf_counter() - started) / (step - 1) if step > 1 else float("nan")
    print(f"rank={accelerator.process_index} steps_run={step} step_time_s={per_step:.3f}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
