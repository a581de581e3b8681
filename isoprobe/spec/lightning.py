"""The spec's ``lightning`` section: the Trainer arguments that change what a step of ``trainer.fit`` holds.

With ``model.lightning`` the trial is the user's own ``LightningModule`` under
Lightning's own loop (``child.framework.lightning_runner``): its ``training_step``,
``configure_optimizers`` and ``train_dataloader()``. What the Trainer adds to
memory is set here; the rest of the spec says it where it already has a field
(``training.precision`` is the Trainer's precision, ``distributed.strategy:
ddp`` its DDP strategy), so no field is documented twice. Pure: no torch, no
lightning.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.spec.base import SpecSection

#: ``training.precision`` -> the Trainer's ``precision`` argument (the same recipes under Lightning's names).
LIGHTNING_PRECISION = {
    "fp32": "32-true",
    "fp16-mixed": "16-mixed",
    "bf16-mixed": "bf16-mixed",
    "bf16-true": "bf16-true",
}


class LightningSpec(SpecSection):
    """The Trainer's arguments that change memory, for ``model.lightning`` (the rest of the Trainer is Lightning's)."""

    gradient_clip_val: float | None = Field(
        None,
        ge=0,
        description="Trainer(gradient_clip_val=...): clip the gradients at this norm or value; null: no clipping.",
    )
    gradient_clip_algorithm: Literal["norm", "value"] | None = Field(
        None, description="Trainer(gradient_clip_algorithm=...): norm or value; null: Lightning's default (norm)."
    )
    accumulate_grad_batches: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description=(
            "Trainer(accumulate_grad_batches=...): batches whose gradients add up before one optimizer step. A "
            "trial's step is one optimizer step, so it runs this many batches; the answer is the batch size of "
            "one of them."
        ),
    )
    batch_arg_name: str = Field(
        "batch_size",
        min_length=1,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description=(
            "The attribute each trial sets to the batch size, where Lightning's BatchSizeFinder sets it: on the "
            "module, its hparams, the data module or its hparams (lightning_setattr). The dataloader must read it."
        ),
    )
