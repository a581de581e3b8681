"""The child's own memory, read from /proc/self: what a CPU trial's peaks are measured with.

Its own module because both the trial (its peaks) and the environment check
(the import baseline) read it, and neither needs torch for it.

Shared memory matters here because the CPU cap does not see it: RLIMIT_DATA
counts private writable mappings only, so memory a model maps MAP_SHARED
(``mmap.mmap(-1, n)``, shared-memory tensors, what DataLoader workers hand
over) is allocated past the cap without any error. Measured here with a
touched 512 MiB ``mmap.mmap(-1, n)`` under a 256 MiB RLIMIT_DATA: the mapping
succeeds; VmRSS, VmHWM and smaps_rollup's Rss count it (RssShmem 512 MiB);
VmData does not; VmPeak and VmSize do. So the resident peak (VmHWM) already
includes shared memory, and the budget's peak below adds the shared mappings
to the data segment, so that both readings show memory the cap let through
and the parent can refuse a 'fits' that used it (``pipeline.plausibility``).

isoprobe's own modules (pydantic, the protocol, the spec's models, this
package) sit in the trial's process but not in the user's: measured 6.3 MiB
of data segment after torch, which moved small-cnn's edge two samples below a
plain process's. ``import_own`` measures them in each process, imported after
torch so that only what torch would not have imported anyway is counted;
so is the request it reads (its pydantic spec: 0.26 MiB); ``credit_own``
raises the cap by that much before the user's code runs, and every
reading here leaves it out: the cap and the peaks are a plain process's.
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from isoprobe.system.data_cap import budget_of, credit
from isoprobe.system.proc_memory import shared_writable_bytes, status_bytes

if TYPE_CHECKING:
    from isoprobe.protocol.messages import MemoryReading


@dataclass(frozen=True)
class Own:
    """What isoprobe's own modules add to this process: data segment (what the cap counts) and resident."""

    data: int = 0
    rss: int = 0


#: This process's own cost, once measured (``import_own``); a fork inherits it with the memory it describes.
_own = Own()


def import_own(load: Callable[[], object]) -> Own:
    """Run ``load`` (imports of isoprobe's own modules), add what it grew this process by to ``own()``; return that.

    Counted only where torch was imported first: before it, the growth would
    include the standard library modules torch imports too (measured: 15 MiB
    before torch against 6.3 MiB after), and crediting that would let a trial
    fit what a plain process cannot. Without torch (a request run by hand with
    no preload) nothing is counted. A negative growth (memory freed) counts 0.
    """
    global _own
    counted = "torch" in sys.modules
    before = status_bytes("VmData", "VmRSS")
    load()
    after = status_bytes("VmData", "VmRSS")
    if counted and None not in (*before.values(), *after.values()):
        _own = Own(data=_own.data + max(0, after["VmData"] - before["VmData"]),
                   rss=_own.rss + max(0, after["VmRSS"] - before["VmRSS"]))
    return _own


def own() -> Own:
    return _own


def credit_own() -> None:
    """Raise this process's cap (the budget, set by the parent before exec or by ``set_data_cap``) by what isoprobe
    holds of its own, and make it final: called once, with the request read, before any user code.

    The hard limit is ``OWN_ALLOWANCE_BYTES`` above the budget; the new cap is
    the budget plus the measured cost, at most the hard limit, and both limits
    are set to it, so nothing run later (the user's model) can raise it.
    Without a cap there is nothing to credit.
    """
    credit(_own.data)


def cpu_memory() -> MemoryReading:
    """The readings of /proc/self/status, less isoprobe's own modules (``Own``); ``peak_data`` estimates the data
    segment's peak (see ``cpu_readings``)."""
    from isoprobe.protocol.messages import MemoryReading  # here: this module is read before isoprobe's own are imported

    readings = status_bytes("VmHWM", "VmRSS", "VmData", "VmPeak", "VmSize")
    peak_data = None
    if None not in (readings["VmPeak"], readings["VmSize"], readings["VmData"]):
        peak_data = readings["VmPeak"] - (readings["VmSize"] - readings["VmData"]) - _own.data
    return MemoryReading(peak_rss=_less(readings["VmHWM"], _own.rss), rss=_less(readings["VmRSS"], _own.rss),
                         data=_less(readings["VmData"], _own.data), peak_data=peak_data)


