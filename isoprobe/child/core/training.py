"""How a trial's step runs: the levers of the spec's ``training`` section, applied for real.

Child-side only. ``Step.prepare`` turns the built model into the one the real
job trains (bf16 weights, channels_last, gradient checkpointing, compile,
cuDNN autotuning) and records in ``applied`` what is *in effect*, read back
from torch rather than copied from the spec, so that a test can tell an
option that was applied from one that was silently ignored. ``run`` is one
training (or inference) step; ``evaluate`` is the optional evaluation pass.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from isoprobe.child.core import distributed, workload
from isoprobe.report.trial import Applied, Sizes
from isoprobe.spec.model import Spec

_AUTOCAST_DTYPES = {"fp16-mixed": "float16", "bf16-mixed": "bfloat16"}


class Step:
    """The model, optimizer, scaler and autocast settings of one trial, and its step."""

    def __init__(self, spec: Spec, model, device, python_path: list[str]):
        import torch

        self.spec = spec
        self.training = spec.training
        self.device = device
        self.python_path = python_path
        #: Filled in as each option takes effect, read back from torch (``Applied`` fields only).
        self.applied = Applied()
        self.mode = self.training.mode
        precision = self.training.precision
        self.precision = precision
        self.float_dtype = torch.bfloat16 if precision == "bf16-true" else None
        self.autocast_dtype = getattr(torch, _AUTOCAST_DTYPES[precision]) if precision in _AUTOCAST_DTYPES else None
        loss = spec.model.loss
        self.user_loss = workload.import_callable(loss, python_path) if loss is not None else None
        user_step = spec.model.step
        self.user_step = workload.import_callable(user_step, python_path) if user_step is not None else None
        #: The previous step's output, held as a plain loop's ``outputs`` variable holds it (output_lifetime).
        self._held = None
        self.model = self._prepare(model)
        self.optimizer = None
        self.scaler = None
        if self.mode == "train":
            self.optimizer = distributed.build_optimizer(spec, self.model, build_optimizer)
            if precision == "fp16-mixed":
                self.scaler = distributed.grad_scaler(spec, device)
        self.applied.grad_scaler = self.scaler is not None
        self.sizes: Sizes | None = None
        #: Called between the forward pass (with the loss) and backward; a gang's rank says it got that far.
        self.on_forwarded: Callable[[], None] | None = None

    def _prepare(self, model):
        import torch

        training = self.training
        applied = self.applied
        if self.float_dtype is not None:
            # Converted where it was built (the CPU), then moved: the device never holds both copies.
            model = model.to(self.float_dtype)
        model = model.to(self.device)
        if training.channels_last:
            model = model.to(memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = training.cudnn_benchmark
        applied.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
        applied.precision = self.precision
        applied.weights_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        applied.channels_last = _any_channels_last(model)
        if training.gradient_checkpointing:
            applied.checkpointing, applied.checkpointed_blocks = enable_checkpointing(model)
        if self.mode == "train":
            model.train()
        else:
            model.eval()
        applied.mode = self.mode
        if self.spec.distributed.gang:
            # Wrapped before compile, as a real job does (torch.compile of the DDP / FSDP module).
            model = distributed.wrap_model(model, self.spec, self.device)
        if self.mode == "train":
            applied.output_lifetime = "user_step" if self.spec.model.step else training.output_lifetime
        if training.compile:
            model = torch.compile(model, backend=training.compile_backend)
            applied.compiled = True
        return model

    def batch(
        self, batch_size: int, data_indices: list[int] | None = None, made: workload.Batch | None = None
    ) -> workload.Batch:
        """The trial's batch of ``batch_size`` (``made``: one built elsewhere, the estimate's fake stand-in for
        model.batch's), with what the step asks of it (targets for a user step, channels_last)."""
        import torch

        batch = (
            made
            if made is not None
            else workload.make_batch(
                self.spec, batch_size, self.device, self.python_path, self.float_dtype, data_indices
            )
        )
        if self.user_step is not None and batch.targets is None and self.spec.data is None:
            batch.targets = workload.step_targets(self.spec, batch.inputs)  # the user's step gets a whole batch
        if self.training.channels_last:
            batch.inputs = workload.adapt_inputs(
                batch.inputs,
                lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t,
            )
            self.applied.input_channels_last = _tensors_channels_last(batch.inputs)
        return batch

    def _autocast(self):
        import contextlib

        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def run(self, batch: workload.Batch) -> None:
        """One step: train (forward, loss, backward, optimizer step) or inference (forward only)."""
        import torch

        if self.mode == "inference":
            with torch.inference_mode(), self._autocast():
                output = workload.forward_only(self.spec, self.model, batch)
                self._note_output(output)
            return
        optimizer = self.optimizer
        if optimizer is None:  # built for every mode but inference, which returned above
            raise ValueError(f"a {self.mode} step has no optimizer")
        if self.user_step is not None:
            # The user's own step: their loss, backward, clipping, scheduler, EMA... what it allocates is what fits.
            self.user_step(self.model, optimizer, (batch.inputs, batch.targets), self.device)
            if self.sizes is None:
                self.sizes = self._measure_sizes()
            return
        optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss, output = workload.forward_loss(self.spec, self.model, batch, self.user_loss, self._hold)
        if self.applied.loss_dtype is None:
            self.applied.loss_dtype = str(loss.dtype).removeprefix("torch.")
            if output is not None:
                self._note_output(output)
        del output
        if self.on_forwarded is not None:
            self.on_forwarded()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if self.sizes is None:
            self.sizes = self._measure_sizes()

    def _hold(self, output) -> None:
        """Called as the forward pass returns, before the loss (``workload.forward_loss``).

        A plain loop's ``outputs = model(x)`` rebinds exactly then: the previous
        step's output lived through this forward (not through this loss as well:
        held until after the loss, measured on a language model whose loss copies
        its logits, the trial's peak was 3.3 MiB above a plain loop's and its
        edge one sample lower), and this one lives through the loss, backward and
        the optimizer step. freed_before_backward holds nothing, as a framework
        whose step returns only the loss.
        """
        self._held = output if self.training.output_lifetime == "through_backward" else None

    def release(self) -> None:
        """Drop the last step's held output: the steps (and the evaluation pass) are over."""
        self._held = None

    def _measure_sizes(self) -> Sizes:
        """Parameters, gradients and optimizer state in bytes, after the first step allocated them all."""
        import torch

        nbytes = distributed.local_bytes  # a rank's own shard, for FSDP's sharded parameters and state

        parameters = list(self.model.parameters())
        state = sum(
            nbytes(value)
            for per_parameter in distributed.local_optimizer(self.optimizer).state.values()
            for value in per_parameter.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0  # Adam's step counter is a 0-d tensor
        )
        return Sizes(
            parameter_bytes=sum(nbytes(p) for p in parameters),
            gradient_bytes=sum(nbytes(p.grad) for p in parameters if p.grad is not None),
            optimizer_state_bytes=state,
        )

    def evaluate(self, batch: workload.Batch) -> float:
        """The evaluation pass: eval mode, no gradients (training.eval_grad), the batch given; back to training
        after. Returns seconds."""
        import torch

        cuda = self.device.type == "cuda"
        if cuda:  # CUDA runs asynchronously: the clock must start and stop on finished work, not on launches
            torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        self.model.eval()
        try:
            no_gradients = torch.inference_mode if self.training.eval_grad == "inference_mode" else torch.no_grad
            with no_gradients(), self._autocast():
                workload.forward_only(self.spec, self.model, batch)
        finally:
            self.model.train()
        if cuda:
            torch.cuda.synchronize(self.device)
        self.applied.eval_pass = True
        return time.perf_counter() - started

    def _note_output(self, output) -> None:
        if self.applied.output_dtype is not None:
            return
        try:
            self.applied.output_dtype = str(workload.primary_output(output).dtype).removeprefix("torch.")
        except TypeError:
            pass


