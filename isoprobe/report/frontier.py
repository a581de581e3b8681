"""The frontier's answer: one spec probed at several values of one field, as a pydantic model and a table.

``isoprobe frontier`` prints a ``FrontierResult`` as JSON (``isoprobe schema
--frontier`` publishes its schema) and ``frontier_table`` on stderr. Each point
holds the whole ``Result`` of its probe, the same document ``isoprobe run --set
FIELD=VALUE`` prints, so every maximum can be traced to the trial at that point
that proved it.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field

from isoprobe.report.result import Result
from isoprobe.report.strict import Strict

#: 2: a point may have no result (``error`` says why: its probe failed, or the frontier stopped before it) and
#: the document says whether a signal stopped the frontier (``interrupted``); 1: every point had a result.
FRONTIER_SCHEMA_VERSION: Final = 2  # Final: its type is Literal[2], one of schema_version's


class BorrowedBounds(Strict):
    """Bounds a point's search started from, proven at other points (they steered it; its own trials decided)."""

    fits: int | None = Field(
        None,
        description="A batch that fit at a value needing at least as much memory: the "
        "search looked above it. Null: none borrowed.",
    )
    fits_from: Any = Field(None, description="The value whose probe proved `fits`.")
    fails: int | None = Field(
        None,
        description="A batch that ran out of memory at a value needing at most as much "
        "memory: the search looked below it. Null: none borrowed.",
    )
    fails_from: Any = Field(None, description="The value whose probe proved `fails`.")


class FrontierPoint(Strict):
    """One value of the field: its probe's answer, what it borrowed, and what it cost."""

    value: Any = Field(description="The field's value at this point, as --over gave it (YAML-read).")
    probed: int | None = Field(
        description="1-based order in which this point was answered (the most memory "
        "first); null: not probed (the frontier was stopped before it)."
    )
    max_batch_size: int | None = Field(
        description="The largest batch that fit at this value (run at this value); "
        "null: no answer (see result.message)."
    )
    recommended_batch_size: int | None = Field(
        description="The recommended batch at this value (headroom applied, soaked)."
    )
    tokens_per_batch: int | None = Field(
        description="max_batch_size x value when the field is an element of input.shape (for a sequence model's "
        "input.shape.0: tokens in the largest batch); null for other fields."
    )
    trials: int = Field(description="Trials this frontier ran for the point (0: answered from the cache).")
    seconds: float = Field(description="Wall time of this point, environment check and trials (or the cache read).")
    borrowed: BorrowedBounds | None = Field(
        None, description="The bounds this point's search borrowed from points answered before it; null: none."
    )
    result: Result | None = Field(
        description="The point's whole result, as 'isoprobe run --set FIELD=VALUE' prints "
        "it; null when its probe gave none (see error)."
    )
    error: str | None = Field(
        None,
        description="Why this point has no result: its probe failed before an answer "
        "(a spec that only this value breaks, such as a factory that raises "
        "for it; an environment check that failed; an internal error), or "
        "it was not probed because the frontier was interrupted. Null when "
        "there is a result (an unanswered result says why in its message).",
    )

    @property
    def answered(self) -> bool:
        """A proven maximum at this value."""
        return self.result is not None and self.result.answered

    @property
    def from_cache(self) -> bool:
        return self.result is not None and self.result.cache is not None and self.result.cache.hit


class FrontierResult(Strict):
    """The edge over a field's values: what ``isoprobe frontier`` prints on stdout."""

    schema_version: Literal[1, 2] = Field(
        FRONTIER_SCHEMA_VERSION,
        description="Version of this document's layout: "
        "2 (this one) lets a point have no result (its error says why); 1 did not.",
    )
    spec_path: str = Field(description="The spec probed at every value.")
    field: str = Field(description="The dotted spec field --over varied, as --set names it (input.shape.0).")
    direction: Literal["increasing", "decreasing", "none"] = Field(
        description="How memory was assumed to move with the value: increasing (a larger value needs more), "
        "decreasing, or none (nothing borrowed between points). An assumption only steers the "
        "searches: a wrong one costs trials, never an answer."
    )
    answered: bool = Field(description="Every point has a proven maximum.")
    interrupted: Literal["interrupted", "terminated"] | None = Field(
        None,
        description="Set when SIGINT (interrupted) or SIGTERM (terminated) stopped the frontier: the points "
        "answered before it are here whole, the one it stopped has the trials it had run, the "
        "ones after it were not probed. Null: the frontier ran to its end.",
    )
    points: list[FrontierPoint] = Field(description="One per value, in the order --over gave them.")
    total_trials: int = Field(description="Trials run for the whole frontier (cache hits run none).")
    total_seconds: float = Field(description="Wall time of the whole frontier.")


def frontier_table(result: FrontierResult) -> str:
    """The frontier for people: one row per value (stderr, beside the JSON on stdout), then why any point has no
    answer, then the totals."""
    head = (result.field, "max", "recommended", "tokens/batch", "trials", "seconds", "borrowed")
    rows = [head]
    for point in result.points:
        borrowed = point.borrowed
        said = []
        if borrowed is not None and borrowed.fits is not None:
            said.append(f"fits {borrowed.fits}")
        if borrowed is not None and borrowed.fails is not None:
            said.append(f"fails {borrowed.fails}")
        rows.append(
            (
                str(point.value),
                _shown(point.max_batch_size),
                _shown(point.recommended_batch_size),
                _shown(point.tokens_per_batch),
                "cache" if point.from_cache else str(point.trials),
                f"{point.seconds:.1f}",
                ", ".join(said) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.rjust(width) if i else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    for point in result.points:
        if not point.answered:
            why = _why_unanswered(point)
            lines.append(f"{result.field}={point.value}: no answer: {why.splitlines()[0] if why else '?'}")
    probed = sum(p.probed is not None for p in result.points)
    stopped = f"; {result.interrupted}: {probed} of {len(result.points)} points probed" if result.interrupted else ""
    lines.append(f"{result.total_trials} trials in {result.total_seconds:.1f} s{stopped}")
    return "\n".join(lines)


def _why_unanswered(point: FrontierPoint) -> str | None:
    """Why a point has no answer: its error where its probe gave no result, else its result's message."""
    if point.error is not None:
        return point.error
    return point.result.message if point.result is not None else None


def _shown(number: int | None) -> str:
    return "-" if number is None else str(number)
