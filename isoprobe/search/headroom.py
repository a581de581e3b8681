"""From the maximum to a recommendation: headroom below the memory edge, then rounding.

Pure arithmetic over the trials that fit. The maximum is where memory ran out
in *this* probe; a real run meets other processes, longer evaluation passes
and allocator drift, so users want explicit, measurable headroom (Lightning
grew a ``margin`` option for this). Headroom here is memory, not a batch
fraction: peak memory is close to ``a + k·batch`` (activations grow linearly),
so the batch whose predicted peak stays ``headroom`` below the capacity is
``floor((capacity - headroom - a) / k)``. The product then runs that batch and
records its measured peak, so the recommendation is tested like the maximum.
"""

from __future__ import annotations

from dataclasses import dataclass

from isoprobe.spec.units import format_bytes


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
    CUDA), whichever trials the search's path happened to run. Two rules make the path matter as little
    as it can:

    - the capacity is the nominal one, never a value read off the line (the line at the first failing
      batch was used once, when CPU peaks were resident memory and the cap was on the data segment: in
      the same units it only moved the target with the line, so two probes of the same setup recommended
      12 and 1);
    - the line only ever *adds* batches: a batch that fitted with a measured peak within the target is
      proven to keep the headroom, so the recommendation is never below it, whatever the line through
      the other points says (a flat or steep line from a few noisy points cannot drag it down).

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
    usable = [(b, p) for b, p in fitting if b <= max_batch]
    line = line_with_anchor(usable, anchor)
    reserve = headroom_in_bytes(headroom, capacity)
    target = capacity - reserve
    notes: list[str] = []
    if line is None or line.slope <= 0:
        batch = max_batch
        notes.append("too few fitting trials to model memory per sample; headroom not applied")
    else:
        batch = min(max_batch, int((target - line.intercept) // line.slope))
        # The division rounds either way by an ulp (a fitted slope of 1.0000000000000002 made 2 // it 1): step
        # to the largest batch whose predicted peak is within the target, to half a byte (peaks are whole bytes).
        for _ in range(2):
            if batch + 1 <= max_batch and line.at(batch + 1) <= target + 0.5:
                batch += 1
            elif batch >= 1 and line.at(batch) > target + 0.5:
                batch -= 1
        over_what = (f"line over {line.points} fitting trials" if line.points > 1
                     else "line from the fitting trial's base reading to its peak")
        notes.append(f"largest batch whose predicted peak stays {format_bytes(reserve)} below the capacity "
                     f"({over_what})")
        if batch < 1:
            batch = 1
            notes.append("the headroom cannot be met even at 1 sample; recommending 1")
    over = [b for b, p in usable if p > target]
    if over and batch >= min(over) > 1:
        batch = min(over) - 1
        notes.append(f"below {min(over)}, whose measured peak was over the target")
    if multiple_of > 1:
        rounded = batch - batch % multiple_of
        if rounded >= 1:
            batch = rounded
            notes.append(f"rounded down to a multiple of {multiple_of}")
        else:
            notes.append(f"kept {batch}: no multiple of {multiple_of} is at or below it")
    proven = proven_within(usable, target, multiple_of)
    if proven is not None and proven[0] > batch:
        batch = proven[0]
        notes.append(f"{batch} fitted with a measured peak of {format_bytes(proven[1])}, within the target: "
                     "never recommend less than a batch proven to keep the headroom")
    predicted = int(line.at(batch)) if line is not None and line.slope > 0 else None
    return Advice(batch, capacity, reserve, target, line, predicted, "; ".join(notes))


def proven_within(fitting: list[tuple[int, int]], target: int, multiple_of: int = 1) -> tuple[int, int] | None:
    """The largest batch (a multiple of ``multiple_of`` where one is asked) whose every measured peak stayed
    within ``target``, and that peak; None when no batch did."""
    highest: dict[int, int] = {}
    for batch, peak in fitting:
        highest[batch] = max(peak, highest.get(batch, peak))
    within = [(b, p) for b, p in highest.items() if p <= target and (multiple_of <= 1 or b % multiple_of == 0)]
    return max(within) if within else None