def _any_channels_last(model) -> bool:
    import torch

    for parameter in model.parameters():
        if parameter.dim() == 4:
            return parameter.is_contiguous(memory_format=torch.channels_last) and not parameter.is_contiguous()
    return False


def _tensors_channels_last(inputs) -> bool:
    import torch

    found = []

    def keep(tensor):
        found.append(tensor)
        return tensor

    workload.adapt_inputs(inputs, keep)
    images = [t for t in found if t.dim() == 4]
    return bool(images) and all(
        t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous() for t in images
    )


def build_optimizer(spec: Spec, parameters):
    import torch

    name = spec.optimizer.name
    kwargs = dict(spec.optimizer.kwargs)
    if name == "sgd":
        kwargs.setdefault("lr", 0.01)
        kwargs.setdefault("momentum", 0.9)
        return torch.optim.SGD(parameters, **kwargs)
    if name == "adam":
        return torch.optim.Adam(parameters, **kwargs)
    if name == "adamw":
        return torch.optim.AdamW(parameters, **kwargs)
    raise ValueError(f"unknown optimizer {name!r}")


# --------------------------------------------------------------------------- gradient checkpointing


def enable_checkpointing(model) -> tuple[str, int]:
    """Turn on gradient checkpointing; return how ('model' switch or 'blocks' wrapped) and how many blocks.

    A model's own switch comes first (Hugging Face, timm): it knows its blocks.
    Otherwise every block of the model's sequential stages is wrapped, which is
    what people do by hand for torchvision models. Raises ValueError when the
    model has neither: silently training without checkpointing would answer
    for a setup the user did not ask about.
    """
    if hasattr(model, "gradient_checkpointing_enable") and getattr(model, "supports_gradient_checkpointing", True):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "model", sum(1 for m in model.modules() if getattr(m, "gradient_checkpointing", False))
    if hasattr(model, "set_grad_checkpointing"):
        try:
            model.set_grad_checkpointing(True)
            return "model", sum(1 for m in model.modules() if getattr(m, "grad_checkpointing", False))
        except (AssertionError, NotImplementedError):
            pass  # this timm model has no support: fall back to wrapping its blocks
    count = _wrap_blocks(model)
    if count == 0:
        raise ValueError(
            "training.gradient_checkpointing: the model has no sequential stages to checkpoint and no switch of "
            "its own (gradient_checkpointing_enable / set_grad_checkpointing)"
        )
    return "blocks", count


