"""glibc's heap churn after a step: how far its heaps reached above what they hold now (``heap_churn``).

Read after every step of a CPU trial (``child.core.step_report``): the floor of the spread (``search.margin``). A
command's trial measures the same from outside (``child.command_trial.tree``).
"""

from __future__ import annotations

import ctypes
import re

#: malloc_info's totals over every arena: the heaps' size now and the most they ever reached.
_SYSTEM_TOTAL = re.compile(rb'<system type="(current|max)" size="(\d+)"/>')


def heap_churn(info: bytes | None = None) -> int | None:
    """How far glibc's heaps reached above what they hold now, in bytes: read after a step, what that step (or an
    earlier one) grew and gave back of them. None where malloc_info cannot be read (not glibc).

    Why: blocks under the mmap threshold (``MALLOC_MMAP_THRESHOLD_``, set on every CPU trial) live in the heaps,
    and blocks a step frees can stay held into the next step in some address-space layouts and not in others,
    so another run of the same batch can need up to this much more than the trial read (the floor of the spread,
    ``search.margin``; a command's trial measures the same from outside, ``child.command_trial.supervisor``). Tensors
    of 128 KiB
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
