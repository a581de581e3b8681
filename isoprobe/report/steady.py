"""Steady state: when a trial's peak has stopped rising (where the long-run edge lies: ``search.long_run``).

Pure (no processes, no torch, no clock). The rule is part of the trial's
request and of the result, and both sides apply it, so it lives with the
result's models. A search
trial runs ``search.steps`` steps; a real job runs thousands, and on some setups
the peak keeps rising for a dozen steps after the third (measured on the CPU
backend: FSDP2's and ZeRO-1's ranks grow by tens of MiB over steps 3 to 10, see
docs/steady-state.md). So the trials whose verdict decides the reported maximum
(the confirmation of the edge, and every trial of the long-run search below)
keep stepping until their peak is steady, up to a cap of steps:

- ``SteadyRule`` travels in the trial's request; the child applies ``is_steady``
  after each step (the ranks of a gang agree: steady when every rank is).
- A peak still rising at the cap is not 'fits': ``Outcome.STILL_RISING``.
- When the edge's confirmation fails in the long run (out of memory after the
  search's steps, or still rising), ``search.long_run.next_long_run_batch`` plans the steady
  trials below it: a first jump by the growth measured, doubling down until one
  is steady, then bisection, so the answer is the largest batch proven steady.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

#: The rise over the window that still counts as steady. Measured (docs/steady-state.md): a settled CPU
#: trial's data-segment peak does not move at all from step to step (0 bytes over 19 to 22 steps); while
#: growing, FSDP2's and ZeRO-1's ranks rose by 1 to 86 MiB at a time. On CUDA the reserved peak moves in
#: whole segments (2 MiB at least). So a quarter of a MiB: above no noise there is, below every real rise.
TOLERANCE_BYTES = 256 << 10
#: Steps the peak must hold still. In the measurements a rank's peak stood still for 4 steps (steps 4 to 7)
#: and then rose again (FSDP2 rank 0 by 2 MiB, ZeRO-1 rank 1 by 8 MiB), so 4 is not enough. Near the cap,
#: later rises of 1 to 10 MiB after 6 to 12 still steps were seen too (docs/steady-state.md, "Creep"): no
#: window rules them out, and a longer one makes every deciding trial long; the 30-step harness checks.
WINDOW_STEPS = 5
#: Steps the peak must hold still in a process whose heap is quiet: read after every step but the first, its churn
#: (``StepDone.heap_churn_bytes``) never above ``QUIET_CHURN_BYTES``. The pauses ``WINDOW_STEPS`` waits out are the
#: heap's: its growth comes as fragmentation of blocks under the mmap threshold (docs/steady-state.md: FSDP2's and
#: ZeRO-1's ranks kept 30 to 90 MiB free inside their heaps), and a heap that grows and gives back at most a MiB a
#: step has no such jumps beyond what the spread's margin covers (``search.margin.CHURN_MARGIN_BYTES``). Measured:
#: the held-out convnet's plain loop, its Lightning module and its Trainer (heap churn 0.2 MiB) peaked at step 3
#: within 0.1 MiB of step 30 (docs/steady-state.md, "A quiet heap").
QUIET_WINDOW_STEPS = 3
#: The most heap churn a step may read for the quiet window: the spread's margin above a measured churn.
QUIET_CHURN_BYTES = 1 << 20
#: The most steps a deciding trial runs (``search.steady_steps`` overrides it). The measured growth stopped
#: by step 12 at the latest; 30 steps is the long run the issue's table checked.
DEFAULT_MAX_STEPS = 30


class SteadyRule(BaseModel):
    """How long a deciding trial keeps stepping: until its peak is steady, or ``max_steps``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_steps: int = Field(ge=1, description="Steps run whatever the peak does (search.steps).")
    max_steps: int = Field(ge=1, description="The cap: a peak still rising after this many steps is still_rising.")
    window: int = Field(WINDOW_STEPS, ge=1, description="Steps over which the peak must not rise.")
    tolerance_bytes: int = Field(TOLERANCE_BYTES, ge=0, description="A rise over the window up to this is steady.")
    stop_at_bytes: int | None = Field(
        None,
        ge=0,
        description="A running peak at or above this (the capacity less the spread, in the budget's "
        "units) ends the trial after min_steps: it leaves no more than the spread free, so however long it runs it "
        "cannot be the maximum (the parent judges it marginal). Null: no such stop.",
    )
    quiet_window: int | None = Field(
        None,
        ge=1,
        description="Steps the peak must hold still instead of window where the trial's heap is quiet: "
        "its heap churn read after every step but the first and never above quiet_churn_bytes (QUIET_WINDOW_STEPS, "
        "one process of isoprobe's own on the CPU backend). Null: window, always.",
    )
    quiet_churn_bytes: int = Field(QUIET_CHURN_BYTES, ge=0, description="The most heap churn of a quiet step.")


