"""A trial of ``model.lightning``: the user's LightningModule under Lightning's own ``trainer.fit``.

The runner of ``child.framework.runners`` for the ``lightning`` source. What fits is
what the user's loop allocates: the module's own ``training_step`` and
``configure_optimizers`` (scheduler and all), real batches from its (or the
data module's) ``train_dataloader()``, and the Trainer's precision plugin,
clipping and accumulation from the spec (``spec.lightning``). The batch size is
set where Lightning's own BatchSizeFinder sets it (``lightning_setattr``: the
module, its hparams, the data module or its hparams), in the ``setup`` hook,
after the data module's ``setup`` and before any dataloader is made.

The batch that arrives is checked against the trial's before the first step
runs on it (``batch_problem``): a ``train_dataloader()`` that does not read the
batch size set (a fixed ``DataLoader(batch_size=...)``), or a dataset smaller
than the batch, would otherwise make the trial's verdict one about another batch.

One step is one optimizer step (``accumulate_grad_batches`` batches): the
callback starts the step reporter's clock at the first batch of a step and
reports when ``trainer.global_step`` moved (also for manual optimisation).
The Trainer writes nothing: a ``DummyLogger`` (the module's ``self.logger``
exists, as in the real fit, and writes nowhere), no checkpoint, progress bar or
summary. A short trial does not validate (``limit_val_batches=0``, no sanity
check). A trial that decides the maximum (its request has a ``cycle``: issue
55) validates early, where the module validates at all (a ``validation_step``
and a ``val_dataloader`` of its own or its data module's): after the search's
steps, ``EVAL_BATCHES`` batches of the user's own validation loader (its own
eval batch), then it steps on, so that its steady peak has seen the validation
beside the optimizer's state, as the real fit's first validation would. A
ReduceLROnPlateau whose metric only validation logs is not strict in a trial
(it reads a number and allocates nothing) instead of failing where the real fit,
which validates, would step it.

A rank of a gang (``distributed.strategy: ddp``) has joined the process group
already (``child.core.distributed.join``); ``LOCAL_RANK`` in the environment makes
Lightning attach to it as it does to ranks that torchrun started, instead of
launching processes of its own.
"""

from __future__ import annotations

import os
from collections.abc import Sized
from typing import TYPE_CHECKING, Any

from isoprobe.child.core import cuda as child_cuda
from isoprobe.child.core.memory import cpu_memory
from isoprobe.child.core.step_report import StepHook
from isoprobe.child.core.workload import import_callable
from isoprobe.child.framework.runners import final_readings, framework_cycle
from isoprobe.protocol.messages import MESSAGE_CHARS, InspectProblem, ModelBuilt
from isoprobe.report import steady
from isoprobe.spec.lightning import LIGHTNING_PRECISION, LightningSpec
from isoprobe.spec.model import Spec

if TYPE_CHECKING:
    from isoprobe.child.core.step_report import Progress
    from isoprobe.child.events import Events
    from isoprobe.protocol.messages import TrialRequest


def build(spec: Spec, python_path: list[str]) -> tuple[Any, Any]:
    """The module and the data module (or None), from their classes or factories; TypeError if one is not."""
    import lightning.pytorch as pl

    if spec.model.lightning is None:  # this runner is only ever chosen for a lightning source
        raise ValueError("build needs model.lightning")
    module = import_callable(spec.model.lightning, python_path)(**spec.model.kwargs)
    if not isinstance(module, pl.LightningModule):
        raise TypeError(
            f"model.lightning {spec.model.lightning} gave a {type(module).__name__}, not a "
            "lightning.pytorch.LightningModule"
        )
    datamodule = None
    if spec.model.datamodule is not None:
        datamodule = import_callable(spec.model.datamodule, python_path)(**spec.model.datamodule_kwargs)
        if not isinstance(datamodule, pl.LightningDataModule):
            raise TypeError(
                f"model.datamodule {spec.model.datamodule} gave a {type(datamodule).__name__}, not a "
                "lightning.pytorch.LightningDataModule"
            )
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
    return (
        f"{name!r} is in none of {where}, where Lightning's BatchSizeFinder sets the batch size: "
        f"store it there (self.{name} = ... or save_hyperparameters()) and read it in train_dataloader()"
    )


