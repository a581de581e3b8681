"""What a command trial's processes reported, read by its supervisor (``child.command_trial.supervisor``): each
process's lines
from the shim, who is a rank, and the data segment sampled from outside each rank (CPU backend).

The shim (``child/shim``) writes one file of JSON lines per process into the trial's folder; ``Tree`` reads them,
takes only what the shim can have written (``Tree.of_this_trial``: issue 47, forged steps), and knows which
processes are ranks (a helper that stepped and exited is not, once it has ended). Nothing here imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from isoprobe.protocol.command import (
    ShimException,
    ShimFiles,
    ShimForward,
    ShimHello,
    ShimStep,
    parse_lines,
)
from isoprobe.protocol.wiring import SHIM_DIR_ENV
from isoprobe.system.primitives import alive

#: How often the supervisor reads the shim's files and the command's state.
POLL_SECONDS = 0.01
#: How often it samples each rank's data segment between those reads (``Sampler``).
SAMPLE_SECONDS = 0.001
#: The brk heap is read every this many samples (4 ms): /proc/PID/maps costs about 45 us a read against statm's
#: 10, and what it must see (a batch's small blocks, alive through a step of a tenth of a second or more) lasts.
_HEAP_EVERY = 4
#: The head of /proc/PID/maps read for the ``[heap]`` line: the interpreter's own mappings and the heap come
#: first (about 700 bytes in a venv's python with torch imported); the rest (tens of KiB of libraries) is skipped.
_MAPS_HEAD_BYTES = 4096


@dataclass
class Process:
    """What one process of the command's tree has reported."""

    pid: int
    hello: ShimHello | None = None
    steps: list[ShimStep] = field(default_factory=list)
    own_peaks: list[int | None] = field(default_factory=list)  # per step, as report.steady.swing_bytes takes them
    heap_churns: list[int | None] = field(default_factory=list)  # per step: the heap's range within it (Sampler)
    exception: ShimException | None = None
    offset: int = 0
    ended: bool = False  # gone (or a zombie) without an exception line, while the command ran on
    forged: bool = False  # lines the shim cannot have written (a second hello, a step out of sequence)
    forward: str | None = None  # in its next step: None, its forward "began", or it "returned" (ShimForward)

    @property
    def launched_rank(self) -> bool:
        """One of several ranks a launcher declared (WORLD_SIZE > 1): its loss ends the gang, never shrinks it."""
        return self.hello is not None and (self.hello.world_size or 1) > 1

    @property
    def budget_peaks(self) -> list[int]:
        return [s.budget_peak_bytes if s.budget_peak_bytes is not None else (s.peak_bytes or 0) for s in self.steps]

    @property
    def name(self) -> str:
        rank = self.hello.rank if self.hello is not None else None
        return f"rank {rank} (pid {self.pid})" if rank is not None else f"pid {self.pid}"


@dataclass
class Tree:
    """Everything the shim wrote so far, by process."""

    folder: Path
    processes: dict[int, Process] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)

    def read(self, sampler: Sampler | None = None) -> None:
        """Take the new complete lines of every process's file; with ``sampler`` (CPU), a step's budget peak is the
        most its process's data segment was sampled at until now (the step's line is written at its end)."""
        for path in self.folder.glob("p*.jsonl"):
            try:
                pid = int(path.stem[1:])
            except ValueError:
                continue
            process = self.processes.setdefault(pid, Process(pid))
            try:
                with open(path, "rb") as handle:
                    handle.seek(process.offset)
                    data = handle.read()
            except OSError:
                continue
            complete = data.rfind(b"\n") + 1
            process.offset += complete
            lines = parse_lines(data[:complete])
            # A step's own peak is known only when its line came alone: the samples since the line before it span
            # just that step (two lines read at once share their samples, and neither step's own peak is known).
            alone = sum(isinstance(line, ShimStep) for line in lines) == 1
            for line in lines:
                if isinstance(line, ShimHello):
                    if process.hello is None and self.of_this_trial(pid, line):
                        process.hello = line
                    elif process.hello is not None:
                        process.forged = True  # the shim says hello once: someone else wrote one of them
                elif isinstance(line, ShimStep) and (process.hello is None or line.step != len(process.steps) + 1):
                    # Not the shim's: a step before its process said hello, or out of sequence (issue 47, forged)
                    process.forged = process.forged or process.hello is not None
                    continue
                elif isinstance(line, ShimStep):
                    own = churn = None
                    if sampler is not None:
                        sampler.sample([pid])  # the last reading before the step is taken as done
                        line = line.model_copy(update={"budget_peak_bytes": sampler.peak(pid, line.budget_peak_bytes)})
                        own = sampler.since_last_step(pid)
                        churn = sampler.heap_churn_since_last_step(pid)
                    process.steps.append(line)
                    process.forward = None
                    process.own_peaks.append(own if alone else None)
                    process.heap_churns.append(churn if alone else None)
                elif isinstance(line, ShimForward):
                    if process.hello is not None and line.step == len(process.steps) + 1:
                        process.forward = "returned" if line.returned else (process.forward or "began")
                elif isinstance(line, ShimException) and process.exception is None:
                    process.exception = line
                elif isinstance(line, ShimFiles):
                    self.modules.update(line.modules)
                    self.reads.update(line.reads)

    def of_this_trial(self, pid: int, hello: ShimHello) -> bool:
        """Whether the process that says hello is one of this trial's: a process of this node whose environment
        names this trial's folder (every process the command starts inherits it), or one of another node (a Slurm
        step's task, whose /proc is not here). A line written for a process that does not exist, or for one of
        someone else's, is not a step of this trial (issue 47: forged step lines credited batch 400 where 162 is
        the edge); docs/command.md says what a command can still forge."""
        if hello.host is not None and hello.host != os.uname().nodename:
            return True
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environment = handle.read()
        except OSError:
            return False
        return f"{SHIM_DIR_ENV}={self.folder}".encode() in environment.split(b"\0")

    def forged(self) -> Process | None:
        """A process with lines the shim cannot have written (``Process.forged``), if any."""
        return next((p for p in self.processes.values() if p.forged), None)

    def note_endings(self) -> None:
        """Mark the stepping processes that have ended without an exception line (``alive``)."""
        for process in self.processes.values():
            if process.steps and not process.ended and process.exception is None and not alive(process.pid):
                process.ended = True

    def ranks(self) -> list[Process]:
        """The processes that stepped, rank order (a rank number first, then by PID), less those that ended while
        the command ran on and were no launcher's rank: a helper the script ran (a sanity check of two steps in a
        subprocess) stepped and exited, and waiting for its further steps hung every trial (issue 47)."""
        stepping = [p for p in self.processes.values() if p.steps and not (p.ended and not p.launched_rank)]
        return sorted(
            stepping, key=lambda p: (p.hello.rank if p.hello and p.hello.rank is not None else 1 << 30, p.pid)
        )

    def expected_ranks(self) -> int:
        """How many ranks a step must hear from: the largest WORLD_SIZE a stepping process reported, else how many
        stepped (one, for a plain script)."""
        sizes = [p.hello.world_size for p in self.ranks() if p.hello is not None and p.hello.world_size]
        return max([len(self.ranks()), *sizes])

    def failure(self) -> Process | None:
        """The first process whose exception reached its top (by time)."""
        failed = [(p, p.exception.t) for p in self.processes.values() if p.exception is not None]
        return min(failed, key=lambda pair: pair[1])[0] if failed else None


