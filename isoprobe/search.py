"""The edge search: a pure function of what the trials have shown so far.

No processes, no torch, no clock. ``plan_next`` looks at the history of
observations and names the next batch to try (or None when the answer is
known); ``conclude`` reads the answer off the same history. ``run_search``
is the loop that joins them to an oracle, so tests drive it with scripted and
flaky oracles and the product drives it with real child processes.

Strategy: ``plan_next`` owns what every strategy shares (begin at the start,
retry a crash or timeout, stop on an error, confirm the maximum once the
bracket is closed); a *step* only picks the next batch strictly inside the
open bracket. Two steps exist:
- ``doubling_step``, the classic: double until the first failure or a cap, then
  bisect until the largest batch that fits and the smallest that fails are
  adjacent;
- ``guided_step`` (the default): peak memory is close to ``a + k·batch``, so it
  fits that line to the peaks the fitting trials measured, jumps next to the
  edge the line predicts against the memory capacity, and checks the edge pair
  there. Safeguards make a wrong line (noise, a cuDNN workspace jump, a
  capacity in the wrong units) cost at most about twice the classic's trials;
  with no capacity or no readings it *is* the classic.
Either way the answer is the same exact edge: a step only chooses where to
look, the verdicts decide.

A *prior* (``Limits.prior``: the line traced before any trial, ``child.estimate``)
only moves where the guided search looks: the first trial goes most of the way to
the prior's edge instead of the start (``first_batch``); if nothing has fit yet
and a batch failed, the search steps down towards the start (``DESCENT``), so a
high estimate costs trials, never the answer; and the line is anchored on the
measured peaks with a slope the prior bounds (``prior_line``). Without a prior
every step is as it was.

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

import math
from dataclasses import dataclass, field
from typing import Callable

from isoprobe.outcomes import Outcome, StopReason

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
    #: Memory the trial held without its batch (weights, gradients, optimizer state, runtime),
    #: read after the steps in the same units as ``peak_bytes``: the line's anchor while only one
    #: batch has been measured.
    base_bytes: int | None = None


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
class Limits:
    """Where the search starts, the largest batch it may try, and how hard it checks."""

    start: int = 2
    cap: int | None = None
    ceiling: int = DEFAULT_CEILING
    retries: int = 1        # extra attempts for a batch whose trial crashed or timed out
    confirmations: int = 1  # extra runs of the final maximum before it is reported
    capacity: int | None = None  # memory the peaks are compared with (guided step); None: no prediction
    prior: Prior | None = None   # a line estimated before any trial (guided step, with a capacity); None: none

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
        return math.floor((capacity - self.intercept) / self.slope)


#: While the line stands on a single batch (and its base reading), its slope is a rough estimate:
#: the first jump goes only this fraction of the way to the predicted edge, so that it most likely
#: fits and gives the line a far second point. Half the way: a small batch's peak often sits less
#: far above its base reading than its batch costs (tests/models.py:memory_hog on the CPU backend:
#: 13.6 MB per sample read at batch 2, 23 MB between batches 17 and 26), and the jump must still
#: fit; when the estimate is right, the second point's line finds the edge all the same.
FIRST_JUMP_FRACTION = 0.5
#: Before anything has failed, never jump beyond this factor above the largest batch that fit: a
#: prediction from small batches is an extrapolation, and a huge batch can fail for other reasons.
MAX_JUMP_FACTOR = 16


def memory_line(history: tuple[Observation, ...] | list[Observation], limits: Limits) -> MemoryLine | None:
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
    judged = verdicts(history, limits)
    readings: dict[int, list[Observation]] = {}
    for o in history:
        verdict = judged.get(o.batch_size)
        if o.peak_bytes is not None and verdict is not None and verdict.outcome is Outcome.FITS:
            readings.setdefault(o.batch_size, []).append(o)
    if not readings:
        return None

    def mean(values: list[int]) -> float | None:
        return sum(values) / len(values) if values else None

    batches = sorted(readings)
    top = batches[-1]
    peak = mean([o.peak_bytes for o in readings[top]])
    base = mean([o.base_bytes for o in readings[top] if o.base_bytes is not None])
    slopes = []
    if base is not None and peak > base:
        slopes.append((peak - base) / top)
    if len(batches) >= 2:
        second = batches[-2]
        slopes.append((peak - mean([o.peak_bytes for o in readings[second]])) / (top - second))
    slope = max(slopes, default=0.0)
    if slope <= 0:
        return None
    return MemoryLine(peak - slope * top, slope, len(batches))


#: With a prior, the first trial goes this fraction of the way to the edge the prior predicts: an
#: estimate that is a little high (the trace cannot see allocator caching, fragmentation or kernel
#: scratch memory, so it errs high more often than low: +5 % on ResNet50, +14 % on small-cnn) then
#: still fits, and its measured peak corrects the line for the next two trials, the edge pair.
#: benchmarks/simulate_search.py chose 0.8 over 0.9 (same medians, no device worse than without a prior
#: on exact readings).
PRIOR_FIRST_FRACTION = 0.8
#: Nothing has fit yet and a trial failed above the start (the estimate was high): the next one goes to
#: this fraction of the failed batch, at least the start.
DESCENT = 0.75
#: The measured slope is trusted only within this factor of the prior's, either way: a secant between
#: two noisy or flat readings never sends the search past what the estimate allows.
PRIOR_SLOPE_RANGE = 2.0


def prior_edge(limits: Limits) -> int | None:
    """The largest batch the prior predicts within the capacity (None without a prior or a capacity)."""
    if limits.prior is None or limits.capacity is None:
        return None
    return math.floor((limits.capacity - limits.prior.intercept) / limits.prior.slope)


def first_batch(limits: Limits) -> int:
    """The first trial: the start, or with a prior most of the way to its predicted edge (within the limits)."""
    edge = prior_edge(limits)
    if edge is None:
        return limits.start
    return max(limits.start, min(math.floor(PRIOR_FIRST_FRACTION * edge), limits.highest))


def prior_line(history: tuple[Observation, ...] | list[Observation], limits: Limits) -> MemoryLine | None:
    """The line the guided step follows when a prior exists: measured where possible, the prior's slope otherwise.

    Through the largest batch that fit, at its measured peak (near the edge, so the
    slope only carries the line over a short distance); its slope is the secant
    through the two largest measured batches, held within ``PRIOR_SLOPE_RANGE`` of
    the prior's; while one batch has been measured, the steeper of the prior's and
    that batch's peak-over-base slope (at most ``PRIOR_SLOPE_RANGE`` times the
    prior's). With no reading at all it is the prior itself.
    """
    prior = limits.prior
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


def _fit_readings(history, limits: Limits) -> dict[int, list[int]]:
    """The peaks measured per batch, for the batches that fit every time."""
    judged = verdicts(history, limits)
    readings: dict[int, list[int]] = {}
    for o in history:
        verdict = judged.get(o.batch_size)
        if o.peak_bytes is not None and verdict is not None and verdict.outcome is Outcome.FITS:
            readings.setdefault(o.batch_size, []).append(o.peak_bytes)
    return readings


def _mean(values: list[int]) -> float:
    return sum(values) / len(values)


def _line(history: tuple[Observation, ...] | list[Observation], limits: Limits) -> MemoryLine | None:
    """The guided step's line: none without a capacity, the prior-aware one with a prior, else ``memory_line``."""
    if limits.capacity is None:
        return None
    return prior_line(history, limits) if limits.prior is not None else memory_line(history, limits)


