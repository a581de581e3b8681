"""The token budget: the largest T such that every batch a token-bucketing sampler forms under T fits.

A length-bucketing sampler fills each batch of bucket length L with
floor(T / L) samples padded to L. So T fits when, for every length L of the
distribution, floor(T / L) samples at L fit, and the answer is

    T* = min over L of (L * (e_L + 1) - 1)

where e_L is the largest number of samples that fits at length L: the
*binding* length is the one that takes the minimum. ``search_budget`` finds
T* over an oracle ``fits(samples, length)`` (a fresh-process trial in the
product, a function in the unit tests). Pure: no processes, no clock.

It needs far fewer trials than an edge search per length, because it reuses
what every trial proved, under two assumptions:

1. **Monotone in samples at a fixed length**: n fits at L implies every n' < n
   fits at L (the edge search's own assumption: more samples, more tensors).
2. **Monotone in length at a fixed sample count**: n fits at L implies n fits
   at every L' < L (a shorter sequence makes every activation, attention map
   and padded input smaller or equal; the parameters and optimizer state do
   not depend on the length). Equivalently, n failing at L fails at L' > L.

From these, a trial at (n, L) settles a whole quadrant, and a length needs no
exact edge unless it can lower the minimum: with U the smallest
L' * (e_L' + 1) found so far, a length L lowers it only if e_L < ceil(U / L) - 1,
so one trial at n = ceil(U / L) - 1 (often answered by a fit at a longer
length, then no trial at all) rules L out, and only a binding candidate is
bisected, within the bounds the longer lengths already proved. Lengths are
taken longest first: a longer length's fits are floors for every shorter one.

A trial that is neither a fit nor out of memory (an error, a crash or a
timeout that persisted over its retries, still rising) is no verdict on
memory: the search stops there and gives no budget rather than guess
(``TokenSearch.stop``). The binding length's
edge is run at that length itself ``confirmations`` times (search.confirmations),
and at least once where only a longer length's fit proved it, so the reported
budget's binding batch is one that ran at its own length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from isoprobe.report.outcomes import Outcome

#: The oracle: one trial of ``samples`` at ``length``, classified.
Oracle = Callable[[int, int], Outcome]


@dataclass(frozen=True)
class LengthEdge:
    """What the search proved at one bucket length: the edge where it mattered, a floor where it did not."""

    length: int
    max_fitting: int | None  # the largest sample count proven to fit here (by a trial here or at a longer length)
    first_failing: int | None  # the smallest proven to fail here (here or at a shorter length); None: not needed
    trials: int  # trials run at this length

    @property
    def budget_limit(self) -> int | None:
        """The largest token budget this length allows (L * first_failing - 1); None when it was not needed."""
        return None if self.first_failing is None else self.length * self.first_failing - 1


@dataclass(frozen=True)
class TokenSearch:
    """The answer: the budget, its binding length, every length's edge, and the trials in order."""

    budget: int | None
    binding_length: int | None
    edges: tuple[LengthEdge, ...]
    trials: tuple[tuple[int, int, Outcome], ...]  # (samples, length, outcome), in the order they ran
    stop: Outcome | None = None  # the non-memory outcome that stopped the search, if one did
    capped: bool = False  # every length fits the sample cap: the cap, not memory, binds

    def edge(self, length: int) -> LengthEdge:
        return next(e for e in self.edges if e.length == length)


@dataclass
class _Knowledge:
    """Every trial's verdict, and what the two assumptions infer from them."""

    fits: list[tuple[int, int]] = field(default_factory=list)
    fails: list[tuple[int, int]] = field(default_factory=list)

    def lower(self, length: int) -> int:
        """The largest n proven to fit at ``length``: a fit at this or any longer length (0: none yet)."""
        return max((n for n, at in self.fits if at >= length), default=0)

    def upper(self, length: int) -> int | None:
        """The smallest n proven to fail at ``length``: a failure at this or any shorter length."""
        return min((n for n, at in self.fails if at <= length), default=None)


class _Stopped(Exception):
    def __init__(self, outcome: Outcome):
        self.outcome = outcome


def search_budget(
    fits: Oracle,
    lengths: list[int],
    start: int = 1,
    cap: int | None = None,
    confirm: Oracle | None = None,
    retries: int = 0,
    retry: Oracle | None = None,
    confirmations: int = 1,
) -> TokenSearch:
    """The largest token budget every bucket of ``lengths`` fits, over the trial oracle ``fits``.

    ``confirm``: the oracle for the binding batch's confirmations (default ``fits``); the product's run until
    its peak is steady, as the batch search's confirmations of its maximum do. ``confirmations``: how many
    (search.confirmations; 0: none, unless the binding batch never ran at its own length, which then runs once
    in ``fits`` as a search trial).
    ``retries``: a trial whose outcome is retried (``Meaning.retried``: a crash or a timeout, no evidence about
    memory) is run again, in ``retry`` (default ``fits``), up to this many times, as the batch search retries
    (search.retries); if it persists, the search stops with that outcome.

    ``start``: the first sample count tried at the longest length (doubling from there).
    ``cap``: the most samples a batch may hold (a sampler's own limit on samples per batch); a
    length where the cap fits does not limit the budget.
    """
    if not lengths or any(not isinstance(x, int) or x < 1 for x in lengths):
        raise ValueError(f"lengths must be positive integers, got {lengths!r}")
    ordered = sorted(set(lengths), reverse=True)
    search = _Search(fits, start, cap, confirm or fits, retries, retry or fits, confirmations)
    try:
        search.bound_over(ordered)
        stop = search.confirm_binding(_binding(ordered, search.known, search.bound))
    except _Stopped as stopped:
        stop = stopped.outcome
    return search.answer(ordered, stop)


