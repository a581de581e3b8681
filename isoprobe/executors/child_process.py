"""One started child of the local executor: its record, and what the parent does with it until it is gone.

``LocalExecutor`` starts a child in one of two ways (spawned as ``python -m
isoprobe.child``, or forked from the fork server, itself a spawned child), and
either way records it as one ``StartedChild``: a keeper whose exit status is the
child's, the lifeline's write end, and the files the child writes. What the
parent then does with a child is the same whichever way it started, and lives
here: wait for its imports (``await_warm``), hand a spawned child its request
(``deliver``; a fork gets its request in its order), wait for its end from
delivery on (``wait_for_end``, which a gang's supervisor, ``executors.gang``,
uses for its ranks too), and stop it (``stop_child``). Which child serves which
request (a spare, one started on demand, a fork) is ``LocalExecutor``'s job; how
a process is prepared before it runs (its environment, its cap, its deadlines),
``processes``'; how it and everything it started is ended, ``keeper``'s.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from isoprobe.errors import ProbeError
from isoprobe.executors import Conditions
from isoprobe.executors.fork_server_channel import ForkedProcess
from isoprobe.executors.processes import VERDICT_EXIT_GRACE_SECONDS, write_atomically
from isoprobe.protocol.messages import IMPORT_LINE, Inspected, Started, TrialResult, Warm, last_of, read_events
from isoprobe.system.primitives import lift_idle_policy, sigkill_below

#: How often the parent looks at a child's events while it imports (the cost of a look: one small read).
_POLL_SECONDS = 0.01
#: How long a keeper may take, once its lifeline is closed, to kill and reap its tree and exit. A torch
#: process unmaps gigabytes as it dies; only at idle priority (which the keeper lifts) did that take more
#: than 30 s (measured: docs/measurements.md). Past this, the keeper is taken as stopped or stuck.
STOP_SECONDS = 60.0


@dataclass
class StartedChild:
    """A keeper (and the child under it) and the files the child writes; ``warm``: started ahead, as a spare."""

    process: subprocess.Popen | ForkedProcess  # the keeper: its exit status is the child's
    lifeline_write: int
    events_path: Path
    stderr_path: Path
    conditions: Conditions
    warm: bool
    forked: bool = False  # forked from the fork server (``warm`` too: it imported nothing itself)
    #: How many ``warm`` reports mean it has imported all it was asked to: one more for each ``IMPORT_LINE``
    #: it was sent (``extend_imports``).
    warm_reports: int = 1


def await_warm(child: StartedChild, timeout: float) -> bool | None:
    """Wait until the child has imported: True once it reported ``warm``, False if it ended first, None at timeout.

    A spare still importing when its turn comes is on the critical path from
    now on: its idle priority is lifted (again at every look, since the child
    lowers it itself once it starts importing).
    """
    deadline = time.monotonic() + timeout
    while True:
        events = read_events(child.events_path)
        if sum(isinstance(event, Warm) for event in events) >= child.warm_reports:
            return True
        if child.process.poll() is not None:
            return False
        started = last_of(events, Started) if child.warm else None
        if started is not None:
            lift_idle_policy(started.pid)
        if time.monotonic() >= deadline:
            return None
        time.sleep(_POLL_SECONDS)


def modules_file(stem: Path, modules: tuple[str, ...]) -> Path:
    """``modules``, one a line, in a file beside a child's others (``IMPORT_LINE``, ``ImportOrder`` name it)."""
    path = stem.with_suffix(".imports")
    write_atomically(path, "".join(f"{module}\n" for module in modules))
    return path


def extend_imports(child: StartedChild, conditions: Conditions, modules: Path) -> bool:
    """Tell a waiting spawned child to import the modules the file ``modules`` names too (``IMPORT_LINE``), so that
    it serves ``conditions``; False if it is gone. ``await_warm`` then waits for its next ``warm``."""
    if child.forked or not _tell(child, f"{IMPORT_LINE}{modules}", last=False):
        return False
    child.conditions = conditions
    child.warm_reports += 1
    return True


def deliver(child: StartedChild, request_path: Path) -> bool:
    """Hand a waiting child its request; False if it is gone (its pipe is closed)."""
    return _tell(child, str(request_path), last=True)


def _tell(child: StartedChild, line: str, *, last: bool) -> bool:
    """Write one line to a waiting child's stdin (``last``: then close it); False if it is gone."""
    if child.process.poll() is not None:
        return False
    stdin = child.process.stdin
    assert stdin is not None, "only a spawned child is told anything (a forked one gets its request in the order)"
    try:
        stdin.write(f"{line}\n".encode())
        if last:
            stdin.close()
        else:
            stdin.flush()
    except (BrokenPipeError, OSError):
        return False
    return True


def wait_for_end(child: StartedChild, timeout: float) -> tuple[bool, bool]:
    """Wait for the child's end, ``timeout`` seconds from delivery: (timed out, had its verdict at the deadline).

    At the deadline its events are read before anything is killed. With a
    verdict already there, the child was on its way out: it gets
    ``VERDICT_EXIT_GRACE_SECONDS`` to finish, and an exit in that time is an
    ordinary end. Killed all the same, the run is timed out *with* a verdict,
    which the probe can tell from a trial that had no verdict by its deadline.
    """
    try:
        child.process.wait(timeout=timeout)
        return False, False
    except subprocess.TimeoutExpired:
        pass
    events = read_events(child.events_path)
    if last_of(events, TrialResult) is None and last_of(events, Inspected) is None:
        return True, False
    try:
        child.process.wait(timeout=VERDICT_EXIT_GRACE_SECONDS)
        return False, False
    except subprocess.TimeoutExpired:
        return True, True


def stop_child(child: StartedChild, seconds: float | None = None) -> None:
    """Close the lifeline (the keeper then kills and reaps the whole tree and exits) and reap the keeper.

    Bounded: a keeper that has not ended ``seconds`` (``STOP_SECONDS``) after
    its lifeline closed is stopped (SIGSTOP) or stuck, and its tree is SIGKILLed
    from here, as the keeper would have; if even that leaves it running, the
    probe stops with an error rather than wait for ever.
    """
    seconds = STOP_SECONDS if seconds is None else seconds
    if child.lifeline_write >= 0:
        os.close(child.lifeline_write)
        child.lifeline_write = -1
    if not _ended_within(child, seconds):
        _kill_tree(child.process.pid)
        if not _ended_within(child, seconds):
            raise ProbeError(
                f"a child process of isoprobe (keeper {child.process.pid}) did not end {seconds:g} s "
                "after it was told to, nor as long after SIGKILL; the machine may be overloaded or "
                "its disk stuck"
            )
    if child.process.stdin is not None and not child.process.stdin.closed:
        try:
            child.process.stdin.close()
        except OSError:
            pass


def _ended_within(child: StartedChild, seconds: float) -> bool:
    try:
        child.process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_tree(keeper_pid: int) -> None:
    """SIGKILL a keeper and everything below it (found in /proc by ancestry), a few sweeps for late forks."""
    sigkill_below(keeper_pid, also=(keeper_pid,))