class Sampler:
    """The most each rank's data segment held, sampled from outside the rank (CPU backend).

    Why sampled: Linux keeps no high-water mark of the data segment (what RLIMIT_DATA caps), and the one
    isoprobe's own trials estimate it from (VmPeak) counts the address space a new malloc arena reserves and
    the cap never does; a script's threads map such arenas, which put that estimate at the cap at every batch.
    Read from /proc/PID/statm (one short line; its data field is the data segment and the stack) every
    millisecond by this process, so the rank itself runs nothing for it. A spike shorter than the interval can
    be missed; the peak a step holds while its activations live is not. Every ``_HEAP_EVERY`` samples it also
    reads the brk heap's size (``heap_bytes``): how far that moves within a step bounds what glibc can hold of
    it into the next step in another run's layout (a command's floor, ``search.margin``).
    """

    def __init__(self) -> None:
        self.most: dict[int, int] = {}
        self.since_step: dict[int, int] = {}  # the most since the step before, for report.steady.swing_bytes
        self.heap_since_step: dict[int, tuple[int, int]] = {}  # the heap's least and most since the step before
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.gone: set[int] = set()
        self.rounds = 0

    def sample(self, pids) -> None:
        self.rounds += 1
        heap_round = self.rounds % _HEAP_EVERY == 0
        for pid in pids:
            if pid in self.gone:
                continue
            try:
                with open(f"/proc/{pid}/statm", "rb") as handle:
                    data = int(handle.read().split()[5]) * self.page
            except (OSError, ValueError, IndexError):
                self.gone.add(pid)
                continue
            if data > self.most.get(pid, 0):
                self.most[pid] = data
            if data > self.since_step.get(pid, 0):
                self.since_step[pid] = data
            if heap_round:
                self.sample_heap(pid)

    def read_heap(self, pid: int) -> int | None:
        """The heap's size now (the seam a test scripts)."""
        return heap_bytes(pid)

    def sample_heap(self, pid: int) -> None:
        heap = self.read_heap(pid)
        if heap is not None:
            low, high = self.heap_since_step.get(pid, (heap, heap))
            self.heap_since_step[pid] = (min(low, heap), max(high, heap))

    def since_last_step(self, pid: int) -> int | None:
        """The most sampled since the last call for ``pid`` (a step's own peak), and start again; None: no sample."""
        return self.since_step.pop(pid, None)

    def heap_churn_since_last_step(self, pid: int) -> int | None:
        """How far the heap grew and shrank since the last call for ``pid`` (most minus least: a step's own churn);
        the next step's range starts from this reading. None: the heap could not be read."""
        heap = self.read_heap(pid)
        span = self.heap_since_step.pop(pid, None)
        if heap is None:
            return None
        low, high = span or (heap, heap)
        self.heap_since_step[pid] = (heap, heap)
        return max(high, heap) - min(low, heap)

    def peak(self, pid: int, reported: int | None) -> int | None:
        """A step's budget peak: the most sampled so far, or what the shim read at the step's end if more."""
        sampled = self.most.get(pid)
        if sampled is None:
            return reported
        return max(sampled, reported or 0)


def heap_bytes(pid: int) -> int | None:
    """The size of a process's brk heap (glibc's main arena, where blocks under the mmap threshold live), from
    ``[heap]`` in the head of /proc/PID/maps; None: no heap there, or the process is gone."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            head = handle.read(_MAPS_HEAD_BYTES)
    except OSError:
        return None
    at = head.find(b" [heap]\n")
    if at < 0:
        return None
    line = head[head.rfind(b"\n", 0, at) + 1 : at]
    try:
        low, high = line.split(b" ", 1)[0].split(b"-")
        return int(high, 16) - int(low, 16)
    except ValueError:
        return None
