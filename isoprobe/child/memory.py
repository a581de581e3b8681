"""The child's own memory, read from /proc/self/status: what a CPU trial's peaks are measured with.

Its own module because both the trial (its peaks) and the environment check
(the import baseline) read it, and neither needs torch for it.
"""

from __future__ import annotations

from isoprobe.protocol import MemoryReading


def _proc_status_bytes(*keys: str) -> dict[str, int | None]:
    """VmHWM, VmRSS, VmData... from /proc/self/status, in bytes (None where absent)."""
    values: dict[str, int | None] = {key: None for key in keys}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in values:
                    values[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def cpu_memory() -> MemoryReading:
    readings = _proc_status_bytes("VmHWM", "VmRSS", "VmData", "VmPeak", "VmSize")
    peak_data = None
    if None not in (readings["VmPeak"], readings["VmSize"], readings["VmData"]):
        peak_data = readings["VmPeak"] - (readings["VmSize"] - readings["VmData"])
    return MemoryReading(
        peak_rss=readings["VmHWM"], rss=readings["VmRSS"], data=readings["VmData"], peak_data=peak_data
    )


def cpu_readings() -> dict[str, int | None]:
    """A CPU trial's peaks: resident (what people know) and the data segment (what the budget caps).

    RLIMIT_DATA caps the data segment, which runs a near-constant ~200 MiB above
    the resident set (mapped but untouched pages), so the resident peak is not in
    the budget's units. Linux keeps no high-water mark of the data segment, but
    it keeps one of the whole address space (VmPeak); the part of the address
    space that is not data (code, read-only mappings, the stack) is settled once
    the imports are done, so VmPeak minus that part estimates the data peak.
    Measured on ResNet50 under 3 GiB: the estimate puts batch 21 at 2.97 GiB and
    predicts 22 above 3 GiB, where the edge is. ``base_bytes`` is the data
    segment after the steps, with the batch's activations freed.

    Keyed by the ``TrialResult`` fields they fill.
    """
    memory = cpu_memory()
    return {"peak_bytes": memory.peak_rss, "budget_peak_bytes": memory.peak_data, "base_bytes": memory.data}
