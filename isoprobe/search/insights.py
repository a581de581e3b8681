"""Answers beyond the maximum, from the trials that already ran: throughput and where the memory goes.

Pure functions over the result's own trials (and the child's measured sizes),
so that every number here is derived from evidence in the same JSON and can be
unit-tested with literal values. No trial is run for these answers: the
throughput curve covers the *tested* batches only, and says so.
"""

from __future__ import annotations

import statistics

from isoprobe.report.insights import MemoryBreakdown, Throughput, ThroughputPoint
from isoprobe.report.trial import Trial
from isoprobe.search.headroom import line_with_anchor


def step_throughput(batch_size: int, step_seconds: list[float]) -> tuple[float | None, float | None]:
    """Samples per second over the timed steps, and their spread ((max - min) / median).

    The first step is left out: it pays one-time costs (kernel selection, the
    optimizer's state, compilation), which a long run amortises away. With one
    timed step there is no spread to report (None), not a spread of zero.
    """
    timed = [s for s in step_seconds[1:] if s > 0]
    if not timed:
        return None, None
    median = statistics.median(timed)
    spread = (max(timed) - min(timed)) / median if len(timed) >= 2 else None
    return batch_size / median, spread


def fastest_batch_size(points: dict[int, float], tolerance: float) -> int | None:
    """The smallest batch whose throughput is within ``tolerance`` of the best: as fast, and more headroom."""
    if not points:
        return None
    best = max(points.values())
    return min(batch for batch, speed in points.items() if speed >= (1 - tolerance) * best)


def throughput(trials: list[Trial], tolerance: float) -> Throughput | None:
    """The throughput curve over the tested batches that fit, and the fastest batch on it."""
    best_runs: dict[int, Trial] = {}
    speeds: dict[int, float] = {}  # each batch's best run's samples_per_second
    for trial in trials:
        speed = trial.samples_per_second
        if not trial.outcome.meaning.fits or speed is None or trial.purpose == "memory_check":
            continue
        if trial.batch_size not in speeds or speed > speeds[trial.batch_size]:
            best_runs[trial.batch_size] = trial
            speeds[trial.batch_size] = speed
    if not best_runs:
        return None
    fastest = fastest_batch_size(speeds, tolerance)
    spreads = [t.step_seconds_spread for t in best_runs.values() if t.step_seconds_spread is not None]
    noise = f"; timed steps spread up to {max(spreads):.0%}" if spreads else "; one timed step per trial, no spread"
    return Throughput(
        points=[
            ThroughputPoint(
                batch_size=b,
                samples_per_second=round(speeds[b], 3),
                step_seconds_spread=t.step_seconds_spread,
            )
            for b, t in sorted(best_runs.items())
        ],
        best_samples_per_second=round(max(speeds.values()), 3),
        fastest_batch_size=fastest,
        tolerance=tolerance,
        note=(
            f"{len(speeds)} tested batch sizes (the search's, not a sweep){noise}; fastest = smallest within "
            f"{tolerance:.0%} of the best"
        ),
    )


def base_anchor(trials: list[Trial], up_to: int | None = None) -> tuple[int, int] | None:
    """(batch, base reading) of the largest batch (at most ``up_to``) whose fitting trials have both a peak and a
    base reading: the anchor of a memory line through one measured batch (``headroom.line_with_anchor``). Where
    that batch ran more than once, its lowest base (the steeper line, towards a smaller batch), whatever the order
    the trials ran in."""
    bases = [
        (t.batch_size, base)
        for t in trials
        if t.outcome.meaning.fits
        and (base := t.base_bytes)
        and (t.budget_peak_bytes or t.peak_bytes)
        and (up_to is None or t.batch_size <= up_to)
    ]
    if not bases:
        return None
    top = max(batch for batch, _ in bases)
    return top, min(base for batch, base in bases if batch == top)


def memory_breakdown(trials: list[Trial]) -> MemoryBreakdown | None:
    """Parameters, gradients and optimizer state as the child measured them; activations from the line.

    The sizes come from the largest batch that fit (they do not depend on the
    batch). The line is fitted to the fitting trials' peaks in the capacity's
    units (``budget_peak_bytes``): its slope is what one more sample costs, its
    intercept the fixed part.
    """
    fitting = [t for t in trials if t.outcome.meaning.fits and t.purpose != "memory_check"]
    points = [(t.batch_size, peak) for t in fitting if (peak := t.budget_peak_bytes or t.peak_bytes)]
    # One batch measured (an exact estimate's search): the line from its base reading, as the recommendation's.
    line = line_with_anchor(points, base_anchor(fitting))
    measured = max((t for t in fitting if t.sizes is not None), key=lambda t: t.batch_size, default=None)
    if measured is None and line is None:
        return None
    sizes = measured.sizes if measured else None
    return MemoryBreakdown(
        parameter_bytes=sizes.parameter_bytes if sizes else None,
        gradient_bytes=sizes.gradient_bytes if sizes else None,
        optimizer_state_bytes=sizes.optimizer_state_bytes if sizes else None,
        activation_bytes_per_sample=round(line.slope, 1) if line else None,
        fixed_bytes=round(line.intercept, 1) if line else None,
        cuda_context_bytes=sizes.cuda_context_bytes if sizes else None,
        reserved_unallocated_bytes=sizes.reserved_unallocated_bytes if sizes else None,
        from_batch_size=measured.batch_size if measured else None,
    )
