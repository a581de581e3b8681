"""How much of the CPU a process tree got while it wanted it: what tells a busy node from a slow or hung trial.

A trial's timeout is wall time. On a node whose cores other people's processes keep busy (a shared login node, a
Slurm node running other jobs), a trial that would finish in 100 s alone may get a third of a core and run past
it: its timeout then says nothing about the batch (issue 55: with the machine at load 20-30 on 2 cores, the
default command probe timed out twice at batch 2 and answered nothing). The kernel says which it was: each
thread's ``/proc/PID/task/TID/schedstat`` holds the nanoseconds it ran on a CPU and the nanoseconds it waited,
runnable, for one. A hung trial (a deadlock, a wait on a lost peer) sleeps: it neither runs nor waits. A slow
trial on a quiet node runs and hardly waits. A starved trial waits for a CPU about as long as it runs, or longer.

Standard library only; Linux (elsewhere every reading is zero and nothing is ever called starved).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from isoprobe.system.primitives import descendants

#: Starved: the tree waited, runnable, at least this share of the time it wanted a CPU (ran or waited). Alone on
#: a core a process waits for next to nothing (the kernel's own threads, the page cache's writers); one busy loop
#: per core beside it makes it wait about half the time; six loops on two cores, about 70 % (measured here, see
#: docs/command.md, "A busy node").
STARVED_SHARE = 0.5


@dataclass(frozen=True)
class CpuTime:
    """Nanoseconds a process tree's live threads ran on a CPU and waited, runnable, for one (since each began)."""

    running_ns: int = 0
    waiting_ns: int = 0

    def since(self, earlier: CpuTime) -> CpuTime:
        """The time between ``earlier`` and this reading (threads that ended meanwhile are not counted in either)."""
        return CpuTime(max(0, self.running_ns - earlier.running_ns), max(0, self.waiting_ns - earlier.waiting_ns))

    @property
    def waiting_share(self) -> float:
        """The share of the time it wanted a CPU that it waited for one (0 when it wanted none)."""
        wanted = self.running_ns + self.waiting_ns
        return self.waiting_ns / wanted if wanted else 0.0


def tree_cpu_time(root: int) -> CpuTime:
    """What ``root`` and every process below it (by ancestry, whatever its session) ran and waited, summed over
    their live threads."""
    running = waiting = 0
    for pid in [root, *(pid for pid, state in descendants(root) if state not in ("Z", "X"))]:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as handle:
                    ran, waited = handle.read().split()[:2]
                running += int(ran)
                waiting += int(waited)
            except (OSError, ValueError):
                continue  # ended meanwhile
    return CpuTime(running, waiting)


#: The most one reading may extend a deadline, in multiples of the wall time read: a share of 80 % waiting.
MOST_EXTENSION = 4.0


def starved_seconds(used: CpuTime, wall_seconds: float, share: float = STARVED_SHARE) -> float:
    """How much longer a tree that used ``used`` over ``wall_seconds`` needs to have had the CPU it wanted, if it
    was starved (it waited at least ``share`` of the time it wanted a CPU, and wanted one a tenth of the wall time
    at least: a sleeping, hung tree wants none); else 0.

    Waiting a share ``s`` of the time, it got ``1 - s`` of what it would have had alone: ``wall_seconds`` of
    its time on a quiet node take ``wall_seconds / (1 - s)`` here, so it is owed ``wall_seconds * s / (1 - s)``
    (at most ``MOST_EXTENSION`` times ``wall_seconds``). Per thread: several threads waiting at once count once
    each, as they would have run at once."""
    wanted = (used.running_ns + used.waiting_ns) / 1e9
    s = used.waiting_share
    if s < share or wanted < 0.1 * wall_seconds or wall_seconds <= 0:
        return 0.0
    return min(MOST_EXTENSION * wall_seconds, wall_seconds * s / (1.0 - s) if s < 1.0 else float("inf"))