@dataclass
class _Search:
    """One token search: its oracles and settings, what its trials proved, and its steps.

    Each step of ``search_budget`` is a method here, so that each is short and named while all of them read and
    extend the same evidence (``known``, ``trials``). Which outcome is a fit, a bound, retried or a stop is read
    from the outcome table (``Outcome.meaning``), never listed here.
    """

    fits: Oracle
    start: int
    cap: int | None
    confirm: Oracle
    retries: int
    retry: Oracle
    confirmations: int
    known: _Knowledge = field(default_factory=_Knowledge)
    trials: list[tuple[int, int, Outcome]] = field(default_factory=list)
    #: U: the smallest L * first_failing so far; the budget is U - 1. Kept here, not returned, so that a search
    #: stopped half way still reports the lengths it bound (``answer``).
    bound: int | None = None

    def ask(self, samples: int, length: int) -> bool:
        """A verdict: inferred when the quadrants already hold one, else a trial."""
        if samples <= self.known.lower(length):
            return True
        upper = self.known.upper(length)
        if upper is not None and samples >= upper:
            return False
        return self.run(samples, length)

    def run(self, samples: int, length: int, oracle: Oracle | None = None) -> bool:
        """A trial (in ``oracle``, default ``fits``), retried while its outcome is no evidence yet
        (``Meaning.retried``): True for a fit, False for a failed allocation (the only bound, ``Meaning.
        allocation_failed``); any other outcome stops the search (``_Stopped``)."""
        outcome = (oracle or self.fits)(samples, length)
        self.trials.append((samples, length, outcome))
        for _ in range(self.retries):
            if not outcome.meaning.retried:
                break
            outcome = self.retry(samples, length)
            self.trials.append((samples, length, outcome))
        if outcome.meaning.fits:
            self.known.fits.append((samples, length))
            return True
        if outcome.meaning.allocation_failed:
            self.known.fails.append((samples, length))
            return False
        raise _Stopped(outcome)

    def edge_below(self, length: int) -> None:
        """The exact edge at ``length``: doubling while no failure bounds it (up to the cap), then bisection."""
        while True:
            lower, upper = self.known.lower(length), self.known.upper(length)
            if upper is None:
                if self.cap is not None and lower >= self.cap:
                    return  # the cap fits here: this length does not limit the budget
                doubled = max(self.start, 2 * lower)
                self.ask(doubled if self.cap is None else min(self.cap, doubled), length)
            elif upper - lower <= 1:
                return
            else:
                self.ask((lower + upper) // 2, length)

    def bound_over(self, ordered: list[int]) -> None:
        """``bound``, the smallest L * first_failing over the lengths (longest first), each length ruled out by one
        trial (or none) where it cannot lower it, bisected only where it can; None while no length failed."""
        for length in ordered:
            bound = self.bound
            if bound is None:
                self.edge_below(length)
            else:
                need = math.ceil(bound / length) - 1  # fitting this many here rules the length out
                if self.cap is not None and need > self.cap:
                    need = self.cap
                if need < 1 or self.ask(need, length):
                    continue
                self.edge_below(length)
            upper = self.known.upper(length)
            if upper == 1:
                self.bound = length  # not one sample of this length fits: no budget can hold it, the search is over
                return
            if upper is not None and (bound is None or length * upper < bound):
                self.bound = length * upper

    def confirm_binding(self, binding: int | None) -> Outcome | None:
        """The binding batch run at its own length: ``confirmations`` times, or once where only a longer length's
        fit proved it. OUT_OF_MEMORY when it fit before and failed now (flaky: no budget to stand on)."""
        if binding is None:
            return None
        edge = self.known.lower(binding)
        ran_here = any(s == edge and at == binding and o.meaning.fits for s, at, o in self.trials)
        if edge >= 1 and not ran_here and not self.confirmations:
            self.run(edge, binding)  # proven at a longer length only: the binding batch runs at its own length once
        for _ in range(self.confirmations if edge >= 1 else 0):
            if not self.run(edge, binding, self.confirm):  # a confirmation, at its own length
                break
        upper = self.known.upper(binding)
        if upper is not None and upper <= edge:
            return Outcome.OUT_OF_MEMORY
        return None

    def answer(self, ordered: list[int], stop: Outcome | None) -> TokenSearch:
        """The search's answer from what it proved: no budget after a stop, the cap's when no length failed."""
        known, trials, bound = self.known, tuple(self.trials), self.bound
        per_length = tuple(
            LengthEdge(
                length,
                known.lower(length) or None,
                _needed_upper(length, known, bound),
                sum(1 for _, at, _ in trials if at == length),
            )
            for length in sorted(ordered)
        )
        if stop is not None:
            return TokenSearch(None, None, per_length, trials, stop)
        binding = _binding(ordered, known, bound)
        if binding is None or bound is None:  # no length failed within the cap
            budget = None if self.cap is None else max(ordered) * self.cap
            return TokenSearch(budget, None, per_length, trials, capped=True)
        if known.lower(binding) < 1:  # not even one sample fits at the binding length: a sampler could never train it
            return TokenSearch(None, binding, per_length, trials)
        return TokenSearch(bound - 1, binding, per_length, trials)


def _binding(ordered: list[int], known: _Knowledge, bound: int | None) -> int | None:
    """The length whose limit is the minimum (the longest of a tie: its batches are the fewest, longest samples)."""
    if bound is None:
        return None
    return next(length for length in ordered if (upper := known.upper(length)) is not None and length * upper == bound)


def _needed_upper(length: int, known: _Knowledge, bound: int | None) -> int | None:
    """A length's proven failing count, when it is the edge (lower + 1): else the length did not bind."""
    upper = known.upper(length)
    return upper if upper is not None and upper == known.lower(length) + 1 else None
