"""The spec: what the user writes in YAML, validated into one typed ``Spec``.

Every field a user can set is documented here, once, in its ``Field``
description; ``isoprobe schema --spec`` prints them as JSON Schema.
Loading is split into parse (YAML, in ``spec_yaml``: hostile files included),
override (command-line flags), validate (pydantic, every problem collected) and
resolve (paths against the spec file), and every failure on the way becomes one
``SpecError`` that names the file, the field and the fix. Files a spec names are
read only through ``safe_read`` (regular files, bounded). This module must not
import torch.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from isoprobe.errors import Problem, SpecError, shown
from isoprobe.overrides import OVERRIDABLE, Override, apply, from_mapping, origin_of, parse_sets  # noqa: F401 - API
from isoprobe.spec_distributed import DistributedSpec
from isoprobe.safe_read import NOT_A_PIPE, Refused, kind_of, read_regular_file
from isoprobe.spec_yaml import MAX_SPEC_BYTES, MAX_SPEC_VALUES, read_spec_yaml  # noqa: F401 - part of the API
from isoprobe.units import MAX_BYTES, parse_bytes


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must never be silently ignored. A float must be finite (no inf, no NaN)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


ByteCount = Annotated[int, BeforeValidator(parse_bytes)]


def _parse_headroom(value: Any) -> float | int:
    """A number in [0, 1) is a fraction of memory; an integer >= 1 or a size string is bytes (at most 1 PiB).

    Integers are compared as integers: one of 400 digits overflows ``float()``.
    """
    if isinstance(value, bool):
        raise ValueError("expected a fraction such as 0.1 or a size such as '2GiB'")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is neither a fraction in [0, 1) nor a whole number of bytes")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"headroom cannot be negative, got {shown(value)}")
        if 0 <= value < 1:
            return float(value)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value} is neither a fraction in [0, 1) nor a whole number of bytes")
        count = int(value)
    else:
        count = parse_bytes(value)
    if count > MAX_BYTES:
        raise ValueError(f"{shown(value)} is more than 1 PiB: not a memory size")
    return count


Headroom = Annotated[float | int, BeforeValidator(_parse_headroom)]

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"
#: 2**36 elements is 256 GiB of float32 for ONE sample: a larger shape is a typo.
MAX_SAMPLE_ELEMENTS = 1 << 36
#: The search never tries more (search.DEFAULT_CEILING); a start or cap above it is a typo.
MAX_BATCH_SIZE = 1 << 24


_CALLABLE_REFERENCE = re.compile(r"[^:]+:[A-Za-z_][A-Za-z0-9_]*")
#: The model sources, in the order a reader meets them; exactly one is given.
MODEL_SOURCES = ("torchvision", "timm", "huggingface", "factory")
#: The library (importable module and distribution) each named model source builds with; a factory has none.
#: The one place this mapping lives: the child imports it, the cache keys its version, the warm spare preloads it.
MODEL_LIBRARIES = {"torchvision": "torchvision", "timm": "timm", "huggingface": "transformers"}
#: What a user installs for a source whose library is not a core dependency.
EXTRAS = {"timm": "pip install 'isoprobe[timm]'", "huggingface": "pip install 'isoprobe[huggingface]'"}
#: The spec fields that name a callable: 'module:function' or 'file.py:function'.
CALLABLE_FIELDS = ("factory", "batch", "loss", "step")


def is_file_reference(target: str) -> bool:
    """Whether the part before ':' of a callable reference names a file (vs. an importable module).

    The one rule, used where a reference is resolved against the spec's folder,
    hashed for the cache key, checked before any trial, and imported in the child.
    """
    return target.endswith(".py") or "/" in target


class ModelSpec(_Strict):
    """Which network to train. Give exactly one of ``torchvision``, ``timm``, ``huggingface`` and ``factory``."""

    torchvision: str | None = Field(
        None,
        min_length=1,
        description="Name of a torchvision model, as accepted by torchvision.models.get_model, e.g. 'resnet50', "
        "'deeplabv3_resnet50' (segmentation) or 'fasterrcnn_resnet50_fpn' (detection).",
    )
    timm: str | None = Field(
        None,
        min_length=1,
        description="Name of a timm model, as accepted by timm.create_model, e.g. 'convnext_tiny' "
        "(needs the extra: pip install 'isoprobe[timm]'). Random weights, never downloaded.",
    )
    huggingface: str | None = Field(
        None,
        min_length=1,
        description=(
            "A Hugging Face transformers model type, e.g. 'gpt2', 'bert' or 'llama', built from its config "
            "with random weights and no download (AutoConfig.for_model(type, **kwargs)); kwargs are config "
            "values such as n_layer. The head follows target.task: language_modeling builds the causal-LM "
            "model, classification the sequence-classification one. Needs the extra: "
            "pip install 'isoprobe[huggingface]'."
        ),
    )
    factory: str | None = Field(
        None,
        description=(
            "A Python function returning a torch.nn.Module, written 'package.module:function' "
            "(importable; the spec's folder is on the import path) or 'path/to/file.py:function' "
            "(relative to the spec file)."
        ),
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the model builder (for huggingface: config values), e.g. "
        "{num_classes: 1000}. Weights are never downloaded.",
    )
    batch: str | None = Field(
        None,
        description=(
            "Optional batch maker 'module:function' or 'file.py:function', called as f(batch_size, device) and "
            "returning (inputs, targets): inputs a tensor, a tuple (model(*inputs)) or a dict (model(**inputs)). "
            "For inputs the built-in tasks do not cover; replaces the 'input' section."
        ),
    )
    loss: str | None = Field(
        None,
        description=(
            "Optional loss 'module:function' or 'file.py:function', called as f(output, targets) and returning "
            "a scalar tensor. Replaces the loss of target.task; with it, the 'target' section may be left out."
        ),
    )
    step: str | None = Field(
        None,
        description=(
            "Optional training step 'module:function' or 'file.py:function', called as "
            "f(model, optimizer, batch, device) once per step, where batch is (inputs, targets) from model.batch "
            "or the built-in task (class indices per sample; per pixel at the input's size for segmentation). "
            "It runs one full step as your real loop does: your loss, backward, gradient clipping, scheduler, "
            "EMA copy of the weights... and replaces isoprobe's own step, so that what fits is what your code "
            "allocates. State it keeps between steps (an EMA model) belongs in the function's module. Train mode "
            "only; do autocast inside it (training.precision fp32 or bf16-true). Its signature is checked "
            "before any trial."
        ),
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "ModelSpec":
        given = [name for name in MODEL_SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of 'torchvision' (a model name), 'timm' (a model name), 'huggingface' "
                f"(a model type) or 'factory' ('module:function'); got {', '.join(given) or 'none'}"
            )
        for name in CALLABLE_FIELDS:
            value = getattr(self, name)
            if value is not None and not _CALLABLE_REFERENCE.fullmatch(value):
                message = f"{name} {value!r} must look like 'package.module:function' or 'file.py:function'"
                # factory keeps its historical wording; batch and loss name their own field.
                raise ValueError(message if name == "factory" else f"{name}: {message}")
        return self

    @property
    def source(self) -> str:
        """Which of MODEL_SOURCES this spec names."""
        return next(name for name in MODEL_SOURCES if getattr(self, name) is not None)

    @property
    def library(self) -> str | None:
        """The module the source builds with (MODEL_LIBRARIES), or None for a factory."""
        return MODEL_LIBRARIES.get(self.source)


class InputSpec(_Strict):
    """One sample of the model's input; the batch dimension is added in front."""

    shape: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, max_length=8, description="Per-sample input shape without the batch dimension, e.g. [3, 224, 224]."
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
    def _plausible_size(self) -> "InputSpec":
        elements = 1
        for dimension in self.shape:
            elements *= dimension
        if elements > MAX_SAMPLE_ELEMENTS:
            raise ValueError(f"one sample of shape {self.shape} has {elements} elements: far beyond any real input")
        return self

    @model_validator(mode="after")
    def _high_only_for_integers(self) -> "InputSpec":
        if self.dtype == "int64" and self.high is None:
            raise ValueError("dtype int64 needs 'high' (inputs are drawn from [0, high))")
        if self.dtype != "int64" and self.high is not None:
            raise ValueError("'high' applies to dtype int64 only")
        return self


