"""Whether a child's 'fits' can stand: the verdict checked against what the trial was asked to do.

The child writes its own verdict, and the user's model runs in the same
process, by design. So a 'fits' line in the events file proves only that
*something* wrote it: a model can find the file (its variable, /proc/self/fd)
and write a well-formed 'fits' with a peak of 1000 B, then exit 0. Nothing
here can tell a careful forgery of plausible numbers from the truth; what it
does is refuse a verdict that cannot be true, in two ways:

- **implausible** (``crashed``): the events do not show a trial that ran what
  was asked (no model built before the verdict, not exactly the asked steps,
  step times that are not the steps', more than one verdict), or its memory
  is below what importing torch alone took. Unknown is never 'fits'.
- **over budget** (``out_of_memory``): the trial's own peak is above its
  budget. On the CPU backend RLIMIT_DATA does not count shared memory
  (MAP_SHARED mappings, shared-memory tensors), so a model can go past the
  cap without an allocation ever failing; the peak still shows it. On CUDA
  the fraction caps the allocator alone, from the memory outside it measured
  after the warm-up; what loads outside it later (lazily loaded kernels,
  NCCL's buffers, Triton's cubins) can put the process past the budget with
  no allocation failing; its reading, context included, shows it.

Pure: a list of protocol events and an ``Asked`` in, a reason (or None) out,
so every rule is a unit test over literal runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from isoprobe.protocol.messages import EvalDone, MemoryReading, ModelBuilt, StepDone, TrialResult
from isoprobe.report.cycle import CycleRule
from isoprobe.report.outcomes import Outcome
from isoprobe.report.steady import SteadyRule
from isoprobe.spec.units import format_bytes


@dataclass(frozen=True)
class Asked:
    """What a trial was asked to do, and the least memory a child of this probe can have used."""

    steps: int
    backend: Literal["cpu", "cuda"]
    #: The trial's own cap (a memory check runs under a larger one); None: no cap.
    budget_bytes: int | None = None
    eval_pass: bool = False
    #: CPU: the environment check's readings after importing torch and the model library (data segment
    #: and resident); every trial imports at least as much. None where unknown (no check is made then).
    import_memory: MemoryReading | None = None
    #: Set for a trial that decides the edge: it runs from ``steps`` up to the rule's cap (``steady``).
    steady: SteadyRule | None = None
    #: Set for a command trial that waits for the script's evaluation pass (``report.cycle``): it may step on to the
    #: rule's bound, and the steady rule's window past a pass seen there.
    cycle: CycleRule | None = None


def implausible(events: list, asked: Asked) -> str | None:
    """Why the run's last verdict, a 'fits', cannot be true; None if it can (or is not a 'fits')."""
    verdicts = [i for i, e in enumerate(events) if isinstance(e, TrialResult)]
    if not verdicts or events[verdicts[-1]].outcome is not Outcome.FITS:
        return None
    result: TrialResult = events[verdicts[-1]]
    before = events[: verdicts[-1]]
    reasons = []
    if len(verdicts) > 1:
        reasons.append(f"{len(verdicts)} verdicts were written; a child writes exactly one")
    if not any(isinstance(e, ModelBuilt) for e in before):
        reasons.append("no model_built event came before the verdict")
    steps = [e for e in before if isinstance(e, StepDone)]
    numbers = [e.step for e in steps]
    least, most = (
        (asked.steps, asked.steps) if asked.steady is None else (asked.steady.min_steps, asked.steady.max_steps)
    )
    if asked.cycle is not None:
        most = max(most, asked.cycle.max_steps + (asked.steady.window if asked.steady is not None else 0))
    most += sum(e.cap_lowered for e in steps)  # each lowered cap asks for one more step (child.core.cuda.refit_cap)
    if numbers != list(range(1, len(numbers) + 1)) or not least <= len(numbers) <= most:
        asked_for = f"{least}" if least == most else f"{least} to {most}"
        reasons.append(f"{asked_for} training steps were asked for, the step events show {numbers or 'none'}")
    elif not _same_times(result.step_seconds, [e.seconds for e in steps]):
        reasons.append(f"step_seconds {result.step_seconds} are not the times of the step events")
    if result.phase != "done":
        reasons.append(f"'fits' in phase {result.phase!r}, not at the end of the steps ('done')")
    if asked.eval_pass and not any(isinstance(e, EvalDone) for e in before):
        reasons.append("an evaluation pass was asked for, and no eval event came before the verdict")
    reasons += _impossible_memory(result, asked)
    if not reasons:
        return None
    return "implausible 'fits' (not counted): " + "; ".join(reasons)


