"""An own trial's heap churn (``child.core.heap_churn.heap_churn``): what a step grew and gave back of glibc's heaps.

It sets the floor of the spread for one process (``search.margin``): blocks a step frees can be held into the
next step in another run's address-space layout. Read from ``malloc_info``'s closing totals (the heaps' size now
and the most it ever was); literal XML here, and a fresh interpreter that grows and frees its heap for real.
"""

from __future__ import annotations

import subprocess
import sys

from isoprobe.child.core.heap_churn import heap_churn

MiB = 1024**2

#: malloc_info of a process with the main arena and one thread's arena; the closing totals sum them.
INFO = b"""<malloc version="1">
<heap nr="0">
<sizes>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="3" size="4096"/>
<system type="current" size="10485760"/>
<system type="max" size="14680064"/>
<aspace type="total" size="10485760"/>
<aspace type="mprotect" size="10485760"/>
</heap>
<heap nr="1">
<sizes>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="1" size="512"/>
<system type="current" size="135168"/>
<system type="max" size="1183744"/>
<aspace type="total" size="135168"/>
<aspace type="mprotect" size="135168"/>
</heap>
<total type="fast" count="0" size="0"/>
<total type="rest" count="4" size="4608"/>
<total type="mmap" count="2" size="270336"/>
<system type="current" size="10620928"/>
<system type="max" size="15863808"/>
<aspace type="total" size="10620928"/>
<aspace type="mprotect" size="10620928"/>
</malloc>
"""


def test_the_churn_is_the_totals_most_less_their_current_over_every_arena():
    assert heap_churn(INFO) == (14680064 - 10485760) + (1183744 - 135168)


def test_an_unreadable_report_is_no_reading_never_zero():
    assert heap_churn(b"") is None
    assert heap_churn(b'<malloc><system type="current" size="1"/></malloc>') is None


#: A fresh interpreter under the trials' malloc setting: its heap's churn before, then after 4 MiB of 4 KiB blocks
#: (under the mmap threshold: on the heap) were built and freed, as a step builds and frees its small blocks.
STEP = """
import json
from isoprobe.child.core.heap_churn import heap_churn
before = heap_churn()
blocks = [bytearray(4096) for _ in range(1024)]
del blocks
print(json.dumps([before, heap_churn()]))
"""


def test_a_step_that_builds_and_frees_small_blocks_shows_as_churn_and_a_quiet_one_does_not():
    done = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, check=True,
                          env={"MALLOC_MMAP_THRESHOLD_": "131072", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": ":".join(sys.path)})
    before, after = [int(v) for v in done.stdout.strip()[1:-1].split(",")]
    assert before < MiB // 2, before
    assert after - before >= 3 * MiB, (before, after)
