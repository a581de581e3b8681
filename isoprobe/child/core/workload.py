"""What a trial trains: the model from its source, a synthetic batch of the task's worst-case shape, the loss.

Child-side only (imports torch lazily, like the rest of the child). The four model sources
(torchvision, timm, Hugging Face transformers from a config, a user factory)
and the five tasks (classification, segmentation, language modelling,
regression, detection) meet here, so that ``training.py`` can run one step the
same way for all of them: ``forward_loss`` for a training step,
``forward_only`` for inference and evaluation.

The batch is always the *worst case* the spec describes: every sequence at the
maximum length, every image at full size, because a real epoch meets that
batch sooner or later and the answer must hold for it.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from isoprobe.child.core.references import import_callable
from isoprobe.spec.input_target import InputSpec, TargetSpec
from isoprobe.spec.model import Spec

#: What the loss functions of the built-in tasks expect the model to return, for error messages.
_EXPECTED_OUTPUT = {
    "classification": "(batch, classes)",
    "segmentation": "(batch, classes, height, width)",
    "language_modeling": "(batch, sequence, vocabulary)",
    "regression": "(batch, *target.shape)",
}


@dataclass
class Batch:
    """One synthetic batch: what the model is called with, and what the loss compares against.

    ``targets`` is None for the built-in classification-like tasks until the first
    forward pass shows the output's shape (per-pixel targets for dense outputs).
    """

    inputs: Any
    targets: Any = None
    #: What the real loop keeps alive while it trains, and so the trial too: the dataset the batch came from.
    dataset: Any = None


def task_of(spec: Spec) -> str | None:
    """The target's task (given, or implied by classes / shape); None when model.loss replaces the target."""
    return spec.target.resolved_task if spec.target is not None else None


# --------------------------------------------------------------------------- the model


def import_model_library(spec: Spec):
    """The model source's library (``ModelSpec.library``: torchvision, timm or transformers), or None for a factory."""
    library = spec.model.library
    return importlib.import_module(library) if library is not None else None


def build_model(spec: Spec, python_path: list[str]):
    """The spec's model with fresh random weights; nothing is ever downloaded."""
    import torch

    model_spec = spec.model
    kwargs = dict(model_spec.kwargs)
    if model_spec.torchvision is not None:
        import torchvision

        kwargs.setdefault("weights", None)
        if task_of(spec) == "detection" or _is_torchvision_detection(model_spec.torchvision):
            kwargs.setdefault("weights_backbone", None)
        model = torchvision.models.get_model(model_spec.torchvision, **kwargs)
    elif model_spec.timm is not None:
        import timm

        kwargs.setdefault("pretrained", False)
        model = timm.create_model(model_spec.timm, **kwargs)
    elif model_spec.huggingface is not None:
        model = _build_huggingface(spec, model_spec.huggingface, kwargs)
    elif model_spec.factory is not None:
        model = import_callable(model_spec.factory, python_path)(**kwargs)
    else:  # the spec's validation asks for exactly one source
        raise ValueError("the model section names no source (torchvision, timm, huggingface or factory)")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"the model builder returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _is_torchvision_detection(name: str) -> bool:
    import torchvision

    try:
        return name in torchvision.models.list_models(module=torchvision.models.detection)
    except Exception:
        return False


def _build_huggingface(spec: Spec, name: str, config_values: dict):
    """``AutoConfig.for_model`` + ``from_config``: the architecture ``name`` at random init, no download, no cache."""
    import transformers

    task = task_of(spec)
    if task == "classification" and spec.target is not None:  # (a task is only ever a target's)
        config_values.setdefault("num_labels", spec.target.classes)
    config = transformers.AutoConfig.for_model(name, **config_values)
    if task == "language_modeling":
        config.use_cache = False  # a training step keeps no key/value cache
        return transformers.AutoModelForCausalLM.from_config(config)
    if task == "classification":
        return transformers.AutoModelForSequenceClassification.from_config(config)
    return transformers.AutoModel.from_config(config)


# --------------------------------------------------------------------------- the batch


