"""What people and programs read: progress lines on stderr, the result on stdout.

Every view renders from the ``Result`` model (or, while a probe runs, from the
``Trial`` models it is made of), so the JSON and the text never disagree.
"""

from __future__ import annotations

from typing import Callable

from isoprobe.outcomes import Outcome
from isoprobe.result import Result, Trial
from isoprobe.units import format_bytes


class Reporter:
    """Progress for people, one line per event, on stderr (the CLI passes ``sys.stderr`` writes)."""

    def __init__(self, write: Callable[[str], None]):
        self._write = write

    def note(self, text: str) -> None:
        self._write(f"isoprobe: {text}")

    def trial(self, trial: Trial) -> None:
        self._write(trial_line(trial))


_PURPOSE_LABELS = {
    "search": "",
    "retry": "  [retry after a crash or timeout]",
    "confirmation": "  [confirmation of the maximum]",
    "recommendation_check": "  [recommendation check]",
    "memory_check": "  [memory check: re-run with more memory]",
}


def trial_line(trial: Trial) -> str:
    """``isoprobe: trial  3  batch     16  fits  peak 2.31 GiB  12.4 s``"""
    peak = format_bytes(trial.peak_bytes) if trial.outcome is Outcome.FITS else "-"
    detail = ""
    if trial.outcome is not Outcome.FITS:
        reason = trial.signal or (trial.error.type if trial.error else None) or trial.phase
        detail = f" ({reason})" if reason else ""
    purpose = _PURPOSE_LABELS[trial.purpose]
    return (
        f"isoprobe: trial {trial.index:>2}  batch {trial.batch_size:>6}  "
        f"{trial.outcome.value + detail:<30}  peak {peak:>10}  {trial.seconds:6.1f} s{purpose}"
    )


def summary_lines(result: Result) -> list[str]:
    """The closing lines on stderr: the answer in words, and what to try if there is none."""
    lines = [f"isoprobe: {result.message}"]
    if result.recommendation is not None and result.recommended_batch_size is not None:
        lines.append(
            f"isoprobe: recommended {result.recommended_batch_size}: {result.recommendation.note}; "
            f"measured peak {format_bytes(result.recommendation.measured_peak_bytes)} "
            f"of {format_bytes(result.device.capacity_bytes if result.device else None)}"
        )
    lines += [f"isoprobe:   try: {s}" for s in result.suggestions]
    lines.append(f"isoprobe: {len(result.trials)} trials in {result.total_seconds:.1f} s")
    return lines


def result_json(result: Result) -> str:
    return result.model_dump_json(indent=2)