def rule_for(search_steps: int, max_steps: int | None, quiet: bool = False) -> SteadyRule | None:
    """The rule for a probe whose search runs ``search.steps`` steps; None when ``max_steps`` is 0 (off).
    ``quiet``: its trials read their heap churn (one process of isoprobe's own on the CPU backend), so a quiet
    heap holds still over ``QUIET_WINDOW_STEPS``."""
    cap = DEFAULT_MAX_STEPS if max_steps is None else max_steps
    if cap == 0:
        return None
    # A cap below the window's steps could never see a steady peak: it is raised to the least that can.
    return SteadyRule(
        min_steps=search_steps,
        max_steps=max(cap, search_steps, WINDOW_STEPS + 1),
        quiet_window=QUIET_WINDOW_STEPS if quiet else None,
    )


def is_quiet(churns: list[int | None], rule: SteadyRule) -> bool:
    """Whether a trial's heap was quiet over the steps it ran (``SteadyRule.quiet_window``): ``churns``, each step's
    ``StepDone.heap_churn_bytes``, read after every step but the first (which builds what the run keeps) and none
    above ``quiet_churn_bytes``."""
    after_first = churns[1:]
    return (
        rule.quiet_window is not None
        and bool(after_first)
        and all(c is not None and c <= rule.quiet_churn_bytes for c in after_first)
    )


def window_for(churns: list[int | None], rule: SteadyRule) -> int:
    """The steps the peak must hold still: ``quiet_window`` where the heap was quiet, else ``window``."""
    quiet_window = rule.quiet_window
    return quiet_window if quiet_window is not None and is_quiet(churns, rule) else rule.window


def rise(peaks: list[int], window: int) -> int | None:
    """How much the running peak rose over the last ``window`` steps; None with too few steps."""
    if len(peaks) <= window:
        return None
    return peaks[-1] - peaks[-1 - window]


def is_steady(peaks: list[int], rule: SteadyRule, churns: Sequence[int | None] = ()) -> bool:
    """After these per-step peaks (and heap churns, ``window_for``): has the trial run its minimum and has its peak
    held for the window?"""
    if len(peaks) < rule.min_steps:
        return False
    risen = rise(peaks, window_for(list(churns), rule))
    return risen is not None and risen <= rule.tolerance_bytes


def past_the_margin(peaks: list[int], rule: SteadyRule) -> bool:
    """Whether the running peak, after the minimum steps, already leaves no more than the spread free
    (``SteadyRule.stop_at_bytes``): the trial has shown all it can (issue 35: a marginal deciding trial ran
    7 steps, 28 s, to be ruled out by a peak it had reached at its third)."""
    return (
        rule.stop_at_bytes is not None
        and len(peaks) >= rule.min_steps
        and bool(peaks)
        and peaks[-1] >= rule.stop_at_bytes
    )


def should_stop(peaks: list[int], rule: SteadyRule, churns: Sequence[int | None] = ()) -> bool:
    """Whether the trial has stepped enough: steady, at the cap, or already past the margin."""
    return len(peaks) >= rule.max_steps or is_steady(peaks, rule, churns) or past_the_margin(peaks, rule)


def swing_bytes(own_peaks: list[int | None]) -> int | None:
    """The most one step's own peak rose above the lowest own peak of a later step, in one process.

    ``own_peaks``: each step's own peak (the most the process held between the end of the step before and the
    end of this one; None where it is not known). The first step is left out: the optimizer's state appears
    in it, so its peak is lower for a reason that does not come back. A step that stays higher for good is
    growth, which the steady rule judges; one that comes back down is the swing. None with fewer than two
    known steps after the first.
    """
    known = [p for p in own_peaks[1:] if p is not None]
    if len(known) < 2:
        return None
    swing, lowest_after = 0, known[-1]
    for peak in reversed(known[:-1]):
        swing = max(swing, peak - lowest_after)
        lowest_after = min(lowest_after, peak)
    return swing


def rising_rate(peaks: list[int]) -> float | None:
    """How fast a trial's running peak rose over the second half of its steps, in bytes a step; None with fewer
    than four steps (the first half holds the start-up's growth, which every run has and which stops)."""
    if len(peaks) < 4:
        return None
    half = len(peaks) // 2
    return max(0.0, (peaks[-1] - peaks[half]) / (len(peaks) - 1 - half))


def watching_for(rule: SteadyRule, rate: float | None) -> SteadyRule:
    """The rule for a deciding trial of a probe whose trials were still rising at the cap, at ``rate`` bytes a step
    expected at this trial's batch (``TrialRunner.deciding_rule``): a window long enough for that rate to rise
    past the tolerance twice over (up to the cap), and no quiet window. Why: a leak that keeps a slice of every
    batch rises ~150 KiB every few steps, which the 3-step quiet window with its 256 KiB tolerance read as still;
    batch 15 "survived" and ran out at step 1,326 of a real run, while 16, 32 and 96 had been seen still rising
    (issue 47). Unchanged where no rate was seen."""
    if not rate or rate <= 0:
        return rule
    needed = -(-2 * rule.tolerance_bytes // int(max(1.0, rate)))
    window = min(max(rule.window, needed), rule.max_steps - 1)
    return rule.model_copy(update={"window": window, "quiet_window": None})
