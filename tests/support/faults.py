"""Fault injection for the tests: a model that misbehaves in chosen ways at chosen batch sizes.

Referenced from specs as '<this file>:faulty'. Not shipped with the package: a
real model's faults are not a feature. Below ``at`` the model is a tiny linear
layer that fits; at or above ``at`` it commits ``fault``; above ``edge`` it
raises the CPU allocator's own out-of-memory error, so a scenario has a known
true maximum without allocating gigabytes.

Faults: segfault, abort, sigkill, hang, raise, exit0 (exit without a result),
garbage (binary junk on stdout and stderr, then carry on), half_result (half
an events line, then SIGKILL), grandchild (leave a grandchild holding
stdout/stderr, sleeping, then carry on), grandchild_hang (same, then hang),
flaky_oom (out of memory with probability ``probability``), alloc (a real
allocation of 1 TiB, which fails under any cap; raise_cuda_oom: 16 TiB on the
rank's GPU), nth:K:<fault>
(commit <fault> only on the K-th attempt at each batch; needs ``state_dir``).

Hostile conditions (issue 14): escape_session (start ``sleep 600`` in a new
session, then carry on), escape_double_fork (the same by fork, setsid, fork),
spin (a regex that backtracks for ever, holding the GIL), stop (SIGSTOP
itself), sleep:S (sleep S seconds, once per process: a slow step), hang_on_exit
(carry on, then hang while the child flushes stdout after its verdict),
channel_hidden (raise unless the events file's path and descriptor are out of
reach). Faults combine with ``+``, committed left to right:
``escape_session+hang``. With ``ranks`` (a distributed trial), only those ranks commit the fault.

With ``state_dir``, a fault about to be committed first writes
``committed-<pid>`` there (the fault's name inside), so that a test can wait
until it has begun (a spinning or stopped trial writes nothing else).
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from isoprobe.report.outcomes import Outcome
from isoprobe.protocol.messages import EVENTS_ENV, TrialResult, event_line

CPU_OOM_MESSAGE = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)"
)


def _attempt_number(state_dir: str, batch: int) -> int:
    """1 for the first process that reaches this batch, 2 for the next, ... (counted in files)."""
    counter = Path(state_dir) / f"attempts-{batch}"
    number = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(number))
    return number


def _events_fd() -> int:
    """The child's events file, found the hard way (its path is no longer in the environment)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".events.jsonl"):
                return int(fd)
        except OSError:
            continue
    raise RuntimeError("no events file open")


def _escape(double_fork: bool) -> None:
    """Start ``sleep 600`` outside this process's session, where a kill of the trial's group cannot reach."""
    if not double_fork:
        subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return
    sleep = shutil.which("sleep")
    first = os.fork()
    if first == 0:  # as little as possible from here to exec: this process has torch's threads
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(sleep, ["sleep", "600"])
        finally:
            os._exit(0)
    os.waitpid(first, 0)  # the middle process exits at once: the sleep is an orphan in its own session


