"""Before any trial: check the environment in a child, then decide where trials run and under what.

The parent never imports torch, so what torch and the GPU are like comes from
an ``inspect`` child (``protocol.InspectRequest``), run through the same
executor as the trials. What it cannot build becomes a ``SpecError`` naming
the field to fix. ``resolve_target`` and ``trial_conditions`` are pure.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from isoprobe.errors import ProbeError, Problem, SpecError
from isoprobe.executors import Conditions, Executor
from isoprobe.executors.ranks import CPU_RAM_SHARE
from isoprobe.pipeline.inspect_failure import inspect_failure, inspect_problem, unfinished_trace
from isoprobe.protocol.messages import (
    DataScan,
    Estimate,
    Estimated,
    Facts,
    Inspected,
    InspectRequest,
    MemoryReading,
    first_of,
)
from isoprobe.protocol.wiring import TRIAL_ENV
from isoprobe.report.device import AllocatorInfo, DeviceInfo
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes
from isoprobe.system.data_cap import OWN_ALLOWANCE_BYTES
from isoprobe.system.hardware import cpu_name, ram_bytes

#: CPU backend budget when the spec sets none. Big enough for resnet50 at a
#: handful of samples (imports take ~0.9 GiB of it), small enough that the
#: search ends in minutes on 2 cores.
DEFAULT_CPU_BUDGET = 3 * 1024**3
#: Data segment a trial needs beyond the import baseline before any model exists.
_MIN_BUDGET_MARGIN = 64 * 1024**2


@dataclass(frozen=True)
class Target:
    """The resolved device: where trials run and the memory they may use."""

    backend: Literal["cpu", "cuda"]
    device: str
    info: DeviceInfo
    #: CUDA: the memory free when the environment was checked (other processes and the check's context taken
    #: out). Shown, not predicted against: a trial's reading counts the whole card's use (``search_capacity``).
    free_bytes: int | None = None
    #: CUDA: what the check's own process held outside its allocator, by NVML's per-process count (None where
    #: NVML cannot say): a neighbour's memory is not the trial's (``cuda_outside_bytes``).
    own_outside_bytes: int | None = None
    #: CPU: the environment check's readings after its imports, which are every trial's (``preload``, in
    #: ``inspect_conditions`` and ``trial_conditions`` alike): a trial's peak below them cannot be true
    #: (``pipeline.plausibility``).
    import_memory: MemoryReading | None = None
    #: The installed packages the model's code imported in the environment check (``Facts.model_imports``):
    #: every trial's process imports them before its request (``preload``).
    model_imports: tuple[str, ...] = ()
    #: With spec.data: the environment check's scan of the dataset (its size, the longest samples).
    data: DataScan | None = None
    #: With model.hf_trainer: the length of the Trainer's train set, which no batch tried exceeds.
    train_samples: int | None = None

    @property
    def search_capacity(self) -> int:
        """The memory the search's line predicts against and the margin is read from: the capacity.

        On CUDA that is the budget, or the card's total without one: a trial's reading (``budget_peak_bytes``) is
        what is in use on the card at its peak, its context and libraries included (and other processes', which
        take memory from it as much), so it is compared with the whole of what the process may use. Compared with
        the free memory instead, as it once was, the context and libraries were counted twice where no budget was
        set; and with a budget, a reading of the allocator alone never came closer to the budget than the memory
        outside it (300-600 MiB), so no batch was ever marginal (issue 45)."""
        return self.info.capacity_bytes

    @property
    def cuda_outside_bytes(self) -> int | None:
        """CUDA: what the environment check held on the trials' card outside its allocator, the first figure a
        command's shim takes off its budget; None elsewhere. Its own, where NVML gives its pid's figure; else all in
        use on the card, other processes' memory included (conservative: a neighbour then shrinks the cap)."""
        if self.backend != "cuda":
            return None
        if self.own_outside_bytes is not None:
            return self.own_outside_bytes
        if self.free_bytes is None:
            return None
        return max(0, self.info.total_memory_bytes - self.free_bytes)


