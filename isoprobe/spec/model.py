"""The spec: what the user writes in YAML, validated into one typed ``Spec``.

Every field a user can set is documented here, once, in its ``Field``
description; ``isoprobe schema --spec`` prints them as JSON Schema. These
models say what a spec is; turning a file, a dict or command-line overrides into
one, and naming every problem on the way, is ``spec.load``'s job. This module
must not import torch.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from isoprobe.errors import shown
from isoprobe.spec.base import SpecSection
from isoprobe.spec.data import CALLABLE_REFERENCE as _CALLABLE_REFERENCE, DataSpec
from isoprobe.spec.distributed import DistributedSpec
from isoprobe.spec.lightning import LightningSpec
from isoprobe.spec.units import MAX_BYTES, parse_bytes


ByteCount = Annotated[int, BeforeValidator(parse_bytes)]
#: A size where 0 means "none" (search.edge_spread: 0 turns the spread rule off).
ByteCountOrZero = Annotated[int, BeforeValidator(lambda value: 0 if value == 0 or value == "0" else parse_bytes(value))]


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


#: The model sources, in the order a reader meets them; exactly one is given.
MODEL_SOURCES = ("torchvision", "timm", "huggingface", "factory", "hf_trainer", "lightning")
#: The library (importable module and distribution) each named model source builds with; a factory has none.
#: The one place this mapping lives: the child imports it, the cache keys its version, the warm spare preloads it.
MODEL_LIBRARIES = {"torchvision": "torchvision", "timm": "timm", "huggingface": "transformers",
                   "hf_trainer": "transformers", "lightning": "lightning"}
#: What a user installs for a source whose library is not a core dependency.
EXTRAS = {"timm": "pip install 'isoprobe[timm]'", "huggingface": "pip install 'isoprobe[huggingface]'",
          "hf_trainer": "pip install 'isoprobe[huggingface]'", "lightning": "pip install 'isoprobe[lightning]'"}
#: The spec fields that name a callable: 'module:function' or 'file.py:function'.
CALLABLE_FIELDS = ("factory", "batch", "loss", "step", "hf_trainer", "lightning", "datamodule")


def is_file_reference(target: str) -> bool:
    """Whether the part before ':' of a callable reference names a file (vs. an importable module).

    The one rule, used where a reference is resolved against the spec's folder,
    hashed for the cache key, checked before any trial, and imported in the child.
    """
    return target.endswith(".py") or "/" in target


def one_source_message(given: list[str]) -> str:
    """The one wording for a model section with no source or several (``ModelSpec``, ``Spec``)."""
    return ("give exactly one of 'torchvision' (a model name), 'timm' (a model name), 'huggingface' "
            "(a model type), 'factory' ('module:function'), 'hf_trainer' ('module:function' building a "
            "transformers.Trainer) or 'lightning' ('module:LightningModuleClass'); "
            f"got {', '.join(given) or 'none'}")


class ModelSpec(SpecSection):
    """Which network to train. Give exactly one of ``torchvision``, ``timm``, ``huggingface``, ``factory``,
    ``hf_trainer`` (a whole training setup: the user's own Trainer) and ``lightning`` (the user's LightningModule)."""

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
    hf_trainer: str | None = Field(
        None,
        description=(
            "Your own Hugging Face training setup: a function 'module:function' or 'file.py:function' called as "
            "f(batch_size, **kwargs) that returns a transformers.Trainer (your model, TrainingArguments, dataset "
            "and collator) whose per_device_train_batch_size is batch_size. Each trial runs its trainer.train() "
            "for the trial's steps, so what fits is what your Trainer allocates; the answer is the per-device "
            "batch. input, target, optimizer and the training options other than eval_pass come from your "
            "Trainer, not the spec (see docs/huggingface.md). Needs the extra: pip install 'isoprobe[huggingface]'."
        ),
    )
    lightning: str | None = Field(
        None,
        description=(
            "A LightningModule class, or a function returning one, written 'package.module:Name' or "
            "'path/to/file.py:Name'; kwargs are its init arguments. Each trial runs trainer.fit on it in a fresh "
            "process: its own training_step, configure_optimizers and train_dataloader() (or the datamodule's), "
            "with the Trainer arguments of the 'lightning' section. Replaces the input, target and optimizer "
            "sections. Needs the extra: pip install 'isoprobe[lightning]'."
        ),
    )
    datamodule: str | None = Field(
        None,
        description="With lightning: an optional LightningDataModule class or factory, 'module:Name' or "
        "'file.py:Name', whose train_dataloader() gives the batches in place of the module's.",
    )
    datamodule_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="With datamodule: its init arguments, e.g. {data_dir: data}."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the model builder (for huggingface: config values; for hf_trainer: "
        "the function's; for lightning: the module's init arguments), e.g. {num_classes: 1000}. Weights are "
        "never downloaded.",
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

    depends_on: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "Files the model's code reads that isoprobe cannot see it read: those opened by C or Rust code (a "
            "tokenizer library's own reader, a natively memory-mapped file), relative to the spec file, e.g. "
            "[tokenizer.json]. They are hashed into the cache key, so editing one probes again. Files read "
            "through Python's open() (json.load, Path.read_text, torch.load) are tracked without this."
        ),
    )

    @model_validator(mode="after")
    def _at_most_one_source(self) -> "ModelSpec":
        # None at all is the spec's to judge (``Spec``): a spec with a ``command`` has no model section.
        given = [name for name in MODEL_SOURCES if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(one_source_message(given))
        if self.lightning is None and (self.datamodule is not None or self.datamodule_kwargs):
            raise ValueError("datamodule: a LightningDataModule goes with model.lightning (a LightningModule)")
        if self.datamodule is None and self.datamodule_kwargs:
            raise ValueError("datamodule_kwargs: set model.datamodule, the data module they are for")
        for name in CALLABLE_FIELDS:
            value = getattr(self, name)
            if value is not None and not _CALLABLE_REFERENCE.fullmatch(value):
                message = f"{name} {value!r} must look like 'package.module:function' or 'file.py:function'"
                if name in ("lightning", "datamodule"):
                    message = f"{name} {value!r} must look like 'package.module:ClassName' or 'file.py:ClassName'"
                # factory keeps its historical wording; batch and loss name their own field.
                raise ValueError(message if name == "factory" else f"{name}: {message}")
        return self

    @property
    def source(self) -> str | None:
        """Which of MODEL_SOURCES this spec names; None for a spec whose trials run a ``command``."""
        return next((name for name in MODEL_SOURCES if getattr(self, name) is not None), None)

    @property
    def library(self) -> str | None:
        """The module the source builds with (MODEL_LIBRARIES: lightning's trainer too), or None for a factory."""
        return MODEL_LIBRARIES.get(self.source)


class InputSpec(SpecSection):
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
    def _consistent(self) -> "TrainingSpec":
        if self.mode == "inference" and self.gradient_checkpointing:
            raise ValueError(
                "gradient_checkpointing: saves memory for the backward pass; mode inference has none"
            )
        if self.mode == "inference" and self.eval_pass:
            raise ValueError("eval_pass: adds an evaluation pass to training; in mode inference every step is one")
        return self


#: search.bucket_lengths: a length above this is a typo (a million tokens in one sample).
MAX_BUCKET_LENGTH = 1 << 20
#: search.bucket_lengths: at most this many; each costs at least one trial.
MAX_BUCKETS = 64


class SearchSpec(SpecSection):
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
    steady_steps: int | None = Field(
        None, ge=0, le=10000,
        description=(
            "The most steps a trial that decides the maximum runs while its peak still rises (the trial right below "
            "the smallest failure, whose fit makes it the maximum; a maximum whose only fit was a shorter trial runs "
            "once more; any search.confirmations; the long-run search below a batch that failed the long run): it "
            "stops as soon as the peak has held still for 5 steps (so it runs at least 6). A peak still rising at "
            "this cap is still_rising, not fits. null: 30; 0: off (every trial runs search.steps, and the maximum "
            "is the batch that fit one trial of them)."
        ),
    )
    edge_spread: ByteCountOrZero | None = Field(
        None, le=MAX_BYTES,
        description=(
            "How far a batch's long-run peak may move between fresh processes and over steps (the spread): the "
            "maximum reported is a batch whose steady peak leaves more than this free below the capacity; one that "
            "fitted closer is reported in edge_margin.marginal, never as the maximum. null: the backend's measured "
            "floor (docs/steady-state.md), raised to what this probe saw between two runs of one batch; 0: off "
            "(the raw edge, a coin toss in a long run). Applies with the steady rule only (search.steady_steps "
            "not 0)."
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
    confirmations: int | None = Field(
        None,
        ge=0,
        le=5,
        description=(
            "Extra runs of the maximum after its first fit, each in a fresh process and stepping until its peak is "
            "steady (search.steady_steps). If one fails, the edge is flaky and the answer moves down to the largest "
            "batch that fit every time it ran. null: 0 for the batch search, whose deciding trial (the batch right "
            "below the smallest failure) already stepped until steady and cleared the spread (search.edge_spread: "
            "how far a fresh process may move; a maximum whose only fit was a shorter trial still runs once more, "
            "until steady); 1 for the token search's binding batch and the evaluation batch, which keep their "
            "confirmation. 0: none beyond that (result.max_confirmed false)."
        ),
    )

    def confirmations_for(self, search: Literal["batch", "tokens", "eval"]) -> int:
        """search.confirmations as applied: the spec's, else 0 for the batch search (its deciding trial is the
        proof), 1 for the token and evaluation searches."""
        if self.confirmations is not None:
            return self.confirmations
        return 0 if search == "batch" else 1
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
            "one trial at a time. Not with a distributed strategy, where each trial is already a gang: a spec error."
        ),
    )
    warm_start: bool = Field(
        True,
        description=(
            "Start the next trial's process while the current one runs: it imports torch at idle priority "
            "(never touching the GPU), so that it only builds and trains when its turn comes. Saves the import, "
            "seconds per trial; false: each trial's process is started when the trial is due (same imports, "
            "same timeout; only slower). Gangs stepped by srun: see distributed.steps_ahead."
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

    unit: Literal["samples", "tokens"] = Field(
        "samples",
        description=(
            "What the answer counts. samples (the default): the largest batch. tokens: the largest token budget "
            "per batch T (samples x padded length) for a length-bucketing sampler: every bucket length L of "
            "search.bucket_lengths, filled with floor(T / L) samples of length L (input.shape[0]), fits. "
            "See docs/data.md#token-budgets."
        ),
    )
    bucket_lengths: list[Annotated[int, Field(ge=1, le=MAX_BUCKET_LENGTH)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_BUCKETS,
        description=(
            "With unit tokens: the padded lengths your sampler's buckets produce (positive integers, e.g. "
            "[128, 256, 512, 1024]); each trial's input.shape[0] is one of them. The budget is the largest one "
            "every length fits; the result names the binding (worst) length."
        ),
    )

    @model_validator(mode="after")
    def _start_within_caps(self) -> "SearchSpec":
        for name in ("max_batch_size", "dataset_size"):
            cap = getattr(self, name)
            if cap is not None and self.start_batch_size > cap:
                raise ValueError(f"start_batch_size {self.start_batch_size} is above {name} {cap}")
        if self.unit == "tokens" and self.bucket_lengths is None:
            raise ValueError("bucket_lengths: unit tokens needs the lengths your sampler pads its buckets to, e.g. "
                             "search.bucket_lengths: [128, 256, 512]")
        if self.bucket_lengths is not None and self.unit != "tokens":
            raise ValueError("bucket_lengths: applies to unit tokens; set search.unit: tokens, or remove it")
        if self.unit == "tokens" and self.parallel != 1:
            raise ValueError("unit: tokens runs one trial at a time (each length's trial decides where the next "
                             "goes); set search.parallel to 1")
        return self

    @property
    def cap(self) -> int | None:
        """The largest batch the search may try, or None when only memory limits it."""
        caps = [c for c in (self.max_batch_size, self.dataset_size) if c is not None]
        return min(caps) if caps else None


class RecommendationSpec(SpecSection):
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
            "down (up to 3 soaks). null (the default): a soak only where it adds evidence: none when the "
            "recommended batch is below a maximum whose deciding trial stepped until its peak was steady and the "
            "line, plus the growth that trial showed over steps, keeps it within the headroom (memory rises with "
            "the batch, so the maximum's steady run already proves it; result.recommendation.proven_by_trial "
            "names that trial); otherwise a soak of 20 steps on CUDA, 6 on the CPU backend (where a step takes "
            "seconds to minutes and the allocator settles within two steps, so 6 show a trend over the last "
            "four). A number: always soak that many steps. 0: no soak and no trial for the recommendation: the "
            "batch advised from the fitting trials, at or below the maximum (result.recommendation.soaked false)."
        ),
    )


class PlanSpec(SpecSection):
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


class Spec(SpecSection):
    """A training setup to probe: a model isoprobe trains (``model`` and the sections that describe its step), or
    the job's own training command (``command``), run as it is."""

    model: ModelSpec = Field(
        default_factory=ModelSpec, description="The network isoprobe trains. Give it, or command (not both).")
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
    shell: bool = Field(False, description="With command given as one string: run it with /bin/sh -c (pipes, "
                                           "variables, &&) instead of splitting it into words.")
    batch_from: Literal["argument", "env"] = Field(
        "argument",
        description="Where the command takes its batch size from: 'argument' (the default: '{batch_size}' must be "
                    "in its arguments) or 'env' (the script reads ISOPROBE_BATCH_SIZE, which every trial sets).",
    )
    command_dir: str | None = Field(
        None, min_length=1,
        description="The folder the command runs in, relative to the spec file. Unset: the folder isoprobe runs in "
                    "(as a job script's next line would). Part of the cache key.",
    )
    command_env: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, max_length=256,
        description="Environment variables the command's behaviour depends on (e.g. [CONFIG, NCCL_ALGO]): their "
                    "values are part of the cache key, so changing one probes again.",
    )
    input: InputSpec | None = Field(
        None, description="One sample of the input; required unless model.batch or data makes the batches."
    )
    target: TargetSpec | None = Field(
        None, description="The task and its targets; required unless model.loss computes the loss (with data: "
        "unset, the loss is the model's own output.loss, as a Hugging Face model given labels returns it)."
    )
    data: DataSpec | None = Field(
        None, description="Batches from your own dataset, the worst one (the B longest samples) in every trial; "
        "replaces input. See docs/data.md."
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
    lightning: LightningSpec | None = Field(
        None, description="With model.lightning: the Trainer's arguments that change memory (defaults: Lightning's)."
    )

    @property
    def workload(self) -> str:
        """What the trials run, for a person: 'torchvision resnet50', or 'command python train.py ...'."""
        if self.command is not None:
            from isoprobe.spec.command import shown_command

            return f"command {shown_command(self.command)}"
        return f"{self.model.source} {getattr(self.model, self.model.source)}"

    @model_validator(mode="after")
    def _sections_fit_together(self) -> "Spec":
        if self.command is not None:
            _command_fits(self)
            return self
        if self.model.source is None and "model" not in self.model_fields_set:
            raise ValueError("model: this section is required (the network to train), unless command gives the "
                             "job's own training command")
        if self.model.source is None:
            raise ValueError(f"model: {one_source_message([])}")
        if self.search.unit == "tokens":
            _tokens_fit(self)
        if self.distributed.gang and self.search.parallel != 1:
            raise ValueError(f"search.parallel: {self.search.parallel} runs several trials at once, and with "
                             f"distributed.strategy {self.distributed.strategy} every trial is already a gang of ranks "
                             "(on CUDA one GPU per rank; on the CPU one budget per rank): set it to 1")
        if self.distributed.gang and self.training.mode != "train":
            raise ValueError(f"distributed.strategy: {self.distributed.strategy} distributes training; with "
                             "training.mode inference use strategy none")
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
        if self.input is None and self.model.batch is None and not framework:
            raise ValueError("input: this section is required (the per-sample shape), unless model.batch makes the batches")
        if self.target is None and self.model.loss is None and not (self.model.step and self.model.batch) and not framework:
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



def _command_fits(spec: Spec) -> None:
    """With a command the script builds its model, data, loss and optimizer itself, and launches its own ranks:
    every section that would describe them again is named, not ignored."""
    from isoprobe.spec.command import NOT_FOR_COMMANDS, command_problems

    command_problems(spec.command, spec.shell, spec.batch_from, spec.command_env)
    defaults = {"model": ModelSpec(), "optimizer": OptimizerSpec()}
    given = [name for name in NOT_FOR_COMMANDS
             if (getattr(spec, name) != defaults[name] if name in defaults else getattr(spec, name) is not None)]
    if given:
        names = ", ".join(given)
        raise ValueError(f"{given[0]}: a command builds its own model, data and optimizer, so {names} would be "
                         f"ignored: remove {'it' if len(given) == 1 else 'them'} (the trial runs your script as it is)")
    changed = [f"training.{name}" for name in TrainingSpec.model_fields
               if getattr(spec.training, name) != TrainingSpec.model_fields[name].default]
    if changed:
        raise ValueError(f"{changed[0]}: the command's own code sets how a step runs (precision, compile, "
                         "checkpointing...); remove the training section and set it in the script's arguments")
    if spec.distributed.strategy != "none":
        raise ValueError(f"distributed.strategy: a command starts its own ranks (torchrun, accelerate launch...); "
                         f"remove distributed.strategy {spec.distributed.strategy}: each rank the command starts is "
                         "measured, and the budget is per rank")
    if spec.search.unit == "tokens":
        raise ValueError("search.unit: tokens sets isoprobe's own input length; a command's batches are the "
                         "script's: use unit samples")
    if spec.search.parallel != 1:
        raise ValueError(f"search.parallel: {spec.search.parallel} runs several trials at once; a command's trial is "
                         "its whole process tree (a launcher's ranks, its workers), whose devices the command picks "
                         "itself: set it to 1")


def _tokens_fit(spec: Spec) -> None:
    """search.unit tokens varies input.shape[0] from trial to trial: a spec whose batches it cannot lengthen is
    refused here, before any trial, rather than answered for a length it never ran."""
    if spec.data is not None:
        raise ValueError("search.unit: tokens with data is not built yet (it needs the dataset's samples grouped by "
                         "length); describe the input as input {shape: [length, ...]} with search.bucket_lengths")
    if spec.model.batch is not None or spec.model.hf_trainer is not None or spec.model.lightning is not None:
        raise ValueError("search.unit: tokens sets the length of isoprobe's own batches (input.shape[0]); with "
                         "model.batch, model.hf_trainer or model.lightning the batches are yours: use unit samples")
    if spec.input is None:
        raise ValueError("input: unit tokens needs input.shape, whose first dimension is the sequence length")
    if spec.allocators is not None:
        raise ValueError("allocators: the comparison searches batch sizes; with search.unit tokens give one "
                         "allocator")
    if spec.training.eval_pass:
        raise ValueError("training.eval_pass: the evaluation batch is searched in samples after the training "
                         "answer; with search.unit tokens run it as a second probe with unit samples")


#: The training options a Hugging Face Trainer sets itself (its TrainingArguments); the spec's own would be ignored.
_TRAINER_OWNS = ("mode", "precision", "channels_last", "gradient_checkpointing", "compile", "compile_backend",
                 "cudnn_benchmark", "output_lifetime")


def _check_hf_trainer(spec: Spec) -> None:
    """model.hf_trainer: the user's Trainer brings its data, loss, optimizer and options; the spec must not
    describe them again, since isoprobe would not use what it says (a silently ignored field is a lie)."""
    given = [f"'{name}'" for name in ("input", "target", "data") if getattr(spec, name) is not None]
    # Values against the defaults, not the fields a user set: the spec reaches the trial as JSON, every field set.
    given += ["'optimizer'"] if spec.optimizer != OptimizerSpec() else []
    given += [f"'model.{name}'" for name in ("batch", "loss", "step") if getattr(spec.model, name) is not None]
    given += [f"'training.{name}'" for name in _TRAINER_OWNS
              if getattr(spec.training, name) != TrainingSpec.model_fields[name].default]
    if given:
        raise ValueError(
            f"model.hf_trainer: your Trainer's own TrainingArguments, dataset, collator and optimizer run in each "
            f"trial, so {', '.join(given)} would be ignored: remove {'it' if len(given) == 1 else 'them'} (set "
            "precision, gradient checkpointing, accumulation, torch_compile... in the TrainingArguments your "
            "function builds; training.eval_pass is the one training option that applies)"
        )
    if spec.distributed.strategy != "none":
        raise ValueError(f"distributed.strategy: {spec.distributed.strategy} is not supported with model.hf_trainer "
                         "yet (one process per trial): use strategy none, the answer is the per-device batch")


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
        raise ValueError(f"training: precision {spec.training.precision} autocasts isoprobe's own step; with "
                         "model.step, autocast inside your step and set training.precision to fp32")
    task = spec.target.resolved_task if spec.target is not None else None
    if task == "detection":
        raise ValueError("target.task: detection batches come from the synthetic images here; with data, give "
                         "model.loss (or model.step) and leave target out")
    if spec.allocators is not None and spec.allocator is not None:
        raise ValueError("allocators: give either 'allocator' (one setting) or 'allocators' (to compare)")


def _lightning_fits(spec: Spec) -> None:
    """With model.lightning the module's own code does what these sections describe: each one set is named."""
    if spec.model.lightning is None:
        raise ValueError("lightning: this section sets the Trainer for model.lightning (a LightningModule); "
                         "remove it or set model.lightning")
    owned = {"input": "the batches come from the module's (or datamodule's) train_dataloader()",
             "target": "the loss is the module's training_step",
             "optimizer": "the optimizer is the module's configure_optimizers()"}
    given = {"input": spec.input is not None, "target": spec.target is not None,
             "optimizer": spec.optimizer != OptimizerSpec()}  # fields set, also after a JSON round trip
    for name, why in owned.items():
        if given[name]:
            raise ValueError(f"{name}: not used with model.lightning ({why}); remove the section")
    if spec.data is not None:
        raise ValueError("data: not used with model.lightning (the batches come from the module's or datamodule's "
                         "train_dataloader()); remove the section")
    for name in ("batch", "loss", "step"):
        if getattr(spec.model, name) is not None:
            raise ValueError(f"model.{name}: not used with model.lightning (the module's training_step and "
                             "train_dataloader() run); remove it")
    training = spec.training
    for name, why in (("channels_last", "convert the model in the module's setup() or __init__"),
                      ("gradient_checkpointing", "enable it in the module, as in the real run"),
                      ("compile", "compile inside the module (configure_model), as in the real run"),
                      ("eval_pass", "the trials run training only (limit_val_batches=0)")):
        if getattr(training, name):
            raise ValueError(f"training.{name}: not applied to a LightningModule by isoprobe; {why}")
    if training.mode != "train":
        raise ValueError("training.mode: model.lightning runs trainer.fit; set it to train")
    if spec.distributed.strategy not in ("none", "ddp"):
        raise ValueError(f"distributed.strategy: {spec.distributed.strategy} is not run through Lightning here; "
                         "with model.lightning use none or ddp (Lightning's DDPStrategy)")
