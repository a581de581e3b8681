"""The spread: how far a batch's long-run peak moves between fresh processes and over steps, and the rule
that a reported maximum clears the capacity by more than it.

Pure (no processes, no clock). Near the edge the same batch fits in one fresh process and runs out of
memory in the next: on the CPU backend glibc's heap fragments differently from run to run and keeps
creeping by a few MiB long after a window of steps has held still; on CUDA the libraries' workspaces, the
free space inside the caching allocator's segments and NCCL's buffers can do the same. One steady trial is
one draw: a batch whose steady peak sits within that spread of the capacity fitted by luck as often as not.
So a deciding trial that fits
counts towards the maximum only when ``capacity - steady peak > spread``; one that fits inside the spread
is *marginal*: reported as such (``report.result.EdgeMargin``), never as the maximum.
The figures behind every constant here: docs/measurements.md#the-spreads-floors (the long runs: docs/steady-state.md).

The spread is the larger of

- the floor (``floor_bytes``): on the CPU backend, for one process or a command, what the probe's own fitting
  trials measured of the cause, the heap a step grows and gives back (what another run's layout can hold into
  the next step), plus a MiB or two; otherwise the most a long run's peak was measured to move above a steady trial's,
  across fresh processes and up to 30 steps, with the models of docs/steady-state.md, as a fixed part plus a
  fraction of the capacity; and
- what this probe itself saw (``observed_bytes``): where one batch ran in two fresh processes (a search
  trial and its confirmation), the most their peaks after the same step differed; and where one process's
  own peak in one step rose above a later step's (``report.steady.swing_bytes``, a command trial's on the
  CPU backend), by how much: the same batch, the same process, needing that much more at one step than at
  another, which a long run can need again at any step. A swing counts only where no trial measured the
  command's heap churn: the churn bounds that hold in any run (the command's floor), and a swing the trial saw
  is already in its peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1 << 20

#: The fixed part of each backend's floor: the most a long run's peak moved above a steady trial's. CPU: measured.
#: CUDA: a cuDNN or cuBLAS workspace or a module's kernels, what can move between fresh processes in
#: ``child.cuda_readings.allocator_need``'s reading; a probe's own confirmations widen it (``observed_bytes``).
#: Measured on an H200 (docs/gpu.md): one batch's readings in fresh processes (isoprobe's trial and a plain loop)
#: differed by 0 to 2 MiB in the reserved peak and 2 to 4 MiB outside the allocator, at 8 GiB and on the whole
#: 140 GiB card; 14 MiB once, at the cap under expandable segments. Figures: docs/measurements.md#the-spreads-floors.
FLOOR_BYTES = {"cpu": 8 * MIB, "cuda": 40 * MIB}
#: The part of each backend's floor that grows with the capacity. CUDA: none. The 0.2 % it had before a GPU
#: measured it was 286 MiB on a 140 GiB card, where fresh processes differed by 2 MiB: it ruled out batches that
#: a plain loop trained on that card (docs/gpu.md, part f: 375 and 376 trained, isoprobe said 374).
FLOOR_FRACTION = {"cpu": 0.004, "cuda": 0.0}
#: An FSDP gang's floor is this many times a process's: its deciding trial reads less than independent plain ranks
#: at the same batch, and its maximum is the worst of its ranks'. DDP and ZeRO-1 gangs read what independent ranks
#: read and take a process's floor. Figures: docs/measurements.md#the-spreads-floors.
GANG_FACTOR = 2
#: The strategies whose gangs get GANG_FACTOR (``distributed.strategy``).
WIDER_FLOOR_STRATEGIES = frozenset({"fsdp"})
#: The strategies that make a trial a gang of isoprobe's own ranks: they keep the fixed floor.
GANG_STRATEGIES = frozenset({"ddp", "zero1", "fsdp"})
#: Where no trial measured the heap churn (below), a command trial's floor on the CPU backend (``command:``,
#: docs/command.md): its reading is the data segment itself, the very number ``RLIMIT_DATA`` caps, sampled through
#: each step, so its floor covers only what one run's reading cannot show of another run: glibc's heap holding
#: freed blocks for a few steps in some runs and not in others, by address-space layout. This is the largest such
#: hold measured (one input batch of the Lightning script) rounded up, plus the transient
#: (docs/measurements.md#the-spreads-floors).
#: On CUDA a command reads the caching allocator's reserved peak, as isoprobe's own trials do, and keeps their floor.
COMMAND_FLOOR_BYTES = {"cpu": 6 * MIB}
#: On the CPU backend the hold is bounded by what the process's heaps churn within a step
#: (``report.result.Trial.heap_churn_bytes``): only blocks a step frees can be held into the next, and blocks of
#: 128 KiB and more (every tensor of any size: the trials' ``MALLOC_MMAP_THRESHOLD_``) are mmapped and given back
#: exactly. So where the probe's fitting trials measured the churn, the floor of one process (or of a command's
#: processes) is the most of it plus a margin (``churn_margin``), whatever the capacity (the churns measured, and
#: how the answers at that floor held in independent long runs: docs/measurements.md#the-spreads-floors). A gang's
#: ranks keep the fixed floor (FSDP's offset is not the heap's), and ``FLOOR_BYTES`` stays the floor of a process
#: no trial measured (one step only, not glibc, CUDA).
#:
#: This is a command's margin: what one reading cannot show of another beyond the heap's hold, a reading moving
#: between fresh processes; a command's transient between two samples 1 ms apart is smaller. Checked by the five
#: scripts' own 30-step runs at their answers (figures: docs/measurements.md#the-spreads-floors).
CHURN_MARGIN_BYTES = 1 * MIB
#: One process of isoprobe's own: its readings (VmPeak, no sampling gap) move by half a MiB between fresh
#: processes, and its peak can still rise late by a MiB that no heap churn shows (an arena of Python's small-object
#: allocator, which is mmapped). The two together (figures: docs/measurements.md#the-spreads-floors).
OWN_CHURN_MARGIN_BYTES = 3 * MIB // 2


@dataclass(frozen=True)
class Spread:
    """The spread a probe applies, and where it comes from."""

    floor_bytes: int
    observed_bytes: int | None  # None: no batch ran in two fresh processes that could be compared

    @property
    def bytes(self) -> int:
        return max(self.floor_bytes, self.observed_bytes or 0)


def floor_bytes(
    backend: str, capacity: int, strategy: str = "none", command: bool = False, heap_churns: Sequence[int] = ()
) -> int:
    """The backend's floor for a capacity, per process or per rank of a gang of ``strategy``. On the CPU backend,
    for one process or a command's processes whose fitting trials measured their heap churn (``heap_churns``): the
    most of it plus ``churn_margin``; a command's without it, ``COMMAND_FLOOR_BYTES``."""
    if heap_churns and churn_sets_floor(backend, strategy, command):
        return max(heap_churns) + churn_margin(command)
    if command and backend in COMMAND_FLOOR_BYTES:
        return COMMAND_FLOOR_BYTES[backend]
    single = max(FLOOR_BYTES.get(backend, FLOOR_BYTES["cuda"]), int(FLOOR_FRACTION.get(backend, 0.0) * capacity))
    return single * GANG_FACTOR if strategy in WIDER_FLOOR_STRATEGIES else single


