"""The spec's ``input`` and ``target`` sections: the synthetic batch isoprobe builds, and what the loss compares.

Together they describe one training batch when the user gives neither their
own batches (``model.batch``, ``data``) nor their own loss (``model.loss``):
the per-sample input shape and dtype, and the task whose loss runs on the
output. Which sections a spec needs, given the others, is decided in
``spec.model``, where the rules across sections live.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from isoprobe.spec.base import SpecSection

#: 2**36 elements is 256 GiB of float32 for ONE sample: a larger shape is a typo.
MAX_SAMPLE_ELEMENTS = 1 << 36


class InputSpec(SpecSection):
    """One sample of the model's input; the batch dimension is added in front."""

    shape: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1,
        max_length=8,
        description="Per-sample input shape without the batch dimension, e.g. [3, 224, 224].",
    )
    dtype: Literal["float32", "float16", "bfloat16", "float64", "int64"] = Field(
        "float32", description="Element type of the synthetic input."
    )
    high: int | None = Field(
        None,
        ge=1,
        description="For dtype int64 only: inputs are random integers in [0, high), e.g. a vocabulary size.",
    )

    @model_validator(mode="after")
    def _plausible_size(self) -> InputSpec:
        elements = 1
        for dimension in self.shape:
            elements *= dimension
        if elements > MAX_SAMPLE_ELEMENTS:
            raise ValueError(f"one sample of shape {self.shape} has {elements} elements: far beyond any real input")
        return self

    @model_validator(mode="after")
    def _high_only_for_integers(self) -> InputSpec:
        if self.dtype == "int64" and self.high is None:
            raise ValueError("dtype int64 needs 'high' (inputs are drawn from [0, high))")
        if self.dtype != "int64" and self.high is not None:
            raise ValueError("'high' applies to dtype int64 only")
        return self


TASKS = ("classification", "segmentation", "language_modeling", "regression", "detection")


class TargetSpec(SpecSection):
    """What the loss compares the output with: the task, and the classes or the shape of its targets."""

    task: Literal["classification", "segmentation", "language_modeling", "regression", "detection"] | None = Field(
        None,
        description=(
            "classification: cross-entropy over (batch, classes) outputs; segmentation: per-pixel cross-entropy "
            "over (batch, classes, H, W); language_modeling: next-token cross-entropy, the labels being the input "
            "ids shifted by one (input: int64 token ids of the maximum sequence length, high = vocabulary size); "
            "regression: mean squared error against target.shape; detection: torchvision detection models, "
            "which return their own losses (synthetic boxes and labels). Unset: classification when classes is "
            "given, regression when shape is."
        ),
    )
    classes: int | None = Field(
        None, ge=2, le=1 << 24, description="Number of classes (classification, segmentation, detection)."
    )
    shape: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, min_length=1, description="Regression: per-sample target shape; the loss is mean squared error."
    )
    boxes_per_image: int = Field(8, ge=1, le=1000, description="Detection: synthetic ground-truth boxes per image.")

    @model_validator(mode="after")
    def _fields_fit_the_task(self) -> TargetSpec:
        task = self.resolved_task
        if task is None:
            raise ValueError(
                "give exactly one of 'classes' (classification, segmentation, detection) or 'shape' (regression)"
            )
        if task == "regression":
            if self.shape is None or self.classes is not None:
                raise ValueError("regression takes 'shape' (the per-sample target shape), not 'classes'")
        elif self.shape is not None:
            raise ValueError(f"'shape' is for regression; {task} takes 'classes'")
        elif task in ("classification", "segmentation", "detection") and self.classes is None:
            raise ValueError(f"{task} needs 'classes'")
        return self

    @property
    def resolved_task(self) -> str | None:
        if self.task is not None:
            return self.task
        if self.classes is not None and self.shape is None:
            return "classification"
        if self.shape is not None and self.classes is None:
            return "regression"
        return None