def inspect_conditions(spec: Spec) -> Conditions:
    """How the environment check's process is started: it imports what every trial imports before its request.

    Why the preload: the executor bounds a child's imports on their own, before
    the request is delivered (``processes.import_timeout``: minutes, for a cold
    page cache or a network filesystem), and runs the request's timeout from
    delivery. So the check's whole bound is that import bound plus the spec's
    ``search.trial_timeout`` for the rest (building the model on the meta device,
    one forward pass on meta tensors, an optimizer on one parameter: less than a
    trial does after the same imports). A factory that hangs is stopped after
    trial_timeout, not after a fixed 300 s as it once was, and the ``warm``
    event tells the two phases apart in the error. It also makes the import
    baseline what a trial's process really imports (torch._dynamo included),
    with a gang's threads per rank: so its process can be the trials' fork server's.
    """
    return Conditions(
        backend="cpu" if spec.device == "cpu" else "cuda",
        allocator=spec.allocator,
        preload=preload(spec),
        threads=spec.distributed.threads_per_rank,
    )


def inspect_environment(spec: Spec, spec_path: str, executor: Executor, python_path: list[str]) -> Facts:
    """Run the inspect child; map what it cannot build to a SpecError, and a child without an answer to a ProbeError."""
    run = executor.run(
        InspectRequest(spec=spec, python_path=python_path),
        inspect_conditions(spec),
        timeout=spec.search.trial_timeout,
        name="inspect",
    )
    # The first of each: written before the user's code ran at real batch sizes (the estimate's trace), which
    # could append lines of its own to the channel.
    inspected = first_of(run.events, Inspected)
    if inspected is None or (run.timed_out and not run.verdict_at_timeout):
        raise ProbeError(inspect_failure(run, spec), run.stderr_tail)
    if inspected.problems:
        raise SpecError(spec_path, [inspect_problem(p) for p in inspected.problems])
    estimated = first_of(run.events, Estimated)
    if estimated is None:  # the trace hung, crashed or left: the search runs as it does without an estimate
        return inspected.facts.model_copy(update={"estimate": Estimate(note=unfinished_trace(run, spec))})
    return inspected.facts.model_copy(update={"estimate": estimated.estimate})


#: The headline faulthandler's watchdog writes before it ends a process (``child.core.estimate._hard_deadline``).
def resolve_target(spec: Spec, facts: Facts, budget_source: str | None, source: str = "spec") -> Target:
    """Pick the backend from the spec's device and what the inspect child saw. Pure given ``facts``."""
    requested = spec.device
    devices = facts.cuda_devices
    note = None
    if requested == "auto":
        if devices:
            requested_device, note = "cuda:0", "device auto: a GPU is visible, using cuda:0"
        else:
            requested_device = "cpu"
            note = "device auto: no GPU visible, using the CPU backend (memory capped per trial)"
    else:
        requested_device = "cuda:0" if requested == "cuda" else requested
    if requested_device == "cpu":
        return _cpu_target(spec, facts, budget_source, source, note)
    index = int(requested_device.split(":")[1])
    if not devices:
        raise SpecError(
            source,
            [Problem("device", f"{requested} was asked for, but torch sees no GPU here", "use device: auto or cpu")],
        )
    if index >= len(devices):
        raise SpecError(
            source,
            [
                Problem(
                    "device",
                    f"{requested} does not exist: {len(devices)} GPU(s) visible",
                    f"pick cuda:0 .. cuda:{len(devices) - 1}",
                )
            ],
        )
    check_gang_fits_node(spec, source, gpus=len(devices), index=index)
    device = devices[index]
    budget = spec.memory_budget
    if budget is not None and budget > device.total_memory_bytes:
        raise SpecError(
            source,
            [
                Problem(
                    "memory_budget",
                    f"{format_bytes(budget)} is more than the GPU has ({format_bytes(device.total_memory_bytes)})",
                    "lower it, or leave it unset to use the whole GPU",
                )
            ],
        )
    info = DeviceInfo(
        backend="cuda",
        requested=spec.device,
        name=device.name,
        index=index,
        total_memory_bytes=device.total_memory_bytes,
        memory_budget_bytes=budget,
        budget_source=budget_source if budget is not None else None,
        capacity_bytes=budget or device.total_memory_bytes,
        note=note,
    )
    return Target(
        "cuda",
        requested_device,
        info,
        device.free_memory_bytes,
        own_outside_bytes=device.outside_bytes,
        model_imports=tuple(facts.model_imports),
        data=facts.data,
        train_samples=facts.train_samples,
    )