def churn_sets_floor(backend: str, strategy: str, command: bool) -> bool:
    """Whether a measured heap churn sets the floor: on the CPU backend, for one process or a command's processes
    (a gang's ranks keep the fixed floor)."""
    return backend == "cpu" and (command or strategy not in GANG_STRATEGIES)


def churn_margin(command: bool) -> int:
    """What the floor adds above a measured heap churn: a command's processes' or one process's of isoprobe's own."""
    return CHURN_MARGIN_BYTES if command else OWN_CHURN_MARGIN_BYTES


def least_floor_bytes(
    backend: str,
    capacity: int,
    strategy: str = "none",
    command: bool = False,
    heap_churns: Sequence[int] = (),
    override: int | None = None,
) -> int:
    """The least floor the probe can have once one more trial has fit: what a trial's stop at the margin
    (``report.steady.past_the_margin``) may use before that trial has measured its own heap churn. A floor from
    the churn only grows with more trials; where none measured it yet, the next one may read none at all."""
    if override is not None:
        return override
    if churn_sets_floor(backend, strategy, command):
        return max(heap_churns, default=0) + churn_margin(command)
    return floor_bytes(backend, capacity, strategy, command, heap_churns)


#: A churn or swing read at a batch below this fraction of the batch it would judge does not set that batch's floor.
NEAR_FRACTION = 0.5


