"""The spec: what the user writes in YAML, validated into one typed ``Spec``, and the rules across its sections.

Every field a user can set is documented once, in its ``Field`` description:
the root's fields here, each section's in its own module (``spec/__init__``
lists them); ``isoprobe schema --spec`` prints them as JSON Schema. A rule
within one section is that section's validator; a rule that relates several
sections (a command replaces model, data and optimizer; a Trainer owns its
training options; unit tokens needs batches isoprobe lengthens...) is here,
in ``Spec``'s validator and the functions below it, so that what a spec may
combine is read in one place. These models say what a spec is; turning a
file, a dict or command-line overrides into one, and naming every problem on
the way, is ``spec.load``'s job. This module must not import torch.

The names that moved to the section modules are re-exported here (``__all__``):
``from isoprobe.spec.model import ...`` keeps working for each of them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from isoprobe.spec.base import SpecSection
from isoprobe.spec.data import DataSpec
from isoprobe.spec.distributed import DistributedSpec
from isoprobe.spec.input_target import MAX_SAMPLE_ELEMENTS, TASKS, InputSpec, TargetSpec
from isoprobe.spec.lightning import LightningSpec
from isoprobe.spec.model_section import (
    CALLABLE_FIELDS,
    EXTRAS,
    MODEL_LIBRARIES,
    MODEL_SOURCES,
    ModelSpec,
    is_file_reference,
    one_source_message,
)
from isoprobe.spec.recommendation import PlanSpec, RecommendationSpec
from isoprobe.spec.search_section import MAX_BATCH_SIZE, MAX_BUCKET_LENGTH, MAX_BUCKETS, SearchSpec
from isoprobe.spec.size_fields import ByteCount, ByteCountOrZero, Headroom
from isoprobe.spec.training import OptimizerSpec, TrainingSpec
from isoprobe.spec.units import MAX_BYTES

__all__ = [  # noqa: RUF022 - grouped by the module each name moved to (the comments), not sorted
    "Spec",
    "DEVICE_PATTERN",
    # the sections, each in its module
    "ModelSpec",
    "InputSpec",
    "TargetSpec",
    "DataSpec",
    "OptimizerSpec",
    "TrainingSpec",
    "SearchSpec",
    "RecommendationSpec",
    "PlanSpec",
    "DistributedSpec",
    "LightningSpec",
    # spec.model_section
    "MODEL_SOURCES",
    "MODEL_LIBRARIES",
    "EXTRAS",
    "CALLABLE_FIELDS",
    "is_file_reference",
    "one_source_message",
    # spec.input_target, spec.search_section
    "MAX_SAMPLE_ELEMENTS",
    "TASKS",
    "MAX_BATCH_SIZE",
    "MAX_BUCKET_LENGTH",
    "MAX_BUCKETS",
    # spec.size_fields
    "ByteCount",
    "ByteCountOrZero",
    "Headroom",
]

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"


class Spec(SpecSection):
    """A training setup to probe: a model isoprobe trains (``model`` and the sections that describe its step), or
    the job's own training command (``command``), run as it is."""

    model: ModelSpec = Field(
        default_factory=ModelSpec, description="The network isoprobe trains. Give it, or command (not both)."
    )
    command: list[Annotated[str, Field(min_length=1)]] | Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description=(
            "The job's own training command, run as it is in each trial (docs/command.md): an argv list, or a "
            "string split into words as a shell would (no shell runs it unless shell is true). '{batch_size}' "
            "anywhere in an argument becomes the trial's batch size, e.g. 'torchrun --nproc-per-node 2 train.py "
            "--batch-size {batch_size}'. Each trial ends the command's whole process tree once it has run enough "
            "optimizer steps; it runs in isoprobe's working directory. Replaces model, input, target, data, "
            "optimizer and lightning."
        ),
    )
    shell: bool = Field(
        False,
        description="With command given as one string: run it with /bin/sh -c (pipes, "
        "variables, &&) instead of splitting it into words.",
    )
    batch_from: Literal["argument", "env"] = Field(
        "argument",
        description="Where the command takes its batch size from: 'argument' (the default: '{batch_size}' must be "
        "in its arguments) or 'env' (the script reads ISOPROBE_BATCH_SIZE, which every trial sets).",
    )
    batch_check: Literal["on", "off"] = Field(
        "on",
        description="Whether a command trial is judged on the batch its model's forwards took (docs/command.md, "
        "'Does the script train at the batch it is given?'): 'on' refuses a command whose trials prove "
        "it trains at another batch; 'off' for a script whose inputs mislead that reading.",
    )

    @field_validator("batch_check", mode="before")
    @classmethod
    def _batch_check_words(cls, value):
        """YAML reads a bare ``off`` (and ``on``) as a boolean: ``batch_check: off`` means what it says."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    command_dir: str | None = Field(
        None,
        min_length=1,
        description="The folder the command runs in, relative to the spec file. Unset: the folder isoprobe runs in "
        "(as a job script's next line would). Part of the cache key.",
    )
    command_env: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        max_length=256,
        description="Environment variables the command's behaviour depends on (e.g. [CONFIG, NCCL_ALGO]): their "
        "values are part of the cache key, so changing one probes again.",
    )
    input: InputSpec | None = Field(
        None, description="One sample of the input; required unless model.batch or data makes the batches."
    )
    target: TargetSpec | None = Field(
        None,
        description="The task and its targets; required unless model.loss computes the loss (with data: "
        "unset, the loss is the model's own output.loss, as a Hugging Face model given labels returns it).",
    )
    data: DataSpec | None = Field(
        None,
        description="Batches from your own dataset, the worst one (the B longest samples) in every trial; "
        "replaces input. See docs/data.md.",
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
        description=(
            "The real job's data-parallel strategy and ranks: with one, the answer is the per-rank micro-batch."
        ),
    )
    lightning: LightningSpec | None = Field(
        None, description="With model.lightning: the Trainer's arguments that change memory (defaults: Lightning's)."
    )

    @property
    def workload(self) -> str:
        """What the trials run, for a person: 'torchvision resnet50', or 'command python train.py ...'."""
        if self.command is not None:
            from isoprobe.spec.command import shown_command

            return f"command {shown_command(self.command)}"
        source = self.model.source
        assert source is not None, "the validator refuses a spec with neither a command nor a model source"
        return f"{source} {getattr(self.model, source)}"

    @model_validator(mode="after")
    def _sections_fit_together(self) -> Spec:
        if self.command is not None:
            _command_fits(self, self.command)
            return self
        if self.model.source is None and "model" not in self.model_fields_set:
            raise ValueError(
                "model: this section is required (the network to train), unless command gives the "
                "job's own training command"
            )
        if self.model.source is None:
            raise ValueError(f"model: {one_source_message([])}")
        if self.search.unit == "tokens":
            _tokens_fit(self)
        if self.distributed.gang and self.search.parallel != 1:
            raise ValueError(
                f"search.parallel: {self.search.parallel} runs several trials at once, and with "
                f"distributed.strategy {self.distributed.strategy} every trial is already a gang of ranks "
                "(on CUDA one GPU per rank; on the CPU one budget per rank): set it to 1"
            )
        if self.distributed.gang and self.training.mode != "train":
            raise ValueError(
                f"distributed.strategy: {self.distributed.strategy} distributes training; with "
                "training.mode inference use strategy none"
            )
        if self.model.hf_trainer is not None:
            if self.lightning is not None:
                _lightning_fits(self)  # names the section: it sets the Trainer of model.lightning only
            _check_hf_trainer(self)
            return self
        framework = self.model.lightning is not None or self.lightning is not None
        if framework:
            _lightning_fits(self)  # its own sections: the module's code does what input, target, optimizer say
        if self.data is not None:
            _data_fits(self)
            return self
        _own_batches_fit(self, framework)
        return self


def _own_batches_fit(spec: Spec, framework: bool) -> None:
    """Without a command, a Trainer or data, isoprobe makes the batches (from input, or model.batch) and the step
    (its loss, or model.step): the sections that describe them must be there and agree. Spec's validator reaches
    this last, once each case that brings its own batches has returned; ``framework``: a LightningModule, whose
    own code does what input, target and optimizer say."""
    if spec.input is None and spec.model.batch is None and not framework:
        raise ValueError("input: this section is required (the per-sample shape), unless model.batch makes the batches")
    if spec.target is None and spec.model.loss is None and not (spec.model.step and spec.model.batch) and not framework:
        raise ValueError(
            "target: this section is required (the task and its classes or shape), unless model.loss "
            "is given (or model.step with model.batch)"
        )
    if spec.model.step is not None:
        if spec.model.loss is not None:
            raise ValueError("model: model.step computes its own loss; give model.step or model.loss, not both")
        if spec.training.mode != "train":
            raise ValueError("training: mode inference runs no training step; model.step needs mode train")
        if spec.training.precision.endswith("-mixed"):
            raise ValueError(
                f"training: precision {spec.training.precision} autocasts isoprobe's own step; with "
                "model.step, autocast (and scale) inside your step and set training.precision to "
                "fp32 (or bf16-true, which converts the model)"
            )
    task = spec.target.resolved_task if spec.target is not None else None
    if (
        task == "language_modeling"
        and spec.model.batch is None
        and (spec.input is None or spec.input.dtype != "int64" or len(spec.input.shape) != 1)
    ):
        raise ValueError(
            "input: language_modeling takes token ids: input {shape: [sequence_length], dtype: int64, "
            "high: vocabulary_size}"
        )
    if task == "detection" and spec.model.batch is None and (spec.input is None or len(spec.input.shape) != 3):
        raise ValueError("input.shape: detection takes images: [channels, height, width]")
    if spec.training.channels_last and spec.model.batch is None and (spec.input is None or len(spec.input.shape) != 3):
        raise ValueError("training.channels_last: applies to image batches, input.shape [channels, height, width]")
    if spec.allocators is not None:
        if spec.allocator is not None:
            raise ValueError("allocators: give either 'allocator' (one setting) or 'allocators' (to compare)")
        if len(set(spec.allocators)) != len(spec.allocators):
            raise ValueError("allocators: each setting once")
    if spec.model.huggingface is not None and task not in (None, "language_modeling", "classification"):
        raise ValueError("target.task: huggingface models take language_modeling or classification here")


def _command_fits(spec: Spec, command: str | list[str]) -> None:
    """With a command the script builds its model, data, loss and optimizer itself, and launches its own ranks:
    every section that would describe them again is named, not ignored."""
    from isoprobe.spec.command import NOT_FOR_COMMANDS, command_problems

    command_problems(command, spec.shell, spec.batch_from, spec.command_env)
    defaults = {"model": ModelSpec(), "optimizer": OptimizerSpec()}
    given = [
        name
        for name in NOT_FOR_COMMANDS
        if (getattr(spec, name) != defaults[name] if name in defaults else getattr(spec, name) is not None)
    ]
    if given:
        names = ", ".join(given)
        raise ValueError(
            f"{given[0]}: a command builds its own model, data and optimizer, so {names} would be "
            f"ignored: remove {'it' if len(given) == 1 else 'them'} (the trial runs your script as it is)"
        )
    changed = [
        f"training.{name}"
        for name in TrainingSpec.model_fields
        if getattr(spec.training, name) != TrainingSpec.model_fields[name].default
    ]
    if changed:
        raise ValueError(
            f"{changed[0]}: the command's own code sets how a step runs (precision, compile, "
            "checkpointing...); remove the training section and set it in the script's arguments"
        )
    if spec.distributed.strategy != "none":
        raise ValueError(
            f"distributed.strategy: a command starts its own ranks (torchrun, accelerate launch...); "
            f"remove distributed.strategy {spec.distributed.strategy}: each rank the command starts is "
            "measured, and the budget is per rank"
        )
    if spec.search.unit == "tokens":
        raise ValueError(
            "search.unit: tokens sets isoprobe's own input length; a command's batches are the "
            "script's: use unit samples"
        )
    if spec.search.parallel != 1:
        raise ValueError(
            f"search.parallel: {spec.search.parallel} runs several trials at once; a command's trial is "
            "its whole process tree (a launcher's ranks, its workers), whose devices the command picks "
            "itself: set it to 1"
        )


def _tokens_fit(spec: Spec) -> None:
    """search.unit tokens varies input.shape[0] from trial to trial: a spec whose batches it cannot lengthen is
    refused here, before any trial, rather than answered for a length it never ran."""
    if spec.data is not None:
        raise ValueError(
            "search.unit: tokens with data is not built yet (it needs the dataset's samples grouped by "
            "length); describe the input as input {shape: [length, ...]} with search.bucket_lengths"
        )
    if spec.model.batch is not None or spec.model.hf_trainer is not None or spec.model.lightning is not None:
        raise ValueError(
            "search.unit: tokens sets the length of isoprobe's own batches (input.shape[0]); with "
            "model.batch, model.hf_trainer or model.lightning the batches are yours: use unit samples"
        )
    if spec.input is None:
        raise ValueError("input: unit tokens needs input.shape, whose first dimension is the sequence length")
    if spec.allocators is not None:
        raise ValueError("allocators: the comparison searches batch sizes; with search.unit tokens give one allocator")
    if spec.training.eval_pass:
        raise ValueError(
            "training.eval_pass: the evaluation batch is searched in samples after the training "
            "answer; with search.unit tokens run it as a second probe with unit samples"
        )


#: The training options a Hugging Face Trainer sets itself (its TrainingArguments); the spec's own would be ignored.
_TRAINER_OWNS = (
    "mode",
    "precision",
    "channels_last",
    "gradient_checkpointing",
    "compile",
    "compile_backend",
    "cudnn_benchmark",
    "output_lifetime",
)


def _check_hf_trainer(spec: Spec) -> None:
    """model.hf_trainer: the user's Trainer brings its data, loss, optimizer and options; the spec must not
    describe them again, since isoprobe would not use what it says (a silently ignored field is a lie)."""
    given = [f"'{name}'" for name in ("input", "target", "data") if getattr(spec, name) is not None]
    # Values against the defaults, not the fields a user set: the spec reaches the trial as JSON, every field set.
    given += ["'optimizer'"] if spec.optimizer != OptimizerSpec() else []
    given += [f"'model.{name}'" for name in ("batch", "loss", "step") if getattr(spec.model, name) is not None]
    given += [
        f"'training.{name}'"
        for name in _TRAINER_OWNS
        if getattr(spec.training, name) != TrainingSpec.model_fields[name].default
    ]
    if given:
        raise ValueError(
            f"model.hf_trainer: your Trainer's own TrainingArguments, dataset, collator and optimizer run in each "
            f"trial, so {', '.join(given)} would be ignored: remove {'it' if len(given) == 1 else 'them'} (set "
            "precision, gradient checkpointing, accumulation, torch_compile... in the TrainingArguments your "
            "function builds; training.eval_pass is the one training option that applies)"
        )
    if spec.distributed.strategy != "none":
        raise ValueError(
            f"distributed.strategy: {spec.distributed.strategy} is not supported with model.hf_trainer "
            "yet (one process per trial): use strategy none, the answer is the per-device batch"
        )


def _data_fits(spec: Spec) -> None:
    """With data, the dataset makes the batches: the sections that would make them too are named, not ignored.

    The checks of the other sections that do not depend on where the batch comes from run here as well.
    """
    if spec.input is not None:
        raise ValueError("input: with data, every batch comes from data.dataset (its longest samples); remove input")
    if spec.model.batch is not None:
        raise ValueError("model.batch: with data, every batch comes from data.dataset; give one of them")
    if spec.training.channels_last:
        raise ValueError("training.channels_last: not applied to batches from data; convert in data.collate_fn")
    if spec.model.step is not None and spec.model.loss is not None:
        raise ValueError("model: model.step computes its own loss; give model.step or model.loss, not both")
    if spec.model.step is not None and spec.training.mode != "train":
        raise ValueError("training: mode inference runs no training step; model.step needs mode train")
    if spec.model.step is not None and spec.training.precision.endswith("-mixed"):
        raise ValueError(
            f"training: precision {spec.training.precision} autocasts isoprobe's own step; with "
            "model.step, autocast inside your step and set training.precision to fp32"
        )
    task = spec.target.resolved_task if spec.target is not None else None
    if task == "detection":
        raise ValueError(
            "target.task: detection batches come from the synthetic images here; with data, give "
            "model.loss (or model.step) and leave target out"
        )
    if spec.allocators is not None and spec.allocator is not None:
        raise ValueError("allocators: give either 'allocator' (one setting) or 'allocators' (to compare)")


def _lightning_fits(spec: Spec) -> None:
    """With model.lightning the module's own code does what these sections describe: each one set is named."""
    if spec.model.lightning is None:
        raise ValueError(
            "lightning: this section sets the Trainer for model.lightning (a LightningModule); "
            "remove it or set model.lightning"
        )
    owned = {
        "input": "the batches come from the module's (or datamodule's) train_dataloader()",
        "target": "the loss is the module's training_step",
        "optimizer": "the optimizer is the module's configure_optimizers()",
    }
    given = {
        "input": spec.input is not None,
        "target": spec.target is not None,
        "optimizer": spec.optimizer != OptimizerSpec(),
    }  # fields set, also after a JSON round trip
    for name, why in owned.items():
        if given[name]:
            raise ValueError(f"{name}: not used with model.lightning ({why}); remove the section")
    if spec.data is not None:
        raise ValueError(
            "data: not used with model.lightning (the batches come from the module's or datamodule's "
            "train_dataloader()); remove the section"
        )
    for name in ("batch", "loss", "step"):
        if getattr(spec.model, name) is not None:
            raise ValueError(
                f"model.{name}: not used with model.lightning (the module's training_step and "
                "train_dataloader() run); remove it"
            )
    training = spec.training
    for name, why in (
        ("channels_last", "convert the model in the module's setup() or __init__"),
        ("gradient_checkpointing", "enable it in the module, as in the real run"),
        ("compile", "compile inside the module (configure_model), as in the real run"),
        ("eval_pass", "the trials run training only (limit_val_batches=0)"),
    ):
        if getattr(training, name):
            raise ValueError(f"training.{name}: not applied to a LightningModule by isoprobe; {why}")
    if training.mode != "train":
        raise ValueError("training.mode: model.lightning runs trainer.fit; set it to train")
    if spec.distributed.strategy not in ("none", "ddp"):
        raise ValueError(
            f"distributed.strategy: {spec.distributed.strategy} is not run through Lightning here; "
            "with model.lightning use none or ddp (Lightning's DDPStrategy)"
        )
