"""The CPU trial's budget peak counts the shared memory the cap lets through (``child/core/memory.py``).

RLIMIT_DATA does not count MAP_SHARED mappings, so the child adds them to its
data segment's peak; the parent then refuses a 'fits' above the budget
(tests/unit/test_plausibility.py). No child process and no torch here: the
readings are pure functions over literal /proc text, plus this test process's
own /proc for a mapping it makes itself.
"""

from __future__ import annotations

import mmap

from isoprobe.child.core.memory import budget_peak
from isoprobe.system.proc_memory import shared_writable_bytes

MiB = 1024**2

#: /proc/self/maps of a child holding a 64 MiB anonymous MAP_SHARED mapping, a memfd, a read-only
#: shared locale cache, private data and code.
MAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 fe:00 123 /usr/bin/python3.11
7f0000000000-7f0004000000 rw-s 00000000 00:01 4096 /dev/zero (deleted)
7f0004000000-7f0004100000 rw-s 00000000 00:01 4097 /memfd:torch-shm (deleted)
7f0005000000-7f0005007000 r--s 00000000 fe:00 338846 /usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache
7f0006000000-7f000a000000 rw-p 00000000 00:00 0
7f000a000000-7f000a100000 r-xp 00000000 fe:00 99 /usr/lib/libtorch_cpu.so
7f000b000000-7f000b001000 ---p 00000000 00:00 0
"""


def test_writable_shared_mappings_are_summed_and_nothing_else():
    assert shared_writable_bytes(MAPS) == 64 * MiB + 1 * MiB  # not the read-only cache, not private data


def test_unreadable_or_odd_lines_count_nothing():
    assert shared_writable_bytes("") == 0
    assert shared_writable_bytes("garbage\n7f00-zz rw-s 0 0 0\n\n") == 0


def test_a_shared_mapping_of_this_process_is_seen():
    before = shared_writable_bytes()
    size = 8 * MiB
    mapping = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS, as tests/support/hostile.py:memory_hog maps it
    try:
        assert shared_writable_bytes() - before == size
    finally:
        mapping.close()
    assert shared_writable_bytes() == before


def test_the_data_part_never_exceeds_the_cap_and_the_shared_part_comes_on_top():
    cap = 1536 * MiB
    # Measured overshoot of the VmPeak estimate (a new malloc arena's transient reservation): 1555 MiB
    # under a 1536 MiB cap that the kernel enforces. Without shared memory the budget peak is the cap at most.
    assert budget_peak(1555 * MiB, cap, 0) == cap
    assert budget_peak(1400 * MiB, cap, 0) == 1400 * MiB
    # Shared mappings are what the cap does not hold: only they can put the budget peak above it.
    assert budget_peak(1555 * MiB, cap, 624 * MiB) == cap + 624 * MiB
    assert budget_peak(1000 * MiB, cap, 624 * MiB) == 1624 * MiB


def test_without_a_cap_or_a_reading():
    assert budget_peak(5000 * MiB, None, 10 * MiB) == 5010 * MiB
    assert budget_peak(None, 1536 * MiB, 10 * MiB) is None
