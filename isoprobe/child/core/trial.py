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
import traceback
from typing import TYPE_CHECKING, Any

from isoprobe.child.core import cuda as child_cuda
from isoprobe.child.core.memory import cpu_memory
from isoprobe.child.core.optimizer_state import RealSteps
from isoprobe.child.core.step_report import Progress, StepHook
from isoprobe.child.core.training import Step
from isoprobe.child.core.workload import build_model, import_model_library
from isoprobe.child.framework.runners import final_readings, framework_runner
from isoprobe.child.reads import files_read, watch_reads
from isoprobe.child.sources import imported_sources
from isoprobe.protocol.messages import (
    MESSAGE_CHARS,
    EvalDone,
    Forwarded,
    Imported,
    ModelBuilt,
    TrialRequest,
    TrialResult,
)
from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome, classify_exception, maybe_allocation_failure
from isoprobe.report.trial import CudaMemoryAtFailure, ErrorInfo

if TYPE_CHECKING:
    from isoprobe.child.events import Events

_TRACEBACK_LINES = 25


def run_trial(request: TrialRequest, events: Events) -> None:
    if request.spec.command is not None:  # the job's own command, supervised from here (child.command_trial.supervisor)
        from isoprobe.child.command_trial.supervisor import run_command_trial

        return run_command_trial(request, events)
    watch_reads()  # before the user's code runs (see cache_reads)
    progress = Progress()
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
        events.emit(
            TrialResult(
                outcome=Outcome.FITS,
                phase=progress.phase,
                step_seconds=progress.step_seconds,
                reads=reads,
                sources=imported_sources(),
                threads=_threads(),
                **report,
            )
        )
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
    events.emit(
        TrialResult(
            outcome=outcome,
            phase=progress.phase,
            step_seconds=progress.step_seconds,
            error=error,
            reads=reads,
            sources=imported_sources(),
            threads=_threads(),
            **report,
        )
    )


def _threads() -> int | None:
    """The intra-op threads torch runs here (None if the trial never imported it): the cache checks them."""
    torch = sys.modules.get("torch")
    try:
        return torch.get_num_threads() if torch is not None else None
    except Exception:
        return None