TASKS = ("classification", "segmentation", "language_modeling", "regression", "detection")


class TargetSpec(_Strict):
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
    boxes_per_image: int = Field(
        8, ge=1, le=1000, description="Detection: synthetic ground-truth boxes per image."
    )

    @model_validator(mode="after")
    def _fields_fit_the_task(self) -> "TargetSpec":
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


class OptimizerSpec(_Strict):
    """The optimizer whose state is part of the memory a training step needs."""

    name: Literal["sgd", "adam", "adamw"] = Field(
        "adam", description="sgd (momentum 0.9 unless kwargs say otherwise), adam or adamw."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the torch.optim class, e.g. {lr: 0.001}."
    )


class TrainingSpec(_Strict):
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
        False, description="Convert the model and the image batch to the channels_last memory format (convolutional models)."
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
        "inductor", min_length=1, description="The torch.compile backend when compile is true, e.g. inductor or aot_eager."
    )
    cudnn_benchmark: bool = Field(
        False,
        description="torch.backends.cudnn.benchmark: cuDNN autotuning, which can pick algorithms with larger workspaces.",
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
    eval_pass: bool = Field(
        False,
        description=(
            "Also run an evaluation forward pass (eval mode, no gradients) at the same batch after the training "
            "steps of each trial, so that the answer covers validation too (train mode only)."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> "TrainingSpec":
        if self.mode == "inference" and self.gradient_checkpointing:
            raise ValueError(
                "gradient_checkpointing: saves memory for the backward pass; mode inference has none"
            )
        if self.mode == "inference" and self.eval_pass:
            raise ValueError("eval_pass: adds an evaluation pass to training; in mode inference every step is one")
        return self


class SearchSpec(_Strict):
    """Where the search starts, where it must stop, and what one trial is."""

    start_batch_size: int = Field(
        2, ge=1, le=MAX_BATCH_SIZE, description="First batch tried. 2 by default: BatchNorm needs more than one sample in training."
    )
    max_batch_size: int | None = Field(
        None, ge=1, le=MAX_BATCH_SIZE, description="Never try a batch above this. The answer is this value if it fits."
    )
    dataset_size: int | None = Field(
        None, ge=1, description="Number of samples in the dataset: a batch larger than the dataset is never tried."
    )
    steps: int = Field(
        3,
        ge=2,
        le=1000,
        description=(
            "Training steps per trial (at least 2: Adam's state is allocated at the first optimizer step, "
            "so the second step's peak can exceed the first's)."
        ),
    )
    trial_timeout: float = Field(
        600.0, gt=0, le=7 * 24 * 3600,
        description="Seconds one trial may take from the moment its process, imports done, receives the request; "
                    "then it and everything it started is killed.",
    )
    retries: int = Field(
        1,
        ge=0,
        le=5,
        description=(
            "Extra attempts, each in a fresh process, for a batch whose trial crashed or timed out. If the "
            "failure persists, the batch counts as failing with that class (never as out of memory)."
        ),
    )
    confirmations: int = Field(
        1,
        ge=0,
        le=5,
        description=(
            "Extra runs of the final maximum before it is reported. If one fails, the edge is flaky and the "
            "answer moves down to the largest batch that fit every time it ran."
        ),
    )
    strategy: Literal["guided", "doubling"] = Field(
        "guided",
        description=(
            "guided: fit peak memory = a + k*batch to the trials that fit and jump next to the edge it predicts "
            "(falls back to bisection when the prediction misses); doubling: the classic double-then-bisect. "
            "Both find the same exact edge; guided needs fewer trials."
        ),
    )
    parallel: Literal["auto"] | Annotated[int, Field(ge=1, le=64)] = Field(
        1,
        description=(
            "Trials run at once, one per slot; the search then proposes up to that many batches per round "
            "(a k-ary split instead of a bisection) and finds the same exact edge in fewer rounds. On CUDA a "
            "slot is a visible GPU (auto: all of them; they must be the same model with the same memory). On "
            "the CPU backend a slot is one memory budget: at most min(cores, 80 % of RAM // budget) slots "
            "(auto: that many), so that the slots' caps together never exceed the machine. 1 (the default): "
            "one trial at a time. Not with a distributed strategy (each trial is already a gang)."
        ),
    )
    warm_start: bool = Field(
        True,
        description=(
            "Start the next trial's process while the current one runs: it imports torch at idle priority "
            "(never touching the GPU), so that it only builds and trains when its turn comes. Saves the import, "
            "seconds per trial; false: each trial's process is started when the trial is due (same imports, "
            "same timeout; only slower)."
        ),
    )

    estimate: bool = Field(
        True,
        description=(
            "Trace one training step on fake tensors in the environment check (seconds, no memory) and start the "
            "guided search at the edge it predicts, the measured peaks correcting it: fewer trials. false: no "
            "trace, and the search starts at start_batch_size. The answer is exact either way."
        ),
    )
    fork_server: bool | None = Field(
        None,
        description=(
            "Fork every trial from one server process that imported torch and the model library once (it never "
            "creates a CUDA context nor runs a torch operation): a trial starts in milliseconds instead of "
            "seconds, and is still a fresh process with its own memory, cap, allocator and CUDA context, "
            "contained as a spawned one is, and measuring what a spawned one does (the server's threads and "
            "resident library pages are restored in each fork). null (the default): on the CPU backend, where "
            "this was measured; spawned on CUDA until it is measured on a GPU. true: on both; false: spawn "
            "every trial's process (warm_start then applies). A server that cannot start or dies is replaced "
            "by spawned processes."
        ),
    )

    @model_validator(mode="after")
    def _start_within_caps(self) -> "SearchSpec":
        for name in ("max_batch_size", "dataset_size"):
            cap = getattr(self, name)
            if cap is not None and self.start_batch_size > cap:
                raise ValueError(f"start_batch_size {self.start_batch_size} is above {name} {cap}")
        return self

    @property
    def cap(self) -> int | None:
        """The largest batch the search may try, or None when only memory limits it."""
        caps = [c for c in (self.max_batch_size, self.dataset_size) if c is not None]
        return min(caps) if caps else None


class RecommendationSpec(_Strict):
    """How the recommended batch is derived from the maximum: headroom below the edge, then rounding."""

    headroom: Headroom = Field(
        0.1,
        description=(
            "Memory to keep free below the capacity: a fraction in [0, 1) such as 0.1, or a size such as '2GiB'. "
            "The capacity is memory_budget or the device's memory; once the edge is found, the peak predicted "
            "at the first failing batch if that is lower (on CPU the peak is resident memory, which stays below "
            "the data-segment cap)."
        ),
    )
    multiple_of: int = Field(
        1, ge=1, le=MAX_BATCH_SIZE, description="Round the recommended batch down to a multiple of this (e.g. 8 for tensor cores)."
    )
    objective: Literal["max", "throughput"] = Field(
        "max",
        description=(
            "max: recommend the largest batch within the headroom; throughput: the smallest tested batch within "
            "the headroom that is within throughput_tolerance of the best measured throughput."
        ),
    )
    throughput_tolerance: float = Field(
        0.03, ge=0, lt=1, description="Fraction of the best throughput that counts as as fast (0.03: within 3 %)."
    )
    soak_steps: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description=(
            "Steps the recommended batch runs in a fresh process before it is reported, reading the peak after "
            "each step: memory that grows over steps (fragmentation, a cache that fills, a leak) shows there. "
            "A batch that fails, or whose peak still rises above the headroom line, moves the recommendation "
            "down (up to 3 soaks). Default: 20 on CUDA; 6 on the CPU backend, where a step takes seconds to "
            "minutes and the allocator settles within two steps, so 6 show a trend over the last four. 0: no "
            "soak (the recommended batch is still run once if no trial ran it)."
        ),
    )


class PlanSpec(_Strict):
    """A target global batch to reach by gradient accumulation and data parallelism."""

    target_global_batch: int | None = Field(
        None, ge=1, le=1 << 30, description="The global batch the real job wants (micro-batch x accumulation x ranks)."
    )
    world_size: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description=(
            "Data-parallel ranks. Unset: WORLD_SIZE (torchrun) or SLURM_NTASKS from the environment, else 1."
        ),
    )


class Spec(_Strict):
    """A training setup to probe."""

    model: ModelSpec
    input: InputSpec | None = Field(
        None, description="One sample of the input; required unless model.batch makes the batches."
    )
    target: TargetSpec | None = Field(
        None, description="The task and its targets; required unless model.loss computes the loss."
    )
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    device: str = Field(
        "auto",
        pattern=DEVICE_PATTERN,
        description="auto (CUDA if a GPU is visible, else CPU), cpu, cuda or cuda:N.",
    )
    memory_budget: ByteCount | None = Field(
        None,
        le=MAX_BYTES,
        description=(
            "Memory the trial may use, e.g. '8GiB', '16 GB' or bytes. On CUDA: a cap below the card's memory "
            "(ask 'what fits on a 16 GB card' on a bigger one). On CPU: a hard limit on the child process, "
            "imports included; default 3GiB."
        ),
    )
    allocator: str | None = Field(
        None,
        description=(
            "PYTORCH_CUDA_ALLOC_CONF for every trial, e.g. 'expandable_segments:True'. "
            "Unset: the value in isoprobe's own environment, if any, is passed on."
        ),
    )
    allocators: list[str] | None = Field(
        None,
        min_length=2,
        max_length=8,
        description=(
            "Allocator settings to compare, e.g. [default, 'expandable_segments:True', 'max_split_size_mb:128'] "
            "('default': torch's own, the variable unset). The edge is searched under each, starting from what "
            "the previous one found; the result gives the maximum per setting and the best. The answer's "
            "max_batch_size is the first one's. CUDA only: on the CPU backend the setting has no effect, so "
            "the edge is searched once and the result says so. Replaces 'allocator'."
        ),
    )
    recommendation: RecommendationSpec = Field(default_factory=RecommendationSpec)
    plan: PlanSpec = Field(default_factory=PlanSpec)
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec,
        description="The real job's data-parallel strategy and ranks: with one, the answer is the per-rank micro-batch.",
    )

    @model_validator(mode="after")
    def _sections_fit_together(self) -> "Spec":
        if self.distributed.gang and self.training.mode != "train":
            raise ValueError(f"distributed.strategy: {self.distributed.strategy} distributes training; with "
                             "training.mode inference use strategy none")
        if self.input is None and self.model.batch is None:
            raise ValueError("input: this section is required (the per-sample shape), unless model.batch makes the batches")
        if self.target is None and self.model.loss is None and not (self.model.step and self.model.batch):
            raise ValueError("target: this section is required (the task and its classes or shape), unless model.loss "
                             "is given (or model.step with model.batch)")
        if self.model.step is not None:
            if self.model.loss is not None:
                raise ValueError("model: model.step computes its own loss; give model.step or model.loss, not both")
            if self.training.mode != "train":
                raise ValueError("training: mode inference runs no training step; model.step needs mode train")
            if self.training.precision.endswith("-mixed"):
                raise ValueError(f"training: precision {self.training.precision} autocasts isoprobe's own step; with "
                                 "model.step, autocast (and scale) inside your step and set training.precision to "
                                 "fp32 (or bf16-true, which converts the model)")
        task = self.target.resolved_task if self.target is not None else None
        if task == "language_modeling" and self.model.batch is None:
            if self.input is None or self.input.dtype != "int64" or len(self.input.shape) != 1:
                raise ValueError(
                    "input: language_modeling takes token ids: input {shape: [sequence_length], dtype: int64, "
                    "high: vocabulary_size}"
                )
        if task == "detection" and self.model.batch is None and (self.input is None or len(self.input.shape) != 3):
            raise ValueError("input.shape: detection takes images: [channels, height, width]")
        if self.training.channels_last and self.model.batch is None and (
            self.input is None or len(self.input.shape) != 3
        ):
            raise ValueError("training.channels_last: applies to image batches, input.shape [channels, height, width]")
        if self.allocators is not None:
            if self.allocator is not None:
                raise ValueError("allocators: give either 'allocator' (one setting) or 'allocators' (to compare)")
            if len(set(self.allocators)) != len(self.allocators):
                raise ValueError("allocators: each setting once")
        if self.model.huggingface is not None and task not in (None, "language_modeling", "classification"):
            raise ValueError("target.task: huggingface models take language_modeling or classification here")
        return self