def _less(value: int | None, own_part: int) -> int | None:
    return None if value is None else value - own_part


def data_cap() -> int | None:
    """This process's RLIMIT_DATA (soft) less its own modules' credit, in bytes (the budget), or None without one."""
    return budget_of(_own.data)


def budget_peak(peak_data: int | None, cap: int | None, shared: int) -> int | None:
    """The peak in the budget's units: the data segment's (never above the cap), plus the shared mappings.

    ``peak_data`` (VmPeak minus the address space that is not data, now) can
    overshoot: measured here, 1555 MiB for a trial whose data segment, polled
    every 0.5 ms, never passed 1491 MiB under a 1536 MiB cap, because a new
    malloc arena briefly reserves 64 MiB more address space than it keeps. The
    kernel holds the data segment to the cap, so the cap is the estimate's
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

    RLIMIT_DATA caps the data segment, which runs a near-constant ~200 MiB above
    the resident set (mapped but untouched pages), so the resident peak is not in
    the budget's units. Linux keeps no high-water mark of the data segment, but
    it keeps one of the whole address space (VmPeak); the part of the address
    space that is not data (code, read-only mappings, the stack) is settled once
    the imports are done, so VmPeak minus that part estimates the data peak.
    Measured on ResNet50 under 3 GiB: the estimate puts batch 21 at 2.97 GiB and
    predicts 22 above 3 GiB, where the edge is. ``base_bytes`` is the data
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
    return {"peak_bytes": memory.peak_rss, "budget_peak_bytes": budget_peak(memory.peak_data, data_cap(), shared),
            "base_bytes": base, "file_resident_bytes": status_bytes("RssFile")["RssFile"]}


#: malloc_info's totals over every arena: the heaps' size now and the most they ever reached.
_SYSTEM_TOTAL = re.compile(rb'<system type="(current|max)" size="(\d+)"/>')


def heap_churn(info: bytes | None = None) -> int | None:
    """How far glibc's heaps reached above what they hold now, in bytes: read after a step, what that step (or an
    earlier one) grew and gave back of them. None where malloc_info cannot be read (not glibc).

    Why: blocks under the mmap threshold (``MALLOC_MMAP_THRESHOLD_``, set on every CPU trial) live in the heaps,
    and blocks a step frees can stay held into the next step in some address-space layouts and not in others,
    so another run of the same batch can need up to this much more than the trial read (the floor of the spread,
    ``search.margin``; a command's trial measures the same from outside, ``child.command``). Tensors of 128 KiB
    and more are mmapped and freed exactly, so a model whose samples are large tensors churns nothing here.

    Read from ``malloc_info`` (glibc 2.10+): per arena it keeps the size obtained from the system and the most it
    ever was, and its closing totals sum them over the arenas. The most is all-time (the fork server's history
    included), so the difference is never below a step's own churn, only above it: a floor from it errs towards
    batches that fit. ``info``: the XML, for tests.
    """
    if info is None:
        info = _malloc_info()
        if info is None:
            return None
    totals = dict(_SYSTEM_TOTAL.findall(info)[-2:])  # the closing totals come last
    if set(totals) != {b"current", b"max"}:
        return None
    return max(0, int(totals[b"max"]) - int(totals[b"current"]))


def _malloc_info() -> bytes | None:
    """glibc's ``malloc_info`` XML, written into an in-memory stream (a few KiB, freed at once)."""
    try:
        libc = ctypes.CDLL(None)
        open_memstream, malloc_info = libc.open_memstream, libc.malloc_info
    except (OSError, AttributeError):
        return None
    open_memstream.restype = ctypes.c_void_p
    open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    if not stream:
        return None
    try:
        failed = malloc_info(0, stream) != 0
    finally:
        libc.fclose(stream)
    try:
        return None if failed else ctypes.string_at(buffer, size.value)
    finally:
        libc.free(buffer)