def _train(request: TrialRequest, events: Events, progress: Progress) -> dict[str, Any]:
    """Build, then run the spec's training steps; return the peak readings (TrialResult fields). Raises on failure."""
    spec = request.spec
    report: dict[str, Any] = {}
    import torch

    device = torch.device(request.device)
    cuda = device.type == "cuda"
    if cuda:  # first thing: a bad allocator setting raises here, inside the try (see child.core.cuda)
        child_cuda.initialise(torch, device)
    if request.rank is not None:
        # One rank of a gang meets the others before building what they share. On CUDA before the budget
        # is set: nccl's communicators take memory outside the allocator, which the budget must leave out.
        from isoprobe.child.core.distributed import join

        join(request.rank, device)
    if cuda:
        report.update(child_cuda.setup(torch, device, spec.training.precision, request.memory_budget_bytes))
    import_model_library(spec)  # here, so that its cost lands in the 'imported' phase
    progress.phase = "imported"
    events.emit(Imported(memory=cpu_memory()))
    runner = framework_runner(spec.model.source)
    if runner is not None:  # the user's own trainer runs the steps (child.framework.runners)
        report.update(runner(request, events, progress, torch, device))
        progress.phase = "done"
        return report
    python_path = request.python_path
    step = Step(spec, build_model(spec, python_path), device, python_path)
    progress.phase = "model_built"
    events.emit(ModelBuilt(memory=cpu_memory()))
    if request.rank is not None:  # which rank hung, if the gang times out inside a step (executors.gang.laggard)
        step.on_forwarded = lambda: events.emit(Forwarded(step=len(progress.step_seconds) + 1))
    if cuda:
        child_cuda.start_counting(torch, device)  # peaks and retries from here on
    batch = step.batch(request.batch_size, request.data_indices)
    squeezed = False
    real_steps = RealSteps(step, lambda: len(progress.step_seconds) + 1)
    hook = StepHook(torch, device, request, events, progress, can_extend=True)
    anew = spec.training.input_lifetime == "through_next_batch"
    step.applied.input_lifetime = spec.training.input_lifetime
    while True:
        if anew and progress.step_seconds:
            # As `for x, y in loader: x = x.to(device)`: the next batch is collated and moved while the previous
            # one is still bound (and the last output held, training.output_lifetime), then it replaces it. Its
            # memory is in the next step's reading (a running peak); its time is the loader's, not the step's.
            batch = step.batch(request.batch_size, request.data_indices)
        hook.begin()
        step.run(batch)
        if hook.after_step():
            break  # the spec's steps, or steady or at the cap: the parent judges which from the step events
    real_steps.settle(lambda: step.run(batch), len(progress.step_seconds))  # fp16: the optimizer's state, for real
    if cuda:
        batch, squeezed = _squeeze(request, torch, device, step, batch, hook)
    if request.eval_batch_size is not None:
        # As a job validates: the training state (weights, gradients, optimizer state) held, the training
        # batch and its output dropped, then one evaluation batch of the size under test.
        step.release()
        del batch
        progress.phase = "eval"
        # The evaluation batch's samples are a prefix of the same longest-first order (with spec.data).
        seconds = step.evaluate(step.batch(request.eval_batch_size, request.data_indices))  # synchronises first
        report["eval_seconds"] = seconds
        events.emit(EvalDone(seconds=seconds))
    step.release()  # before the readings: base_bytes is the memory held with the batch's activations freed
    report["applied"] = step.applied
    report["sizes"] = step.sizes
    if spec.training.compile and len(progress.step_seconds) >= 2:
        # The first step compiles (forward and backward graphs); the later ones show what a step costs.
        later = sorted(progress.step_seconds[1:])
        report["compile_seconds"] = max(0.0, progress.step_seconds[0] - later[len(later) // 2])
    report.update(final_readings(torch, device, step.sizes, [] if squeezed else hook.peaks))
    progress.phase = "done"
    return report


#: The steps a squeezed trial runs again (``child.core.cuda.squeeze``): the first gives the cache back and refits under
#: the lower cap, the second repeats it as every later step would. A deciding trial runs its rule's window again.
SQUEEZE_STEPS = 2


def _squeeze(
    request: TrialRequest, torch: Any, device: Any, step: Step, batch: Any, hook: StepHook
) -> tuple[Any, bool]:
    """Whether a trial whose peak read within the spread of the capacity fit its steps again under a cap the spread
    lower (``TrialRequest.margin_check_bytes``), with the batch it holds now; False where it was not asked or not
    needed. One process, a training trial: a gang's ranks step together, and an evaluation trial's verdict is its
    evaluation's. A deciding trial's steps there must hold still by its rule, as its steps did."""
    check_at = request.margin_check_bytes
    if check_at is None or request.rank is not None or request.eval_batch_size is not None:
        return batch, False
    if max(hook.peaks, default=0) < check_at:
        return batch, False
    rule = request.steady
    steps = rule.window + 1 if rule is not None else SQUEEZE_STEPS
    anew = request.spec.training.input_lifetime == "through_next_batch"
    held = [batch]

    def run_steps() -> bool:
        peaks = []
        for _ in range(steps):
            if anew:  # as the loop does: the next batch built while the last is still bound
                held[0] = step.batch(request.batch_size, request.data_indices)
            step.run(held[0])
            peaks.append(child_cuda.step_readings(torch.cuda, device)["budget_peak_bytes"])
        return rule is None or steady.is_steady(peaks, rule)

    fit = child_cuda.squeeze(torch, device, check_at, run_steps)
    return held[0], fit


def _cuda_memory_now(device: str):
    """The card as the failure left it (evidence for an ambiguous library error), if torch got imported."""
    torch = sys.modules.get("torch")
    reading = child_cuda.memory_at_failure(torch, torch.device(device)) if torch is not None else None
    return CudaMemoryAtFailure(**reading) if reading else None


def _describe_failure(exc: BaseException) -> tuple[Outcome, ErrorInfo]:
    names = [cls.__name__ for cls in type(exc).__mro__]
    message = str(exc)
    outcome = classify_exception(names, message)
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines)[-8000:].splitlines()[-_TRACEBACK_LINES:]
    qualified = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    return outcome, ErrorInfo(type=qualified, message=message[:MESSAGE_CHARS], traceback_tail="\n".join(tail) + "\n")