def check_gang_fits_node(
    spec: Spec, source: str, *, gpus: int | None = None, index: int = 0, budget: int | None = None
) -> None:
    """A gang runs on this node: on CUDA one visible GPU per rank from cuda:0, on the CPU every rank's budget.

    A gang run as a Slurm job step (``launcher`` srun) runs on the allocation's nodes, one GPU a rank as Slurm
    binds it: this node's GPUs and RAM do not bound it, and a step the allocation cannot hold is Slurm's refusal.
    With ``device: cpu`` the parent checks the budgets before the environment check (``answer._resolve_ranks``);
    here it is checked again once the backend is known (``device: auto`` without a GPU).
    """
    if not spec.distributed.gang:
        return
    world = spec.distributed.world_size or 1
    if spec.distributed.launcher == "srun":
        world = 1
    if gpus is not None and index != 0:
        raise SpecError(
            source,
            [
                Problem(
                    "device",
                    f"{spec.device}: a distributed trial's ranks take the visible GPUs "
                    f"from cuda:0 on (rank r on cuda:r)",
                    "use device: cuda (choose the GPUs with CUDA_VISIBLE_DEVICES)",
                )
            ],
        )
    if gpus is not None and world > gpus:
        raise SpecError(
            source,
            [
                Problem(
                    "distributed.world_size",
                    f"{world} ranks need {world} GPUs, one each; {gpus} visible here",
                    f"set it to at most {gpus} (a smaller gang's shards are larger: the answer errs on the safe side)",
                )
            ],
        )
    if budget is not None and world * budget > int(ram_bytes() * CPU_RAM_SHARE):
        raise SpecError(
            source,
            [
                Problem(
                    "distributed.world_size",
                    f"{world} ranks of {format_bytes(budget)} each need "
                    f"{format_bytes(world * budget)}, more than {CPU_RAM_SHARE:.0%} of this "
                    f"machine's {format_bytes(ram_bytes())}",
                    "lower distributed.world_size or memory_budget",
                )
            ],
        )


def inherited_data_limit() -> int | None:
    """This process's hard RLIMIT_DATA (``ulimit -d``), which no trial it starts can exceed; None: unlimited."""
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def _within_data_limit(spec: Spec, budget: int, source: str, note: str | None) -> tuple[int, str | None]:
    """The CPU budget under this process's hard data limit, and the note to print: a budget set above the limit is
    a spec error (the cap could not be set: an unprivileged process cannot raise its hard limit), the default
    one is lowered to it; at or just below the limit, isoprobe's own modules are no longer credited."""
    hard = inherited_data_limit()
    if hard is None or hard >= budget + OWN_ALLOWANCE_BYTES:
        return budget, note
    if budget > hard:
        if spec.memory_budget is not None:
            raise SpecError(
                source,
                [
                    Problem(
                        "memory_budget",
                        f"{format_bytes(budget)} is more than a trial can be given here: this process's hard data "
                        f"limit (RLIMIT_DATA, ulimit -d) is {format_bytes(hard)}, and no process it starts may "
                        "exceed it",
                        f"set memory_budget (--memory-budget) to at most {hard} bytes ({format_bytes(hard)}), or run "
                        "isoprobe where the hard limit is higher (ulimit -d; a batch system's job limits)",
                    )
                ],
            )
        budget = hard
        limited = (
            f"memory_budget not set: the default {format_bytes(DEFAULT_CPU_BUDGET)} is above this process's "
            f"hard data limit (ulimit -d), so the trials get {format_bytes(hard)}"
        )
    else:
        limited = (
            f"this process's hard data limit (ulimit -d, {format_bytes(hard)}) leaves no room above the budget "
            "for isoprobe's own modules (about 6 MiB, credited to a trial's cap elsewhere): they count "
            "against the budget, so the answer may be a sample below a plain process's"
        )
    return budget, limited if note is None else f"{note}; {limited}"


def _cpu_target(spec: Spec, facts: Facts, budget_source: str | None, source: str, note: str | None) -> Target:
    budget, note = _within_data_limit(spec, spec.memory_budget or DEFAULT_CPU_BUDGET, source, note)
    check_gang_fits_node(spec, source, budget=budget)
    baseline = facts.memory_after_import.data
    if baseline and budget < baseline + _MIN_BUDGET_MARGIN:
        raise SpecError(
            source,
            [
                Problem(
                    "memory_budget",
                    f"{format_bytes(budget)} is less than a trial needs just to import torch "
                    f"({format_bytes(baseline)} measured here)",
                    f"give at least {format_bytes(baseline + 512 * 1024**2)} for a small model",
                )
            ],
        )
    info = DeviceInfo(
        backend="cpu",
        requested=spec.device,
        name=cpu_name(),
        total_memory_bytes=ram_bytes(),
        memory_budget_bytes=budget,
        budget_source=budget_source if spec.memory_budget else "default",
        capacity_bytes=budget,
        import_baseline_bytes=baseline,
        note=note,
    )
    return Target(
        "cpu",
        "cpu",
        info,
        import_memory=facts.memory_after_import,
        model_imports=tuple(facts.model_imports),
        data=facts.data,
        train_samples=facts.train_samples,
    )


