"""``IsolatedBatchSizeFinder``: Lightning's BatchSizeFinder, with every trial in a fresh process.

    from isoprobe.lightning import IsolatedBatchSizeFinder

    trainer = L.Trainer(callbacks=[IsolatedBatchSizeFinder(memory_budget="8GiB")], ...)
    trainer.fit(model, datamodule=data)

Runs in the user's training process (it imports lightning, which imports
torch; the probe itself does not: ``isoprobe.probe`` starts the trials as child
processes). Before training it asks ``probe()`` (with the cache: the same setup
answers at once the second time) about the module and data module that
``fit`` was given and the Trainer's memory settings, then sets the recommended
batch (``use="max"``: the largest that fits) where Lightning's finder sets it
(``lightning_setattr``: the module, its hparams, the data module or its
hparams), and logs what it found.

**When.** In the ``setup`` hook. ``Trainer._run`` calls, in order,
``strategy.setup_environment()`` (the process group, and on a GPU
``torch.cuda.set_device``), the data module's, the callbacks' and the module's
``setup``, then ``strategy.setup``, which moves the module to the device, then
``on_fit_start``, where Lightning's own finder runs. So here the module's
weights are still on the CPU and the training process holds no CUDA tensor of
its own; on a GPU it holds a CUDA context (``set_device`` made it): the trials
see that context's memory as taken, as the real run's allocator will, and
their own context besides, so the answer errs on the safe side by one context.

**What is probed.** ``model.lightning`` is the module's class and
``model.kwargs`` its init arguments, read from ``hparams``
(``save_hyperparameters()``) or given as ``module_kwargs``; likewise the data
module. A class defined in the training script itself is named by its file, so
the script must guard its training with ``if __name__ == "__main__":`` (a
child imports it). Precision, gradient clipping and accumulation are the
Trainer's; device the Trainer's root device; a DDP Trainer of several ranks is
probed as a gang of that many (``distributed.strategy: ddp``). ``overrides``
sets any other spec field (``{"search.steps": 5}``).

**Several ranks.** Global rank 0 probes; the others wait in the strategy's
broadcast of its answer (a collective: its timeout, 30 minutes by default in
Lightning's DDP, must be longer than the probe), so every rank sets the same batch.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from collections.abc import Mapping
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities.parsing import lightning_setattr

from isoprobe.errors import ProbeError
from isoprobe.spec.lightning import LIGHTNING_PRECISION

#: Under Lightning's logger, so its lines show where Lightning's own finder's do (its handler, its level).
log = logging.getLogger("lightning.pytorch.isoprobe")
_PRECISION = {lightning: ours for ours, lightning in LIGHTNING_PRECISION.items()}


class IsolatedBatchSizeFinder(pl.Callback):
    """Probes the Trainer's own setup in fresh processes before training, then sets the batch size (see the module)."""

    def __init__(
        self,
        *,
        use: Literal["recommended", "max"] = "recommended",
        batch_arg_name: str = "batch_size",
        memory_budget: str | int | None = None,
        module_kwargs: Mapping[str, Any] | None = None,
        datamodule_kwargs: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] | None = None,
        cache: bool = True,
        quiet: bool = False,
    ):
        if use not in ("recommended", "max"):
            raise ValueError(f"use: 'recommended' or 'max', not {use!r}")
        self.use, self.batch_arg_name, self.memory_budget = use, batch_arg_name, memory_budget
        self.module_kwargs, self.datamodule_kwargs = module_kwargs, datamodule_kwargs
        self.overrides, self.cache, self.quiet = dict(overrides or {}), cache, quiet
        #: The probe's ``Result`` (rank 0; None on the others), and the batch size set.
        self.result = None
        self.batch_size: int | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        answer: tuple[int | None, str] = (None, "")
        if trainer.is_global_zero:
            try:
                answer = self._probe(trainer, pl_module)
            except Exception as exc:
                answer = (None, f"{type(exc).__name__}: {exc}")
        if trainer.world_size > 1:
            answer = trainer.strategy.broadcast(answer, src=0)
        size, message = answer
        if size is None:
            raise ProbeError(f"IsolatedBatchSizeFinder: {message}")
        lightning_setattr(pl_module, self.batch_arg_name, size)
        self.batch_size = size
        log.info(f"IsolatedBatchSizeFinder: {message}; {self.batch_arg_name} set to {size}")

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[int | None, str]:
        from isoprobe import probe

        result = probe(
            spec_for(trainer, pl_module, self.batch_arg_name, self.module_kwargs, self.datamodule_kwargs),
            memory_budget=self.memory_budget,
            overrides=self.overrides,
            cache=self.cache,
            quiet=self.quiet,
            progress=None if self.quiet else log.info,
        )
        self.result = result
        size = result.max_batch_size if self.use == "max" else result.recommended_batch_size
        if not result.answered or size is None:
            return None, result.message
        return size, f"{result.message} (isoprobe, fresh processes); using the {self.use} batch"


