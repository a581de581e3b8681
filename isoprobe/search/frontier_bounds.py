"""What one point of a frontier may borrow from the others, and the bracket a borrowed bound narrows.

A frontier probes the same spec at several values of one field (``isoprobe
frontier SPEC --over input.shape.0=128,256,512``). When memory grows with the
value, an edge proven at one value says something about the others: a batch
that fit where the setup needs *more* memory fits here too, and a batch that ran
out of memory where it needs *less* runs out here too. ``borrowed_for`` collects
those bounds for the next point; ``bracket`` narrows a search's bracket with
them.

The direction is an assumption the user can state or refuse (``Direction``), so
a borrowed bound only steers the search, never answers it: the maximum reported
at a point is a batch that fit at that point, the failure above it ran out of
memory at that point, and a borrowed bound the point's own trials contradict is
dropped (``bracket``). A wrong direction costs trials, never the answer.
Pure: no processes, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from isoprobe.search.history import Borrowed, Limits, Observation, bounds, bounds_above, verdicts

#: increasing: a larger value needs more memory (a sequence length, an image size); decreasing: less
#: (gradient checkpointing segments, say); none: nothing is borrowed, every point is searched alone.
Direction = Literal["increasing", "decreasing", "none"]


def bracket(history: Sequence[Observation], limits: Limits) -> tuple[int | None, int | None]:
    """(lower, upper): this point's own bounds, narrowed by the borrowed ones its trials have not contradicted.

    A borrowed fit is dropped where a batch at or below it failed here, a
    borrowed failure where a batch at or above it fit here, and both where they
    disagree with each other; a borrowed bound outside ``[start, highest]`` is
    no help and is dropped too (the start is always a batch the search may run).
    """
    lower, upper = bounds(history, limits)
    borrowed = limits.borrowed
    if borrowed is None:
        return lower, upper
    judged = verdicts(history, limits)
    failed = [b for b, v in judged.items() if bounds_above(v)]
    fit = [b for b, v in judged.items() if v.outcome is not None and v.outcome.meaning.fits]
    fits, fails = borrowed.fits, borrowed.fails
    if fits is not None and (not limits.start <= fits <= limits.highest or any(b <= fits for b in failed)):
        fits = None
    if fails is not None and (fails <= limits.start or any(b >= fails for b in fit)):
        fails = None
    if fits is not None and fails is not None and fits >= fails:
        fits = fails = None
    if fits is not None:
        lower = fits if lower is None else max(lower, fits)
    if fails is not None:
        upper = fails if upper is None else min(upper, fails)
    return lower, upper


@dataclass(frozen=True)
class Proven:
    """What a finished point proved: its place in the memory order and its edge."""

    rank: int  # 0: the value that needs the least memory
    max_fitting: int | None  # the largest batch that fit at this point
    out_of_memory: int | None  # the smallest batch above it that ran out of memory there (not a crash or timeout)


def memory_ranks(values: Sequence[object], direction: Direction) -> list[int] | None:
    """Each value's place when ordered by the memory it needs (0: least); None when nothing is borrowed.

    ``increasing`` and ``decreasing`` order numbers only (a bool is not one);
    ``ValueError`` for anything else, so a caller can name the value.
    """
    if direction == "none":
        return None
    numbers: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{value!r} is not a number: --direction {direction} orders numbers")
        numbers.append(value)
    order = sorted(range(len(numbers)), key=lambda i: numbers[i], reverse=direction == "decreasing")
    ranks = [0] * len(values)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def probe_order(ranks: list[int] | None, count: int) -> list[int]:
    """The order the points are probed in: the one needing the most memory first (its edge is the smallest,
    so its trials are the cheapest, and it bounds every other point from below); as given without ranks."""
    if ranks is None:
        return list(range(count))
    return sorted(range(count), key=lambda i: -ranks[i])


def borrowed_for(rank: int, proven: Sequence[Proven]) -> Borrowed | None:
    """The bounds a point of rank ``rank`` borrows from the finished points (None: nothing to borrow).

    fits: the largest maximum proven at a value needing more memory; fails: the
    smallest out-of-memory batch proven at a value needing less.
    """
    fits = [p.max_fitting for p in proven if p.rank > rank and p.max_fitting is not None]
    fails = [p.out_of_memory for p in proven if p.rank < rank and p.out_of_memory is not None]
    if not fits and not fails:
        return None
    return Borrowed(fits=max(fits) if fits else None, fails=min(fails) if fails else None)