# --------------------------------------------------------------------------- loading

#: A spec given as data (the Python API) has no file: errors name it so, and relative paths resolve against
#: the current directory, as if the spec were a file there.
DATA_SPEC_NAME = "<dict spec>"


def load_spec(
    spec: str | os.PathLike | Mapping[str, Any] | Spec,
    overrides: Mapping[str, Any] | Sequence[Override] | None = None,
    *,
    sets: Sequence[str] = (),
) -> Spec:
    """Read, override, validate and resolve a spec; raise one ``SpecError`` with every problem.

    ``spec`` is a YAML file's path, or the same data as a mapping (relative paths
    in it resolve against the current directory; errors name it ``DATA_SPEC_NAME``
    there), or a ``Spec``, read as the mapping it dumps to (so a ``Spec`` built in
    code has its file references resolved as a dict's are).
    ``sets`` are ``FIELD=VALUE`` texts as ``--set`` takes them (the value is YAML,
    under the spec file's rules); ``overrides`` maps a dotted field, or a named flag
    of ``OVERRIDABLE`` (``--memory-budget``), to a value taken as it is (``None``:
    not given), or is a list of ``Override``. The sets apply first, then the
    overrides: a named flag wins over a ``--set`` of its field. See ``isoprobe.overrides``.
    """
    if isinstance(spec, Spec):
        spec = spec.model_dump(mode="json", exclude_unset=True)
    if isinstance(spec, Mapping):
        import copy

        path = Path.cwd() / DATA_SPEC_NAME
        raw = copy.deepcopy(dict(spec))
    else:
        path = Path(spec)
        raw = read_spec_yaml(path)
    source = str(path)
    given, problems = parse_sets(sets, source)
    if isinstance(overrides, Mapping):
        given += from_mapping(overrides)
    else:
        given += list(overrides or ())
    origins, blocked = apply(raw, given)
    reported: set[str] = set()
    try:
        validated = Spec.model_validate(raw)
    except ValidationError as exc:
        problems += [_problem_from(error, origins) for error in exc.errors()]
        reported = {".".join(str(part) for part in error["loc"]) for error in exc.errors()}
    problems += [problem for where, problem in blocked if where not in reported]  # else validation said it
    if problems:
        raise SpecError(source, problems)
    return _resolve_paths(validated, path.parent.resolve(), source)


