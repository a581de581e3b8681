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
flaky_oom (out of memory with probability ``probability``), nth:K:<fault>
(commit <fault> only on the K-th attempt at each batch; needs ``state_dir``).
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import torch
from torch import nn

from isoprobe.outcomes import Outcome
from isoprobe.protocol import EVENTS_ENV, TrialResult, event_line

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


def _commit(fault: str, probability: float) -> None:
    if fault == "segfault":
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
        fd = os.open(os.environ[EVENTS_ENV], os.O_WRONLY | os.O_APPEND)
        os.write(fd, line[: len(line) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault in ("grandchild", "grandchild_hang"):
        subprocess.Popen(["sleep", "1000"], stdout=1, stderr=2, close_fds=False)
        if fault == "grandchild_hang":
            while True:
                time.sleep(60)
    elif fault == "flaky_oom":
        if random.random() < probability:
            raise RuntimeError(CPU_OOM_MESSAGE)
    else:
        raise ValueError(f"unknown fault {fault!r}")


class Faulty(nn.Module):
    def __init__(self, fault: str, at: int, edge: int | None, probability: float, state_dir: str | None):
        super().__init__()
        self.fault, self.at, self.edge = fault, at, edge
        self.probability, self.state_dir = probability, state_dir
        self.linear = nn.Linear(16, 4)
        self.committed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        if self.edge is not None and batch > self.edge:
            raise RuntimeError(CPU_OOM_MESSAGE)
        if batch >= self.at and not self.committed:
            self.committed = True  # once per process: a fault in step 1 is enough
            fault = self.fault
            if fault.startswith("nth:"):
                _, k, inner = fault.split(":", 2)
                fault = inner if _attempt_number(self.state_dir, batch) == int(k) else ""
            if fault:
                _commit(fault, self.probability)
        return self.linear(x)


def faulty(
    fault: str,
    at: int,
    edge: int | None = None,
    probability: float = 0.5,
    state_dir: str | None = None,
) -> nn.Module:
    return Faulty(fault, at, edge, probability, state_dir)
