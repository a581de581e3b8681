"""Where to look next inside the open bracket: the classic doubling step and the model-guided one.

A *step* only chooses a batch strictly inside the bracket (``search.plan_next``
owns the start, retries, errors and the confirmation), so a step can cost trials,
never the answer. ``guided_step`` fits the line ``a + k·batch`` through the peaks
the fitting trials measured (``memory_line``), or through a prior traced before any
trial (``prior_line``), and checks the edge pair where it predicts the edge.
Pure: no processes, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from isoprobe.search.history import Limits, Observation, bounds, verdicts
from isoprobe.search.margin import NEAR_FRACTION

Step = Callable[[tuple[Observation, ...], Limits, int, "int | None"], int]


def doubling_step(history: tuple[Observation, ...], limits: Limits, lower: int, upper: int | None) -> int:
    """The classic move: double while nothing has failed, then bisect the bracket."""
    if upper is None:
        return min(2 * lower, limits.highest)
    return (lower + upper) // 2


@dataclass(frozen=True)
class MemoryLine:
    """Peak memory as ``intercept + slope·batch``, fitted to what the trials measured."""

    intercept: float
    slope: float
    batches: int  # distinct batches measured; 1 means the slope comes from one batch and its base reading

    def largest_within(self, capacity: int) -> int:
        """The largest batch whose predicted peak is within ``capacity`` (may be below 1)."""
        return math.floor(self.reaches(capacity))

    def reaches(self, capacity: int) -> float:
        """The batch, as a real number, at which the predicted peak reaches ``capacity``."""
        return (capacity - self.intercept) / self.slope


#: While the line stands on a single batch (and its base reading), its slope is a rough estimate:
#: the first jump goes only this fraction of the way to the predicted edge, so that it most likely
#: fits and gives the line a far second point. Half the way: a small batch's peak often sits less
#: far above its base reading than its batch costs (tests/support/models.py:memory_hog on the CPU backend:
#: 13.6 MB per sample read at batch 2, 23 MB between batches 17 and 26), and the jump must still
#: fit; when the estimate is right, the second point's line finds the edge all the same.
FIRST_JUMP_FRACTION = 0.5
#: Before anything has failed, never jump beyond this factor above the largest batch that fit: a
#: prediction from small batches is an extrapolation, and a huge batch can fail for other reasons.
MAX_JUMP_FACTOR = 16


def memory_line(history: Sequence[Observation], limits: Limits) -> MemoryLine | None:
    """The memory line through the largest batch that fit every time; None without a rising line.

    Its slope is the larger of two estimates: the secant through the two largest
    measured batches (local: near the edge is where the line must be right),
    and the slope from that batch's base reading (the memory held without the
    batch) to its peak. Small batches often peak on something other than their
    activations (a kernel's scratch, the optimizer step), which flattens the
    secant between them; the base-anchored slope is then the steeper one, and
    choosing it makes the prediction err on the side of batches that fit. With
    one measured batch only the base-anchored slope exists; with no base
    reading either, there is no line and the guided step is the classic one.
    """
    readings = _fit_readings(history, limits)
    if not readings:
        return None
    batches = sorted(readings)
    top = batches[-1]
    peak = _mean(readings[top])
    # The base readings of the trials that measured ``top``'s peak: the memory they held without the batch.
    base = [
        o.base_bytes for o in history if o.batch_size == top and o.peak_bytes is not None and o.base_bytes is not None
    ]
    slopes = []
    if base and peak > _mean(base):
        slopes.append((peak - _mean(base)) / top)
    if len(batches) >= 2:
        second = batches[-2]
        slopes.append((peak - _mean(readings[second])) / (top - second))
    slope = max(slopes, default=0.0)
    if slope <= 0:
        return None
    return MemoryLine(peak - slope * top, slope, len(batches))


#: Nothing has fit yet and a trial failed above the start (the estimate was high): the next one goes to
#: this fraction of the failed batch, at least the start.
DESCENT = 0.75
#: The measured slope is trusted only within this factor of the prior's, either way: a secant between
#: two noisy or flat readings never sends the search past what the estimate allows.
PRIOR_SLOPE_RANGE = 2.0


def prior_edge(limits: Limits) -> int | None:
    """The largest batch the prior predicts to leave more than ``limits.margin`` free below the capacity (None
    without a prior or a capacity): a batch predicted inside the margin could at best be marginal, so the first
    trial (one above) goes there, where a failure is cheap."""
    if limits.prior is None or limits.capacity is None:
        return None
    return math.floor((limits.capacity - limits.margin - limits.prior.intercept) / limits.prior.slope)


def first_batch(limits: Limits) -> int:
    """The first trial: the start, or with a prior its predicted edge (within the limits).

    The predicted edge itself, stepping until steady (``edge_search.decides``): when the estimate is exact, it fits
    and proves the maximum, and the batch above it runs out: the bare proof, two trials. An estimate errs high more
    often than low (the trace cannot see allocator caching, fragmentation or kernel scratch memory: +5 % on
    ResNet50, +14 % on small-cnn); then this trial is the cheapest there is (it ends at the first allocation that
    does not fit) and the next one corrects the estimate (``miss_descent``), with no second failure above the edge
    first (issue 49). A low estimate fits here, and its measured peak corrects the line.
    Without ``limits.correct_misses`` (the search before issue 49): one above the predicted edge, then the edge.
    """
    edge = prior_edge(limits)
    if edge is None:
        return limits.start
    return max(limits.start, min(edge + (0 if limits.correct_misses else 1), limits.highest))


def prior_line(history: Sequence[Observation], limits: Limits) -> MemoryLine | None:
    """The line the guided step follows when a prior exists: measured where possible, the prior's slope otherwise.

    Through the largest batch that fit, at its measured peak (near the edge, so the
    slope only carries the line over a short distance); its slope is the secant
    through the two largest measured batches, held within ``PRIOR_SLOPE_RANGE`` of
    the prior's; while one batch has been measured, the steeper of the prior's and
    that batch's peak-over-base slope (at most ``PRIOR_SLOPE_RANGE`` times the
    prior's). With no reading at all it is the prior itself.
    """
    prior = limits.prior
    if prior is None:  # ``_line`` asks for it only with a prior; without one the guided step has ``memory_line``
        raise ValueError("prior_line needs limits.prior")
    readings = _fit_readings(history, limits)
    if not readings:
        return MemoryLine(prior.intercept, prior.slope, 0)
    batches = sorted(readings)
    top = batches[-1]
    peak = _mean(readings[top])
    slope = prior.slope
    base = [o.base_bytes for o in history if o.batch_size == top and o.base_bytes is not None]
    if base and len(batches) == 1:
        # The steeper of the prior's slope and the reading's own (peak over base): the prediction errs
        # towards batches that fit, and a fit there is a second reading near the edge.
        slope = min(max((peak - _mean(base)) / top, prior.slope), prior.slope * PRIOR_SLOPE_RANGE)
    if len(batches) >= 2:
        second = batches[-2]
        secant = (peak - _mean(readings[second])) / (top - second)
        slope = min(max(secant, prior.slope / PRIOR_SLOPE_RANGE), prior.slope * PRIOR_SLOPE_RANGE)
    return MemoryLine(peak - slope * top, slope, len(batches))


#: Issue 49, "a miss corrects the model": how far an estimate's predicted edge may err high and still be corrected
#: in one trial. Measured: +5 % on ResNet50, +14 % on small-cnn (docs/how-it-works.md); the issue's worst case is
#: +50 %. After the predicted edge ran out with nothing fit, the next trial goes this far below it (``miss_descent``),
#: where a fit is all but certain and its reading, with the failure above it, corrects the line
#: (``corrected_line``): the edge pair comes next. Less far (15 %, the known error) lands closer to the edge when the
#: estimate errs by little, but a second failure when it errs by more: simulated over 445 linear devices per row
#: (``simulate_search.py --compare-policies``), 15 % took 5 trials at +50 % where this takes 4.
ERROR_BOUND = 0.5


def miss_descent(limits: Limits, upper: int, misses: int) -> int:
    """Nothing has fit, and ``misses`` trials at or below the estimate's predicted edge ran out of memory: the next
    trial assumes the estimate's edge ``ERROR_BOUND`` too high, the factor squared with each further miss (1.5,
    2.25, 5.06 ... below its predicted edge), below the smallest failure ``upper``, at least the start."""
    edge = prior_edge(limits)
    reference = upper if edge is None else edge
    exponent = 2 ** min(max(misses, 1) - 1, 16)
    return max(limits.start, min(upper - 1, math.floor(reference / math.exp(math.log1p(ERROR_BOUND) * exponent))))


def corrected_line(
    history: Sequence[Observation], limits: Limits, upper: int | None, misses: int = 0
) -> MemoryLine | None:
    """The line once something has failed (or from an estimate): what the fits and the failures say together.

    Through the largest batch measured (``top``, its mean peak), with the steepest slope the readings give:
    - its peak over its own base reading (the memory held without the batch);
    - with an estimate, its peak over the estimate's intercept (what the trace gets right: weights, gradients,
      optimizer state; its slope is what misses), held within ``PRIOR_SLOPE_RANGE`` of the estimate's slope;
    - the secant to the next batch measured; after a miss only where that batch is at least ``NEAR_FRACTION`` of
      ``top``: a correction is never drawn from batches so small that the heap, not the batch, sets their readings
      (the torchrun DDP script's 2 and 4 predicted 43 where 30 is its edge);
    and, where ``upper`` failed above ``top``, the failure's bound: the slope is more than
    ``bound = (capacity - peak) / (upper - top)``. A line steeper than the bound stands. One flatter than it missed,
    by a factor of at least ``bound / slope`` (issue 49: a miss corrects the model): the bound alone would put the
    edge one below ``upper``, so after ``misses`` (> 0) mispredictions in a row the line takes the proven error
    again, ``bound · (bound / slope)^(2^(misses - 1))``: twice as far as the failure proves, then four times.
    None without a capacity or a reading, or (``misses`` > 0) without a slope from a reading near the edge
    (``top`` below ``NEAR_FRACTION`` of ``upper``): the caller bisects, and a fit there is such a reading.
    """
    if limits.capacity is None:
        return None
    readings = _fit_readings(history, limits)
    if not readings:
        return None
    batches = sorted(readings)
    top = batches[-1]
    peak = _mean(readings[top])
    slopes = []
    base = [o.base_bytes for o in history if o.batch_size == top and o.base_bytes is not None]
    if base and peak > _mean(base):
        slopes.append((peak - _mean(base)) / top)
    prior = limits.prior
    if prior is not None:
        anchored = (peak - prior.intercept) / top
        slopes.append(min(max(anchored, prior.slope / PRIOR_SLOPE_RANGE), prior.slope * PRIOR_SLOPE_RANGE))
    # After a miss only a batch near ``top`` draws a secant; otherwise the next one down does, as before issue 49.
    near = [b for b in batches[:-1] if b >= NEAR_FRACTION * top or not misses]
    if near:
        secant = (peak - _mean(readings[near[-1]])) / (top - near[-1])
        if prior is not None:
            secant = min(max(secant, prior.slope / PRIOR_SLOPE_RANGE), prior.slope * PRIOR_SLOPE_RANGE)
        slopes.append(secant)
    slope = max(slopes, default=0.0)
    if upper is not None and upper > top and limits.capacity > peak:
        bound = (limits.capacity - peak) / (upper - top)
        if misses > 0:
            if slope <= 0 or top < NEAR_FRACTION * upper:
                return None  # no reading near enough to correct: bisect
            if bound > slope:  # the proven error, in logarithms (a huge one would overflow a power)
                slope = bound * math.exp(min(math.log(bound / slope) * 2 ** min(misses - 1, 16), 50.0))
        slope = max(slope, bound)
    if slope <= 0:
        return None
    return MemoryLine(peak - slope * top, slope, len(batches))


def _fit_readings(history: Sequence[Observation], limits: Limits) -> dict[int, list[int]]:
    """The peaks measured per batch, for the batches that fit every time (``Meaning.fits``)."""
    judged = verdicts(history, limits)
    readings: dict[int, list[int]] = {}
    for o in history:
        verdict = judged.get(o.batch_size)
        if (
            o.peak_bytes is not None
            and verdict is not None
            and verdict.outcome is not None
            and verdict.outcome.meaning.fits
        ):
            readings.setdefault(o.batch_size, []).append(o.peak_bytes)
    return readings


def _mean(values: list[int]) -> float:
    return sum(values) / len(values)


def _line(history: Sequence[Observation], limits: Limits) -> MemoryLine | None:
    """The guided step's line: none without a capacity, the prior-aware one with a prior, else ``memory_line``."""
    if limits.capacity is None:
        return None
    if limits.correct_misses:
        upper = bounds(history, limits)[1]
        if (upper is not None or limits.prior is not None) and _fit_readings(history, limits):
            return corrected_line(history, limits, upper)
    return prior_line(history, limits) if limits.prior is not None else memory_line(history, limits)


#: ``edge_first``: how close above ``e`` (in samples) the line must reach the capacity for ``e`` to be checked first. A
#: quarter: the DDP script's line reached it 0.06 of a sample above 30 (marginal); the HF framing's 0.44 above 29,
#: whose edge was 30 (tests/unit/test_search_prior.py).
EDGE_FIRST_FRACTION = 0.25


def edge_first(history: Sequence[Observation], limits: Limits) -> int | None:
    """The line's predicted edge ``e`` where it is the less certain of the edge pair, else None (issue 49).

    The line reaches the capacity (less the margin) between ``e`` and ``e + 1``; within ``EDGE_FIRST_FRACTION`` above
    ``e``, ``e`` itself is the one a small error in the line moves across (the torchrun DDP script: its line put 30 at
    5 MiB under the 8 MiB margin, an 89 MiB sample, and 30 was marginal). Checked first and stepping until steady,
    ``e`` then decides: a fit is the maximum once ``e + 1`` runs out, a failure puts the maximum at ``e - 1``.
    ``e + 1`` first (the classic check) costs a third trial exactly there. Only with ``limits.correct_misses`` and a
    line through measured readings (a prior's first trial is its edge already)."""
    if not limits.correct_misses or limits.capacity is None:
        return None
    line = _line(tuple(history), limits)
    if line is None or (line.batches < 2 and limits.prior is None) or line.batches < 1:
        return None
    reach = line.reaches(limits.capacity - limits.margin)
    edge = math.floor(reach)
    return edge if edge >= 1 and reach - edge < EDGE_FIRST_FRACTION else None


def probes_the_edge(history: Sequence[Observation], limits: Limits, batch: int) -> bool:
    """Whether ``batch`` is the guided step's check right above the edge a measured memory line predicts (``e + 1``,
    with ``e`` the largest batch predicted to leave more than ``limits.margin`` free): expected to fail, and when it
    fits instead, most likely the edge itself (the line was a sample low), so the trial that fits there should be
    its proof (``edge_search.decides``). Only for a line through two measured batches and no prior: simulated over
    2,000 searches of tests/unit/test_search_prior.py's device, it then halved the maxima run twice (0.21 to 0.04 a
    search) for 0.21 fits that stepped on without being the edge; a prior's line, off by 5 to 50 %, misses by many
    samples on that device, and its probes cost 0.7 to 0.9 such fits for 0.14 to 0.09 reruns saved."""
    if limits.prior is not None or limits.capacity is None:  # no capacity: no line (``_line``)
        return False
    line = _line(tuple(history), limits)
    return line is not None and line.batches > 1 and batch == line.largest_within(limits.capacity - limits.margin) + 1


def predicted_marginal(history: Sequence[Observation], limits: Limits, batch: int) -> bool:
    """Whether ``batch`` is the check right above the corrected line's edge (``corrected_line``, once something
    failed) and the line says it fits the capacity, but not by more than ``limits.margin``: at best marginal, so its
    trial should step until steady (``edge_search.decides``): a short fit there tells nothing, and a steady one is
    the maximum's proof or a long-run failure (issue 49: small-cnn's 153 under 1.25 GiB, inside a 3 MiB spread).
    False without a margin, before any failure, or with the correction off."""
    if not limits.correct_misses or not limits.margin or limits.capacity is None:
        return False
    upper = bounds(history, limits)[1]
    if upper is None:
        return False
    line = corrected_line(history, limits, upper)
    if line is None:
        return False
    edge = line.largest_within(limits.capacity - limits.margin)
    return batch == edge + 1 and batch <= line.largest_within(limits.capacity)


def _misses(history: tuple[Observation, ...], limits: Limits) -> int:
    """How many of the latest new batches in a row the line mispredicted, signed.

    +k: the last k new batches fit although the line said they would fail (it
    under-predicts); -k: they failed although it said they would fit. 0 when the
    last new batch went as predicted, or was not a prediction (no line then).
    Each batch is judged against the line as it stood when that batch was chosen.
    """
    capacity = limits.capacity
    if capacity is None:  # no capacity, no line (``_line``): nothing was a prediction
        return 0
    judged = verdicts(history, limits)
    streak = 0
    seen: set[int] = set()
    for index, observation in enumerate(history):
        batch = observation.batch_size
        if batch in seen or batch not in judged:
            continue
        seen.add(batch)
        line = _line(history[:index], limits)
        outcome = judged[batch].outcome
        if line is None or outcome is None:
            streak = 0
            continue
        fits = outcome.meaning.fits
        predicted_fits = batch <= line.largest_within(capacity)
        if fits == predicted_fits:
            streak = 0
        elif fits:
            streak = streak + 1 if streak > 0 else 1
        else:
            streak = streak - 1 if streak < 0 else -1
    return streak


def _bracket_stalled(history: tuple[Observation, ...], limits: Limits) -> bool:
    """True when the last new batch, tried inside a bracket, did not halve it.

    The classic bisection halves the bracket with every trial; a line that keeps
    landing near one bound (noisy readings, a curve that is not a line) may
    shrink it by one sample a time. After such a step (when the line has missed
    twice in a row) the next one bisects, so a wrong line costs at most about
    twice the bisection's trials. A line that predicted the batch right is not
    judged by this: its ``e + 1`` step pins the upper bound without halving the
    bracket, and its next step, ``e``, closes it or misses.
    """
    firsts: list[int] = []
    seen: set[int] = set()
    for index, observation in enumerate(history):
        if observation.batch_size not in seen:
            seen.add(observation.batch_size)
            firsts.append(index)
    if len(firsts) < 2:
        return False
    before_lower, before_upper = bounds(history[: firsts[-1]], limits)
    lower, upper = bounds(history, limits)
    if before_lower is None or before_upper is None or lower is None or upper is None:
        return False
    return upper - lower > (before_upper - before_lower) / 2


def guided_step(history: tuple[Observation, ...], limits: Limits, lower: int, upper: int | None) -> int:
    """Jump to where the memory line says the edge is, and check the edge pair there.

    With the line's predicted edge ``e`` (largest batch within the capacity):
    - one measured batch only (slope uncertain): go ``FIRST_JUMP_FRACTION`` of the
      way to ``e``, to get a far second point that most likely fits; if a bracket
      already exists, the line has failed once: bisect;
    - otherwise try ``e + 1`` while the bracket's top is above it (expected to
      fail: it pins the upper bound right above the edge), then ``e`` (expected
      to fit: it pins the lower bound). An accurate line closes the bracket in
      two trials.
    Safeguards: after k mispredictions in a row on the same side the step moves
    at least 2^(k-1) from the bound that keeps moving (galloping), but never past
    the bracket's midpoint. After two or more misses in a row, when the last new
    batch did not halve the bracket, the step bisects (``_bracket_stalled``); a
    first miss gets one galloping step, and a right prediction is followed. So a
    wrong or noisy line degrades to bisection. Before any failure the jump is at most ``MAX_JUMP_FACTOR`` ×
    ``lower``. With ``limits.correct_misses`` (issue 49) the line inside a bracket is ``corrected_line``, and a miss
    there is not galloped from: the corrected line takes the error the failure proved again (at least 1, 2, 4 ... below
    the failure, never below the middle), or, with no reading near the edge to correct, the step bisects.
    """
    line = _line(history, limits)
    capacity = limits.capacity
    if line is None or capacity is None:  # no capacity, no line (``_line``): the classic step
        return doubling_step(history, limits, lower, upper)
    misses = _misses(history, limits)
    # A line that predicted its last batch right is followed (its next step closes the bracket or
    # misses); a single miss gets one galloping step next to it (an edge predicted one sample off is
    # the common case); a stalled bracket after two misses in a row is bisected.
    if upper is not None and abs(misses) >= 2 and _bracket_stalled(history, limits):
        return doubling_step(history, limits, lower, upper)
    top = limits.highest if upper is None else upper - 1
    if limits.correct_misses and misses < 0 and upper is not None:
        # A miss corrects the model (issue 49): the line of the fits and the failures together, the error the failure
        # proved taken again (twice, four times ... per miss in a row); at least 1, 2, 4 ... below the failure, never
        # below the bracket's middle (a bisection's worth); with no reading near the edge, the middle itself.
        corrected = corrected_line(history, limits, upper, -misses)
        if corrected is None:
            return (lower + upper) // 2
        edge = min(corrected.largest_within(capacity - limits.margin), upper - 2 ** min(-misses - 1, 62))
        return max(lower + 1, min(max(edge, (lower + upper) // 2), top))
    edge = line.largest_within(capacity - limits.margin)
    if line.batches == 1 and limits.prior is None:
        if upper is not None:
            return (lower + upper) // 2
        candidate = lower + math.floor(FIRST_JUMP_FRACTION * (edge - lower))
    elif edge_first(history, limits) == edge:
        candidate = edge  # the less certain of the pair, deciding (``edge_first``)
    else:
        candidate = edge + 1 if upper is None or edge + 1 < upper else edge
    middle = top if upper is None else (lower + upper) // 2
    if misses > 0:  # it keeps under-predicting: gallop upwards
        candidate = max(candidate, min(lower + 2 ** min(misses - 1, 62), middle))
    elif misses < 0:  # it keeps over-predicting: gallop downwards (only inside a bracket)
        candidate = min(candidate, max(top + 1 - 2 ** min(-misses - 1, 62), middle))
    if upper is None:
        candidate = min(candidate, MAX_JUMP_FACTOR * lower)
    return max(lower + 1, min(candidate, top))
