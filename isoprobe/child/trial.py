"""A trial: the spec's training steps at one batch size, and the peak memory they needed.

The child classifies its own exception (out of memory versus any other error,
``outcomes.classify_exception``) and writes exactly one ``TrialResult``, with
the user's source files it ran and the files it read (``cache.sources``,
``child.reads``: the cache's answer is only as current as they are) and the
intra-op threads it ran (``cache.threads``). A process that ends without one is classified by the
parent (crashed, timed out).
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from isoprobe.report import steady
from isoprobe.child.reads import files_read, watch_reads
from isoprobe.child.sources import imported_sources
from isoprobe.child import cuda as child_cuda
from isoprobe.child.memory import budget_peak, cpu_memory, cpu_readings, data_cap, shared_writable_bytes
from isoprobe.child.optimizer_state import RealSteps
from isoprobe.child.training import Step
from isoprobe.child.workload import build_model, import_model_library
from isoprobe.report.outcomes import Outcome, classify_exception, maybe_allocation_failure
from isoprobe.protocol.messages import MESSAGE_CHARS, EvalDone, Forwarded, Imported, ModelBuilt, StepDone, TrialRequest, TrialResult
from isoprobe.report.result import CudaMemoryAtFailure, ErrorInfo, Sizes

if TYPE_CHECKING:
    from isoprobe.child.events import Events

_TRACEBACK_LINES = 25


@dataclass
class _Progress:
    """How far the trial got: reported with the verdict, whatever the verdict is."""

    phase: str = "started"
    step_seconds: list[float] = field(default_factory=list)


def run_trial(request: TrialRequest, events: Events) -> None:
    watch_reads()  # before the user's code runs (see cache_reads)
    progress = _Progress()
    report: dict[str, Any] = {}
    failure: tuple[Outcome, ErrorInfo] | None = None
    try:
        report = _train(request, events, progress)
    except Exception as exc:  # classified, never guessed: see outcomes.classify_exception
        failure = _describe_failure(exc)
        if request.device.startswith("cuda") and maybe_allocation_failure(failure[1].message):
            failure = failure[0], failure[1].model_copy(update={"cuda_memory": _cuda_memory_now(request.device)})
    if failure is None:
        # Sources at the end: a forward pass may import lazily, and what it ran is what the answer depends on.
        reads = files_read()  # before hashing the sources, whose own opens are no reads of the trial
        events.emit(TrialResult(outcome=Outcome.FITS, phase=progress.phase, step_seconds=progress.step_seconds,
                                reads=reads, sources=imported_sources(), threads=_threads(), **report))
        return
    # The model, optimizer and batch lived in _train's frame, kept alive by the traceback
    # until the except block ended: collect them before writing, so that reporting an
    # out-of-memory does not itself run out of memory.
    gc.collect()
    outcome, error = failure
    if outcome is Outcome.ERROR:
        sys.stderr.write(error.traceback_tail)
    if not request.device.startswith("cuda"):
        report["peak_bytes"] = cpu_memory().peak_rss
    reads = files_read()
    events.emit(TrialResult(outcome=outcome, phase=progress.phase, step_seconds=progress.step_seconds, error=error,
                            reads=reads, sources=imported_sources(), threads=_threads(), **report))


def _threads() -> int | None:
    """The intra-op threads torch runs here (None if the trial never imported it): the cache checks them."""
    torch = sys.modules.get("torch")
    try:
        return torch.get_num_threads() if torch is not None else None
    except Exception:  # noqa: BLE001 - a torch that cannot say: the cache then has nothing to check against
        return None


def _train(request: TrialRequest, events: Events, progress: _Progress) -> dict[str, Any]:
    """Build, then run the spec's training steps; return the peak readings (TrialResult fields). Raises on failure."""
    spec = request.spec
    report: dict[str, Any] = {}
    import torch

    device = torch.device(request.device)
    cuda = device.type == "cuda"
    if cuda:  # first thing: a bad allocator setting raises here, inside the try (see child.cuda)
        child_cuda.initialise(torch, device)
    if request.rank is not None:
        # One rank of a gang meets the others before building what they share. On CUDA before the budget
        # is set: nccl's communicators take memory outside the allocator, which the budget must leave out.
        from isoprobe.child.distributed import join

        join(request.rank, device)
    if cuda:
        report.update(child_cuda.setup(torch, device, spec.training.precision, request.memory_budget_bytes))
    import_model_library(spec)  # here, so that its cost lands in the 'imported' phase
    progress.phase = "imported"
    events.emit(Imported(memory=cpu_memory()))
    python_path = request.python_path
    step = Step(spec, build_model(spec, python_path), device, python_path)
    progress.phase = "model_built"
    events.emit(ModelBuilt(memory=cpu_memory()))
    if request.rank is not None:  # which rank hung, if the gang times out inside a step (executors.gang.laggard)
        step.on_forwarded = lambda: events.emit(Forwarded(step=len(progress.step_seconds) + 1))
    if cuda:
        # Peaks from here on; the model's weights are allocated already and still count.
        torch.cuda.reset_peak_memory_stats(device)
    batch = step.batch(request.batch_size)
    real_steps = RealSteps(step, lambda: len(progress.step_seconds) + 1)
    rule = request.steady
    peaks: list[int] = []
    index = 0
    while True:
        index += 1
        started = time.perf_counter()
        step.run(batch)
        if cuda:
            torch.cuda.synchronize(device)
        progress.step_seconds.append(time.perf_counter() - started)
        progress.phase = f"step {index}"
        memory = _step_memory(torch, device)
        events.emit(StepDone(step=index, seconds=progress.step_seconds[-1], **memory))
        peaks.append(memory["budget_peak_bytes"] or memory["peak_bytes"] or 0)
        if rule is None:
            if index >= (request.steps or spec.search.steps):
                break
        elif _gang_agrees(torch, device, request, steady.should_stop(peaks, rule)):
            break  # steady or at the cap: the parent judges which from the step events (probe.classify)
    real_steps.settle(lambda: step.run(batch), len(progress.step_seconds))  # fp16: the optimizer's state, for real
    if spec.training.eval_pass:
        progress.phase = "eval"
        seconds = step.evaluate(batch)  # synchronises before reading its clock
        report["eval_seconds"] = seconds
        events.emit(EvalDone(seconds=seconds))
    step.release()  # before the readings: base_bytes is the memory held with the batch's activations freed
    report["applied"] = step.applied
    report["sizes"] = step.sizes
    if spec.training.compile and len(progress.step_seconds) >= 2:
        # The first step compiles (forward and backward graphs); the later ones show what a step costs.
        later = sorted(progress.step_seconds[1:])
        report["compile_seconds"] = max(0.0, progress.step_seconds[0] - later[len(later) // 2])
    if cuda:
        report.update(child_cuda.readings(torch, device, step.sizes or Sizes()))
    else:
        report.update(cpu_readings())
    progress.phase = "done"
    return report


def _cuda_memory_now(device: str):
    """The card as the failure left it (evidence for an ambiguous library error), if torch got imported."""
    torch = sys.modules.get("torch")
    reading = child_cuda.memory_at_failure(torch, torch.device(device)) if torch is not None else None
    return CudaMemoryAtFailure(**reading) if reading else None


def _step_memory(torch, device) -> dict[str, int | None]:
    """The peak so far and the memory held now, after a step: growth over the steps shows in them."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_reserved(device)
        return {"peak_bytes": peak, "held_bytes": torch.cuda.memory_allocated(device), "budget_peak_bytes": peak}
    memory = cpu_memory()
    return {"peak_bytes": memory.peak_rss, "held_bytes": memory.rss,
            "budget_peak_bytes": budget_peak(memory.peak_data, data_cap(), shared_writable_bytes())}


def _gang_agrees(torch, device, request: TrialRequest, mine: bool) -> bool:
    """True when every rank says True (one process: its own answer). The ranks must step together, so a
    steady rule ends them at the same step: a gang's steady state is every rank's."""
    if request.rank is None:
        return mine
    import torch.distributed as dist

    flag = torch.tensor([0 if mine else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def _describe_failure(exc: BaseException) -> tuple[Outcome, ErrorInfo]:
    names = [cls.__name__ for cls in type(exc).__mro__]
    message = str(exc)
    outcome = classify_exception(names, message)
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines)[-8000:].splitlines()[-_TRACEBACK_LINES:]
    qualified = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    return outcome, ErrorInfo(type=qualified, message=message[:MESSAGE_CHARS], traceback_tail="\n".join(tail) + "\n")
