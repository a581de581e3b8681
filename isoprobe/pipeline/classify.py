"""What a finished child's run means: one of the six outcomes, with the evidence.

Pure: a ``ChildRun`` in, a ``TrialEnd`` out, so every way a child can end
(a signal, an exit without a verdict, a verdict then a crash, half a line) is
tested with literal values. fits / out_of_memory / error come from the child's
own verdict; crashed and timed_out from how the process ended. Unknown is
never ``fits``. Given what the trial was asked (``plausibility.Asked``), a
'fits' must also hold up against it: one that cannot be true is crashed, one
over its budget is out of memory, each with the reason as evidence. A run
whose end isoprobe's own fork server lost (``ChildRun.lost``) is not the
trial's to classify: the executor runs it again, and ``pipeline.trial_record`` refuses one
that stays lost.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from isoprobe.executors import ChildRun
from isoprobe.pipeline.plausibility import Asked, implausible, over_budget
from isoprobe.protocol.messages import Imported, ModelBuilt, Started, StepDone, TrialResult, last_of
from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome
from isoprobe.spec.units import format_bytes


@dataclass(frozen=True)
class TrialEnd:
    """A child's end, classified."""

    outcome: Outcome
    result: TrialResult | None  # the child's own verdict, if it wrote a valid one
    phase: str | None
    signal_name: str | None
    evidence: str | None = None  # why the outcome is not what the child itself reported


def classify_exit(run: ChildRun, asked: Asked | None = None) -> TrialEnd:
    """fits / out_of_memory / error come from the child's own result; crashed / timed_out from how it ended.

    With ``asked`` (the probe always gives it; a test of one child may not), a
    'fits' is vetted: ``plausibility.implausible`` makes it crashed, without
    the rejected verdict (its phase is then the last one the events show, not
    the verdict's claim), and ``plausibility.over_budget`` out of memory.
    """
    end = _from_the_child(run)
    if asked is None or not end.outcome.meaning.fits or end.result is None:
        return end  # only a fit is vetted (a fit from the child always comes with its verdict)
    reason = implausible(run.events, asked)
    if reason is not None:
        # Rejected: its numbers are not measurements, so the trial reports none of them (the reason names them).
        return replace(
            end, outcome=Outcome.CRASHED, result=None, phase=last_phase(run.events, verdicts=False), evidence=reason
        )
    reason = over_budget(end.result, asked)
    if reason is not None:
        return replace(end, outcome=Outcome.OUT_OF_MEMORY, evidence=reason)
    reason = still_rising(run.events, asked)
    if reason is not None:
        return replace(end, outcome=Outcome.STILL_RISING, evidence=reason)
    return end


def still_rising(events: list, asked: Asked) -> str | None:
    """Why a deciding trial's 'fits' is not one: its peak had not held still when it stopped (None: it had).

    Judged here from the step events, not taken from the child: the same rule
    (``steady.is_steady``) on the peaks in the budget's units it reported.
    """
    rule = asked.steady
    if rule is None:
        return None
    steps = [e for e in events if isinstance(e, StepDone)]
    peaks = [e.budget_peak_bytes if e.budget_peak_bytes is not None else (e.peak_bytes or 0) for e in steps]
    churns = [e.heap_churn_bytes for e in steps]
    if steady.is_steady(peaks, rule, churns) or steady.past_the_margin(peaks, rule):
        return None  # past the margin: it fits as far as it ran, and the parent judges it marginal
    window = steady.window_for(churns, rule)
    risen = steady.rise(peaks, window)
    return (
        f"its peak was still rising after {len(peaks)} steps (the cap is {rule.max_steps}): "
        f"{format_bytes(risen or 0)} over the last {window}, to {format_bytes(peaks[-1] if peaks else 0)}; "
        "a longer run would need more memory"
    )


def _from_the_child(run: ChildRun) -> TrialEnd:
    result = last_of(run.events, TrialResult)
    phase = last_phase(run.events)
    signal_name = signal_name_of(run.returncode)
    if run.timed_out and not (run.verdict_at_timeout and result is not None):
        return TrialEnd(Outcome.TIMED_OUT, result, phase, signal_name)
    if run.timed_out:
        # Its verdict was written before the deadline; only its exit was late, and the kill was ours, so
        # the verdict stands ("fits then died" is for deaths the child did not get from us).
        return TrialEnd(
            result.outcome,
            result,
            phase,
            signal_name,
            "killed at the trial timeout after it had written its verdict: the verdict stands",
        )
    if run.returncode == -signal.SIGKILL and run.oom_kills:
        return TrialEnd(
            Outcome.OUT_OF_MEMORY,
            result,
            phase,
            signal_name,
            f"SIGKILL while the memory cgroup's oom_kill counter rose by {run.oom_kills}: the kernel's OOM killer",
        )
    if result is None:
        return TrialEnd(Outcome.CRASHED, None, phase, signal_name)
    if result.outcome.meaning.fits and run.returncode != 0:
        # It said 'fits', then died on the way out: unknown is never 'fits'.
        return TrialEnd(Outcome.CRASHED, result, phase, signal_name)
    # A failure verdict stands even if the exit was unclean: both say 'not this batch'.
    return TrialEnd(result.outcome, result, phase, signal_name)


def last_phase(events: list, *, verdicts: bool = True) -> str | None:
    """The last phase the child reached: started, imported, model_built, step N, or (``verdicts``) its verdict's."""
    for event in reversed(events):
        if isinstance(event, TrialResult) and verdicts:
            return event.phase
        if isinstance(event, StepDone):
            return f"step {event.step}"
        if isinstance(event, (Started, Imported, ModelBuilt)):
            return event.event
    return None


def signal_name_of(returncode: int) -> str | None:
    """SIGKILL, SIGSEGV... for a process killed by a signal (a negative return code), else None."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
