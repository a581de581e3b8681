"""The spread rule over a probe's trials: how much a deciding trial's steady peak must leave free, and what a
trial that fit inside it tells the search (marginal: a long-run failure).

The rule itself (the spread's size, the floors, ``clears``) is ``search.margin``'s, pure. This module picks
the readings it judges from the trials a ``TrialRunner`` kept (the same question, the same allocator, fitting
trials' heap churns, trials near the batch), so the runner only runs trials.
"""

from __future__ import annotations

from dataclasses import dataclass

from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome
from isoprobe.report.trial import Trial
from isoprobe.search.history import Observation
from isoprobe.search.margin import Spread, clears, near, spread_for


def probe_spread(
    trials: list[Trial],
    *,
    allocator: str | None,
    backend: str,
    capacity: int,
    edge_spread: int | None,
    strategy: str,
    command: bool,
    least: bool = False,
    batch: int | None = None,
) -> Spread | None:
    """The spread a probe applies to ``batch`` (``search.margin``), from ``trials`` (the same question's).
    ``least``: the least it can be once one more trial has fit, for a trial that has not measured its own heap
    churn yet. ``batch``: the batch it judges; the heap churns and swings of trials far below it do not count
    (``search.margin.near``); None: all of them."""
    runs: dict[int, list[list[int]]] = {}
    swings: list[tuple[int, int]] = []
    churns: list[tuple[int, int]] = []  # fitting trials' only: one that ran out at twice the batch churned twice
    for t in trials:
        if t.purpose != "memory_check" and t.training_batch_size is None and t.allocator == allocator:
            peaks = t.step_budget_peak_bytes or t.step_peak_bytes
            if peaks:
                runs.setdefault(t.batch_size, []).append(peaks)
            if t.budget_swing_bytes is not None:
                swings.append((t.batch_size, t.budget_swing_bytes))
            if t.heap_churn_bytes is not None and t.outcome is Outcome.FITS:
                churns.append((t.batch_size, t.heap_churn_bytes))
    near_swings, near_churns = near(swings, batch), near(churns, batch)
    return spread_for(
        backend,
        capacity,
        [r for r in runs.values() if len(r) > 1],
        edge_spread,
        # A command's processes (torchrun's ranks too) get a command's floor: its reading is the
        # data segment the cap counts (search.margin.COMMAND_FLOOR_BYTES).
        strategy=strategy,
        command=command,
        # A swing stands in for the heap's hold only where no trial measured the churn that
        # bounds it (search.margin.CHURN_MARGIN_BYTES): a swing is already in the trial's peak. The
        # least spread leaves swings out: the next trial may measure the churn and drop them.
        swings=[] if near_churns or least else near_swings,
        heap_churns=near_churns,
        least=least,
    )


def fastest_rise(trials: list[Trial], batch: int | None) -> float | None:
    """The fastest rise (bytes a step) of ``trials`` that were still rising at the cap, scaled down to ``batch``
    where it is smaller (a leak that keeps part of each batch grows with the batch): what a deciding trial at
    ``batch`` must be able to see (``steady.watching_for``). None: no trial was."""
    rates = []
    for t in trials:
        if t.outcome is not Outcome.STILL_RISING:
            continue
        rate = steady.rising_rate(t.step_budget_peak_bytes or t.step_peak_bytes or [])
        if rate:
            scale = min(1.0, batch / t.batch_size) if batch else 1.0
            rates.append(rate * scale)
    return max(rates) if rates else None


def margin_against(trial: Trial, spread: Spread | None, capacity: int) -> Margin | None:
    """How much a deciding trial's steady peak left free below ``capacity``, against ``spread`` at its batch."""
    peak = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
    if spread is None or peak is None:
        return None
    return Margin(capacity - peak, spread.bytes, clears(peak, capacity, spread.bytes))


@dataclass(frozen=True)
class Margin:
    """A deciding trial's free memory at its steady peak, and whether that clears the spread."""

    free: int
    spread: int
    clears: bool


def held_still(trial: Trial) -> bool:
    """Whether a trial stepped until its peak held still by its steady rule (not one stopped at the margin, nor a
    short one). Its steps' heap churns as the trial keeps them: the most after the first (``heap_churn_bytes``)."""
    if trial.steady_rule is None:
        return False
    peaks = trial.step_budget_peak_bytes or trial.step_peak_bytes
    churns: list[int | None] = [None, *[trial.heap_churn_bytes] * (len(peaks) - 1)]
    return steady.is_steady(peaks, trial.steady_rule, churns)


def observation_of(trial: Trial, short_steps: int) -> Observation:
    """What the search learns from a trial; a deciding trial that failed only after the search's steps
    (out of memory at a later step, or still rising) is a long-run failure (``Observation.long_run``)."""
    if trial.outcome is not Outcome.FITS:
        long_run = trial.steady_rule is not None and (
            trial.outcome is Outcome.STILL_RISING
            or (trial.outcome is Outcome.OUT_OF_MEMORY and len(trial.step_seconds) >= short_steps)
        )
        return Observation(trial.batch_size, trial.outcome, long_run=long_run, steady=trial.steady_rule is not None)
    peak = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
    return Observation(trial.batch_size, trial.outcome, peak, trial.base_bytes, steady=trial.steady_rule is not None)
