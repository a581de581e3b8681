"""The frontier: one spec answered at several values of one field, each point bounded by the points before it.

Each point is an ordinary answer (``pipeline.answer``): the cache under the key
``isoprobe run --set FIELD=VALUE`` uses, its lock, a probe in fresh processes,
the store. So a rerun is answered from the cache, a point a sweep filled (on
Slurm, in parallel) is a cache hit here, and a point here is a hit for ``run``.
What the frontier adds is the order (``search.frontier_bounds.probe_order``: the value
needing the most memory first) and the bounds each probe borrows from the
points answered before it (``search.frontier_bounds.borrowed_for``), which only
narrow where its search looks: its maximum is still run at its own value.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from isoprobe.errors import ProbeError, SpecError, Terminated
from isoprobe.pipeline.edge import stop_reason_of
from isoprobe.report.frontier import BorrowedBounds, FrontierPoint, FrontierResult
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.output import Reporter
from isoprobe.search.frontier_bounds import Direction, Proven, borrowed_for, memory_ranks, probe_order
from isoprobe.spec.model import Spec


@dataclass(frozen=True)
class FrontierPlan:
    """What ``isoprobe frontier`` asks: the field, its values, and the spec validated at each value."""

    spec_path: str
    field: str
    values: Sequence[Any]
    specs: Sequence[Spec]
    direction: Direction


def resolve_direction(values: Sequence[Any], asked: Direction | None) -> Direction:
    """The direction asked for, or by default increasing for numbers (a longer sequence, a larger image needs more
    memory) and none otherwise; ValueError when an ordering direction is asked of values that are not numbers."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    direction = asked or ("increasing" if numbers else "none")
    memory_ranks(values, direction)  # raises for a value it cannot order
    return direction


def tokens_per_batch(field: str, value: Any, max_batch_size: int | None) -> int | None:
    """max x value when the field is an element of input.shape (the samples' size along it), else None.

    For a sequence model's ``input.shape.0`` that is the tokens in the largest
    batch; for an image's side it is pixels along one side times samples, which
    the column names the same way (elements along the field per batch).
    """
    parts = field.split(".")
    if (
        max_batch_size is None
        or len(parts) != 3
        or parts[:2] != ["input", "shape"]
        or not parts[2].isdigit()
        or isinstance(value, bool)
        or not isinstance(value, int)
    ):
        return None
    return max_batch_size * value