def _wrap_blocks(module) -> int:
    """Wrap every child of each nn.Sequential stage (or nn.ModuleList of blocks) in a checkpoint; return the count.

    A stage whose children are themselves containers (ResNet's Bottlenecks, ViT's
    encoder blocks) has each child wrapped. A stage of plain layers (a deep MLP)
    is split into about sqrt(n) segments, since checkpointing single layers
    saves nothing. The search goes top-down and does not enter what it wrapped.
    """
    import math

    import torch

    count = 0
    for name, child in list(module.named_children()):
        if (
            isinstance(child, torch.nn.ModuleList)
            and len(child) >= 2
            and all(len(list(block.children())) > 0 for block in child)
        ):
            # A list of blocks that the parent's forward calls in turn (transformer layers).
            for index, block in enumerate(list(child)):
                child[index] = CheckpointedBlock(block)
                count += 1
            continue
        if isinstance(child, torch.nn.Sequential) and len(child) >= 2:
            layers = list(child.children())
            if any(len(list(layer.children())) > 0 for layer in layers):
                for index, layer in enumerate(layers):
                    child[index] = CheckpointedBlock(layer)
                    count += 1
                continue
            if len(layers) >= 4:
                segments = max(2, round(math.sqrt(len(layers))))
                setattr(module, name, CheckpointedSequence(child, segments))
                count += segments
                continue
        count += _wrap_blocks(child)
    return count


@functools.cache
def _checkpointed_block_class():
    import torch
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    class _Block(torch.nn.Module):
        """One block whose activations are recomputed in the backward pass."""

        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, *args, **kwargs):
            if not torch.is_grad_enabled():
                return self.block(*args, **kwargs)
            return checkpoint(self.block, *args, use_reentrant=False, **kwargs)

        def __getattr__(self, name):
            # The parent may read its blocks' attributes (nn.TransformerEncoder reads layers[0].self_attn).
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(super().__getattr__("block"), name)

    class _Sequence(torch.nn.Module):
        """A sequence of plain layers checkpointed in segments."""

        def __init__(self, sequence, segments: int):
            super().__init__()
            self.sequence = sequence
            self.segments = segments

        def forward(self, x):
            if not torch.is_grad_enabled():
                return self.sequence(x)
            return checkpoint_sequential(self.sequence, self.segments, x, use_reentrant=False)

    return _Block, _Sequence


def CheckpointedBlock(block):
    return _checkpointed_block_class()[0](block)


def CheckpointedSequence(sequence, segments: int):
    return _checkpointed_block_class()[1](sequence, segments)
