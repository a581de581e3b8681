"""From the maximum to a recommendation: headroom below the memory edge, then rounding.

Pure arithmetic over the trials that fit. The maximum is where memory ran out
in *this* probe; a real run meets other processes, longer evaluation passes
and allocator drift, so users want explicit, measurable headroom (Lightning
grew a ``margin`` option for this). Headroom here is memory, not a batch
fraction: peak memory is close to ``a + k·batch`` (activations grow linearly),
so the batch whose predicted peak stays ``headroom`` below the capacity is
``floor((capacity - headroom - a) / k)``. The product then runs that batch and
records its measured peak, so the recommendation is tested like the maximum.

One spec, one recommendation (issue 56): the choice is a function of the maximum and of what the trials
measured near it, never of which small batches the search's path happened to visit. The line is fitted to
each batch's highest peak from half the maximum up (``line_points``): a small batch's reading can sit on a
floor that is no batch's (on the CPU backend, an address-space reservation that lifts VmPeak in some runs
and not in others: 2, 4 and 13 all read 895.5 MiB in one run of a DDP gang where 2 read 844.0 in the next),
and a least-squares line through such a floor tilts, predicting the batches below the maximum tens of MiB
too high (that gang recommended 16 in one run and 24 in the next, the same maximum 58). The choice also
says what decided it (``Advice.decided_by``) and when its predicted peak lies closer to the target than the
line's own points scatter (a coin toss between runs, said in the note).
"""

from __future__ import annotations

from dataclasses import dataclass

from isoprobe.spec.units import format_bytes

#: The line is fitted to the batches from this fraction of the maximum up (where that is one batch, with the
#: least lifted batch below it: ``line_points``).
LINE_FROM_FRACTION = 0.5
#: A predicted peak closer to the target than the larger of these (and of the line's own scatter) is borderline:
#: another run's readings may put it on the other side. Bytes, and a fraction of the capacity.
BORDERLINE_FLOOR_BYTES = 1 << 20
BORDERLINE_FRACTION = 0.001


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float
    points: int

    def at(self, batch: int) -> float:
        return self.intercept + self.slope * batch


@dataclass(frozen=True)
class Advice:
    batch_size: int
    capacity_bytes: int
    headroom_bytes: int
    target_peak_bytes: int
    line: Line | None
    predicted_peak_bytes: int | None
    note: str
    #: What set the batch (``report.recommendation.Recommendation.decided_by``): line, measured_within,
    #: measured_over, no_line or headroom_unreachable.
    decided_by: str = "line"
    #: The batches the line went through (each one's highest peak), largest first; empty without a line.
    line_batches: tuple[int, ...] = ()


def fit_line(points: list[tuple[int, int]]) -> Line | None:
    """Least-squares line through (batch, peak) pairs; None with fewer than two distinct batches."""
    batches = {b for b, _ in points}
    if len(batches) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_p = sum(p for _, p in points) / n
    sxx = sum((b - mean_b) ** 2 for b, _ in points)
    sxy = sum((b - mean_b) * (p - mean_p) for b, p in points)
    slope = sxy / sxx
    return Line(intercept=mean_p - slope * mean_b, slope=slope, points=n)


def line_with_anchor(points: list[tuple[int, int]], anchor: tuple[int, int] | None) -> Line | None:
    """``fit_line``, or with one batch measured the line from ``anchor`` (that batch and its base reading: the
    memory it held without its batch) to its peak; None without either.

    An exact estimate proves the edge with one fitting trial, so one point is common (issue 35). The base-anchored
    slope is steeper than the activations alone where the peak holds something else too (an optimizer step's
    scratch): what it predicts below the batch errs high, towards smaller batches, never larger ones."""
    line = fit_line(points)
    if line is not None or anchor is None or not points:
        return line
    batch, peak = max(points)
    if anchor[0] != batch or peak <= anchor[1]:
        return None
    return Line(intercept=float(anchor[1]), slope=(peak - anchor[1]) / batch, points=1)


def highest_peaks(points: list[tuple[int, int]], max_batch: int | None = None) -> dict[int, int]:
    """Each batch's highest measured peak (at most ``max_batch``): one point a batch, whatever the order the trials
    ran in and however often a batch ran (a confirmation, a retry, a long run of the maximum)."""
    highest: dict[int, int] = {}
    for batch, peak in points:
        if max_batch is None or batch <= max_batch:
            highest[batch] = max(peak, highest.get(batch, peak))
    return highest