def run_frontier(
    plan: FrontierPlan,
    reporter: Reporter,
    answer_point: Callable[..., Any],
    stopped: Callable[[], str | None] = lambda: None,
) -> FrontierResult:
    """Answer every point, the most memory first, each borrowing the bounds the finished points proved.

    ``answer_point(spec, borrowed)`` is the result for one point (``pipeline.answer.answer`` with the
    command line's cache options; a scripted one in unit tests). A point whose probe raises instead (a spec
    only this value breaks, such as a factory that raises for it; a failed environment check; a bug) is that
    point's ``error``, and the other points are answered all the same. SIGINT or SIGTERM ends the frontier
    with the points answered so far: the interrupted point with the trials it had run, the points after it
    not probed; so does a signal the command noted between two points (``stopped()``: 'interrupted' or
    'terminated'), before the next point starts.
    """
    started = time.monotonic()
    ranks = memory_ranks(plan.values, plan.direction)
    proven: list[tuple[int, Proven]] = []  # (index of the value, what its probe proved)
    points: dict[int, FrontierPoint] = {}
    order = probe_order(ranks, len(plan.values))
    interrupted: str | None = None
    for count, index in enumerate(order, 1):
        if interrupted := stopped():
            break
        value = plan.values[index]
        borrowed = borrowed_for(ranks[index], [p for _, p in proven]) if ranks is not None else None
        bounds = _bounds(borrowed, proven, plan.values)
        point_started = time.monotonic()
        try:
            reporter.note(f"frontier: {plan.field}={value} ({count} of {len(order)})" + _said(bounds))
            result, error = answer_point(plan.specs[index], borrowed), None
        except (KeyboardInterrupt, Terminated) as signal:  # before its probe could hold it: no trial of it ran
            interrupted = stop_reason_of(signal).value
            result, error = None, f"{interrupted} before its first trial"
        except SpecError as exc:
            result, error = None, f"bad spec at this value: {exc.render()}"
        except ProbeError as exc:
            result, error = None, exc.message
        except Exception as exc:  # a bug in isoprobe: this point says so, the others are still answered
            reporter.note(traceback.format_exc().rstrip())
            result, error = None, f"internal error: {type(exc).__name__}: {exc}"
        if error is not None and interrupted is None:
            reporter.note(f"frontier: {plan.field}={value} has no answer: {error}")
        points[index] = _point(
            plan.field, value, count, result, error, bounds, round(time.monotonic() - point_started, 3)
        )
        if result is not None and result.stop_reason in (StopReason.INTERRUPTED, StopReason.TERMINATED):
            interrupted = result.stop_reason.value
        if interrupted:
            break
        if result is not None and result.answered and ranks is not None:
            out_of_memory = (
                result.first_failing_batch_size if result.first_failing_outcome is Outcome.OUT_OF_MEMORY else None
            )
            proven.append((index, Proven(ranks[index], result.max_batch_size, out_of_memory)))
    for index, value in enumerate(plan.values):  # a frontier stopped by a signal: the points it did not reach
        if index not in points:
            points[index] = FrontierPoint(
                value=value,
                probed=None,
                max_batch_size=None,
                recommended_batch_size=None,
                tokens_per_batch=None,
                trials=0,
                seconds=0.0,
                result=None,
                error=f"not probed: the frontier was {interrupted}",
            )
    listed = [points[i] for i in range(len(plan.values))]
    return FrontierResult(
        spec_path=plan.spec_path,
        field=plan.field,
        direction=plan.direction,
        answered=all(p.result is not None and p.result.answered for p in listed),
        interrupted=interrupted,
        points=listed,
        total_trials=sum(p.trials for p in listed),
        total_seconds=round(time.monotonic() - started, 3),
    )


def _point(
    field: str, value: Any, probed: int, result, error: str | None, bounds: BorrowedBounds | None, seconds: float
) -> FrontierPoint:
    """One answered (or failed) point as the document lists it."""
    hit = result is not None and result.cache is not None and result.cache.hit
    maximum = result.max_batch_size if result is not None else None
    return FrontierPoint(
        value=value,
        probed=probed,
        max_batch_size=maximum,
        recommended_batch_size=result.recommended_batch_size if result is not None else None,
        tokens_per_batch=tokens_per_batch(field, value, maximum),
        trials=0 if hit or result is None else len(result.trials),
        seconds=seconds,
        borrowed=bounds,
        result=result,
        error=error,
    )


def _bounds(borrowed, proven: list[tuple[int, Proven]], values: Sequence[Any]) -> BorrowedBounds | None:
    """The borrowed bounds as the result names them: each with the value whose probe proved it."""
    if borrowed is None:
        return None

    def source(attribute: str, bound: int | None) -> Any:
        return next((values[i] for i, p in proven if getattr(p, attribute) == bound), None)

    return BorrowedBounds(
        fits=borrowed.fits,
        fits_from=source("max_fitting", borrowed.fits) if borrowed.fits else None,
        fails=borrowed.fails,
        fails_from=source("out_of_memory", borrowed.fails) if borrowed.fails else None,
    )


def _said(bounds: BorrowedBounds | None) -> str:
    if bounds is None:
        return ""
    said = []
    if bounds.fits is not None:
        said.append(f"{bounds.fits} fit at {bounds.fits_from}")
        said.append("the search looks above it")
    if bounds.fails is not None:
        said.append(f"{bounds.fails} ran out of memory at {bounds.fails_from}")
        said.append("the search looks below it")
    return "; borrowed: " + ", ".join(said) + " (proven here before it counts)"