def _problem_from(error: dict[str, Any], origins: Mapping[str, str]) -> Problem:
    """Turn one pydantic error into a sentence a user can act on."""
    location = [str(part) for part in error["loc"]]
    kind = error["type"]
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    named = re.match(r"([a-z_]+(?:\.[a-z_]+)*): ", message)
    if named and kind == "value_error":
        # A check across fields (a model validator) names the field at the front of its message,
        # relative to the section it validates (the whole spec: the full dotted path).
        location, message = location + named.group(1).split("."), message[named.end():]
    field = ".".join(location)
    fix = ""
    if kind == "extra_forbidden":
        allowed = _known_fields(location[:-1])
        close = difflib.get_close_matches(location[-1], allowed, n=1)
        message = f"unknown field {location[-1]!r}"
        fix = (f"did you mean {close[0]!r}? " if close else "") + f"known fields here: {', '.join(allowed)}"
    elif kind == "missing":
        message = "this field is required"
        fix = _describe(location) or "add it; see specs/ for examples"
    elif kind == "less_than_equal" and location == ["memory_budget"]:
        message = f"{shown(error.get('input'))} is more than 1 PiB: not a memory size"  # as parse_bytes says it
        fix = _describe(location)
    elif kind == "literal_error":
        fix = f"use one of {error.get('ctx', {}).get('expected', '')}"
    elif kind == "string_pattern_mismatch" and location == ["device"]:
        message = f"{shown(error.get('input'))} is not a device"
        fix = "use auto, cpu, cuda or cuda:N"
    elif kind in ("model_type", "dict_type"):
        given = error.get("input")
        message = f"expected a mapping of fields here, got {type(given).__name__} {shown(given)}"
        fix = "known fields here: " + ", ".join(_known_fields(location)) if _known_fields(location) else ""
    else:
        fix = _describe(location)
    if origin := origin_of(field, origins):  # set by an override: name the flag it came from
        field = f"{field} (from {origin})"
    return Problem(field, message, fix)


