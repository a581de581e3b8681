"""A busy node told from a slow or hung trial (issue 55): the CPU a process tree got while it wanted it, read from
the kernel's schedstat, and the time a starved trial is owed on its timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from isoprobe.executors.rounds import MOST_BUSY_TIMEOUTS, BusyClock
from isoprobe.system.cpu_share import MOST_EXTENSION, CpuTime, starved_seconds, tree_cpu_time

SECOND = 10**9
BUSY_LOOP = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def test_a_tree_that_waited_most_of_the_time_it_wanted_a_cpu_is_owed_the_time_it_would_have_had_alone():
    # 10 s of wall time, 2.5 s on a CPU, 7.5 s waiting for one: a quarter of a core, as beside 3 busy loops
    owed = starved_seconds(CpuTime(int(2.5 * SECOND), int(7.5 * SECOND)), 10.0)
    assert owed == pytest.approx(30.0)  # 10 s here is 2.5 s alone: 30 s more give it the 10 s it had on a quiet node


def test_a_quiet_slow_or_a_hung_tree_is_owed_nothing():
    assert starved_seconds(CpuTime(10 * SECOND, int(0.2 * SECOND)), 10.0) == 0  # ran alone: slow, not starved
    assert starved_seconds(CpuTime(int(0.01 * SECOND), int(0.02 * SECOND)), 10.0) == 0  # slept: hung, not starved
    assert starved_seconds(CpuTime(0, 0), 10.0) == 0


def test_one_reading_owes_at_most_a_bounded_multiple_of_its_wall_time():
    assert starved_seconds(CpuTime(1, 100 * SECOND), 10.0) == MOST_EXTENSION * 10.0


def _pinned(code: str) -> subprocess.Popen:
    """A process on CPU 0 only, in a session of its own (an autogroup of its own: another user's process)."""
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {0}))


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs the kernel's schedstat")
def test_the_kernel_says_a_process_beside_busy_loops_on_its_cpu_waited_and_a_sleeping_one_did_not():
    loops = [_pinned(BUSY_LOOP.format(seconds=4)) for _ in range(3)]
    trial = _pinned(BUSY_LOOP.format(seconds=4))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    try:
        time.sleep(0.3)
        before, asleep = tree_cpu_time(trial.pid), tree_cpu_time(sleeper.pid)
        began = time.monotonic()
        time.sleep(2.0)
        used = tree_cpu_time(trial.pid).since(before)
        wall = time.monotonic() - began
        assert used.waiting_share > 0.5, used  # four busy processes on one CPU: a quarter each
        assert starved_seconds(used, wall) > wall
        slept = tree_cpu_time(sleeper.pid).since(asleep)
        assert starved_seconds(slept, wall) == 0
        clock = BusyClock(os.getpid(), time.monotonic(), 10.0)  # this process: a test runner, not starved
        assert clock.owed(time.monotonic() + 2.0) == 0 and clock.extended == 0
    finally:
        for process in (*loops, trial, sleeper):
            process.kill()
            process.wait()


def test_a_busy_clock_stops_extending_at_its_bound(monkeypatch):
    readings = iter([CpuTime(0, 0), CpuTime(SECOND, 9 * SECOND), CpuTime(2 * SECOND, 18 * SECOND),
                     CpuTime(3 * SECOND, 27 * SECOND)] + [CpuTime(3 * SECOND + n, 27 * SECOND + 9 * n)
                                                           for n in range(1, 40)])
    monkeypatch.setattr("isoprobe.system.cpu_share.tree_cpu_time", lambda pid: next(readings))
    clock = BusyClock(1, 0.0, 10.0)
    total, now = 0.0, 10.0
    while (owed := clock.owed(now)) > 0:
        total += owed
        now += owed
    assert total == pytest.approx(MOST_BUSY_TIMEOUTS * 10.0)
    assert clock.busy_at_end
