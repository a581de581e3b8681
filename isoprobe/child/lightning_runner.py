"""A trial of ``model.lightning``: the user's LightningModule under Lightning's own ``trainer.fit``.

The runner of ``child.frameworks`` for the ``lightning`` source. What fits is
what the user's loop allocates: the module's own ``training_step`` and
``configure_optimizers`` (scheduler and all), real batches from its (or the
data module's) ``train_dataloader()``, and the Trainer's precision plugin,
clipping and accumulation from the spec (``spec.lightning``). The batch size is
set where Lightning's own BatchSizeFinder sets it (``lightning_setattr``: the
module, its hparams, the data module or its hparams), in the ``setup`` hook,
after the data module's ``setup`` and before any dataloader is made.

One step is one optimizer step (``accumulate_grad_batches`` batches): the
callback starts the step reporter's clock at the first batch of a step and
reports when ``trainer.global_step`` moved (also for manual optimisation).
The Trainer writes nothing: no logger, checkpoint, progress bar or summary,
no validation (``limit_val_batches=0``, no sanity check).

A rank of a gang (``distributed.strategy: ddp``) has joined the process group
already (``child.distributed.join``); ``LOCAL_RANK`` in the environment makes
Lightning attach to it as it does to ranks that torchrun started, instead of
launching processes of its own.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from isoprobe.child.frameworks import final_readings
from isoprobe.child.memory import cpu_memory
from isoprobe.child.step_report import StepHook
from isoprobe.child.workload import import_callable
from isoprobe.protocol.messages import MESSAGE_CHARS, InspectProblem, ModelBuilt
from isoprobe.spec.lightning import LIGHTNING_PRECISION, LightningSpec
from isoprobe.spec.model import Spec

if TYPE_CHECKING:
    from isoprobe.child.events import Events
    from isoprobe.child.step_report import Progress
    from isoprobe.protocol.messages import TrialRequest


def build(spec: Spec, python_path: list[str]) -> tuple[Any, Any]:
    """The module and the data module (or None), from their classes or factories; TypeError if one is not."""
    import lightning.pytorch as pl

    module = import_callable(spec.model.lightning, python_path)(**spec.model.kwargs)
    if not isinstance(module, pl.LightningModule):
        raise TypeError(f"model.lightning {spec.model.lightning} gave a {type(module).__name__}, not a "
                        "lightning.pytorch.LightningModule")
    datamodule = None
    if spec.model.datamodule is not None:
        datamodule = import_callable(spec.model.datamodule, python_path)(**spec.model.datamodule_kwargs)
        if not isinstance(datamodule, pl.LightningDataModule):
            raise TypeError(f"model.datamodule {spec.model.datamodule} gave a {type(datamodule).__name__}, not a "
                            "lightning.pytorch.LightningDataModule")
    return module, datamodule


def batch_size_holders(module: Any, datamodule: Any, name: str) -> list[str]:
    """Where ``name`` is, in the places ``lightning_setattr`` looks (without a Trainer attached yet)."""
    found = []
    for label, owner in (("module", module), ("datamodule", datamodule)):
        if owner is None:
            continue
        if hasattr(owner, name):
            found.append(f"{label}.{name}")
        if name in getattr(owner, "hparams", {}):
            found.append(f"{label}.hparams.{name}")
    return found


def missing_batch_size(spec: Spec, module: Any, datamodule: Any) -> str | None:
    """Why a trial could not set the batch size (the environment check's verdict), or None."""
    name = (spec.lightning or LightningSpec()).batch_arg_name
    if batch_size_holders(module, datamodule, name):
        return None
    where = "the module, the data module or their hparams" if datamodule is not None else "the module or its hparams"
    return (f"{name!r} is in none of {where}, where Lightning's BatchSizeFinder sets the batch size: "
            f"store it there (self.{name} = ... or save_hyperparameters()) and read it in train_dataloader()")


def check_buildable(torch: Any, spec: Spec, python_path: list[str], facts: dict[str, Any]) -> list[InspectProblem]:
    """The environment check for ``model.lightning``: do the module and data module build, and is there a batch
    size to set? The module is built on the meta device (no memory; built for real once where that fails, as
    for any model); nothing is traced: the step is the user's ``trainer.fit``, which only a trial runs."""
    try:
        with torch.device("meta"):
            module, datamodule = build(spec, python_path)
    except Exception as exc:  # noqa: BLE001 - one real build decides whether it is the meta device or the code
        facts["meta_build_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        try:
            module = _built("lightning", lambda: build(spec, python_path)[0])
            datamodule = _built("datamodule", lambda: build(spec, python_path)[1])
        except _Problem as problem:
            return [problem.found]
    facts["parameter_count"] = sum(p.numel() for p in module.parameters())
    facts["parameter_bytes"] = sum(p.numel() * p.element_size() for p in module.parameters())
    missing = missing_batch_size(spec, module, datamodule)
    return [InspectProblem(stage="batch_arg_name", type="AttributeError", message=missing[:MESSAGE_CHARS])] if missing else []


class _Problem(Exception):
    def __init__(self, found: InspectProblem):
        self.found = found


def _built(stage: str, make: Any) -> Any:
    """``make()``, or the problem it raised for ``stage`` (model.lightning or model.datamodule)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - the user's code: any exception is a spec problem to name
        raise _Problem(InspectProblem(stage=stage, type=type(exc).__name__, message=str(exc)[:MESSAGE_CHARS])) from None


def trainer_arguments(spec: Spec, device: Any, world_size: int | None) -> dict[str, Any]:
    """The Trainer's arguments for a trial: the spec's memory-relevant ones, and nothing that writes or validates."""
    options = spec.lightning or LightningSpec()
    arguments: dict[str, Any] = {
        "precision": LIGHTNING_PRECISION[spec.training.precision],
        "accumulate_grad_batches": options.accumulate_grad_batches,
        "gradient_clip_val": options.gradient_clip_val,
        "gradient_clip_algorithm": options.gradient_clip_algorithm,
        "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
        "enable_model_summary": False, "limit_val_batches": 0, "num_sanity_val_steps": 0,
        "max_epochs": -1,
    }
    if device.type == "cuda":
        arguments.update(accelerator="gpu", devices=[device.index if world_size is None else 0])
    else:
        arguments.update(accelerator="cpu", devices=1)
    if world_size is not None:  # a rank of the gang: every rank's Trainer sees the whole node's devices
        from lightning.pytorch.strategies import DDPStrategy

        ddp = spec.distributed
        options_ddp = {key: value for key, value in (("bucket_cap_mb", ddp.bucket_cap_mb),
                                                     ("gradient_as_bucket_view", ddp.gradient_as_bucket_view),
                                                     ("static_graph", ddp.static_graph)) if value is not None}
        arguments.update(strategy=DDPStrategy(**options_ddp), devices=world_size, num_nodes=1)
    return arguments


def original(exc: BaseException) -> BaseException:
    """The user's exception, where Lightning raised its own in its place (``raise ... from`` the original)."""
    while type(exc).__module__.startswith(("lightning", "pytorch_lightning")) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def run(request: TrialRequest, events: Events, progress: Progress, torch: Any, device: Any) -> dict[str, Any]:
    """The runner (``child.frameworks``' contract): build, fit for the hook's steps, return the readings."""
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.parsing import lightning_setattr

    spec = request.spec
    module, datamodule = build(spec, request.python_path)
    progress.phase = "model_built"
    events.emit(ModelBuilt(memory=cpu_memory()))
    hook = StepHook(torch, device, request, events, progress)
    name = (spec.lightning or LightningSpec()).batch_arg_name
    size = request.batch_size

    class TrialSteps(pl.Callback):
        """Sets the batch size where BatchSizeFinder does, and reports each optimizer step to the hook."""

        def __init__(self) -> None:
            self.step_at: int | None = None

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            missing = missing_batch_size(spec, pl_module, trainer.datamodule)
            if missing is not None:
                raise AttributeError(missing)
            lightning_setattr(pl_module, name, size)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if self.step_at is None:
                self.step_at = trainer.global_step
                hook.begin()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.step_at is not None and trainer.global_step > self.step_at:  # the optimizer stepped
                self.step_at = None
                if hook.after_step():
                    trainer.should_stop = True

    world_size = request.rank.world_size if request.rank is not None else None
    if request.rank is not None:
        os.environ["LOCAL_RANK"] = str(request.rank.rank)  # Lightning attaches to the gang, launches nothing
        os.environ.setdefault("NODE_RANK", "0")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = pl.Trainer(max_steps=hook.most_steps, callbacks=[TrialSteps()],
                         **trainer_arguments(spec, device, world_size))
    try:
        trainer.fit(module, datamodule=datamodule)
    except BaseException as exc:
        inner = original(exc)
        if inner is exc:
            raise
        raise inner from None  # classified as itself: an out-of-memory error is one
    if hook.steps_done == 0:
        raise RuntimeError("trainer.fit ran no optimizer step: train_dataloader() gave no batch at this batch "
                           "size (drop_last with fewer samples than the batch?)")
    del trainer, module, datamodule
    return final_readings(torch, device)