def spec_for(
    trainer: pl.Trainer,
    module: pl.LightningModule,
    batch_arg_name: str = "batch_size",
    module_kwargs: Mapping[str, Any] | None = None,
    datamodule_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The spec (a dict, as ``probe`` takes it) of this Trainer's fit: its module, data module and memory settings."""
    model: dict[str, Any] = {
        "lightning": reference(type(module)),
        "kwargs": init_arguments(module, module_kwargs, "module_kwargs"),
    }
    # Lightning's data connector sets it on each Trainer (None until fit is given one); the class declares none.
    datamodule = trainer.datamodule  # type: ignore[attr-defined]  # an instance attribute Lightning adds
    if datamodule is not None:
        model["datamodule"] = reference(type(datamodule))
        model["datamodule_kwargs"] = init_arguments(datamodule, datamodule_kwargs, "datamodule_kwargs")
    precision = _PRECISION.get(str(trainer.precision))
    if precision is None:
        raise ValueError(f"precision {trainer.precision!r} is not probed by isoprobe (it runs {', '.join(_PRECISION)})")
    clip = trainer.gradient_clip_algorithm
    lightning: dict[str, Any] = {
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "batch_arg_name": batch_arg_name,
    }
    if trainer.gradient_clip_val is not None:
        lightning["gradient_clip_val"] = float(trainer.gradient_clip_val)
        lightning["gradient_clip_algorithm"] = getattr(clip, "value", clip) or "norm"
    device = trainer.strategy.root_device
    spec: dict[str, Any] = {
        "model": model,
        "lightning": lightning,
        "training": {"precision": precision},
        "device": "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}",
    }
    if trainer.world_size > 1:
        from lightning.pytorch.strategies import DDPStrategy

        if not isinstance(trainer.strategy, DDPStrategy):
            raise ValueError(f"strategy {type(trainer.strategy).__name__} is not probed by isoprobe (DDP is)")
        spec["distributed"] = {"strategy": "ddp", "world_size": trainer.world_size}
        spec["device"] = "cpu" if device.type == "cpu" else "cuda"  # a gang takes cuda:0.. one rank each
    return spec


def reference(cls: type) -> str:
    """``module:Name`` for a class of a package; ``/path/file.py:Name`` for one of a script or a single file
    (the child imports it from there, whatever its working directory)."""
    name = cls.__qualname__
    if "." in name:
        raise ValueError(
            f"{cls.__module__}.{name} is defined inside another class or function: define it at the "
            "top level of a module, where a fresh process can import it"
        )
    if cls.__module__ == "__main__" or "." not in cls.__module__:
        return f"{inspect.getfile(cls)}:{name}"
    top = cls.__module__.split(".")[0]
    if importlib.util.find_spec(top) is None:  # pragma: no cover - a class always has a module
        raise ValueError(f"{cls.__module__} cannot be imported again")
    return f"{cls.__module__}:{name}"


def init_arguments(owner: Any, given: Mapping[str, Any] | None, option: str) -> dict[str, Any]:
    """The init arguments a fresh process rebuilds ``owner`` with: ``given``, else its saved hyperparameters.

    A constructor with required parameters and nothing saved cannot be rebuilt: the error names the fix.
    """
    if given is not None:
        return dict(given)
    saved = dict(getattr(owner, "hparams", {}) or {})
    parameters = inspect.signature(type(owner).__init__).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    arguments = {key: value for key, value in saved.items() if key in parameters or accepts_any}
    required = [
        name
        for name, p in list(parameters.items())[1:]
        if p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and name not in arguments
    ]
    if required:
        raise ValueError(
            f"{type(owner).__name__} needs {', '.join(required)} to be built in a fresh process: "
            f"call self.save_hyperparameters() in its __init__, or give {option}={{...}}"
        )
    return arguments
