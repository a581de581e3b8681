"""Judging a soak: did the recommended batch survive a long run, and if not, which batch would?

Pure (no processes, no torch), like ``search`` and ``recommend``. A search
trial runs a few steps; a real job runs thousands. Memory that grows from
step to step (a cache that fills, fragmentation, a leak in the user's code)
does not show in a few steps, so the recommended batch is run for
``recommendation.soak_steps`` steps in a fresh process before it is reported,
and the peak after every step is read (``Trial.step_peak_bytes``: the
running peak, so it only rises). Growth is judged on the later steps only:
the first ones warm up (the optimizer's state, the allocator's pools, cuDNN's
workspaces) and rise for reasons that stop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A rise of the running peak over the last third of the steps smaller than this is noise, not growth:
#: the larger of this many bytes and ``RISE_FRACTION`` of the peak.
RISE_FLOOR_BYTES = 4 << 20
RISE_FRACTION = 0.005
#: Without enough steps to measure growth, a failed soak moves the batch down by this fraction.
FALLBACK_STEP_DOWN = 1 / 8


@dataclass(frozen=True)
class SoakJudgement:
    """What one soak's per-step peaks say."""

    survived: bool
    still_rising: bool
    #: How fast the running peak rose per step over the later steps (None: too few steps to tell).
    growth_bytes_per_step: float | None
    #: The peak the last step would reach if the growth went on to the end of the soak.
    projected_peak_bytes: int | None


def rise_noise_bytes(peak: int) -> int:
    """The largest rise of a running peak that is noise, not growth, at a peak of ``peak`` bytes: the larger of
    ``RISE_FLOOR_BYTES`` and ``RISE_FRACTION`` of the peak. One figure for a soak's judgement and for the proof by
    the maximum (``proven_by_maximum``), so the two paths call the same readings growth."""
    return int(max(RISE_FLOOR_BYTES, RISE_FRACTION * peak))


def _growth(peaks: list[int]) -> float | None:
    """Bytes per step the running peak rose from the end of the warm-up (a third of the steps, at least
    two) to the last step; None with fewer than three steps."""
    count = len(peaks)
    if count < 3:
        return None
    first = max(2, math.ceil(count / 3))  # 1-based step where the warm-up is over
    if first >= count:
        first = count - 1
    return (peaks[-1] - peaks[first - 1]) / (count - first)


def judge(fits: bool, steps: int, peaks: list[int], target_peak_bytes: int) -> SoakJudgement:
    """Judge a soak of ``steps`` steps whose running peak after each completed step was ``peaks``.

    It survived when it ran every step and fit, and its peak was not still
    rising past ``target_peak_bytes`` (the recommendation's headroom line):
    memory that grows and is already above the line will break the headroom
    in a longer run. A peak still rising but below the line survives, flagged.
    """
    growth = _growth(peaks)
    tail = peaks[-max(2, math.ceil(len(peaks) / 3)) :] if len(peaks) >= 3 else []
    rise = tail[-1] - tail[0] if tail else 0
    still_rising = bool(tail) and rise > rise_noise_bytes(tail[-1])
    projected = None
    if peaks:
        projected = int(peaks[-1] + max(0.0, growth or 0.0) * max(0, steps - len(peaks)))
    ran_all = fits and len(peaks) >= steps
    survived = ran_all and not (still_rising and peaks[-1] > target_peak_bytes)
    return SoakJudgement(survived, still_rising, growth, projected)


def lower_batch(
    batch: int, judgement: SoakJudgement, per_sample_bytes: float | None, target_peak_bytes: int, multiple_of: int = 1
) -> int:
    """The batch to soak next after ``batch`` did not survive: below it by what the growth costs.

    With a measured growth and a memory line, the batch whose projected end
    peak is back on the target line: ``batch - (projected - target) / per
    sample``. Otherwise (too few steps, no line) ``FALLBACK_STEP_DOWN`` of the
    batch. Always at least one sample lower; rounded down to ``multiple_of``
    where that stays above 0. May return 0: nothing left to recommend.
    """
    down = max(1, math.ceil(batch * FALLBACK_STEP_DOWN))
    if judgement.projected_peak_bytes is not None and judgement.growth_bytes_per_step is not None and per_sample_bytes:
        over = judgement.projected_peak_bytes - target_peak_bytes
        if over > 0:
            down = max(1, math.ceil(over / per_sample_bytes))
    lower = batch - down
    if multiple_of > 1 and lower >= multiple_of:
        lower -= lower % multiple_of
    return max(0, lower)


@dataclass(frozen=True)
class ProvenByMaximum:
    """Why a batch below a steady maximum needs no soak: its predicted peak plus the maximum's growth over steps."""

    predicted_bytes: int
    growth_bytes: int


def proven_by_maximum(
    batch: int,
    maximum: int,
    maximum_peaks: list[int],
    short_steps: int,
    predicted_peak_bytes: int | None,
    target_peak_bytes: int,
) -> ProvenByMaximum | None:
    """Whether the maximum's steady run proves ``batch`` without a soak of its own (None: it does not).

    ``maximum_peaks``: the running peak after each step of the maximum's deciding trial, which stepped until its
    peak held still (``report.steady``). A batch below it peaks lower at every step (memory rises with the batch),
    so it holds the long run wherever the maximum did; the headroom is the one thing left to show: the line's
    prediction for ``batch`` plus the growth the maximum showed after the search's ``short_steps`` (a short
    trial's peak on the line misses that growth) must stay within ``target_peak_bytes``. Without a prediction, a
    batch at or above the maximum, or readings too few to tell the growth: None, and the soak runs.

    A rise within ``rise_noise_bytes`` is no growth (issue 56): a soak would not call it rising either, and the
    maximum's readings move by that much from run to run (24 KiB in one run, a MiB in another), which must not
    decide whether a soak runs.
    """
    if predicted_peak_bytes is None or batch >= maximum or len(maximum_peaks) < short_steps or short_steps < 1:
        return None
    growth = max(0, maximum_peaks[-1] - maximum_peaks[short_steps - 1])
    if growth <= rise_noise_bytes(maximum_peaks[-1]):
        growth = 0
    if predicted_peak_bytes + growth > target_peak_bytes:
        return None
    return ProvenByMaximum(predicted_peak_bytes, growth)