def likely_backend(spec: Spec) -> Literal["cpu", "cuda"]:
    """The backend the trials will most likely get, known before the inspect child answers.

    Only used to start the first trial's process early: if the guess is wrong,
    that process is discarded, never used. ``auto`` counts as CPU where the
    NVIDIA driver shows no GPU (no /proc/driver/nvidia/gpus entry).
    """
    no_gpu = not any(Path("/proc/driver/nvidia/gpus").glob("*"))
    return "cpu" if spec.device == "cpu" or (spec.device == "auto" and no_gpu) else "cuda"


def allocator_setting(spec: Spec, backend: str, label: str | None = None) -> str | None:
    """The PYTORCH_CUDA_ALLOC_CONF a trial gets: an ``allocators`` entry ('default' is '': removed), or
    ``allocator``."""
    if label is None and spec.allocators and backend == "cuda":
        label = spec.allocators[0]
    if label is not None:
        return "" if label == "default" else label
    return spec.allocator


def preload(spec: Spec, model_imports: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a warm child imports before its request: everything a trial imports that touches no device.

    torch._dynamo is on the list because constructing any torch optimizer imports
    it (torch/_compile.py), about 2.5 s measured here: without it the warm child
    would save the import of torch only to pay as much again in the build.
    ``model_imports`` (the installed packages the environment check saw the
    model's code import) come last: a package first imported inside a fork left
    ~1.3 MiB more than in a fresh process, and cost a sample at the edge.
    """
    if spec.command is not None:
        return ()  # the trial's process only supervises the command, whose own processes import what they need
    library = spec.model.library
    trainer = ("transformers.trainer",) if spec.model.hf_trainer is not None else ()  # accelerate with it: seconds
    named = ("torch", "torch._dynamo") + ((library,) if library else ()) + trainer
    return named + tuple(m for m in model_imports if m not in named and m.partition(".")[0] not in named)


def model_imports_note(spec: Spec, conditions: Conditions) -> str | None:
    """What the first trial waits for beyond its own start, when the model's code imported installed modules that
    the process started during the environment check had not (``conditions``: the trials'); None when nothing."""
    added = conditions.preload[len(preload(spec)) :]
    if not added:
        return None
    shown = ", ".join(added[:3]) + (f" and {len(added) - 3} more" if len(added) > 3 else "")
    return (
        f"the model's code imports {len(added)} installed module(s) beyond torch and the model library "
        f"({shown}): every trial's process imports them before its request, and the first trial waits for that"
    )


def trial_conditions(
    spec: Spec,
    backend: Literal["cpu", "cuda"],
    memory_limit: int | None,
    allocator_label: str | None = None,
    model_imports: tuple[str, ...] = (),
) -> Conditions:
    """How every ordinary trial's process is started: the backend, the allocator, the CPU cap, the preload."""
    return Conditions(
        backend=backend,
        allocator=allocator_setting(spec, backend, allocator_label),
        memory_limit=memory_limit if backend == "cpu" else None,
        preload=preload(spec, model_imports),
        threads=spec.distributed.threads_per_rank,
    )


def allocator_info(spec: Spec, backend: str, environ: dict[str, str]) -> AllocatorInfo:
    """The allocator setting the trials ran with, and where it came from (``Result.allocator``)."""
    value: str | None
    if spec.allocators and backend == "cuda":
        value, source = spec.allocators[0], "spec"
    elif spec.allocator is not None:
        value, source = spec.allocator, "spec"
    elif environ.get("PYTORCH_CUDA_ALLOC_CONF") or environ.get("PYTORCH_ALLOC_CONF"):
        value = environ.get("PYTORCH_CUDA_ALLOC_CONF") or environ.get("PYTORCH_ALLOC_CONF")
        source = "environment"
    else:
        value, source = None, "none"
    variables = (
        ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
        if spec.allocator is not None or (spec.allocators and backend == "cuda")
        else []
    )
    return AllocatorInfo(value=value, source=source, variables=variables, applies=backend == "cuda")


def probe_of_this_trial(environ: Mapping[str, str]) -> str | None:
    """The pid of the probe whose trial this process is part of (``ISOPROBE_TRIAL``), or None: a hook run there (a
    TaskProlog for a trial step's task) must do nothing (``cli.run``)."""
    return environ.get(TRIAL_ENV) or None
