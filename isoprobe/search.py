"""The edge search: a pure function of what the trials have shown so far.

No processes, no torch, no clock. ``plan_next`` looks at the history of
observations and names the next batch to try (or None when the answer is
known); ``conclude`` reads the answer off the same history. ``run_search``
is the loop that joins them to an oracle, so tests drive it with scripted and
flaky oracles and the product drives it with real child processes.

Strategy: grow from the start by doubling until the first failure or a cap,
then bisect until the largest batch that fits and the smallest that fails are
adjacent, then run that largest batch again (``confirmations``) before
answering.

A batch may be tried more than once, so each batch gets one *verdict* from
all its attempts:
- it **fits** only if every attempt fit (a batch that sometimes fails is not
  one to run overnight);
- any **error** (a non-memory exception: a bug) stops the search at once;
- a **crash** or **timeout** is no verdict yet: the batch is tried again in a
  fresh process, up to ``retries`` times; if it persists, the batch *fails*
  with that class (never silently as out of memory);
- otherwise it **fails**: out of memory if any attempt ran out of memory, else
  the class of its last failure. A batch with both fitting and failing
  attempts is *flaky*.
Only fitting batches raise the lower bound and only failing batches lower the
upper bound, so the answer is always a batch that fit every time it ran, and a
flaky or crashing batch can only make the answer smaller, never larger.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

from isoprobe.outcomes import Outcome

#: Without a user cap the search still stops: no real setup fits 16M samples,
#: and a tiny model on tiny inputs must not double forever.
DEFAULT_CEILING = 1 << 24

_NO_VERDICT = (Outcome.CRASHED, Outcome.TIMED_OUT)


@dataclass(frozen=True)
class Observation:
    """What one trial showed: the batch, how it ended, and its peak memory if it fit."""

    batch_size: int
    outcome: Outcome
    peak_bytes: int | None = None


@dataclass(frozen=True)
class Limits:
    """Where the search starts, the largest batch it may try, and how hard it checks."""

    start: int = 2
    cap: int | None = None
    ceiling: int = DEFAULT_CEILING
    retries: int = 1        # extra attempts for a batch whose trial crashed or timed out
    confirmations: int = 1  # extra runs of the final maximum before it is reported

    def __post_init__(self) -> None:
        if self.start < 1:
            raise ValueError("start must be >= 1")
        if self.highest < self.start:
            raise ValueError(f"start {self.start} is above the largest batch allowed ({self.highest})")
        if self.retries < 0 or self.confirmations < 0:
            raise ValueError("retries and confirmations must be >= 0")

    @property
    def highest(self) -> int:
        return min(self.cap, self.ceiling) if self.cap is not None else self.ceiling

    @property
    def most_attempts(self) -> int:
        """No batch is ever tried more often than this."""
        return 1 + max(self.retries, self.confirmations)


class Stop(str, enum.Enum):
    """Why the search ended."""

    EDGE_FOUND = "edge_found"                  # max fits (every time), max + 1 fails
    CAPPED = "capped"                          # the largest allowed batch fits (every time)
    START_DOES_NOT_FIT = "start_does_not_fit"  # the start batch runs out of memory
    ERROR = "error"                            # a trial raised a non-memory exception
    CRASHED = "crashed"                        # nothing fits, and the start batch's verdict is crashed
    TIMED_OUT = "timed_out"                    # nothing fits, and the start batch's verdict is timed out


@dataclass(frozen=True)
class Verdict:
    """One batch, judged from all its attempts. ``outcome`` is None while a retry is due."""

    batch_size: int
    outcome: Outcome | None
    attempts: int
    fits_count: int
    flaky: bool


def verdicts(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> dict[int, Verdict]:
    """Every tried batch's verdict (see the module docstring for the rules)."""
    attempts: dict[int, list[Outcome]] = {}
    for observation in history:
        if observation.batch_size > limits.highest:
            continue  # above the cap (a history resumed under a lower cap): never an answer
        attempts.setdefault(observation.batch_size, []).append(observation.outcome)
    judged = {}
    for batch, outcomes in attempts.items():
        fits = outcomes.count(Outcome.FITS)
        failures = [o for o in outcomes if o is not Outcome.FITS]
        flaky = 0 < fits < len(outcomes)
        if not failures:
            outcome: Outcome | None = Outcome.FITS
        elif Outcome.ERROR in failures:
            outcome = Outcome.ERROR
        elif Outcome.OUT_OF_MEMORY in failures:
            outcome = Outcome.OUT_OF_MEMORY
        elif fits == 0 and len(outcomes) <= limits.retries:
            outcome = None  # crashed or timed out, and a fresh process may still tell
        else:
            outcome = failures[-1]
        judged[batch] = Verdict(batch, outcome, len(outcomes), fits, flaky)
    return judged


