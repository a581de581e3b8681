"""The environment check, once per probe before any trial: versions, devices, and can the spec be set up?

The model is built on the meta device, so the check costs no memory; every
problem it finds is an ``InspectProblem`` whose ``stage`` the parent maps to
the spec field to fix, so that a typo is a spec error before any trial runs,
not a failed trial.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from isoprobe.child.core import cuda as child_cuda
from isoprobe.child.core.memory import cpu_memory
from isoprobe.child.core.training import build_optimizer, enable_checkpointing
from isoprobe.child.core.workload import (
    build_model,
    import_callable,
    import_model_library,
    make_batch,
    primary_output,
    target_shape,
    task_of,
)
from isoprobe.child.reads import files_read, watch_reads
from isoprobe.child.sources import imported_sources, installed_packages_imported
from isoprobe.protocol.messages import (
    MESSAGE_CHARS,
    CudaDevice,
    DataScanning,
    Estimate,
    Estimated,
    Facts,
    Inspected,
    InspectProblem,
    InspectRequest,
)
from isoprobe.spec.model import Spec

if TYPE_CHECKING:
    from isoprobe.child.events import Events


def _installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def run_inspect(request: InspectRequest, events: Events) -> None:
    """Versions, devices, and whether the model and optimizer can be built at all."""
    watch_reads()  # before the user's code: the files the factory reads belong to the cache entry too
    before = cpu_memory()
    import torch

    spec = request.spec
    facts: dict[str, Any] = {"torch_version": torch.__version__, "memory_before_import": before}  # Facts fields
    library = import_model_library(spec)  # imported as a trial will: its memory belongs in the baseline
    if library is not None and library.__name__ != "torchvision":
        facts["library_versions"] = {library.__name__: library.__version__}
    if spec.model.library == "torchvision":
        facts["torchvision_version"] = library.__version__
    else:
        facts["torchvision_version"] = _installed_version("torchvision")  # no import: ~2.5 s saved
    facts["memory_after_import"] = cpu_memory()
    facts["cuda_available"] = torch.cuda.is_available()
    facts["cuda_devices"] = []
    problems = []
    if facts["cuda_available"]:
        try:
            facts["cuda_devices"] = _cuda_devices(torch, spec)
        except Exception as exc:
            if not _allocator_message(str(exc)):
                raise  # CUDA itself cannot start: no spec error, the parent reports the child's failure
            problems.append(_problem("allocator", exc))
            facts["cuda_available"] = False  # nothing below may touch the device
        facts["cuda_version"] = torch.version.cuda
    if not problems and spec.command is None:  # a command builds its own model, in its own processes
        imported = set(sys.modules)
        problems += _check_buildable(torch, spec, request.python_path, facts, events)
        facts["model_imports"] = installed_packages_imported(imported)
    # Last, because parsing changes this process's allocator setting: every ``allocators`` entry is checked
    # now, so a typo in the list is a spec error before any trial, not trial errors later.
    problems += _allocator_problems(torch, spec)
    # The user's modules the build imported and the files it read: a cached answer is stale once one changes.
    reads = files_read()
    events.emit(Inspected(facts=Facts(**facts), problems=problems, sources=imported_sources(), reads=reads))
    if not problems and spec.command is not None:
        events.emit(
            Estimated(estimate=Estimate(note="a command's step runs in its own script, which the trace cannot follow"))
        )
    elif not problems:
        # After the check's verdict: the trace runs the model's own step at real batch sizes (on fake tensors),
        # and whatever that does (a hang, an exit, a forged line) may cost the estimate, never the check.
        events.emit(Estimated(estimate=_estimate(torch, spec, request.python_path, facts)))


def _estimate(torch, spec: Spec, python_path: list[str], facts: dict[str, Any]):
    """The traced memory estimate (``child.core.estimate``), bounded to a quarter of the check's own timeout.

    On the CPU backend the trials' budget counts the data segment from the process's start, so the import
    baseline measured above (same preload as a trial) is added. On CUDA a trial's reading is what is in use on
    the card, its context included (``child.cuda_readings.card_reading``): what this process's context and any other
    process hold on the card now is added (the libraries a trial warms up come on top: the first trial shows).
    """
    from isoprobe.child.core import estimate
    from isoprobe.protocol.messages import Estimate

    if facts.get("meta_build_warning"):
        return Estimate(note="the model cannot be built on the meta device")
    reason = estimate.skip_reason(spec, facts.get("parameter_count"))
    if reason is not None:
        return Estimate(note=reason)
    device = _trial_device(torch, spec, facts)
    if device.type == "cpu":
        baseline = facts["memory_after_import"].data
    else:
        free, total = torch.cuda.mem_get_info(device)
        baseline = total - free
    limit = min(estimate.TIME_LIMIT_SECONDS, spec.search.trial_timeout / 4)
    return estimate.estimate(torch, spec, python_path, device, baseline, time_limit=limit)


def _cuda_devices(torch, spec: Spec) -> list[CudaDevice]:
    """Every visible GPU's name and size; the free memory of the trials' GPU only.

    CUDA's lazy initialisation runs first (the allocator parses its setting there: a bad key
    raises here, inside the caller's try, and the first allocation then checks the rest).
    Properties create no context; ``mem_get_info`` does, so it is asked of the target device
    alone: a context on every GPU costs memory on a shared node and fails on a GPU in
    exclusive-process mode that another job holds.
    """
    torch.cuda.init()
    count = torch.cuda.device_count()
    target = _target_index(spec, count)
    devices = []
    for index in range(count):
        properties = torch.cuda.get_device_properties(index)
        free = outside = None
        if index == target:
            torch.cuda.set_device(index)
            torch.empty(1, device=f"cuda:{index}")  # the first allocation: the allocator's setting, checked
            free, total = torch.cuda.mem_get_info(index)  # this child's own context is already taken out
            own = child_cuda.own_process_bytes(torch.cuda, index)  # not a neighbour's memory (child.cuda_readings)
            if own is not None:
                outside = child_cuda.outside_allocator_bytes(free, total, torch.cuda.memory_reserved(index), own)
        devices.append(
            CudaDevice(
                name=properties.name,
                total_memory_bytes=properties.total_memory,
                free_memory_bytes=free,
                outside_bytes=outside,
            )
        )
    return devices


def _target_index(spec: Spec, count: int) -> int | None:
    """The GPU the trials will use (``auto`` and ``cuda`` are cuda:0), or None: the CPU, or no such GPU."""
    wanted = spec.device
    if wanted == "cpu" or count == 0:
        return None
    index = 0 if wanted in ("auto", "cuda") else int(wanted.split(":")[1])
    return index if index < count else None  # resolve_target names the GPUs there are


def _allocator_message(message: str) -> bool:
    """Does torch's error speak of the allocator's setting (its parser's wording, torch 2.14)?"""
    lowered = message.lower()
    return any(marker in lowered for marker in ("allocator config", "configtokenizer", "alloc_conf"))


def _allocator_problems(torch, spec: Spec) -> list[InspectProblem]:
    """``allocator`` and each ``allocators`` entry as torch's parser reads them (no device needed): the first
    one rejected. Also on the CPU backend, which does not use them: a typo is a typo."""
    settings = [("allocator", spec.allocator)] if spec.allocator else []
    settings += [("allocators entry", entry) for entry in spec.allocators or [] if entry != "default"]
    for what, setting in settings:
        reason = child_cuda.allocator_setting_problem(torch, setting)
        if reason is not None:
            return [
                InspectProblem(
                    stage="allocator", type="ValueError", message=f"{what} {setting!r}: {reason}"[:MESSAGE_CHARS]
                )
            ]
    return []


def _problem(stage: str, exc: BaseException, prefix: str = "") -> InspectProblem:
    return InspectProblem(stage=stage, type=type(exc).__name__, message=prefix + str(exc)[:MESSAGE_CHARS])


def _mismatch(message: str) -> list[InspectProblem]:
    return [InspectProblem(stage="target", type="ShapeMismatch", message=message)]


def _check_buildable(
    torch, spec: Spec, python_path: list[str], facts: dict[str, Any], events: Events | None = None
) -> list[InspectProblem]:
    """Can the model, optimizer and training options be set up, and does the output fit the target?

    On the meta device first: shapes without memory. A model the meta device cannot
    build is built for real on the CPU, once: if that raises too, the factory itself
    is broken (a spec error); if not, only the meta device was the problem.
    """
    if spec.model.hf_trainer is not None:  # the Trainer is built in each trial, with the user's data and weights
        try:
            _check_builder_signature(import_callable(spec.model.hf_trainer, python_path), spec.model.kwargs)
        except Exception as exc:
            return [_problem("hf_trainer", exc)]
        from isoprobe.child.framework.hf_trainer_runner import check_before_trials

        return check_before_trials(spec, python_path, facts)
    if spec.model.lightning is not None:  # the user's LightningModule: built and checked, never traced
        from isoprobe.child.framework.lightning_runner import check_buildable

        return check_buildable(torch, spec, python_path, facts) + _check_precision(
            torch, spec, _trial_device(torch, spec, facts)
        )
    for stage in ("batch", "loss", "step"):
        reference = getattr(spec.model, stage)
        if reference is not None:
            try:
                function = import_callable(reference, python_path)
                if stage == "step":
                    _check_step_signature(function)
            except Exception as exc:
                return [_problem(stage, exc)]
    collated = None
    if spec.data is not None:
        problem, collated = _scan_data(spec, python_path, facts, events)
        if problem is not None:
            return [problem]
    try:
        with torch.device("meta"):
            model = build_model(spec, python_path)
    except (ImportError, AttributeError, TypeError, ValueError, KeyError) as exc:
        return [_problem("model", exc)]
    except Exception as exc:
        facts["meta_build_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        try:
            build_model(spec, python_path)
        except Exception as real_exc:
            return [_problem("model", real_exc)]
        return []
    device = _trial_device(torch, spec, facts)
    problems = _check_precision(torch, spec, device)
    if spec.training.mode == "train":
        try:
            # One real parameter on the trial's device: fused/foreach and unknown kwargs fail here, not in a trial.
            build_optimizer(spec, [torch.nn.Parameter(torch.zeros(4, device=device))])
        except Exception as exc:
            problems.append(_problem("optimizer", exc))
    facts["parameter_count"] = sum(p.numel() for p in model.parameters())
    facts["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if spec.model.batch is None and spec.data is None:
        problems += _check_output_shape(torch, spec, model, facts)
    if collated is not None:
        problems += _check_data_forward(torch, spec, model, collated, facts)
    if spec.training.gradient_checkpointing:
        try:
            facts["checkpointing"] = enable_checkpointing(model)
        except Exception as exc:
            problems.append(_problem("checkpointing", exc))
    return problems


def _scan_data(
    spec: Spec, python_path: list[str], facts: dict[str, Any], events: Events | None = None
) -> tuple[InspectProblem | None, Any]:
    """The dataset's lengths and worst-first order (``child.core.data``), before any trial: the data section's
    problems (a factory that raises, an empty or iterable dataset, a length that is no number, samples that
    change from read to read, a collate_fn that cannot collate the two longest samples) are spec errors
    naming their field. Returns the problem, or the collated batch of the two longest samples. Where the pass
    is goes out as ``DataScanning`` events: a check stopped in it then names it."""
    from isoprobe.child.core import data

    def report(stage: str, samples: int | None = None, scanning: int | None = None) -> None:
        if events is not None:
            events.emit(DataScanning(stage=stage, samples=samples, scanning=scanning))

    try:
        scanned, collated = data.scan(spec, python_path, report)
        try:
            data.as_inputs_and_targets(collated)
        except TypeError as exc:
            raise data.DataProblem("data.collate_fn", exc) from exc
    except data.DataProblem as problem:
        return InspectProblem(stage=problem.stage, type=problem.type, message=str(problem)[:MESSAGE_CHARS]), None
    facts["data"] = scanned
    return None, collated


def _check_data_forward(torch, spec: Spec, model, collated, facts: dict[str, Any]) -> list[InspectProblem]:
    """One forward pass of the meta model on the two longest samples, collated and moved to the meta device
    (no memory, no compute): a collated batch the model cannot take is a spec error, not a trial's error."""
    from isoprobe.child.core.data import as_inputs_and_targets
    from isoprobe.child.core.workload import adapt_inputs, call_model

    inputs, _ = as_inputs_and_targets(collated)
    try:
        model.train()
        call_model(spec, model, adapt_inputs(inputs, lambda t: t.to("meta")))
    except TypeError as exc:  # the call itself: model(**batch) with keywords forward() does not take
        return [_problem("data.collate_fn", exc, prefix="the model cannot take the collated batch: ")]
    except RuntimeError as exc:
        message = str(exc)
        if any(word in message for word in ("shape", "size", "dimension", "mat1 and mat2", "channels")):
            return [_problem("data.collate_fn", exc, prefix="the model cannot take the collated batch: ")]
        facts["meta_forward_warning"] = f"{type(exc).__name__}: {message[:500]}"
    except Exception as exc:  # an op without a meta kernel, say: the trials will tell
        facts["meta_forward_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    return []


def _check_step_signature(function) -> None:
    """model.step is called as f(model, optimizer, batch, device): a signature that cannot take that is a spec error."""
    _check_signature(function, "f(model, optimizer, batch, device)", None, None, None, None)


def _check_builder_signature(function, kwargs: dict[str, Any]) -> None:
    """model.hf_trainer is called as f(batch_size, **model.kwargs): a signature that cannot take that is a spec error.

    Not called here: building the Trainer builds the user's model and data for real (memory, time), and on
    the meta device the Trainer cannot be built at all; the first trial runs it.
    """
    _check_signature(function, f"f(batch_size, **model.kwargs) with model.kwargs {kwargs}", 1, **kwargs)


def _check_signature(function, call: str, *args: Any, **kwargs: Any) -> None:
    """TypeError naming ``call`` when ``function``'s signature cannot bind ``args`` and ``kwargs``."""
    import inspect

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a signature: the trials will tell
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"{getattr(function, '__name__', function)}{signature} cannot be called as {call}: {exc}"
        ) from None


def _trial_device(torch, spec: Spec, facts: dict[str, Any]):
    """Where the checks run: the trials' GPU, or the CPU (also for a cuda:N that does not exist, which
    ``resolve_target`` then refuses, naming the GPUs there are)."""
    if not facts.get("cuda_available"):
        return torch.device("cpu")
    index = _target_index(spec, len(facts.get("cuda_devices") or []))
    return torch.device("cpu") if index is None else torch.device(f"cuda:{index}")


def _check_precision(torch, spec: Spec, device) -> list[InspectProblem]:
    """Can this device run the spec's precision? A tiny real op under the same autocast, and the scaler."""
    precision = spec.training.precision
    if precision == "fp32":
        return []
    dtype = torch.float16 if precision == "fp16-mixed" else torch.bfloat16
    try:
        if device.type == "cuda" and dtype is torch.bfloat16:
            capability = torch.cuda.get_device_capability(device)
            if not child_cuda.bf16_supported(capability):
                raise RuntimeError(
                    f"{torch.cuda.get_device_name(device)} (compute capability "
                    f"{capability[0]}.{capability[1]}) does not support bfloat16 natively: it needs "
                    "compute capability 8.0 (Ampere) or newer"
                )
        a = torch.ones(4, 4, device=device)
        if precision == "bf16-true":
            (a.to(dtype) @ a.to(dtype)).sum()
        else:
            with torch.autocast(device.type, dtype=dtype):
                (a @ a).sum()
        if precision == "fp16-mixed":
            torch.amp.GradScaler(device.type)
    except Exception as exc:
        return [_problem("precision", exc, prefix=f"{precision} on {device.type}: ")]
    return []


def _check_output_shape(torch, spec: Spec, model, facts: dict[str, Any]) -> list[InspectProblem]:
    """One forward pass on meta tensors (no memory, no compute): does the output match the target?"""
    task = task_of(spec)
    if task == "detection" or (spec.model.huggingface is not None and task == "language_modeling"):
        return []  # these models compute their own losses from the batch
    try:
        batch = make_batch(spec, 2, torch.device("meta"), [])
        model.train()
        output = primary_output(model(batch.inputs))
    except RuntimeError as exc:
        message = str(exc)
        if any(word in message for word in ("shape", "size", "dimension", "mat1 and mat2", "channels")):
            return [_problem("input", exc)]
        facts["meta_forward_warning"] = f"{type(exc).__name__}: {message[:500]}"
        return []
    except Exception as exc:  # an op without a meta kernel, say: the trials will tell
        facts["meta_forward_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        return []
    target = spec.target
    if target is None or spec.model.loss is not None:
        return []  # the user's loss decides what the output must be
    shape = list(output.shape)
    if task == "language_modeling":
        if len(shape) != 3:
            return _mismatch(
                f"language_modeling needs logits (batch, sequence, vocabulary); the model returned shape {shape}"
            )
        return []
    if task == "segmentation" and len(shape) != 4:
        return _mismatch(f"segmentation needs outputs (batch, classes, height, width); the model returned {shape}")
    if target.classes is not None:
        if len(shape) < 2 or shape[1] != target.classes:
            return _mismatch(
                f"the model's output has shape {shape} (per sample {shape[1:]}), "
                f"so its class dimension is {shape[1] if len(shape) > 1 else 'missing'}, "
                f"not target.classes = {target.classes}"
            )
    elif shape[1:] != target_shape(target):
        return _mismatch(
            f"the model's output per sample has shape {shape[1:]}, not target.shape = {target_shape(target)}"
        )
    return []
