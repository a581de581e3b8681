"""The child's own memory, read from /proc/self: what a CPU trial's peaks are measured with.

Its own module because both the trial (its peaks) and the environment check
(the import baseline) read it, and neither needs torch for it.

Shared memory matters here because the CPU cap does not see it: RLIMIT_DATA
counts private writable mappings only, so memory a model maps MAP_SHARED
(``mmap.mmap(-1, n)``, shared-memory tensors, what DataLoader workers hand
over) is allocated past the cap without any error; VmHWM counts it, VmData does
not. So the resident peak already includes shared memory, and the budget's peak
below adds the shared mappings to the data segment, so that both readings show
memory the cap let through and the parent can refuse a 'fits' that used it
(``pipeline.plausibility``). The measurement: docs/measurements.md, "Moved from code".

isoprobe's own modules are measured and credited in ``child.own_modules``; every
reading here leaves them out. glibc's heap churn: ``child.core.heap_churn``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from isoprobe.child.own_modules import own
from isoprobe.system.data_cap import budget_of
from isoprobe.system.proc_memory import shared_writable_bytes, status_bytes

if TYPE_CHECKING:
    from isoprobe.protocol.messages import MemoryReading


def cpu_memory() -> MemoryReading:
    """The readings of /proc/self/status, less isoprobe's own modules (``Own``); ``peak_data`` estimates the data
    segment's peak (see ``cpu_readings``)."""
    from isoprobe.protocol.messages import MemoryReading  # here: this module is read before isoprobe's own are imported

    readings = status_bytes("VmHWM", "VmRSS", "VmData", "VmPeak", "VmSize")
    peak_data = None
    if None not in (readings["VmPeak"], readings["VmSize"], readings["VmData"]):
        peak_data = readings["VmPeak"] - (readings["VmSize"] - readings["VmData"]) - own().data
    return MemoryReading(
        peak_rss=_less(readings["VmHWM"], own().rss),
        rss=_less(readings["VmRSS"], own().rss),
        data=_less(readings["VmData"], own().data),
        peak_data=peak_data,
    )


def _less(value: int | None, own_part: int) -> int | None:
    return None if value is None else value - own_part


def data_cap() -> int | None:
    """This process's RLIMIT_DATA (soft) less its own modules' credit, in bytes (the budget), or None without one."""
    return budget_of(own().data)


def budget_peak(peak_data: int | None, cap: int | None, shared: int) -> int | None:
    """The peak in the budget's units: the data segment's (never above the cap), plus the shared mappings.

    ``peak_data`` (VmPeak minus the address space that is not data, now) can
    overshoot the data segment's real peak: a new malloc arena briefly reserves
    more address space than it keeps (docs/measurements.md, "Moved from code").
    The kernel holds the data segment to the cap, so the cap is the estimate's
    ceiling: that is knowledge, not rounding. Shared mappings are what the cap
    does not hold; they are added on top, so only they can put this above the
    cap. (A shared mapping still there now is not in ``peak_data``: it is in
    VmSize as well as VmPeak.)
    """
    if peak_data is None:
        return None
    data = peak_data if cap is None else min(peak_data, cap)
    return data + shared


def cpu_readings() -> dict[str, int | None]:
    """A CPU trial's peaks: resident (what people know) and the budget's units (what the cap counts).

    RLIMIT_DATA caps the data segment, which runs a near-constant amount above
    the resident set (mapped but untouched pages), so the resident peak is not in
    the budget's units. Linux keeps no high-water mark of the data segment, but
    it keeps one of the whole address space (VmPeak); the part of the address
    space that is not data (code, read-only mappings, the stack) is settled once
    the imports are done, so VmPeak minus that part estimates the data peak
    (checked against ResNet50's edge: docs/measurements.md, "Moved from code"). ``base_bytes`` is the data
    segment after the steps, with the batch's activations freed.

    Writable shared mappings count as data in both (``budget_peak``, and the
    module's docstring): the cap cannot stop them, so they are measured instead,
    and a trial whose budget peak is above its budget does not fit. Resident
    (``peak_bytes``, VmHWM) counts the shared pages the child touched, also those
    unmapped before the end.

    Keyed by the ``TrialResult`` fields they fill.
    """
    shared = shared_writable_bytes()
    memory = cpu_memory()
    base = None if memory.data is None else memory.data + shared
    return {
        "peak_bytes": memory.peak_rss,
        "budget_peak_bytes": budget_peak(memory.peak_data, data_cap(), shared),
        "base_bytes": base,
        "file_resident_bytes": status_bytes("RssFile")["RssFile"],
    }
