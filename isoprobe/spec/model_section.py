"""The spec's ``model`` section: which network isoprobe trains, from which of the six sources.

Named ``model_section`` because ``spec.model`` is the whole spec's model (the
root ``Spec``). The names every layer uses about a model source live here
too, once: the sources, the library each builds with, the extra that installs
it, the fields that name a callable and how such a reference is told to be a
file. Whether a spec without a model section is valid (a ``command`` replaces
it) is the root's to judge, not this section's.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from isoprobe.spec.base import SpecSection
from isoprobe.spec.data import CALLABLE_REFERENCE as _CALLABLE_REFERENCE

#: The model sources, in the order a reader meets them; exactly one is given.
MODEL_SOURCES = ("torchvision", "timm", "huggingface", "factory", "hf_trainer", "lightning")
#: The library (importable module and distribution) each named model source builds with; a factory has none.
#: The one place this mapping lives: the child imports it, the cache keys its version, the warm spare preloads it.
MODEL_LIBRARIES = {
    "torchvision": "torchvision",
    "timm": "timm",
    "huggingface": "transformers",
    "hf_trainer": "transformers",
    "lightning": "lightning",
}
#: What a user installs for a source whose library is not a core dependency.
EXTRAS = {
    "timm": "pip install 'isoprobe[timm]'",
    "huggingface": "pip install 'isoprobe[huggingface]'",
    "hf_trainer": "pip install 'isoprobe[huggingface]'",
    "lightning": "pip install 'isoprobe[lightning]'",
}
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
    return (
        "give exactly one of 'torchvision' (a model name), 'timm' (a model name), 'huggingface' "
        "(a model type), 'factory' ('module:function'), 'hf_trainer' ('module:function' building a "
        "transformers.Trainer) or 'lightning' ('module:LightningModuleClass'); "
        f"got {', '.join(given) or 'none'}"
    )


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
    def _at_most_one_source(self) -> ModelSpec:
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
        source = self.source
        return MODEL_LIBRARIES.get(source) if source is not None else None
