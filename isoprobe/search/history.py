"""What the trials have shown: observations, the search's limits, and each batch's verdict.

The rules of evidence the whole search stands on (``edge_search.py`` explains them):
a batch fits only if every attempt fit (one crash or timeout that a fresh run did not reproduce
aside), a crash or timeout is retried before it counts, and only a failure lowers the upper bound.
Which outcome is which (a fit, retried, reproduced, decisive, a bound) is read from
``report.outcomes.MEANINGS``, never listed here. Pure: no processes, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from isoprobe.report.outcomes import Outcome

#: Without a user cap the search still stops: no real setup fits 16M samples,
#: and a tiny model on tiny inputs must not double forever.
DEFAULT_CEILING = 1 << 24


@dataclass(frozen=True)
class Observation:
    """What one trial showed: the batch, how it ended, and its peak memory if it fit."""

    batch_size: int
    outcome: Outcome
    peak_bytes: int | None = None
    #: Memory the trial held without its batch (weights, gradients, optimizer state, runtime),
    #: read after the steps in the same units as ``peak_bytes``: the line's anchor while only one
    #: batch has been measured.
    base_bytes: int | None = None
    #: A trial that decides the maximum (run until its peak is steady) failed only after the search's steps:
    #: out of memory at a later step, or still rising; or it fit, but inside the spread (``search.margin``:
    #: marginal, outcome FITS). The short trials' fits at the batch do not contradict it (not flaky), and the
    #: short search is over: the long run decides from here (``steady``).
    long_run: bool = False
    #: The trial stepped until its peak was steady (it was asked to decide the maximum, ``decides``): a fit of it
    #: proves the long run, so the maximum needs no second process (``Limits.steady``).
    steady: bool = False


@dataclass(frozen=True)
class Prior:
    """Peak memory as ``intercept + slope·batch``, estimated before any trial (the traced step), in the
    units of ``Observation.peak_bytes``: where the guided search starts, and the slope it trusts until
    measured peaks correct it (see ``prior_line``)."""

    intercept: float
    slope: float

    def __post_init__(self) -> None:
        if not (self.slope > 0 and math.isfinite(self.slope) and math.isfinite(self.intercept)):
            raise ValueError("a prior needs a finite positive slope and a finite intercept")


@dataclass(frozen=True)
class Borrowed:
    """Bounds proven at other points of a frontier (``search.frontier_bounds``), not yet run at this one.

    They narrow where the search looks and nothing else: a borrowed bound is
    never an answer here. The maximum reported is a batch that fit at this
    point, and a borrowed bound the trials here contradict is dropped, so a
    wrong guess about the direction costs trials, never the answer.
    """

    fits: int | None = None  # a batch that fit where the setup needs at least as much memory
    fails: int | None = None  # a batch that ran out of memory where the setup needs at most as much memory


@dataclass(frozen=True)
class Limits:
    """Where the search starts, the largest batch it may try, and how hard it checks."""

    start: int = 2
    cap: int | None = None
    ceiling: int = DEFAULT_CEILING
    retries: int = 1  # extra attempts for a batch whose trial crashed or timed out
    confirmations: int = 1  # extra runs of the final maximum after the first fit (0: none); ``proofs_due``
    capacity: int | None = None  # memory the peaks are compared with (guided step); None: no prediction
    prior: Prior | None = None  # a line estimated before any trial (guided step, with a capacity); None: none
    #: The least a maximum must leave free below the capacity (``search.margin.least_floor_bytes``): the prior's
    #: edge is the largest batch predicted to leave more (``steps.prior_edge``). 0: none.
    margin: int = 0
    borrowed: Borrowed | None = None  # bounds another frontier point proved (search.frontier_bounds); None: none
    #: The trial that would decide the maximum steps until its peak is steady (the product's steady rule): the
    #: oracle is told which trials those are (``run_search``), and the maximum is a batch with a steady fit (a
    #: maximum whose only fit was short runs once more, until steady). False: every trial is alike.
    steady: bool = False
    #: Issue 49, "a miss corrects the model": with a prior the first trial is its predicted edge, and a miss is
    #: corrected from what the failures and the fits say together (``steps.miss_descent``, ``steps.corrected_line``).
    #: False: the search before it (one above the prior's edge, then one sample down through failures), kept only
    #: for the simulation's side-by-side table (``benchmarks/simulations/simulate_search.py --compare-policies``).
    correct_misses: bool = True

    @property
    def confirmations_due(self) -> int:
        """Runs of the maximum after its first fit: ``confirmations``, no more (issue 34: a confirmation was due
        even with none asked); with ``steady``, one of its runs must have stepped until steady (``proofs_due``)."""
        return self.confirmations

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
        """No batch is ever tried more often than this (with ``steady``, a short fit may precede its deciding run; one
        crash or timeout that no run reproduced takes one more run: ``not_reproduced``)."""
        unreproduced = 1 if self.retries or self.confirmations_due else 0
        return 1 + max(self.retries, self.confirmations_due + unreproduced) + (1 if self.steady else 0)


@dataclass(frozen=True)
class Verdict:
    """One batch, judged from all its attempts. ``outcome`` is None while a retry is due."""

    batch_size: int
    outcome: Outcome | None
    attempts: int
    fits_count: int
    flaky: bool
    long_run: bool = False  # an attempt that decides the maximum failed after the search's steps
    steady_fits: int = 0  # attempts that stepped until steady and fit (``Observation.steady``)


def proofs_due(verdict: Verdict, limits: Limits) -> int:
    """Runs of the maximum still due before it is reported: ``confirmations`` after the first fit, and with
    ``limits.steady`` at least one that stepped until steady (a short fit's re-run is both)."""
    due = 1 + limits.confirmations_due - verdict.fits_count
    if limits.steady and verdict.steady_fits == 0:
        due = max(due, 1)
    return max(0, due)


def verdicts(history: Sequence[Observation], limits: Limits) -> dict[int, Verdict]:
    """Every tried batch's verdict (see the module docstring for the rules)."""
    attempts: dict[int, list[Outcome]] = {}
    long_run: set[int] = set()
    steady: dict[int, int] = {}
    for observation in history:
        if observation.batch_size > limits.highest:
            continue  # above the cap (a history resumed under a lower cap): never an answer
        attempts.setdefault(observation.batch_size, []).append(observation.outcome)
        if observation.long_run:
            long_run.add(observation.batch_size)
        if observation.steady and observation.outcome.meaning.fits and not observation.long_run:
            steady[observation.batch_size] = steady.get(observation.batch_size, 0) + 1
    judged = {}
    for batch, outcomes in attempts.items():
        fits = sum(1 for o in outcomes if o.meaning.fits)
        failures = [o for o in outcomes if not o.meaning.fits]
        unreproduced = not_reproduced(outcomes)
        # A long-run failure after short fits is growth, not flakiness; a crash or timeout next to a fit is, once
        # a fresh run has reproduced it (one that no run reproduced is no evidence at all: ``not_reproduced``).
        flaky = (
            not unreproduced
            and 0 < fits < len(outcomes)
            and (batch not in long_run or any(o.meaning.retried for o in failures))
        )
        outcome = Outcome.FITS if not failures or unreproduced else _failed_as(failures, limits, fits)
        judged[batch] = Verdict(batch, outcome, len(outcomes), fits, flaky, batch in long_run, steady.get(batch, 0))
    return judged


def _failed_as(failures: list[Outcome], limits: Limits, fits: int) -> Outcome | None:
    """A failing batch's verdict: its decisive failure of least ``precedence`` (an error, then out of memory, then
    still rising: each ran to its end, so no retry can tell more); else, while a retry is due for a batch that never
    fit, None (a crash or timeout, and a fresh process may still tell); else its last failure. Read from the table,
    so a new failure class is decisive or retried as declared, never retried by default."""
    decisive = [o for o in failures if not o.meaning.retried]
    if decisive:
        return min(decisive, key=_precedence)
    attempts = fits + len(failures)
    if fits == 0 and attempts <= limits.retries:
        return None
    return failures[-1]


def _precedence(outcome: Outcome) -> int:
    """The order in which a decisive failure decides a batch (``Meaning.precedence``, set for every one)."""
    precedence = outcome.meaning.precedence
    if precedence is None:  # the table's test rules this out; a clear error beats a silent order
        raise ValueError(f"outcome {outcome.value} is decisive but declares no precedence")
    return precedence


def not_reproduced(outcomes: Sequence[Outcome]) -> bool:
    """One crash or timeout among a batch's runs, and a fresh run that fit: the batch's verdict is its fits.

    A crash says a process died, not why; the run after it, in a fresh process, is the batch's evidence. Counted as
    a failure, one SIGKILL from outside (a node's hiccup, a rank killed once) capped a search at 31 where 58
    holds. Only once: a second crash or timeout at the batch is reproduced, and the batch fails with its class (a
    batch that sometimes dies is not one to run overnight); a memory verdict is never set aside. A maximum still
    needs its confirmation runs to fit (``proofs_due`` counts fits only)."""
    failures = [o for o in outcomes if not o.meaning.fits]
    return (
        len(failures) == 1
        and failures[0].meaning.must_reproduce
        and len(outcomes) > 1
        and any(o.meaning.fits for o in outcomes)
    )


def bounds(history: Sequence[Observation], limits: Limits) -> tuple[int | None, int | None]:
    """(largest batch that fit every time, smallest failing batch above it); either may be None."""
    judged = verdicts(history, limits)
    # A batch whose deciding trial fit only inside the spread (marginal: ``search.margin``) is no lower bound.
    fits = [b for b, v in judged.items() if v.outcome is not None and v.outcome.meaning.fits and not v.long_run]
    lower = max(fits) if fits else None
    fails = [b for b, v in judged.items() if bounds_above(v) and (lower is None or b > lower)]
    return lower, (min(fails) if fails else None)


def bounds_above(verdict: Verdict) -> bool:
    """Whether a batch's verdict is a failure that bounds the search from above: judged (no retry due), not a fit,
    and not one that stops the search (an error is a bug, not a bound)."""
    outcome = verdict.outcome
    return outcome is not None and not outcome.meaning.fits and not outcome.meaning.stops_search
