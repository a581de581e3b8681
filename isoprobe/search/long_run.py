"""Where the long-run edge lies when a deciding trial's peak had not settled (``report.steady``'s rule).

Pure, like the rest of ``search``: when the edge's confirmation fails in the long
run (out of memory after the search's steps, or still rising), the steady trials
below it are planned here: a first jump by the growth measured, doubling down
until one is steady, then bisection, so the answer is the largest batch proven
steady (docs/steady-state.md).
"""

from __future__ import annotations

import math


def first_jump(peaks: list[int], short_steps: int, capacity: int | None, per_sample: float | None) -> int:
    """How far below a batch that failed in the long run to try first: the growth after the short steps,
    in samples of the memory line (at least 1).

    ``peaks``: its per-step peaks in the budget's units, up to where it failed or
    stopped. The growth counted is the larger of what was measured after step
    ``short_steps`` and what it took to reach the capacity (it did reach it, if it
    ran out of memory): the long run's peak is at least that much above the short
    one. Without a slope (one fitting batch) it is one sample.
    """
    if not per_sample or per_sample <= 0 or len(peaks) < short_steps:
        return 1
    short = peaks[short_steps - 1]
    growth = peaks[-1] - short
    if capacity is not None:
        growth = max(growth, capacity - short)
    return max(1, math.ceil(growth / per_sample))


def next_long_run_batch(steady: dict[int, bool], jump: int) -> int | None:
    """The next batch to run to steady state, or None when the long-run edge is known.

    ``steady``: each batch run to steady state so far, True where it was steady
    and fit (at least one failed: the search's confirmation that started this).
    Below the lowest failure with nothing steady yet: jump down by ``jump``,
    doubling with every further failure; then bisect. None when adjacent, or
    when batch 1 failed too (nothing holds the long run).
    """
    failed = sorted(b for b, ok in steady.items() if not ok)
    if not failed:
        return None
    upper = failed[0]
    fits = [b for b, ok in steady.items() if ok and b < upper]
    if not fits:
        if upper <= 1:
            return None
        failures = len(failed)
        return max(1, upper - jump * 2 ** (failures - 1))
    lower = max(fits)
    return None if upper - lower <= 1 else (lower + upper) // 2
