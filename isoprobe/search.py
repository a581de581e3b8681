"""The edge search: a pure function of what the trials have shown so far.

No processes, no torch, no clock. ``plan_next`` looks at the history of
observations and names the next batch to try (or None when the answer is
known); ``conclude`` reads the answer off the same history. ``run_search``
is the loop that joins them to an oracle, so tests drive it with a scripted
oracle and the product drives it with real child processes.

Strategy: grow from the start by doubling until the first out-of-memory or a
cap, then bisect until the largest batch that fit and the smallest that failed
are adjacent. Only FITS moves the lower bound and only OUT_OF_MEMORY the upper
bound; any other outcome (error, crashed, timed out) stops the search at once,
because it says nothing about memory. The answer is always a batch that was
tried and fit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

from isoprobe.outcomes import Outcome

#: Without a user cap the search still stops: no real setup fits 16M samples,
#: and a tiny model on tiny inputs must not double forever.
DEFAULT_CEILING = 1 << 24


@dataclass(frozen=True)
class Observation:
    """What one trial showed: the batch, how it ended, and its peak memory if it fit."""

    batch_size: int
    outcome: Outcome
    peak_bytes: int | None = None


@dataclass(frozen=True)
class Limits:
    """Where the search starts and the largest batch it may try."""

    start: int = 2
    cap: int | None = None
    ceiling: int = DEFAULT_CEILING

    def __post_init__(self) -> None:
        if self.start < 1:
            raise ValueError("start must be >= 1")
        if self.highest < self.start:
            raise ValueError(f"start {self.start} is above the largest batch allowed ({self.highest})")

    @property
    def highest(self) -> int:
        return min(self.cap, self.ceiling) if self.cap is not None else self.ceiling


class Stop(str, enum.Enum):
    """Why the search ended."""

    EDGE_FOUND = "edge_found"                  # max fits, max + 1 ran out of memory
    CAPPED = "capped"                          # the largest allowed batch fits
    START_DOES_NOT_FIT = "start_does_not_fit"  # the start batch ran out of memory
    ERROR = "error"                            # a trial raised a non-memory exception
    CRASHED = "crashed"                        # a trial died without a verdict
    TIMED_OUT = "timed_out"                    # a trial ran past its timeout


_STOPPING = {Outcome.ERROR: Stop.ERROR, Outcome.CRASHED: Stop.CRASHED, Outcome.TIMED_OUT: Stop.TIMED_OUT}


@dataclass(frozen=True)
class Conclusion:
    """The search's answer, read off the history."""

    stop: Stop
    max_fitting: int | None       # largest batch that fit (tried and succeeded), if any
    first_failing: int | None     # smallest batch above it that ran out of memory, if any
    history: tuple[Observation, ...] = field(default=())

    @property
    def exact(self) -> bool:
        """True when ``max_fitting`` is proven to be the largest allowed batch that fits."""
        return self.stop in (Stop.EDGE_FOUND, Stop.CAPPED)


def bounds(history: list[Observation] | tuple[Observation, ...]) -> tuple[int | None, int | None]:
    """(largest batch that fit, smallest batch above it that ran out of memory), either may be None."""
    fits = [o.batch_size for o in history if o.outcome is Outcome.FITS]
    lower = max(fits) if fits else None
    fails = [
        o.batch_size
        for o in history
        if o.outcome is Outcome.OUT_OF_MEMORY and (lower is None or o.batch_size > lower)
    ]
    return lower, (min(fails) if fails else None)


def plan_next(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> int | None:
    """The next batch to try, or None when the history already holds the answer."""
    if any(o.outcome in _STOPPING for o in history):
        return None
    lower, upper = bounds(history)
    if lower is None:
        return None if upper is not None else limits.start
    if upper is None:
        return None if lower >= limits.highest else min(2 * lower, limits.highest)
    return None if upper - lower <= 1 else (lower + upper) // 2


def conclude(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> Conclusion:
    """Read the answer off a finished history."""
    history = tuple(history)
    lower, upper = bounds(history)
    for observation in history:
        if observation.outcome in _STOPPING:
            return Conclusion(_STOPPING[observation.outcome], lower, upper, history)
    if lower is None:
        if upper is None:
            raise ValueError("no trial has run yet")
        return Conclusion(Stop.START_DOES_NOT_FIT, None, upper, history)
    if upper is None:
        if lower < limits.highest:
            raise ValueError("the search is not finished")
        return Conclusion(Stop.CAPPED, lower, None, history)
    if upper - lower > 1:
        raise ValueError("the search is not finished")
    return Conclusion(Stop.EDGE_FOUND, lower, upper, history)


def run_search(
    oracle: Callable[[int], Observation],
    limits: Limits,
    history: list[Observation] | None = None,
) -> Conclusion:
    """Ask the oracle until the answer is known.

    ``history`` (appended to in place) lets a caller keep the trials so far when
    the loop is interrupted, and resume from them.
    """
    history = [] if history is None else history
    while (batch := plan_next(history, limits)) is not None:
        if any(o.batch_size == batch for o in history):
            raise AssertionError(f"the planner proposed batch {batch} twice")
        observation = oracle(batch)
        if observation.batch_size != batch:
            raise AssertionError(f"asked for batch {batch}, the oracle answered for {observation.batch_size}")
        history.append(observation)
    return conclude(history, limits)