def _misses(history: tuple[Observation, ...], limits: Limits) -> int:
    """How many of the latest new batches in a row the line mispredicted, signed.

    +k: the last k new batches fit although the line said they would fail (it
    under-predicts); -k: they failed although it said they would fit. 0 when the
    last new batch went as predicted, or was not a prediction (no line then).
    Each batch is judged against the line as it stood when that batch was chosen.
    """
    judged = verdicts(history, limits)
    streak = 0
    seen: set[int] = set()
    for index, observation in enumerate(history):
        batch = observation.batch_size
        if batch in seen or batch not in judged:
            continue
        seen.add(batch)
        line = _line(history[:index], limits)
        if line is None or judged[batch].outcome is None:
            streak = 0
            continue
        fits = judged[batch].outcome is Outcome.FITS
        predicted_fits = batch <= line.largest_within(limits.capacity)
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
    ``lower``.
    """
    line = _line(history, limits)
    if line is None:
        return doubling_step(history, limits, lower, upper)
    misses = _misses(history, limits)
    # A line that predicted its last batch right is followed (its next step closes the bracket or
    # misses); a single miss gets one galloping step next to it (an edge predicted one sample off is
    # the common case); a stalled bracket after two misses in a row is bisected.
    if upper is not None and abs(misses) >= 2 and _bracket_stalled(history, limits):
        return doubling_step(history, limits, lower, upper)
    top = limits.highest if upper is None else upper - 1
    edge = line.largest_within(limits.capacity)
    if line.batches == 1 and limits.prior is None:
        if upper is not None:
            return (lower + upper) // 2
        candidate = lower + math.floor(FIRST_JUMP_FRACTION * (edge - lower))
    else:
        candidate = edge + 1 if upper is None or edge + 1 < upper else edge
    middle = top if upper is None else (lower + upper) // 2
    if misses > 0:    # it keeps under-predicting: gallop upwards
        candidate = max(candidate, min(lower + 2 ** min(misses - 1, 62), middle))
    elif misses < 0:  # it keeps over-predicting: gallop downwards (only inside a bracket)
        candidate = min(candidate, max(top + 1 - 2 ** min(-misses - 1, 62), middle))
    if upper is None:
        candidate = min(candidate, MAX_JUMP_FACTOR * lower)
    return max(lower + 1, min(candidate, top))


def plan_next(
    history: list[Observation] | tuple[Observation, ...], limits: Limits, step: Step | None = None
) -> int | None:
    """The next batch to try, or None when the history already holds the answer.

    What every strategy shares lives here: stop on an error, retry a crash or
    timeout first, begin at the start, and confirm the maximum once the bracket
    is closed. ``step`` (default ``guided_step``) only chooses the next batch
    strictly inside the open bracket: above ``lower``, and below ``upper`` or at
    most the largest allowed batch.
    """
    step = guided_step if step is None else step
    history = tuple(history)
    judged = verdicts(history, limits)
    if any(v.outcome is Outcome.ERROR for v in judged.values()):
        return None
    pending = [b for b, v in judged.items() if v.outcome is None]
    if pending:
        return min(pending)  # retry a crash or timeout before moving on
    lower, upper = bounds(history, limits)
    if lower is None:
        if upper is None:
            return first_batch(limits)
        # Nothing fit yet. Without a prior the start failed: nothing fits. With one, a first trial above
        # the start failed (the estimate was high): step down towards the start until a batch fits.
        return None if limits.prior is None or upper <= limits.start else max(limits.start, min(upper - 1, math.floor(upper * DESCENT)))
    if (upper is None and lower < limits.highest) or (upper is not None and upper - lower > 1):
        batch = step(history, limits, lower, upper)
        ceiling = limits.highest if upper is None else upper - 1
        if not lower < batch <= ceiling:
            raise AssertionError(f"step proposed {batch} outside the open bracket ({lower}, {ceiling}]")
        return batch
    # The bracket is closed: confirm the maximum before answering.
    return lower if judged[lower].fits_count < 1 + limits.confirmations else None


@dataclass(frozen=True)
class Conclusion:
    """The search's answer, read off the history."""

    stop: StopReason
    max_fitting: int | None       # largest batch that fit every time it ran
    first_failing: int | None     # smallest failing batch above it
    first_failing_outcome: Outcome | None = None
    flaky: tuple[int, ...] = ()   # batches that both fit and failed
    history: tuple[Observation, ...] = field(default=())

    @property
    def exact(self) -> bool:
        """True when ``max_fitting`` is proven to be the largest allowed batch that fits."""
        return self.stop in (StopReason.EDGE_FOUND, StopReason.CAPPED)


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

    def answer(stop: StopReason) -> Conclusion:
        return Conclusion(stop, lower, known.first_failing, upper_outcome, known.flaky, history)

    errors = [b for b, v in judged.items() if v.outcome is Outcome.ERROR]
    if errors:
        return answer(StopReason.ERROR)
    if plan_next(history, limits) is not None:
        raise ValueError("the search is not finished")
    if lower is None:
        stop = {Outcome.CRASHED: StopReason.CRASHED, Outcome.TIMED_OUT: StopReason.TIMED_OUT}.get(
            upper_outcome, StopReason.START_DOES_NOT_FIT
        )
        return answer(stop)
    return answer(StopReason.CAPPED if known.first_failing is None else StopReason.EDGE_FOUND)


def run_search(
    oracle: Callable[[int], Observation],
    limits: Limits,
    history: list[Observation] | None = None,
    step: Step | None = None,
) -> Conclusion:
    """Ask the oracle until the answer is known.

    ``history`` (appended to in place) lets a caller keep the trials so far when
    the loop is interrupted, and resume from them.
    """
    history = [] if history is None else history
    while (batch := plan_next(history, limits, step)) is not None:
        if sum(o.batch_size == batch for o in history) >= limits.most_attempts:
            raise AssertionError(f"the planner proposed batch {batch} more than {limits.most_attempts} times")
        observation = oracle(batch)
        if observation.batch_size != batch:
            raise AssertionError(f"asked for batch {batch}, the oracle answered for {observation.batch_size}")
        history.append(observation)
    return conclude(history, limits)