def line_points(points: list[tuple[int, int]], max_batch: int) -> list[tuple[int, int]]:
    """The points the recommendation's line is fitted to: each batch's highest peak, for every batch from half the
    maximum up; where that is one batch, it and the batch below whose line to it is steepest; largest first.

    Near the maximum the batch's own memory is the largest part of the peak; far below it a reading can sit on a
    floor that no batch sets (an address-space reservation that lifts VmPeak in some trials only: 2, 4 and 13 read
    the same 895.5 MiB in one run, 2 read 844.0 in another and 4 850.0 beside a 2 at 895.1), and which small
    batches were measured at all is the search's path. A line through such a floor tilts: flatter, it predicts the
    batches below the maximum too high. The maximum and the batches near it are measured on every path. A floor
    only ever lifts a reading (a high-water mark never reads below what the batch held), so of the batches below
    half the maximum, the one that rose least short of the top batch's peak per sample (the steepest line to it)
    is the least lifted."""
    highest = highest_peaks(points, max_batch)
    batches = sorted(highest, reverse=True)
    upper = [b for b in batches if b >= LINE_FROM_FRACTION * max_batch]
    if len(upper) >= 2 or len(batches) < 2:
        return [(b, highest[b]) for b in upper or batches]
    top = batches[0]
    below = max(batches[1:], key=lambda b: ((highest[top] - highest[b]) / (top - b), b))
    return [(top, highest[top]), (below, highest[below])]


def recommendation_line(
    points: list[tuple[int, int]], max_batch: int, anchor: tuple[int, int] | None = None
) -> tuple[Line | None, list[tuple[int, int]]]:
    """The memory line the recommendation predicts with, and the points it went through (``line_points``); with a
    single batch measured, the line from ``anchor`` (``line_with_anchor``)."""
    chosen = line_points(points, max_batch)
    return line_with_anchor(sorted(chosen), anchor), chosen


def borderline_bytes(line: Line, chosen: list[tuple[int, int]], capacity: int) -> int:
    """How close to the target a predicted peak is a coin toss between runs: the line's own points' largest
    distance from it, at least ``BORDERLINE_FLOOR_BYTES`` and ``BORDERLINE_FRACTION`` of the capacity."""
    scatter = max((abs(peak - line.at(batch)) for batch, peak in chosen), default=0.0)
    return int(max(BORDERLINE_FLOOR_BYTES, BORDERLINE_FRACTION * capacity, scatter))


def headroom_in_bytes(headroom: float | int, capacity: int) -> int:
    """A fraction of the capacity, or bytes as given."""
    return int(headroom * capacity) if isinstance(headroom, float) else int(headroom)


def advise(
    max_batch: int,
    fitting: list[tuple[int, int]],
    capacity: int,
    headroom: float | int,
    multiple_of: int,
    anchor: tuple[int, int] | None = None,
) -> Advice:
    """The recommended batch: at most ``max_batch``, predicted to peak below capacity - headroom, rounded down,
    and never below a batch that fitted with its measured peak within that target.

    A function of the measurements alone (issue 34): ``fitting`` are (batch, peak) pairs in the
    capacity's own units (the budget's on the CPU: the data segment the cap counts; reserved memory on
    CUDA), whichever trials the search's path happened to run, in any order. Three rules make the path matter
    as little as it can:

    - the capacity is the nominal one, never a value read off the line (the line at the first failing
      batch was used once, when CPU peaks were resident memory and the cap was on the data segment: in
      the same units it only moved the target with the line, so two probes of the same setup recommended
      12 and 1);
    - the line only ever *adds* batches: a batch that fitted with a measured peak within the target is
      proven to keep the headroom, so the recommendation is never below it, whatever the line through
      the other points says (a flat or steep line from a few noisy points cannot drag it down);
    - the line goes through each batch's highest peak from half the maximum up (``line_points``, issue 56):
      the batches every path measures near the maximum, never a small batch's reading on a floor that no
      batch sets, which tilted the line and moved a DDP gang's recommendation from 24 to 16 in some runs.

    ``Advice.decided_by`` says which rule set the batch, and the note says when the line's choice is
    borderline (a predicted peak closer to the target than the readings move: ``borderline_bytes``).

    The batch may lie below every batch that fit: the search chooses where it starts (with an estimate,
    most of the way to its predicted edge), and a headroom that is wider than that start must still hold.
    Below the fitted batches the line is an extrapolation towards less memory; the recommended batch is
    then run like any other (its soak or check trial) before it is reported. Only a line whose target is
    below one sample, with no batch proven, breaks the headroom (recommending 1, said in the note).

    ``anchor``: (batch, base) of the largest fitting trial, the memory it held without its batch. With a single
    batch measured (an exact estimate proves the edge with one fitting trial) the line runs from that base to the
    batch's peak: steeper than the activations alone where the peak holds something else too (an optimizer
    step's scratch), so the headroom errs towards a smaller batch, never a larger one.
    """
    usable = sorted((b, p) for b, p in fitting if b <= max_batch)
    line, chosen = recommendation_line(usable, max_batch, anchor)
    reserve = headroom_in_bytes(headroom, capacity)
    target = capacity - reserve
    batch, decided_by, notes = _by_line(line, chosen, max_batch, target, reserve)
    over = [b for b, p in usable if p > target]
    if over and batch >= min(over) > 1:
        batch = min(over) - 1
        decided_by = "measured_over"
        notes.append(f"below {min(over)}, whose measured peak was over the target")
    batch, step, rounding = _rounded_down(batch, multiple_of)
    notes += rounding
    proven = proven_within(usable, target, multiple_of)
    if proven is not None and proven[0] > batch:
        batch = proven[0]
        decided_by = "measured_within"
        notes.append(
            f"{batch} fitted with a measured peak of {format_bytes(proven[1])}, within the target: "
            "never recommend less than a batch proven to keep the headroom"
        )
    rising = line if line is not None and line.slope > 0 else None
    if (
        rising is not None
        and decided_by == "line"
        and (close := _borderline(rising, chosen, capacity, target, batch, step, max_batch))
    ):
        notes.append(close)
    predicted = int(rising.at(batch)) if rising is not None else None
    return Advice(
        batch,
        capacity,
        reserve,
        target,
        line,
        predicted,
        "; ".join(notes),
        decided_by,
        tuple(b for b, _ in chosen) if line is not None else (),
    )


