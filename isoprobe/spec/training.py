"""The spec's ``optimizer`` and ``training`` sections: how one step runs, as the real loop runs it.

What a training step holds besides the batch is decided here: the optimizer
whose state is allocated at its first step, and the options (precision,
checkpointing, compile, the lifetimes of the output and the input, an
evaluation pass) that each trial applies for real. The options a model source
owns itself (a Trainer's, a LightningModule's, a command's) are refused in
``spec.model``, which relates the sections.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from isoprobe.spec.base import SpecSection


class OptimizerSpec(SpecSection):
    """The optimizer whose state is part of the memory a training step needs."""

    name: Literal["sgd", "adam", "adamw"] = Field(
        "adam", description="sgd (momentum 0.9 unless kwargs say otherwise), adam or adamw."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the torch.optim class, e.g. {lr: 0.001}."
    )


class TrainingSpec(SpecSection):
    """How one step runs: what the real training loop does to memory, done for real in every trial."""

    mode: Literal["train", "inference"] = Field(
        "train",
        description=(
            "train: forward, loss, backward, optimizer step. inference: forward only under "
            "torch.inference_mode() with the model in eval mode and no optimizer (serving)."
        ),
    )
    precision: Literal["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"] = Field(
        "fp32",
        description=(
            "fp32; fp16-mixed: autocast to float16 with a GradScaler; bf16-mixed: autocast to bfloat16; "
            "bf16-true: the whole model and its inputs in bfloat16. The device must support it (a spec error "
            "otherwise, e.g. bf16 on a GPU older than Ampere). On the CPU backend most CPUs emulate float16, "
            "so fp16-mixed trials run several times slower there; the memory answer is unaffected."
        ),
    )
    channels_last: bool = Field(
        False,
        description="Convert the model and the image batch to the channels_last memory format (convolutional models).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description=(
            "Recompute activations in the backward pass instead of keeping them: the model's own switch where "
            "it has one (Hugging Face gradient_checkpointing_enable, timm set_grad_checkpointing), otherwise "
            "every block of the model's sequential stages (e.g. ResNet's layer1..4) wrapped in "
            "torch.utils.checkpoint."
        ),
    )
    compile: bool = Field(
        False,
        description="Run the model through torch.compile. Compile time is reported apart from the step time.",
    )
    compile_backend: str = Field(
        "inductor",
        min_length=1,
        description="The torch.compile backend when compile is true, e.g. inductor or aot_eager.",
    )
    cudnn_benchmark: bool = Field(
        False,
        description=(
            "torch.backends.cudnn.benchmark: cuDNN autotuning, which can pick algorithms with larger workspaces."
        ),
    )
    output_lifetime: Literal["through_backward", "freed_before_backward"] = Field(
        "through_backward",
        description=(
            "How long the step keeps the model's output. through_backward (default, conservative): until after "
            "backward() and the optimizer step, as a plain loop does (outputs = model(x); loss = criterion(outputs, "
            "y); loss.backward(); optimizer.step() drops outputs only when the next forward returns). "
            "freed_before_backward: dropped once the loss is computed, as in frameworks whose step returns only "
            "the loss: a Lightning training_step that returns the loss alone, Hugging Face's Trainer. For a "
            "language model the logits are the step's largest tensor, so this moves the edge most there. "
            "Ignored with model.step, whose code decides."
        ),
    )
    input_lifetime: Literal["through_next_batch", "one_batch"] = Field(
        "through_next_batch",
        description=(
            "The loop's shape, for isoprobe's own step (model sources whose loop is a framework's run that loop). "
            "through_next_batch (default): every step gets a batch built anew (collated by data.collate_fn with "
            "data:, then moved to the device) while the previous step's batch is still held, as in `for x, y in "
            "loader: x = x.to(device); ...`, where the old batch lives until the new one is bound: the collate's "
            "own memory and two batches at once, beside the weights, gradients and optimizer state. one_batch: "
            "one batch built before the first step and reused, as a loop that never fetches another does."
        ),
    )
    eval_pass: bool = Field(
        False,
        description=(
            "Also find the largest evaluation batch (train mode only): after the training search, a second search "
            "whose trials each run the training steps at the recommended batch (the weights, gradients and "
            "optimizer state a job holds when it validates), then one evaluation pass (eval mode, no gradients, "
            "training.eval_grad) at the batch tried. Its own edge (eval_max_batch_size), so the training answer is "
            "never lowered by evaluation and evaluation never runs out later. With model.hf_trainer: the Trainer's "
            "own eval batch runs after each trial's steps instead (no second search)."
        ),
    )
    eval_grad: Literal["no_grad", "inference_mode"] = Field(
        "no_grad",
        description="How the evaluation pass turns gradients off, as your validation loop does: torch.no_grad() "
        "(Lightning's and Hugging Face's default) or torch.inference_mode().",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSpec:
        if self.mode == "inference" and self.gradient_checkpointing:
            raise ValueError("gradient_checkpointing: saves memory for the backward pass; mode inference has none")
        if self.mode == "inference" and self.eval_pass:
            raise ValueError("eval_pass: adds an evaluation pass to training; in mode inference every step is one")
        return self