def make_batch(
    spec: Spec, batch_size: int, device, python_path: list[str], float_dtype=None, data_indices: list[int] | None = None
) -> Batch:
    """A synthetic batch of the worst-case shape, or with ``spec.data`` the dataset's worst batch of
    ``batch_size`` (``data_indices``: the indices the parent sent); ``float_dtype`` overrides floating inputs."""
    import torch

    if spec.data is not None:
        return _data_batch(spec, batch_size, device, python_path, float_dtype, data_indices)
    maker = spec.model.batch
    if maker is not None:
        made = import_callable(maker, python_path)(batch_size, device)
        if not (isinstance(made, (tuple, list)) and len(made) == 2):
            raise TypeError(f"model.batch must return (inputs, targets), got {type(made).__name__}")
        inputs, targets = made
        return Batch(_cast_floats(inputs, float_dtype), targets)
    task = task_of(spec)
    input_spec = _input(spec)
    shape = (batch_size, *input_spec.shape)
    dtype = getattr(torch, input_spec.dtype)
    if float_dtype is not None and dtype.is_floating_point:
        dtype = float_dtype
    if task == "detection":
        return _detection_batch(spec, batch_size, device, dtype)
    if input_spec.dtype == "int64":
        if input_spec.high is None:  # the spec's validation asks int64 inputs for it
            raise ValueError("input.high is needed for int64 inputs")
        inputs = torch.randint(0, input_spec.high, shape, device=device)
    else:
        inputs = torch.randn(shape, dtype=dtype, device=device)
    if task == "language_modeling":
        return Batch(inputs, inputs)  # the labels are the ids; the loss shifts them by one
    return Batch(inputs)


def _data_batch(spec: Spec, batch_size: int, device, python_path: list[str], float_dtype, sent) -> Batch:
    """The B longest samples, collated by the user's collate_fn, on the device; read as model.batch's pair is."""
    import torch

    from isoprobe.child.core import data

    dataset, collated = data.trial_batch(spec, batch_size, sent, python_path)  # raises the user's own exception
    inputs, targets = data.as_inputs_and_targets(collated)
    inputs = _cast_floats(adapt_inputs(inputs, lambda t: t.to(device)), float_dtype)
    targets = adapt_inputs(targets, lambda t: t.to(device))
    if targets is None and task_of(spec) == "language_modeling" and isinstance(inputs, torch.Tensor):
        targets = inputs  # the labels are the ids; the loss shifts them by one
    return Batch(inputs, targets, dataset=dataset)


def step_targets(spec: Spec, inputs):
    """Targets for model.step before any forward pass: class indices per sample (per pixel at the input's
    size for segmentation), or values of target.shape; the built-in step draws them from its first output."""
    import torch

    target = spec.target
    if target is None:
        return None  # model.batch made this batch without targets: the step does without
    batch = inputs.shape[0]
    device = inputs.device
    if target.classes is not None:
        shape = (batch, *inputs.shape[-2:]) if task_of(spec) == "segmentation" else (batch,)
        return torch.randint(0, target.classes, shape, device=device)
    return torch.randn((batch, *target_shape(target)), device=device)


def _input(spec: Spec) -> InputSpec:
    """``spec.input``: a synthetic batch is only ever made for a spec that has one (the spec's validation)."""
    if spec.input is None:
        raise ValueError("a synthetic batch needs the spec's input section")
    return spec.input


def _target(spec: Spec) -> TargetSpec:
    """``spec.target``: targets are only ever drawn for a spec that has one (model.loss replaces it otherwise)."""
    if spec.target is None:
        raise ValueError("targets need the spec's target section")
    return spec.target


def target_shape(target: TargetSpec) -> list[int]:
    """A regression target's shape: a target without classes has one (the spec's validation)."""
    if target.shape is None:
        raise ValueError("the target has neither classes nor a shape")
    return target.shape


def _cast_floats(value, dtype):
    import torch

    if dtype is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    return value


def _detection_batch(spec: Spec, batch_size: int, device, dtype) -> Batch:
    """Images at full size and ``boxes_per_image`` valid boxes each (torchvision's detection format)."""
    import torch

    channels, height, width = _input(spec).shape
    target = _target(spec)
    count, classes = target.boxes_per_image, target.classes
    if classes is None:  # the spec's validation asks detection for its classes
        raise ValueError("detection needs target.classes")
    images, targets = [], []
    generator = torch.Generator().manual_seed(0)
    for _ in range(batch_size):
        images.append(torch.rand((channels, height, width), dtype=dtype, device=device))
        corner = torch.rand((count, 2), generator=generator) * torch.tensor([width * 0.7, height * 0.7])
        size = 8 + torch.rand((count, 2), generator=generator) * torch.tensor([width * 0.3, height * 0.3])
        boxes = torch.cat([corner, torch.minimum(corner + size, torch.tensor([width, height]))], dim=1)
        labels = torch.randint(1, classes, (count,), generator=generator)
        targets.append({"boxes": boxes.to(device), "labels": labels.to(device)})
    return Batch(images, targets)