def _by_line(
    line: Line | None, chosen: list[tuple[int, int]], max_batch: int, target: int, reserve: int
) -> tuple[int, str, list[str]]:
    """The line's own choice, before the measured peaks correct it (``advise``): the largest batch up to
    ``max_batch`` whose predicted peak is within ``target``, which rule decided it, and the notes that say so.
    Without a rising line, ``max_batch`` (the headroom cannot be applied); where not even one sample meets the
    target, 1."""
    if line is None or line.slope <= 0:
        return max_batch, "no_line", ["too few fitting trials to model memory per sample; headroom not applied"]
    batch = min(max_batch, int((target - line.intercept) // line.slope))
    # The division rounds either way by an ulp (a fitted slope of 1.0000000000000002 made 2 // it 1): step
    # to the largest batch whose predicted peak is within the target, to half a byte (peaks are whole bytes).
    for _ in range(2):
        if batch + 1 <= max_batch and line.at(batch + 1) <= target + 0.5:
            batch += 1
        elif batch >= 1 and line.at(batch) > target + 0.5:
            batch -= 1
    notes = [
        f"largest batch whose predicted peak stays {format_bytes(reserve)} below the capacity "
        f"({_line_words(line, chosen, max_batch)})"
    ]
    if batch < 1:
        notes.append("the headroom cannot be met even at 1 sample; recommending 1")
        return 1, "headroom_unreachable", notes
    return batch, "line", notes


def _rounded_down(batch: int, multiple_of: int) -> tuple[int, int, list[str]]:
    """``batch`` rounded down to a multiple of ``multiple_of`` where one is at or above 1, the step between the
    batches that may be recommended (``_borderline`` names the next one), and the note that says what was done
    (none where no multiple was asked): kept apart so that ``advise`` reads as its three rules."""
    if multiple_of <= 1:
        return batch, 1, []
    rounded = batch - batch % multiple_of
    if rounded >= 1:
        return rounded, multiple_of, [f"rounded down to a multiple of {multiple_of}"]
    return batch, 1, [f"kept {batch}: no multiple of {multiple_of} is at or below it"]


def _line_words(line: Line, chosen: list[tuple[int, int]], max_batch: int) -> str:
    """Which points the line went through, in words; where it reached below half the maximum, that this is the
    path's doing (another run's path may measure other batches)."""
    if line.points == 1:
        return "line from the fitting trial's base reading to its peak"
    batches = sorted(b for b, _ in chosen)
    words = (
        f"line over the fitting batches {', '.join(map(str, batches))}"
        if len(batches) <= 3
        else f"line over the {len(batches)} fitting batches from {batches[0]} to {batches[-1]}"
    )
    if batches[0] < LINE_FROM_FRACTION * max_batch:
        words += (
            f"; no other batch from half of {max_batch} up fitted, so the line reaches down to {batches[0]}, "
            "whose reading may sit on a floor no batch sets: a run whose search measured a batch nearer the "
            "maximum may recommend more"
        )
    return words


def _borderline(
    line: Line, chosen: list[tuple[int, int]], capacity: int, target: int, batch: int, step: int, max_batch: int
) -> str | None:
    """A note where the line's choice is a coin toss between runs: the chosen batch's predicted peak, or the next
    candidate's, lies closer to the target than ``borderline_bytes``; None where it does not."""
    tolerance = borderline_bytes(line, chosen, capacity)
    below = target - line.at(batch)
    if 0 <= below <= tolerance:
        return (
            f"borderline: {batch}'s predicted peak is {format_bytes(int(below))} below the target, within the "
            f"{format_bytes(tolerance)} a run's readings move; another run may recommend "
            f"{max(1, batch - step)}"
        )
    above = line.at(batch + step) - target if batch + step <= max_batch else None
    if above is not None and 0 < above <= tolerance:
        return (
            f"borderline: {batch + step}'s predicted peak is {format_bytes(int(above))} over the target, within "
            f"the {format_bytes(tolerance)} a run's readings move; another run may recommend {batch + step}"
        )
    return None


def proven_within(fitting: list[tuple[int, int]], target: int, multiple_of: int = 1) -> tuple[int, int] | None:
    """The largest batch (a multiple of ``multiple_of`` where one is asked) whose every measured peak stayed
    within ``target``, and that peak; None when no batch did."""
    highest = highest_peaks(fitting)
    within = [(b, p) for b, p in highest.items() if p <= target and (multiple_of <= 1 or b % multiple_of == 0)]
    return max(within) if within else None
