"""What a finished child's run means: one of the five outcomes, with the evidence.

Pure: a ``ChildRun`` in, a ``TrialEnd`` out, so every way a child can end
(a signal, an exit without a verdict, a verdict then a crash, half a line) is
tested with literal values. fits / out_of_memory / error come from the child's
own verdict; crashed and timed_out from how the process ended. Unknown is
never ``fits``.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from isoprobe.executors import ChildRun
from isoprobe.outcomes import Outcome
from isoprobe.protocol import Imported, ModelBuilt, Started, StepDone, TrialResult, last_of


@dataclass(frozen=True)
class TrialEnd:
    """A child's end, classified."""

    outcome: Outcome
    result: TrialResult | None  # the child's own verdict, if it wrote a valid one
    phase: str | None
    signal_name: str | None
    evidence: str | None = None  # why the outcome is not what the child itself reported


def classify_exit(run: ChildRun) -> TrialEnd:
    """fits / out_of_memory / error come from the child's own result; crashed / timed_out from how it ended."""
    result = last_of(run.events, TrialResult)
    phase = last_phase(run.events)
    signal_name = _signal_name(run.returncode)
    if run.timed_out:
        return TrialEnd(Outcome.TIMED_OUT, result, phase, signal_name)
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
    if result.outcome is Outcome.FITS and run.returncode != 0:
        # It said 'fits', then died on the way out: unknown is never 'fits'.
        return TrialEnd(Outcome.CRASHED, result, phase, signal_name)
    # A failure verdict stands even if the exit was unclean: both say 'not this batch'.
    return TrialEnd(result.outcome, result, phase, signal_name)


def last_phase(events: list) -> str | None:
    """The last phase the child reached: started, imported, model_built, step N, or its verdict's."""
    for event in reversed(events):
        if isinstance(event, TrialResult):
            return event.phase
        if isinstance(event, StepDone):
            return f"step {event.step}"
        if isinstance(event, (Started, Imported, ModelBuilt)):
            return event.event
    return None


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
