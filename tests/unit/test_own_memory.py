"""Issue 25, class 6: a CPU trial credits what isoprobe's own modules take in its process, and only that.

The cap and the readings must be a plain process's: the child measures its own
modules' data segment after torch (``child.own_modules.import_own``), raises its cap
by that much and leaves it out of every reading. Caps are set in subprocesses
here: this process's own limits are not the tests' to change.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

import pytest

from isoprobe.child import own_modules

from isoprobe.child.core import memory
from isoprobe.child.main import started_line
from isoprobe.executors.processes import prepare_child
from isoprobe.protocol.messages import Started, parse_events
from isoprobe.system.data_cap import OWN_ALLOWANCE_BYTES

MiB = 1024**2
GiB = 1024**3


def python(code: str, *args: str, **kwargs) -> str:
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, **kwargs)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_child_entry_imports_nothing_of_its_own_before_the_preload():
    """pydantic, the protocol, the spec: imported before torch they could not be measured apart from it."""
    loaded = python("import sys, isoprobe.child.main; "
                    "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('isoprobe', 'pydantic'))))")
    assert set(loaded.split()) <= {"isoprobe", "isoprobe.child", "isoprobe.child.main", "isoprobe.child.core.memory", "isoprobe.child.own_modules",
                                   "isoprobe.child.events", "isoprobe.child.request", "isoprobe.child.source_only",
                                   "isoprobe.child.preload",  # the preload's import itself: standard library only
                                   "isoprobe.protocol",
                                   "isoprobe.protocol.wiring",
                                   "isoprobe.system", "isoprobe.system.data_cap", "isoprobe.system.proc_memory",
                                   "isoprobe.system.primitives"}, loaded  # standard library only


def test_the_started_line_written_by_hand_is_the_protocols_started_event():
    [event] = parse_events(started_line(4242))
    assert isinstance(event, Started) and event.pid == 4242


def grow(kept: list, size: int) -> None:
    """Add ``size`` bytes to the data segment, resident: a private anonymous mapping, written (glibc's malloc
    could serve a large block from memory it kept, and its mmap threshold moves as blocks are freed)."""
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for page in range(0, size, mmap.PAGESIZE):
        block[page] = 1
    kept.append(block)


@pytest.fixture
def fresh_own(monkeypatch):
    monkeypatch.setattr(own_modules, "_own", own_modules.Own())


def test_what_the_own_modules_allocate_after_torch_is_measured(fresh_own, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", object()))
    kept = []
    own = own_modules.import_own(lambda: grow(kept, 16 * MiB))  # touched: resident as well as data
    assert 16 * MiB <= own.data < 17 * MiB, own
    assert 15 * MiB <= own.rss < 17 * MiB, own
    assert own_modules.own() == own


def test_nothing_is_credited_when_torch_was_not_imported_first(fresh_own, monkeypatch):
    """Before torch, the growth includes what torch would import anyway: crediting it overshoots the truth."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    kept = []
    assert own_modules.import_own(lambda: grow(kept, 16 * MiB)) == own_modules.Own()


def test_the_readings_and_the_cap_leave_the_own_modules_out(monkeypatch):
    status = {"VmHWM": 900 * MiB, "VmRSS": 800 * MiB, "VmData": 1000 * MiB, "VmPeak": 3000 * MiB,
              "VmSize": 2500 * MiB}
    monkeypatch.setattr(memory, "status_bytes", lambda *keys: {k: status.get(k) for k in keys})
    monkeypatch.setattr("resource.getrlimit", lambda which: (1206 * MiB, 1206 * MiB))
    monkeypatch.setattr(own_modules, "_own", own_modules.Own(data=6 * MiB, rss=5 * MiB))
    reading = memory.cpu_memory()
    assert (reading.peak_rss, reading.rss, reading.data, reading.peak_data) == (
        895 * MiB, 795 * MiB, 994 * MiB, 1494 * MiB)
    assert memory.data_cap() == 1200 * MiB  # the budget: the cap less the credit


CREDIT = """
import resource, sys
from isoprobe.child import own_modules
soft, hard = (int(v) for v in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
own_modules._own = own_modules.Own(data=int(sys.argv[3]))
own_modules.credit_own()
print(*resource.getrlimit(resource.RLIMIT_DATA))
"""


@pytest.mark.parametrize(("hard", "own", "cap"), [
    (GiB + OWN_ALLOWANCE_BYTES, 6 * MiB, GiB + 6 * MiB),  # the budget plus what was measured
    (GiB + OWN_ALLOWANCE_BYTES, GiB, GiB + OWN_ALLOWANCE_BYTES),  # never past the parent's allowance
    (GiB, 6 * MiB, GiB),  # no room given (a cap not set by isoprobe): none taken
])
def test_a_spawned_child_credits_its_own_modules_and_fixes_its_cap(hard, own, cap):
    """Both limits end at the credited cap, so the user's model cannot raise its soft limit afterwards."""
    assert python(CREDIT, str(GiB), str(hard), str(own)).split() == [str(cap), str(cap)]


@pytest.mark.parametrize(("own", "cap"), [(6 * MiB, GiB + 6 * MiB), (GiB, GiB + OWN_ALLOWANCE_BYTES)])
def test_a_forked_trial_is_capped_as_a_spawned_one_then_credits_its_own(own, cap):
    out = python("import resource; from isoprobe.child import own_modules; from isoprobe.system.data_cap import set_data_cap; "
                 f"own_modules._own = own_modules.Own(data={own}); set_data_cap({GiB}); "
                 "print(*resource.getrlimit(resource.RLIMIT_DATA)); own_modules.credit_own(); "
                 "print(*resource.getrlimit(resource.RLIMIT_DATA))")
    assert out.split() == [str(GiB), str(GiB + OWN_ALLOWANCE_BYTES), str(cap), str(cap)]


def test_the_parent_leaves_room_above_the_budget_for_the_credit_and_no_more():
    out = python("import resource; print(*resource.getrlimit(resource.RLIMIT_DATA))",
                 preexec_fn=prepare_child(GiB, os.getpid()))
    assert out.split() == [str(GiB), str(GiB + OWN_ALLOWANCE_BYTES)]


def test_each_measured_import_adds_to_the_own_cost(fresh_own, monkeypatch):
    """The server's code, the environment check's: imported later, counted on top of the trial's modules."""
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", object()))
    kept = []
    first = own_modules.import_own(lambda: grow(kept, 8 * MiB))
    both = own_modules.import_own(lambda: grow(kept, 8 * MiB))
    assert 16 * MiB <= both.data < 18 * MiB and both.data >= first.data + 8 * MiB, (first, both)