def bounds(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> tuple[int | None, int | None]:
    """(largest batch that fit every time, smallest failing batch above it); either may be None."""
    judged = verdicts(history, limits)
    fits = [b for b, v in judged.items() if v.outcome is Outcome.FITS]
    lower = max(fits) if fits else None
    fails = [
        b for b, v in judged.items()
        if v.outcome not in (None, Outcome.FITS, Outcome.ERROR) and (lower is None or b > lower)
    ]
    return lower, (min(fails) if fails else None)


def plan_next(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> int | None:
    """The next batch to try, or None when the history already holds the answer."""
    judged = verdicts(history, limits)
    if any(v.outcome is Outcome.ERROR for v in judged.values()):
        return None
    pending = [b for b, v in judged.items() if v.outcome is None]
    if pending:
        return min(pending)  # retry a crash or timeout before moving on
    lower, upper = bounds(history, limits)
    if lower is None:
        return None if upper is not None else limits.start
    if upper is None and lower < limits.highest:
        return min(2 * lower, limits.highest)
    if upper is not None and upper - lower > 1:
        return (lower + upper) // 2
    # The bracket is closed: confirm the maximum before answering.
    return lower if judged[lower].fits_count < 1 + limits.confirmations else None


@dataclass(frozen=True)
class Conclusion:
    """The search's answer, read off the history."""

    stop: Stop
    max_fitting: int | None       # largest batch that fit every time it ran
    first_failing: int | None     # smallest failing batch above it
    first_failing_outcome: Outcome | None = None
    flaky: tuple[int, ...] = ()   # batches that both fit and failed
    history: tuple[Observation, ...] = field(default=())

    @property
    def exact(self) -> bool:
        """True when ``max_fitting`` is proven to be the largest allowed batch that fits."""
        return self.stop in (Stop.EDGE_FOUND, Stop.CAPPED)


@dataclass(frozen=True)
class Progress:
    """What a history shows so far, finished or not (an interrupted search reports this)."""

    max_fitting: int | None
    first_failing: int | None
    first_failing_outcome: Outcome | None
    flaky: tuple[int, ...]


def progress(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> Progress:
    """The bounds, how the upper one failed, and the flaky batches, from any history."""
    judged = verdicts(history, limits)
    lower, upper = bounds(history, limits)
    return Progress(
        lower,
        upper,
        judged[upper].outcome if upper is not None else None,
        tuple(sorted(b for b, v in judged.items() if v.flaky)),
    )


def conclude(history: list[Observation] | tuple[Observation, ...], limits: Limits) -> Conclusion:
    """Read the answer off a finished history; raise ValueError for an unfinished one.

    An interrupted search has no conclusion: ``progress`` tells what is known so far.
    """
    history = tuple(history)
    if not history:
        raise ValueError("no trial has run yet")
    judged = verdicts(history, limits)
    known = progress(history, limits)
    lower, upper_outcome = known.max_fitting, known.first_failing_outcome

    def answer(stop: Stop) -> Conclusion:
        return Conclusion(stop, lower, known.first_failing, upper_outcome, known.flaky, history)

    errors = [b for b, v in judged.items() if v.outcome is Outcome.ERROR]
    if errors:
        return answer(Stop.ERROR)
    if plan_next(history, limits) is not None:
        raise ValueError("the search is not finished")
    if lower is None:
        stop = {Outcome.CRASHED: Stop.CRASHED, Outcome.TIMED_OUT: Stop.TIMED_OUT}.get(
            upper_outcome, Stop.START_DOES_NOT_FIT
        )
        return answer(stop)
    return answer(Stop.CAPPED if known.first_failing is None else Stop.EDGE_FOUND)


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
        if sum(o.batch_size == batch for o in history) >= limits.most_attempts:
            raise AssertionError(f"the planner proposed batch {batch} more than {limits.most_attempts} times")
        observation = oracle(batch)
        if observation.batch_size != batch:
            raise AssertionError(f"asked for batch {batch}, the oracle answered for {observation.batch_size}")
        history.append(observation)
    return conclude(history, limits)