def near(readings: list[tuple[int, int]], batch: int | None) -> list[int]:
    """The readings (``(batch, bytes)``: a trial's heap churn or swing) that may set the floor of ``batch``: those
    read at half of it or more (``NEAR_FRACTION``); all of them where ``batch`` is None.

    Why: a step's heap churn comes from blocks under the mmap threshold (128 KiB), which only a small batch's
    tensors are (a batch of 2's activations), and at the edge the same tensors are mmapped and given back exactly.
    The torchrun DDP script's trial at 2 churned 6.9-7.1 MiB, every trial from 4 to 30 churned 0.5-0.9 MiB, and
    that one reading set an 8 MiB floor at 30, whose 6.7-7.5 MiB free then read as marginal, where the script's
    own 30 trains every time (issue 46). A reading at half the batch or more still sees the heap's kind of churn
    at the edge (a sequence model's per-step state), and never less of it than the edge: its tensors are smaller.
    """
    if batch is None:
        return [value for _, value in readings]
    return [value for at, value in readings if at >= NEAR_FRACTION * batch]


def observed_bytes(runs: Sequence[Sequence[int]]) -> int | None:
    """The most two fresh runs of one batch differed in their running peak after the same step.

    ``runs``: each run's per-step running peaks (in the capacity's units). None with fewer than two runs
    that share a step.
    """
    found: int | None = None
    for i, first in enumerate(runs):
        for second in runs[i + 1 :]:
            shared = min(len(first), len(second))
            if shared:
                gap = max(abs(a - b) for a, b in zip(first[:shared], second[:shared], strict=True))
                found = gap if found is None else max(found, gap)
    return found


def spread_for(
    backend: str,
    capacity: int,
    same_batch_runs: Sequence[Sequence[Sequence[int]]] = (),
    override: int | None = None,
    strategy: str = "none",
    command: bool = False,
    swings: Sequence[int] = (),
    heap_churns: Sequence[int] = (),
    least: bool = False,
) -> Spread:
    """The spread for a probe on ``backend``: ``same_batch_runs`` holds, per batch that ran more than once,
    each run's per-step peaks; ``override`` (search.edge_spread as bytes) replaces the floor; ``strategy``: the
    gang's (``distributed.strategy``), "none" for one process or a command's own ranks; ``command``: the
    probe runs a command (``spec.command``); ``swings``: the trials' ``budget_swing_bytes``; ``heap_churns``:
    the fitting trials' ``heap_churn_bytes`` (the floor of one process or a command's, on the CPU backend);
    ``least``: the least spread the probe can have after one more trial (``least_floor_bytes``)."""
    floor = floor_bytes(backend, capacity, strategy, command, heap_churns) if override is None else override
    if least:
        floor = least_floor_bytes(backend, capacity, strategy, command, heap_churns, override)
    observed = [gap for runs in same_batch_runs if (gap := observed_bytes(runs)) is not None]
    observed += swings
    return Spread(floor, max(observed) if observed else None)


def clears(steady_peak: int, capacity: int, spread: int) -> bool:
    """Whether a steady peak leaves more than the spread free below the capacity."""
    return capacity - steady_peak > spread


def samples_to_clear(free: int, spread: int, per_sample: float | None) -> int:
    """How many samples below a marginal batch (``free`` bytes left at its steady peak) the first batch that
    clears ``spread`` should lie (at least 1)."""
    if not per_sample or per_sample <= 0:
        return 1
    return max(1, math.floor((spread - free) / per_sample) + 1)