def _model_at(location: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Spec
    for part in location:
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _known_fields(location: list[str]) -> list[str]:
    model = _model_at(location)
    return list(model.model_fields) if model else []


def _describe(location: list[str]) -> str:
    """The field's own documentation (first sentence) as the fix hint: documented once, shown where it matters."""
    while location and location[-1].isdigit():  # an item of a list: describe the list
        location = location[:-1]
    parent = _model_at(location[:-1]) if location else None
    if parent is None or not location or location[-1] not in parent.model_fields:
        return ""
    description = parent.model_fields[location[-1]].description or ""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", description, maxsplit=1)[0]


def _resolve_paths(spec: Spec, base: Path, source: str) -> Spec:
    """Make file-form references (factory, batch, loss) absolute, so the child finds them from any folder."""
    update = {}
    for name in CALLABLE_FIELDS:
        reference = getattr(spec.model, name)
        if reference is None:
            continue
        target, function = reference.rsplit(":", 1)
        if not is_file_reference(target):
            continue
        file = (base / target).resolve()
        try:
            kind = kind_of(file.stat().st_mode)
        except OSError:
            raise SpecError(
                source,
                [Problem(f"model.{name}", f"no such file: {file}", "paths are relative to the spec file's folder")],
            ) from None
        if kind is not None:
            raise SpecError(source, [Problem(f"model.{name}", f"{file} is {kind}, not a Python file",
                                             "give a .py file" if kind == "a directory" else NOT_A_PIPE)])
        update[name] = f"{file}:{function}"
    if not update:
        return spec
    return spec.model_copy(update={"model": spec.model.model_copy(update=update)})


#: The optional extras, by model source: the distribution to look for and how to install it.
def check_references(spec: Spec, source: str) -> None:
    """Checks that need the installed packages but not torch itself: does the named model exist?

    Fast on purpose (``isoprobe validate`` runs it); the inspect child checks the
    same things authoritatively before any trial.
    """
    from isoprobe.catalog import suggest, torchvision_model_names

    problems: list[Problem] = []
    for name in CALLABLE_FIELDS:
        problems += _factory_problems(getattr(spec.model, name), Path(source).parent, f"model.{name}")
    source_name = spec.model.source
    if source_name in EXTRAS:
        import importlib.util

        module = spec.model.library
        if importlib.util.find_spec(module) is None:
            problems.append(Problem(f"model.{source_name}", f"needs the {module} package, which is not installed",
                                    EXTRAS[source_name]))
    name = spec.model.torchvision
    known = torchvision_model_names()
    if name is not None and known is not None and name not in known:
        close = suggest(name, known)
        fix = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "see torchvision.models.list_models()"
        problems.append(Problem("model.torchvision", f"torchvision has no model named {name!r}", fix))
    if problems:
        raise SpecError(source, problems)


#: A Python file that a factory, batch or loss names: far larger than this is generated junk, not code.
MAX_FACTORY_BYTES = 16 << 20


def _factory_problems(factory: str | None, spec_dir: Path, field: str = "model.factory") -> list[Problem]:
    """Does the factory's module exist, and does it define the function? Checked without running it.

    A file is parsed (not imported) and its top-level names read; a module is only
    located (``find_spec`` on its top-level package). Running the factory, and what
    it raises, is the inspect child's job.
    """
    import ast
    import importlib.util
    import sys

    if factory is None:
        return []
    target, function = factory.rsplit(":", 1)
    if is_file_reference(target):
        file = Path(target)
        try:
            text = read_regular_file(file, MAX_FACTORY_BYTES, what="a Python file").decode("utf-8")
        except Refused as exc:
            return [Problem(field, f"{file} {exc.reason}",
                            NOT_A_PIPE if exc.kind not in (None, "a directory") else "give a .py file")]
        except (OSError, UnicodeDecodeError) as exc:
            return [Problem(field, f"cannot read {file}: {exc}", "")]
        try:
            tree = ast.parse(text, filename=str(file))
        except SyntaxError as exc:
            return [Problem(field, f"{file} line {exc.lineno}: {exc.msg}", "fix the Python syntax")]
        except ValueError as exc:  # older Pythons: "source code string cannot contain null bytes" (3.11.7: SyntaxError)
            return [Problem(field, f"{file} cannot be parsed: {exc}", "fix the Python file")]
        except (RecursionError, MemoryError) as exc:  # one expression of 200,000 terms: Python cannot compile it either
            return [Problem(field, f"{file} is nested too deeply for Python's parser ({type(exc).__name__})",
                            "split the long expression into several statements")]
        defined = {
            getattr(node, "name", None) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        }
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if function not in defined and not any(isinstance(n, ast.ImportFrom) and
                                               any(a.name == "*" for a in n.names) for n in tree.body):
            close = difflib.get_close_matches(function, sorted(n for n in defined if n), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"define {function}() in {file.name}"
            return [Problem(field, f"{file.name} defines no {function!r}", hint)]
        return []
    top = target.split(".")[0]
    added = str(spec_dir.resolve()) not in sys.path
    if added:
        sys.path.insert(0, str(spec_dir.resolve()))
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        if added:
            sys.path.remove(str(spec_dir.resolve()))
    if found is None:
        return [Problem(field, f"no module named {top!r} on the import path",
                        "install it, or put it next to the spec, or use 'path/to/file.py:function'")]
    return []
