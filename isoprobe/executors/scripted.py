"""An executor without processes: each request is answered by a script with a canned ``ChildRun``.

Like httpx's ``MockTransport``: the probe, the search and the classification
run for real, and only the child processes are replaced, so retries,
reclassification, confirmations, flaky edges, interrupts mid-probe and the
allocator comparison are plain unit tests, with no torch and no waiting.

A script is a function of one ``Call`` (the request, the conditions, how many
times this batch was asked for) that returns a ``ChildRun``, built with the
helpers below from the same protocol events a real child writes, or raises
``KeyboardInterrupt`` / ``errors.Terminated`` as a signal would. ``linear``
makes a script of a device whose peak is ``fixed + per_sample * batch``.

The probe vets every 'fits' against what the trial was asked
(``pipeline.plausibility``), so ``fits`` writes what a real child would for the
request being answered: its number of steps, step events whose times are the
verdict's, an evaluation pass if one was asked for.
"""

from __future__ import annotations

import contextvars
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from isoprobe.executors import ChildRun, Conditions
from isoprobe.protocol.messages import (
    EvalDone,
    Facts,
    Imported,
    Inspected,
    InspectProblem,
    InspectRequest,
    MemoryReading,
    ModelBuilt,
    Started,
    StepDone,
    TrialRequest,
    TrialResult,
)
from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome
from isoprobe.report.trial import ErrorInfo, Sizes

#: What the CPU allocator says when the cap is hit (c10's DefaultCPUAllocator).
CPU_OOM_MESSAGE = (
    "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)"
)
#: The import baseline of a canned CPU child (the data segment after importing torch; about 800 MiB
#: here). Below every canned device's fixed part (tests/unit/scripted_probe.py's memory_hog: 720 MiB),
#: as a real device's fixed part includes its imports.
IMPORT_BASELINE_BYTES = 512 * 1024**2
#: The request a script is answering right now: what ``fits`` writes a child's events for.
_ANSWERING: contextvars.ContextVar[TrialRequest | None] = contextvars.ContextVar("answering", default=None)


@dataclass(frozen=True)
class Call:
    """One request as the script sees it."""

    request: TrialRequest
    conditions: Conditions
    attempt: int  # 1 the first time this batch size is asked for (under any purpose), 2 the next...
    number: int  # 1-based count of trial requests so far
    timeout: float = 0.0  # the seconds the probe gave this trial

    @property
    def batch_size(self) -> int:
        """The batch the trial is about: an evaluation trial's evaluation batch (its steps run at
        request.batch_size)."""
        return self.request.eval_batch_size or self.request.batch_size

    @property
    def budget(self) -> int | None:
        return self.request.memory_budget_bytes


Script = Callable[[Call], ChildRun]


