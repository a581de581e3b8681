"""What a command trial's supervisor has seen so far, written as it goes (``protocol.command.CommandSeen``).

The parent kills a trial's child at the deadline, and a killed child writes no verdict; the command's stdout and
stderr are files in the child's own folder, copied to the child's stderr only when it ends (issue 56: a trial with
one rank hung under torchrun said "the command printed nothing on stderr" of a command that printed its steps, and
named no rank). So the supervisor writes each process's steps and the command's last lines as an event at the
start and whenever they change, at most every ``interval`` seconds: what the parent reports for a timeout.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from isoprobe.child.command_trial.tree import Process, Tree
from isoprobe.child.command_trial.verdicts import stderr_tail
from isoprobe.protocol.command import CommandSeen, ShimHello
from isoprobe.report.rank_progress import RankProgress
from isoprobe.system.primitives import alive

if TYPE_CHECKING:
    from isoprobe.child.events import Events

#: How many of the command's last lines (and characters) each of its streams gets in an event.
TAIL_LINES = 20
TAIL_CHARS = 2000


def interval(elapsed: float) -> float:
    """Seconds between two events at ``elapsed`` seconds into the trial: 1 for the first half minute, then a
    thirtieth of the time so far, at most 10 (a trial of 20 minutes writes some 200, not 1200)."""
    return min(10.0, max(1.0, elapsed / 30))


def progress(tree: Tree) -> list[RankProgress]:
    """Each process that said hello, as far as it got."""
    return [_progress(p, p.hello) for p in tree.processes.values() if p.hello is not None]


def _progress(process: Process, hello: ShimHello) -> RankProgress:
    """How far ``process`` got; ``hello``: its hello (only a process that said one is a rank)."""
    remote = hello.host is not None and hello.host != os.uname().nodename
    ended = process.ended or (process.exception is None and not remote and not alive(process.pid))
    return RankProgress(
        pid=process.pid,
        rank=hello.rank,
        world_size=hello.world_size,
        steps=len(process.steps),
        forward=process.forward,
        ended=ended,
    )


def output_tails(folder: Path) -> tuple[str, str]:
    """The command's stderr and stdout, their last lines."""
    return (
        stderr_tail(folder / "stderr", lines=TAIL_LINES, chars=TAIL_CHARS).strip("\n"),
        stderr_tail(folder / "stdout", lines=TAIL_LINES, chars=TAIL_CHARS).strip("\n"),
    )


class Watch:
    """Writes a ``CommandSeen`` when what it sees has changed since the last, no sooner than ``interval``."""

    def __init__(self, folder: Path, events: Events) -> None:
        self.folder = folder
        self.events = events
        self.started = time.monotonic()
        self.written_at: float | None = None
        self.last: tuple | None = None

    def look(self, tree: Tree) -> None:
        now = time.monotonic()
        if self.written_at is not None and now - self.written_at < interval(now - self.started):
            return
        self.written_at = now
        processes = progress(tree)
        sizes = tuple(_size(self.folder / name) for name in ("stdout", "stderr"))
        state = (tuple(processes), sizes)
        if state == self.last:
            return
        self.last = state
        stderr, stdout = output_tails(self.folder)
        self.events.emit(CommandSeen(processes=processes, stdout_tail=stdout, stderr_tail=stderr))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