def check_buildable(torch: Any, spec: Spec, python_path: list[str], facts: dict[str, Any]) -> list[InspectProblem]:
    """The environment check for ``model.lightning``: do the module and data module build, and is there a batch
    size to set? The module is built on the meta device (no memory; built for real once where that fails, as
    for any model); nothing is traced: the step is the user's ``trainer.fit``, which only a trial runs."""
    try:
        with torch.device("meta"):
            module, datamodule = build(spec, python_path)
    except Exception as exc:
        facts["meta_build_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        try:
            module = _built("lightning", lambda: build(spec, python_path)[0])
            datamodule = _built("datamodule", lambda: build(spec, python_path)[1])
        except _Problem as problem:
            return [problem.found]
    facts["parameter_count"] = sum(p.numel() for p in module.parameters())
    facts["parameter_bytes"] = sum(p.numel() * p.element_size() for p in module.parameters())
    missing = missing_batch_size(spec, module, datamodule)
    return (
        [InspectProblem(stage="batch_arg_name", type="AttributeError", message=missing[:MESSAGE_CHARS])]
        if missing
        else []
    )


class _Problem(Exception):
    def __init__(self, found: InspectProblem):
        self.found = found


def _built(stage: str, make: Any) -> Any:
    """``make()``, or the problem it raised for ``stage`` (model.lightning or model.datamodule)."""
    try:
        return make()
    except Exception as exc:
        raise _Problem(InspectProblem(stage=stage, type=type(exc).__name__, message=str(exc)[:MESSAGE_CHARS])) from None


def leading_sizes(torch: Any, batch: Any) -> list[int]:
    """The first dimension of every tensor in a batch (nested in tuples, lists, mappings, dataclasses), in order."""
    import dataclasses
    from collections.abc import Mapping

    found: list[int] = []
    pending = [batch]
    while pending and len(found) < 64:
        item = pending.pop(0)
        if isinstance(item, torch.Tensor):
            if item.dim() > 0:
                found.append(int(item.shape[0]))
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            pending.extend(getattr(item, field.name) for field in dataclasses.fields(item))
    return found


def loader_facts(loader: Any) -> tuple[int | None, int | None]:
    """A torch DataLoader's batch size (its own, or its batch sampler's) and how many samples its sampler draws on
    this rank; None where the loader does not say (another iterable, a batch sampler without a batch_size)."""
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        return None, None
    size = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size", None)
    sampler = getattr(loader.batch_sampler, "sampler", None) or loader.sampler
    try:
        samples = len(sampler) if isinstance(sampler, Sized) else None
    except TypeError:  # an iterable dataset's sampler has no length
        samples = None
    return (size if isinstance(size, int) else None), samples


def batch_problem(
    asked: int, leading: list[int], loader_size: int | None, loader_samples: int | None, batch_idx: int
) -> tuple[str, int | None] | None:
    """Why a batch that arrived is not a batch of ``asked`` samples, or None. Pure. The reason, and the loader's
    samples where there are fewer than ``asked`` (then no batch of ``asked`` exists in the data at all).

    A batch is ``asked``'s when a tensor in it has ``asked`` rows. One without (a layout whose first dimension
    is not the batch, an epoch's last, partial batch) still passes when the loader itself was built with
    ``asked`` and its sampler holds at least that many samples; and, for a loader that does not say, a batch
    after an epoch's first that is smaller than ``asked`` (the partial one). A batch without tensors is not
    judged.
    """
    if not leading or asked in leading:
        return None
    if loader_samples is not None and loader_samples < asked:
        return (
            f"its train_dataloader() holds {loader_samples} samples, fewer than the batch {asked}: no batch of "
            f"{asked} can be drawn, so a verdict at {asked} would be about a batch of {loader_samples}",
            loader_samples,
        )
    if loader_size == asked:
        return None
    if loader_size is None and batch_idx > 0 and all(size < asked for size in leading):
        return None
    made = f"a DataLoader with batch_size={loader_size}" if loader_size is not None else "its loader"
    return (
        f"its train_dataloader() gave a batch of {leading[0]} samples where the trial set the batch size to "
        f"{asked}: {made} does not read the batch size that was set",
        None,
    )


#: Validation batches a deciding trial runs (``validation_early``): the user's loader's first ones, at its own batch.
EVAL_BATCHES = 2


def validates(module: Any, datamodule: Any) -> bool:
    """Whether the user's fit validates: a ``validation_step`` and a ``val_dataloader`` (the module's or the data
    module's), as Lightning's own check of the validation loop reads them (``is_overridden``)."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    loader = is_overridden("val_dataloader", module) or (
        datamodule is not None and is_overridden("val_dataloader", datamodule)
    )
    return bool(is_overridden("validation_step", module) and loader)


def validation_early(spec: Spec) -> dict[str, Any]:
    """The Trainer's arguments that run the user's validation after the search's steps (``EVAL_BATCHES`` batches,
    counted in training batches across epochs), in a trial that decides the maximum."""
    accumulate = (spec.lightning or LightningSpec()).accumulate_grad_batches
    return {
        "limit_val_batches": EVAL_BATCHES,
        "val_check_interval": spec.search.steps * accumulate,
        "check_val_every_n_epoch": None,
    }


def trainer_arguments(spec: Spec, device: Any, world_size: int | None) -> dict[str, Any]:
    """The Trainer's arguments for a trial: the spec's memory-relevant ones, and nothing that writes or validates."""
    from lightning.pytorch.loggers.logger import DummyLogger

    options = spec.lightning or LightningSpec()
    arguments: dict[str, Any] = {
        "precision": LIGHTNING_PRECISION[spec.training.precision],
        "accumulate_grad_batches": options.accumulate_grad_batches,
        "gradient_clip_val": options.gradient_clip_val,
        "gradient_clip_algorithm": options.gradient_clip_algorithm,
        "logger": DummyLogger(),
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "max_epochs": -1,
    }
    if device.type == "cuda":
        arguments.update(accelerator="gpu", devices=[device.index if world_size is None else 0])
    else:
        arguments.update(accelerator="cpu", devices=1)
    if world_size is not None:  # a rank of the gang: every rank's Trainer sees the whole node's devices
        from lightning.pytorch.strategies import DDPStrategy

        ddp = spec.distributed
        options_ddp: dict[str, Any] = {
            key: value
            for key, value in (
                ("bucket_cap_mb", ddp.bucket_cap_mb),
                ("gradient_as_bucket_view", ddp.gradient_as_bucket_view),
                ("static_graph", ddp.static_graph),
            )
            if value is not None
        }
        arguments.update(strategy=DDPStrategy(**options_ddp), devices=world_size, num_nodes=1)
    return arguments


def batch_mismatch(spec: Spec, module: Any, datamodule: Any, problem: str, samples: int | None) -> str:
    """The whole message for ``batch_problem``'s: whose ``train_dataloader()`` (the spec's reference), the
    attribute that was set, and the fix."""
    name = (spec.lightning or LightningSpec()).batch_arg_name
    owner = (
        f"model.datamodule {spec.model.datamodule}"
        if datamodule is not None and spec.model.datamodule
        else f"model.lightning {spec.model.lightning}"
    )
    holders = " and ".join(batch_size_holders(module, datamodule, name)) or name
    if samples is not None:
        fix = f"set search.max_batch_size: {samples} (no larger batch exists in this data)"
    else:
        fix = (
            f"build the DataLoader with the batch size that was set ({holders}), e.g. "
            f"DataLoader(..., batch_size=self.{'hparams.' if 'hparams' in holders else ''}{name}), "
            "as Lightning's own BatchSizeFinder also needs"
        )
    return f"{owner}: {problem} (set on {holders}, in the setup hook): {fix}"


def original(exc: BaseException) -> BaseException:
    """The user's exception, where Lightning raised its own in its place (``raise ... from`` the original)."""
    while type(exc).__module__.startswith(("lightning", "pytorch_lightning")) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def run(request: TrialRequest, events: Events, progress: Progress, torch: Any, device: Any) -> dict[str, Any]:
    """The runner (``child.framework.runners``' contract): build, fit for the hook's steps, return the readings."""
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

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            for config in trainer.lr_scheduler_configs:  # configure_optimizers ran (strategy.setup)
                if config.reduce_on_plateau:
                    config.strict = False  # its metric may be validation's, which trials do not run: not stepped

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            loader_size, loader_samples = loader_facts(trainer.train_dataloader)
            problem = batch_problem(size, leading_sizes(torch, batch), loader_size, loader_samples, batch_idx)
            if problem is not None:
                raise ValueError(batch_mismatch(spec, pl_module, trainer.datamodule, *problem))
            if self.step_at is None:
                self.step_at = trainer.global_step
                hook.begin()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.step_at is not None and trainer.global_step > self.step_at:  # the optimizer stepped
                self.step_at = None
                if hook.after_step() and (not early or validated):
                    trainer.should_stop = True

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if early and not validated and not trainer.sanity_checking:
                validated.append(hook.steps_done + 1)  # the step after it reads its peak (a running peak)

    world_size = request.rank.world_size if request.rank is not None else None
    if request.rank is not None:
        os.environ["LOCAL_RANK"] = str(request.rank.rank)  # Lightning attaches to the gang, launches nothing
        os.environ.setdefault("NODE_RANK", "0")
    if device.type == "cuda":
        child_cuda.start_counting(torch, device)  # peaks and retries from here on
    early = request.cycle is not None and validates(module, datamodule)
    validated: list[int] = []  # the step whose reading first includes the early validation
    arguments = trainer_arguments(spec, device, world_size) | (validation_early(spec) if early else {})
    trainer = pl.Trainer(
        max_steps=hook.most_steps + (steady.WINDOW_STEPS if early else 0), callbacks=[TrialSteps()], **arguments
    )
    try:
        trainer.fit(module, datamodule=datamodule)
    except BaseException as exc:
        inner = original(exc)
        if inner is exc:
            raise
        raise inner from None  # classified as itself: an out-of-memory error is one
    if hook.steps_done == 0:
        raise RuntimeError(
            "trainer.fit ran no optimizer step: train_dataloader() gave no batch at this batch "
            "size (drop_last with fewer samples than the batch?)"
        )
    del trainer, module, datamodule
    return final_readings(torch, device, step_peaks=hook.peaks) | framework_cycle(
        request, hook, validated, early, EVAL_BATCHES
    )