@dataclass
class ScriptedExecutor:
    """Answers trial requests from ``script`` and the environment check from ``inspected``; records every call."""

    script: Script
    inspected: ChildRun | None = None
    calls: list[Call] = field(default_factory=list)
    prestarts: list[Conditions] = field(default_factory=list)
    closed: bool = False

    def __enter__(self) -> ScriptedExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, conditions: Conditions) -> None:
        self.prestarts.append(conditions)

    def run(self, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
        if isinstance(request, InspectRequest):
            return self.inspected if self.inspected is not None else inspected()
        attempt = 1 + sum(1 for c in self.calls if c.batch_size == request.batch_size)
        call = Call(request, conditions, attempt, len(self.calls) + 1, timeout)
        self.calls.append(call)
        token = _ANSWERING.set(request)
        try:
            return self.script(call)
        finally:
            _ANSWERING.reset(token)

    def close(self) -> None:
        self.closed = True

    @property
    def batches(self) -> list[int]:
        """The batch sizes asked for, in order."""
        return [c.batch_size for c in self.calls]


# --------------------------------------------------------------------------- canned runs


def _progress(step_seconds: list[float], step_peaks: list[int] | None = None) -> list:
    memory = MemoryReading(data=IMPORT_BASELINE_BYTES, rss=IMPORT_BASELINE_BYTES, peak_rss=IMPORT_BASELINE_BYTES)
    peaks: list[int | None] = list(step_peaks) if step_peaks else [None] * len(step_seconds)
    return [
        Started(pid=4242),
        Imported(memory=memory),
        ModelBuilt(memory=memory),
        *(
            StepDone(step=i, seconds=s, peak_bytes=p, held_bytes=p, budget_peak_bytes=p)
            for i, (s, p) in enumerate(zip(step_seconds, peaks, strict=True), 1)
        ),
    ]


def _asked_steps() -> int | None:
    """The steps the request being answered asks for (a soak's, else search.steps); None outside a script."""
    request = _ANSWERING.get()
    return None if request is None else (request.steps or request.spec.search.steps)


def fits(
    peak_bytes: int,
    *,
    base_bytes: int | None = None,
    steps: int | None = None,
    step_seconds: float | list[float] = 0.1,
    sizes: Sizes | None = None,
    seconds: float = 1.0,
    warm: bool = False,
    step_growth: int = 0,
    step_peaks: list[int] | None = None,
) -> ChildRun:
    """A child that ran every step and reported ``peak_bytes`` (as both the resident and the budget's peak).

    ``steps``: by default the request's (a soak's, else ``search.steps``) when a
    script is answering one, else 3. ``step_seconds``: each step's time, or a
    list of them (which sets the number of steps). ``step_growth``: how much the
    peak rose with each step (the last step's is ``peak_bytes``); ``step_peaks``: each step's peak instead
    (which sets the number of steps, and the peak: the last one).
    """
    request = _ANSWERING.get()
    if step_peaks is not None:
        step_seconds = [step_seconds if isinstance(step_seconds, float) else 0.1] * len(step_peaks)
        peak_bytes = step_peaks[-1]
    if isinstance(step_seconds, list):
        times = list(step_seconds)
    else:
        if steps is None:
            steps = _asked_steps() or 3
        times = [step_seconds] * steps
    rule = request.steady if request is not None else None
    if rule is not None and step_peaks is None:
        # Asked to step until steady: a flat peak is steady after the rule's window; the timed steps repeat.
        timed = times[1:] or times
        while len(times) < max(rule.min_steps, rule.window + 1):
            times.append(timed[(len(times) - 1) % len(timed)])
    peaks = step_peaks or [peak_bytes - step_growth * (len(times) - i) for i in range(1, len(times) + 1)]
    # An evaluation pass where the probe asks one: an evaluation trial, or an hf_trainer's trial with eval_pass.
    evaluated = (
        [EvalDone(seconds=0.05)]
        if request is not None
        and (
            request.eval_batch_size is not None
            or (request.spec.training.eval_pass and request.spec.model.hf_trainer is not None)
        )
        else []
    )
    result = TrialResult(
        outcome=Outcome.FITS,
        phase="done",
        step_seconds=times,
        peak_bytes=peak_bytes,
        budget_peak_bytes=peak_bytes,
        base_bytes=base_bytes if base_bytes is not None else IMPORT_BASELINE_BYTES,
        sizes=sizes,
        eval_seconds=0.05 if evaluated else None,
    )
    return ChildRun(
        returncode=0, timed_out=False, seconds=seconds, events=[*_progress(times, peaks), *evaluated, result], warm=warm
    )


def failed(
    outcome: Outcome,
    error_type: str,
    message: str,
    *,
    traceback_tail: str = "",
    at_step: int = 1,
    stderr_tail: str = "",
    returncode: int = 0,
    step_peaks: list[int] | None = None,
) -> ChildRun:
    """A child that caught its own exception in step ``at_step`` and classified it (out_of_memory or error).

    ``step_peaks``: the peaks the steps before it reported (``at_step - 1`` of them)."""
    result = TrialResult(
        outcome=outcome,
        phase=f"step {at_step}",
        step_seconds=[0.1] * (at_step - 1),
        error=ErrorInfo(type=error_type, message=message, traceback_tail=traceback_tail),
    )
    return ChildRun(
        returncode=returncode,
        timed_out=False,
        seconds=1.0,
        events=[*_progress([0.1] * (at_step - 1), step_peaks), result],
        stderr_tail=stderr_tail,
    )


def out_of_memory(
    message: str = CPU_OOM_MESSAGE,
    error_type: str = "RuntimeError",
    *,
    at_step: int = 1,
    step_peaks: list[int] | None = None,
) -> ChildRun:
    return failed(Outcome.OUT_OF_MEMORY, error_type, message, at_step=at_step, step_peaks=step_peaks)


def error(message: str = "deliberate non-memory bug", error_type: str = "KeyError") -> ChildRun:
    tail = f"Traceback (most recent call last):\n  ...\n{error_type}: {message}\n"
    return failed(Outcome.ERROR, error_type, message, traceback_tail=tail, stderr_tail=tail)


def crashed(
    signum: int | None = signal.SIGSEGV,
    *,
    stderr_tail: str = "Fatal Python error: Segmentation fault\n",
    steps_done: int = 0,
    returncode: int | None = None,
    oom_kills: int | None = None,
) -> ChildRun:
    """A child that died without a verdict: by ``signum``, or (``signum=None``) by exiting ``returncode``."""
    code = -signum if signum is not None else (returncode or 0)
    return ChildRun(
        returncode=code,
        timed_out=False,
        seconds=1.0,
        events=_progress([0.1] * steps_done),
        stderr_tail=stderr_tail,
        oom_kills=oom_kills,
    )


def timed_out(seconds: float = 60.0) -> ChildRun:
    """A child killed at the trial timeout (its keeper SIGKILLs the tree)."""
    return ChildRun(returncode=-signal.SIGKILL, timed_out=True, seconds=seconds, events=_progress([0.1]))


def inspected(facts: Facts | None = None, problems: list[InspectProblem] | None = None) -> ChildRun:
    """The environment check's answer: by default a CPU machine with torch imported in 900 MiB."""
    facts = facts or Facts(
        torch_version="2.0.0+scripted",
        torchvision_version="0.15.0+scripted",
        memory_after_import=MemoryReading(data=IMPORT_BASELINE_BYTES),
    )
    return ChildRun(
        returncode=0,
        timed_out=False,
        seconds=1.0,
        events=[Started(pid=4241), Inspected(facts=facts, problems=problems or [])],
    )


def linear(
    fixed: int,
    per_sample: int,
    *,
    faults: Callable[[Call], ChildRun | None] | None = None,
    growth_per_step: int = 0,
    growth: Callable[[int], int] | None = None,
) -> Script:
    """A device whose peak is ``fixed + per_sample * batch``: fits under the request's budget, else out of memory.

    ``faults`` (optional) sees every call first; whatever it returns (a crash, a
    hang, a flaky failure) replaces the device's answer, None keeps it.
    ``growth_per_step``: memory that stays behind after each step (a leak), so
    step ``k`` peaks ``growth_per_step * (k - 1)`` higher; a run runs out of
    memory at the first step whose peak is over the budget. ``growth``: instead, the memory grown by step
    ``k`` (0 at step 1), any shape: growth that stops, a leak that never does. A request with a steady rule
    steps as a real child does: until the peaks are steady (``steady.should_stop``), or out of memory.
    """
    grown = growth if growth is not None else (lambda k: growth_per_step * (k - 1))

    def script(call: Call) -> ChildRun:
        if faults is not None and (fault := faults(call)) is not None:
            return fault
        first = fixed + per_sample * call.batch_size
        rule = call.request.steady
        peaks: list[int] = []
        while True:
            peak = max(peaks[-1] if peaks else 0, first + grown(len(peaks) + 1))  # a running peak
            if call.budget is not None and peak > call.budget:
                return out_of_memory(at_step=len(peaks) + 1, step_peaks=peaks)
            peaks.append(peak)
            if steady.should_stop(peaks, rule) if rule is not None else len(peaks) >= (_asked_steps() or 3):
                return fits(peaks[-1], base_bytes=fixed, step_peaks=peaks)

    return script


def gang(*ranks: ChildRun, failed_rank: int | None = None, stop_seconds: float | None = None) -> ChildRun:
    """A distributed trial's run as ``executors.gang`` returns it: every rank's run, the failed rank's on top."""
    deciding = ranks[failed_rank] if failed_rank is not None else ranks[0]
    return replace(
        deciding,
        ranks=tuple(ranks),
        failed_rank=failed_rank,
        gang_stop_seconds=stop_seconds if failed_rank is not None else None,
        seconds=max(run.seconds for run in ranks),
    )
