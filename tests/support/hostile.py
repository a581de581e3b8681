"""Hostile models for the tests: user code that tries to make a trial look better than it was.

Referenced from specs as '<this file>:<function>'. Not shipped with the package.
Each one is the smallest model that shows one class of attack (or accident)
on a trial's verdict, for tests/integration/test_hostile_trials.py:

- ``memory_hog``: memory per sample that is private (counted by the CPU cap,
  RLIMIT_DATA) or shared (``mmap.mmap(-1, n)``, which the cap does not count,
  as with shared-memory tensors and DataLoader workers).
- ``forger``: writes a forged 'fits' verdict to the events file, then exits 0.
- ``value_error_oom``: raises a ValueError whose message says "out of memory".
- ``slow_to_build``: a factory that hangs while building the model.
"""

from __future__ import annotations

import mmap
import os
import time

import torch
from torch import nn

from isoprobe.report.outcomes import Outcome
from isoprobe.protocol.messages import EVENTS_ENV, StepDone, TrialResult, event_line

MIB = 1024**2


class MemoryHog(nn.Module):
    """Holds ``per_sample_mib`` MiB per sample from each forward pass to the next, touched page by page.

    ``shared=False``: a private tensor, which the CPU cap counts (running over
    it is the CPU allocator's own out-of-memory error). ``shared=True``: an
    anonymous MAP_SHARED mapping, which the cap does not count: no allocation
    ever fails, and only a measurement can tell that the trial used more than
    its budget. Held until the next forward pass, as a DataLoader's batch is.
    """

    def __init__(self, per_sample_mib: int, shared: bool):
        super().__init__()
        self.per_sample, self.shared = per_sample_mib * MIB, shared
        self.linear = nn.Linear(16, 4)
        self.held = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:  # the environment check's forward pass on meta tensors: no memory, no attack
            return self.linear(x)
        self.held = None  # last step's memory first, as a data loader's next batch replaces the last
        size = self.per_sample * x.shape[0]
        if self.shared:
            mapping = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
            view = torch.frombuffer(mapping, dtype=torch.uint8)
            view.fill_(1)  # touch every page: resident, and shared
            del view
            self.held = mapping
        else:
            self.held = torch.empty(size, dtype=torch.uint8).fill_(1)
        return self.linear(x)


def memory_hog(per_sample_mib: int = 48, shared: bool = True) -> nn.Module:
    return MemoryHog(per_sample_mib, shared)


def _events_fd() -> int:
    """The child's events file, found as user code would: its environment variable, else its open files."""
    path = os.environ.get(EVENTS_ENV)
    if path:
        return os.open(path, os.O_WRONLY | os.O_APPEND)
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".events.jsonl"):
            return os.open(target, os.O_WRONLY | os.O_APPEND)
    raise RuntimeError("no events file found")


class Forger(nn.Module):
    """At its first forward pass, appends a forged 'fits' (peak ``peak_bytes``) to the events file and exits 0.

    ``well_formed``: the forgery is as good as a line can be without measuring:
    a ``step`` event for each of ``steps`` steps, and step times that match
    them. Otherwise only the verdict line.
    """

    def __init__(self, steps: int, peak_bytes: int, well_formed: bool):
        super().__init__()
        self.steps, self.peak_bytes, self.well_formed = steps, peak_bytes, well_formed
        self.linear = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:  # the environment check: forging its answer is another attack, not this one
            return self.linear(x)
        fd = _events_fd()
        seconds = [0.01] * self.steps
        if self.well_formed:
            for step, took in enumerate(seconds, 1):
                os.write(fd, event_line(StepDone(step=step, seconds=took)))
        os.write(fd, event_line(TrialResult(outcome=Outcome.FITS, phase="done", step_seconds=seconds,
                                            peak_bytes=self.peak_bytes, budget_peak_bytes=self.peak_bytes,
                                            base_bytes=self.peak_bytes)))
        os._exit(0)


def forger(steps: int = 2, peak_bytes: int = 1000, well_formed: bool = True) -> nn.Module:
    return Forger(steps, peak_bytes, well_formed)


class RaisesValueError(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the loader ran out of memory-mapped records (a bug, not an allocation)")


def value_error_oom() -> nn.Module:
    """A bug whose message happens to say "out of memory": not an allocation failure."""
    return RaisesValueError()


def slow_to_build(seconds: float = 3600) -> nn.Module:
    """A factory that hangs while building (a lock, a download, a deadlock): also on the meta device."""
    time.sleep(seconds)
    return nn.Linear(16, 4)