def over_budget(result: TrialResult, asked: Asked) -> str | None:
    """Why a trial's 'fits' used more memory than its budget; None if it did not (``cuda_over_budget`` on CUDA).

    Two readings, each compared in its own units: ``budget_peak_bytes`` (the
    data segment plus the shared mappings still there at the end, the budget's
    units: the child clamps the data part to the cap, which the kernel
    enforces, so only shared memory can put it above) and ``peak_bytes`` (the
    resident peak, VmHWM, which counts every shared page the child touched,
    even one unmapped before the end) less ``file_resident_bytes``, the mapped
    files' pages (RssFile at the end: the libraries' code). Those depend on the
    page cache, not on the trial: measured, a fresh install's trial 1.57 GB
    resident where an older one's was 200 MB lower, and once 1.611 GB, just
    over a 1.5 GiB budget its data segment kept well under, for a 'fits' that
    was real. Shared memory (RssShmem) stays in.
    """
    if result.outcome is not Outcome.FITS or asked.budget_bytes is None:
        return None
    if asked.backend == "cuda":
        return cuda_over_budget(result, asked.budget_bytes)
    budget = asked.budget_bytes
    over = []
    if result.budget_peak_bytes is not None and result.budget_peak_bytes > budget:
        over.append(f"its data segment plus shared mappings peaked at {_size(result.budget_peak_bytes)}")
    own = None if result.peak_bytes is None else result.peak_bytes - (result.file_resident_bytes or 0)
    if own is not None and own > budget:
        over.append(f"its resident peak without the mapped files (shared memory included) was {_size(own)}")
    if not over:
        return None
    return (
        f"the trial ran its steps, but {' and '.join(over)}, above the {_size(budget)} budget, which the "
        f"cap did not stop (it does not count shared memory): it would not fit in {format_bytes(budget)}"
    )


def cuda_over_budget(result: TrialResult, budget: int) -> str | None:
    """Why a CUDA trial's 'fits' held more of the card than its budget, context included; None if it did not."""
    if result.budget_peak_bytes is None or result.budget_peak_bytes <= budget:
        return None
    outside = result.sizes.cuda_context_bytes if result.sizes is not None else None
    parts = f" (outside the allocator: {_size(outside)})" if outside is not None else ""
    return (
        f"the trial ran its steps, but the process held {_size(result.budget_peak_bytes)} of the card at its "
        f"peak{parts}, above the {_size(budget)} budget: memory outside the allocator grew after the fraction "
        f"was set (lazily loaded kernels, NCCL, compiled kernels), so it would not fit in {format_bytes(budget)}"
    )


#: How far below the import baseline a CPU trial's budget peak may read and still be a reading, not a broken one.
#: The peak is VmPeak less the address space that is not data *now* (``child.core.memory.cpu_readings``), which can
#: have grown since the peak (a library or a thread's guard page mapped after it), so a model that adds almost
#: nothing to the baseline can read a little under it: a 16-feature model's trial read 40 KiB below in one run of
#: the whole suite (tests/integration/test_data_limit.py), 180 KiB above alone. Anything broken or forged reads
#: far lower (a forger's 1000 B).
IMPORT_SLACK_BYTES = 1 << 20


def _impossible_memory(result: TrialResult, asked: Asked) -> list[str]:
    """Peaks that no trial of this probe can have: missing, or below what importing torch took."""
    if asked.backend == "cuda":
        if result.peak_bytes is None:
            return ["no peak memory was reported"]
        if result.peak_allocated_bytes is not None and result.peak_allocated_bytes > result.peak_bytes:
            return [
                f"allocated peak {_size(result.peak_allocated_bytes)} above the reserved peak "
                f"{_size(result.peak_bytes)}, which holds it"
            ]
        return []
    reasons = []
    if result.peak_bytes is None or result.budget_peak_bytes is None:
        reasons.append("no peak memory was reported")
    baseline = asked.import_memory
    if baseline is None:
        return reasons
    # Each reading against the import baseline in its own units: the data segment, and resident memory.
    if (
        result.budget_peak_bytes is not None
        and baseline.data
        and result.budget_peak_bytes < baseline.data - IMPORT_SLACK_BYTES
    ):
        reasons.append(
            f"budget peak {_size(result.budget_peak_bytes)} is below the {_size(baseline.data)} data "
            "segment that importing torch alone takes"
        )
    # Resident memory, unlike the data segment, can shrink under memory pressure (the kernel drops the
    # libraries' clean code pages and maps them again later): half of it is a floor no trial goes below.
    resident = baseline.rss
    if result.peak_bytes is not None and resident and result.peak_bytes < resident // 2:
        reasons.append(
            f"resident peak {_size(result.peak_bytes)} is below half the {_size(resident)} resident "
            "after importing torch alone"
        )
    return reasons


def _same_times(reported: list[float], measured: list[float]) -> bool:
    return len(reported) == len(measured) and all(
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(reported, measured, strict=True)
    )


def _size(count: int) -> str:
    """A size for people, with the exact count where the rounded one hides it: '1.50 GiB (1610612736 B)'."""
    text = format_bytes(count)
    return text if text == f"{count} B" else f"{text} ({count} B)"