def adapt_inputs(inputs, transform):
    """Apply ``transform`` to every tensor in the inputs (a tensor, a list/tuple, or a dict)."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return transform(inputs)
    if isinstance(inputs, dict):
        return {k: adapt_inputs(v, transform) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(adapt_inputs(v, transform) for v in inputs)
    return inputs


# --------------------------------------------------------------------------- forward and loss


def call_model(spec: Spec, model, inputs, targets=None):
    """Call the model the way its kind expects: detection models take (images, targets) in training."""
    if task_of(spec) == "detection" and spec.model.batch is None:
        return model(inputs, targets) if model.training else model(inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def forward_loss(spec: Spec, model, batch: Batch, user_loss=None, on_output=None):
    """Forward pass and the scalar loss, as the real training loop computes it; returns (loss, output).

    ``on_output`` is called with the output the moment the model returns, before the loss is computed:
    where a plain loop's ``outputs = model(x)`` rebinds, releasing the previous step's output.
    """
    hold = on_output or (lambda output: None)
    task = task_of(spec)
    if spec.data is not None and task is None and user_loss is None:
        # No target and no loss: the model's own, as a Hugging Face model given labels in the batch returns it.
        output = call_model(spec, model, batch.inputs, batch.targets)
        hold(output)
        return _model_loss(
            output,
            "with data and neither target nor model.loss, the model must return its own "
            "loss (output.loss, as a Hugging Face model given labels does)",
        ), output
    if (
        spec.model.huggingface is not None
        and task == "language_modeling"
        and user_loss is None
        and not isinstance(batch.inputs, dict)
    ):
        # The model's own loss: it shifts the labels and upcasts the logits to float32, as real training does.
        output = model(input_ids=batch.inputs, labels=batch.targets)
        hold(output)
        return _model_loss(output), output
    output = call_model(spec, model, batch.inputs, batch.targets)
    if user_loss is not None:
        hold(output)
        return user_loss(output, batch.targets), output
    if task == "detection":
        hold(None)
        return sum(output.values()), None  # torchvision detection models return their losses in training mode
    logits = primary_output(output)
    hold(logits)
    if batch.targets is None:
        batch.targets = make_targets(spec, logits)
    return loss_of(spec, logits, batch.targets), logits


def _model_loss(output, why: str = "the Hugging Face model returned no loss for labels=input_ids"):
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None:
        raise TypeError(why)
    return loss


def forward_only(spec: Spec, model, batch: Batch):
    """Forward pass without a loss (inference and evaluation); the caller sets the grad mode."""
    if spec.model.huggingface is not None and not isinstance(batch.inputs, dict):
        return model(input_ids=batch.inputs)
    return call_model(spec, model, batch.inputs, batch.targets)


def primary_output(output):
    """The tensor the loss applies to, from the shapes torchvision and common libraries return."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        return output["out"] if "out" in output else next(iter(output.values()))
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)) and output:
        return primary_output(output[0])
    raise TypeError(f"cannot find the output tensor in a {type(output).__name__}")


def make_targets(spec: Spec, output):
    """Targets of the exact shape the loss needs, drawn once from the first output and reused every step."""
    import torch

    target = _target(spec)
    batch = output.shape[0]
    if target.classes is not None:
        # (B, C) -> (B,); (B, C, H, W) -> (B, H, W): per-pixel classes for dense outputs.
        return torch.randint(0, target.classes, (batch, *output.shape[2:]), device=output.device)
    return torch.randn((batch, *target_shape(target)), dtype=output.dtype, device=output.device)


def loss_of(spec: Spec, output, targets):
    import torch.nn.functional as F

    task = task_of(spec)
    if task == "language_modeling":
        if output.dim() != 3:
            raise ValueError(f"language_modeling needs logits {_EXPECTED_OUTPUT[task]}, got {tuple(output.shape)}")
        # Next-token prediction; logits upcast to float32 as Hugging Face's loss does (it costs memory).
        logits = output[:, :-1, :].float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1))
    if task in ("classification", "segmentation"):
        if task == "segmentation" and output.dim() != 4:
            raise ValueError(f"segmentation needs outputs {_EXPECTED_OUTPUT[task]}, got {tuple(output.shape)}")
        return F.cross_entropy(output, targets)
    if tuple(output.shape) != tuple(targets.shape):
        raise ValueError(
            f"the model's output has shape {tuple(output.shape)} but target.shape gives "
            f"{tuple(targets.shape)}: set target.shape to the per-sample output shape {list(output.shape[1:])}"
        )
    return F.mse_loss(output, targets)