class _StuckFlush:
    """sys.stdout whose flush never returns: the child hangs on its way out, after its verdict."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def flush(self):
        while True:
            time.sleep(60)


def _check_channel_hidden() -> None:
    if EVENTS_ENV in os.environ:
        raise RuntimeError(f"${EVENTS_ENV} is visible to the model")
    # What a process the model starts without closing descriptors holds (the listing's own fd is gone by then).
    links = subprocess.run(["ls", "-l", "/proc/self/fd/"], close_fds=False, capture_output=True, text=True,
                           check=True).stdout
    if ".events.jsonl" in links:
        raise RuntimeError(f"a process the model starts inherits the events file: {links}")


def _commit(fault: str, probability: float) -> None:
    if "+" in fault:
        for part in fault.split("+"):
            _commit(part, probability)
        return
    if fault == "escape_session":
        _escape(double_fork=False)
    elif fault == "escape_double_fork":
        _escape(double_fork=True)
    elif fault == "spin":
        re.match(r"(a|aa)*c", "a" * 64)  # exponential backtracking in C: the GIL is never released
    elif fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault.startswith("sleep:"):
        time.sleep(float(fault.split(":", 1)[1]))
    elif fault == "hang_on_exit":
        sys.stdout = _StuckFlush(sys.stdout)
    elif fault == "channel_hidden":
        _check_channel_hidden()
    elif fault == "segfault":
        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "hang":
        while True:
            time.sleep(60)
    elif fault == "raise":
        raise KeyError("deliberate non-memory bug")
    elif fault == "exit0":
        os._exit(0)
    elif fault == "garbage":
        junk = bytes(random.Random(7).randrange(256) for _ in range(4096))
        os.write(1, junk)
        os.write(2, junk)
        os.write(1, event_line(TrialResult(outcome=Outcome.FITS, phase="done")))  # a verdict on stdout changes nothing
    elif fault == "half_result":
        line = event_line(TrialResult(outcome=Outcome.FITS, phase="done", step_seconds=[]))
        os.write(_events_fd(), line[: len(line) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault in ("grandchild", "grandchild_hang"):
        subprocess.Popen(["sleep", "1000"], stdout=1, stderr=2, close_fds=False)
        if fault == "grandchild_hang":
            while True:
                time.sleep(60)
    elif fault == "alloc":
        torch.empty(1 << 40, dtype=torch.uint8)  # 1 TiB: a real allocation failure under any cap
    elif fault == "raise_cuda_oom":
        torch.empty(1 << 44, dtype=torch.uint8, device=f"cuda:{torch.cuda.current_device()}")  # 16 TiB on the GPU
    elif fault == "flaky_oom":
        if random.random() < probability:
            raise RuntimeError(CPU_OOM_MESSAGE)
    else:
        raise ValueError(f"unknown fault {fault!r}")


def _fake(x: torch.Tensor) -> bool:
    """A tensor of the environment check's traced estimate (no data, no kernels): the faults model a real
    step's failures, and a segfault or a full disk does not happen on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor)


class Faulty(nn.Module):
    def __init__(self, fault: str, at: int, edge: int | None, probability: float, state_dir: str | None,
                 ranks: list[int] | None = None):
        super().__init__()
        self.fault, self.at, self.edge = fault, at, edge
        self.ranks = ranks
        self.probability, self.state_dir = probability, state_dir
        self.linear = nn.Linear(16, 4)
        self.committed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        if self.edge is not None and batch > self.edge:
            raise RuntimeError(CPU_OOM_MESSAGE)
        if batch >= self.at and not self.committed and self._on_this_rank() and not _fake(x):
            self.committed = True  # once per process: a fault in step 1 is enough
            fault = self.fault
            if fault.startswith("nth:"):
                _, k, inner = fault.split(":", 2)
                fault = inner if _attempt_number(self.state_dir, batch) == int(k) else ""
            if fault:
                if self.state_dir:
                    (Path(self.state_dir) / f"committed-{os.getpid()}").write_text(fault)
                _commit(fault, self.probability)
        return self.linear(x)

    def _on_this_rank(self) -> bool:
        """With ``ranks``, the fault is committed only by those ranks of a distributed trial."""
        if self.ranks is None:
            return True
        import torch.distributed as dist

        return dist.is_initialized() and dist.get_rank() in self.ranks


def faulty(
    fault: str,
    at: int,
    edge: int | None = None,
    probability: float = 0.5,
    state_dir: str | None = None,
    ranks: list[int] | None = None,
    build_seconds: float = 0.0,
) -> nn.Module:
    """``build_seconds``: sleep that long while building, so that a tiny trial timeout stops every process that
    builds the model (the environment check included) whatever the machine's speed."""
    time.sleep(build_seconds)
    return Faulty(fault, at, edge, probability, state_dir, ranks)
