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


def headroom_in_bytes(headroom: float | int, capacity: int) -> int:
    """A fraction of the capacity, or bytes as given."""
    return int(headroom * capacity) if isinstance(headroom, float) else int(headroom)


def advise(
    max_batch: int,
    fitting: list[tuple[int, int]],
    capacity: int,
    headroom: float | int,
    multiple_of: int,
    first_failing: int | None = None,
) -> Advice:
    """The recommended batch: at most ``max_batch``, predicted to peak below capacity - headroom, rounded down.

    When the edge is known (``first_failing``), the capacity is the lower of the
    nominal one and the peak the line predicts at the first failing batch: the
    memory actually reachable in the peak's own terms. On CUDA the two agree
    (reserved memory against the cap); on CPU the cap is on the data segment
    while the peak is resident memory, which stays below the cap at the edge,
    so a headroom against the nominal budget would barely move the batch.

    The batch may lie below every batch that fit: the search chooses where it
    starts (with an estimate, most of the way to its predicted edge), and a
    headroom that is wider than that start must still hold. Below the fitted
    batches the line is an extrapolation towards less memory; the recommended
    batch is then run like any other (its soak or check trial) before it is
    reported. Only a line whose target is below one sample breaks the headroom
    (recommending 1, said in the note).
    """
    line = fit_line([(b, p) for b, p in fitting if b <= max_batch])
    if line is not None and line.slope > 0 and first_failing is not None:
        capacity = min(capacity, int(line.at(first_failing)))
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
        notes.append(
            f"largest batch whose predicted peak stays {format_bytes(reserve)} below the capacity "
            f"(line over {line.points} fitting trials)"
        )
        if batch < 1:
            batch = 1
            notes.append("the headroom cannot be met even at 1 sample; recommending 1")
    if multiple_of > 1:
        rounded = batch - batch % multiple_of
        if rounded >= 1:
            batch = rounded
            notes.append(f"rounded down to a multiple of {multiple_of}")
        else:
            notes.append(f"kept {batch}: no multiple of {multiple_of} is at or below it")
    predicted = int(line.at(batch)) if line is not None and line.slope > 0 else None
    return Advice(batch, capacity, reserve, target, line, predicted, "; ".join(notes))
