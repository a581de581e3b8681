"""A Hugging Face Trainer script, as the transformers example scripts (run_clm.py and kin) write it.

    python tests/commands/hf_trainer_script.py --per_device_train_batch_size 16 --max_steps 30 \
        --output_dir /tmp/hf_out --report_to none --save_strategy no --use_cpu

Mirrors the examples' idiom: every flag comes from ``HfArgumentParser((ModelArguments,
DataTrainingArguments, TrainingArguments))``, the model is built from a config (a small GPT-2 with
random weights: nothing is downloaded), the data are a ``torch`` dataset of token blocks, and
``Trainer(...).train()`` does the loop. ``--per_device_train_batch_size`` is the batch, ``--max_steps``
the stop. The tokens are synthetic and seeded (block i comes from a generator seeded with i).

Memory grows with the batch through the activations: per sample, ``block_size`` tokens of hidden
states in every layer, the eager attention scores (heads x block x block per layer) and the logits
over the vocabulary (block x vocab), while the weights are small.
Nothing of isoprobe is imported. After training it prints ``steps_run=N step_time_s=T`` (N: the
trainer's ``global_step``; T: mean seconds per step after the first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=64, metadata={"help": "hidden size"})
    n_head: int = field(default=4, metadata={"help": "attention heads"})
    vocab_size: int = field(default=512, metadata={"help": "vocabulary size"})
    attn_implementation: str = field(default="eager", metadata={"help": "eager or sdpa"})


@dataclass
class DataTrainingArguments:
    block_size: int = field(default=256, metadata={"help": "tokens per training sample"})
    num_blocks: int = field(default=4096, metadata={"help": "samples in the synthetic training set"})


class SyntheticTokens(Dataset):
    def __init__(self, num_blocks: int, block_size: int, vocab_size: int) -> None:
        self.num_blocks, self.block_size, self.vocab_size = num_blocks, block_size, vocab_size

    def __len__(self) -> int:
        return self.num_blocks

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        ids = torch.randint(self.vocab_size, (self.block_size,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.first = self.last = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    torch.manual_seed(training_args.seed)
    config = GPT2Config(n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=model_args.n_head,
                        vocab_size=model_args.vocab_size, n_positions=data_args.block_size,
                        bos_token_id=0, eos_token_id=0, attn_implementation=model_args.attn_implementation)
    model = GPT2LMHeadModel(config)
    train_dataset = SyntheticTokens(data_args.num_blocks, data_args.block_size, model_args.vocab_size)

    timer = StepTimer()
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, callbacks=[timer])
    trainer.train()
    steps = trainer.state.global_step
    per_step = (timer.last - timer.first) / (steps - 1) if steps > 1 else float("nan")
    print(f"steps_run={steps} step_time_s={per_step:.3f}", flush=True)


if __name__ == "__main__":
    main()
