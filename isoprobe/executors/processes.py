"""Process primitives of the local executor: a child's environment, its start, its deadlines, its stderr.

Pure where possible (``child_environment``, ``import_timeout``), so what each
child gets is testable without starting one; the rest are small wrappers over
the kernel's signals and files. How a child and everything it starts is ended
lives in ``keeper``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

from isoprobe.protocol.messages import EVENTS_ENV
from isoprobe.protocol.wiring import TRIAL_ENV
from isoprobe.system.data_cap import set_data_cap
from isoprobe.system.hardware import node_gpus, slurm_cuda_visible, visible_devices

#: Below this size glibc serves allocations from its heap and may keep freed memory,
#: which makes an RLIMIT_DATA boundary flaky; above it every block is its own mmap.
MALLOC_MMAP_THRESHOLD = 131072
#: The least time a child gets to import what it needs (torch, torch._dynamo, the model library) before
#: its request is delivered. Not part of the trial's timeout, which runs from delivery, so that a warm
#: and a cold trial get the same time for the same work. 300 s, as the environment check's whole
#: budget: a first import from a cold page cache or a network filesystem (a cluster's shared
#: software tree) takes minutes where a warm one takes seconds (measured here: 3 to 6 s for torch
#: and torch._dynamo on 2 busy cores), and an import that really hangs is still ended.
IMPORT_TIMEOUT_SECONDS = 300.0
#: A child that had written its verdict when its deadline came gets this long to exit on its own
#: (it is on its way out: flushing, unmapping) before it is killed.
VERDICT_EXIT_GRACE_SECONDS = 2.0
_STDERR_TAIL_CHARS = 4000
_STDERR_SCAN_BYTES = 65536
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def memory_environment(backend: str) -> dict[str, str]:
    """What a trial's environment sets that changes how much memory a step needs: a job must run with the same for
    the answer to hold (``report.result.Result.job_environment``; ``--format env`` exports it).

    CPU: glibc's mmap threshold, fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``). Left to glibc, the threshold moves
    up with the largest block freed (to 32 MiB on 64-bit), so 20-30 MB tensors land in the heap, where a freed
    block fragments it: run so, 4 of 5 held-out scripts ran out at isoprobe's maximum (issue 46). Fixed, every
    tensor of 128 KiB or more is mmapped and given back exactly, in the trial and in the job alike."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MALLOC_MMAP_THRESHOLD)} if backend == "cpu" else {}


def child_environment(
    base: Mapping[str, str], *, backend: str, allocator: str | None, events_path: Path, threads: int | None = None
) -> dict[str, str]:
    """The environment one trial runs in. Pure, so what each child gets is testable."""
    env = dict(base)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env[EVENTS_ENV] = str(events_path)
    env[TRIAL_ENV] = str(os.getpid())  # the probe's: a hook in the trial (a TaskProlog) knows to do nothing
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault or abort leaves a Python stack in stderr
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, base.get("PYTHONPATH", "")) if p)
    if allocator == "":
        # torch's default allocator: a setting inherited from isoprobe's own environment must not leak in.
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
    elif allocator is not None:
        # torch reads PYTORCH_CUDA_ALLOC_CONF; newer releases also PYTORCH_ALLOC_CONF. Same value in both,
        # so whichever the installed torch prefers, the trial runs with the spec's setting.
        env["PYTORCH_CUDA_ALLOC_CONF"] = allocator
        env["PYTORCH_ALLOC_CONF"] = allocator
    env.update(memory_environment(backend))
    if backend == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU trial can never create a CUDA context by accident
    else:
        # A Slurm job's GPUs, where only Slurm's variables name them (a batch shell, a hook): cuda:0 of
        # the trial must be the job's first GPU, not the node's. Slurm's numbers are the node's; a device
        # cgroup renumbers what the job sees, so they are resolved (hardware.slurm_cuda_visible).
        visible = visible_devices(base)
        if visible.source != "CUDA_VISIBLE_DEVICES" and visible.value is not None:
            value = slurm_cuda_visible(visible.entries or [], node_gpus())
            if value is not None:
                env["CUDA_VISIBLE_DEVICES"] = value
        # CUDA_DEVICE_ORDER stays the user's: a trial must number GPUs as the job it answers for does (CUDA's
        # default is fastest first). The parent's NVML facts (PCI order) trust a number only where the two orders
        # cannot name different kinds of GPU (hardware.unresolved_reason).
    # Caching off bypasses the memory fraction and the allocator's statistics that every reading comes from.
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    return env


#: The signals that interrupt isoprobe (KeyboardInterrupt, errors.Terminated).
INTERRUPTS = {signal.SIGINT, signal.SIGTERM}


def prepare_child(memory_limit: int | None, parent_pid: int):
    """Runs between fork and exec of the process the executor starts (the keeper, whose child inherits the
    cap): give up if the parent is gone, and cap memory if asked.

    The hard limit is ``OWN_ALLOWANCE_BYTES`` above the cap: room for the child to credit what isoprobe's
    own modules take in it, which it does, and then fixes both limits, before any user code runs; never above
    the hard limit this process inherited (``system.data_cap``).
    """

    def prepare() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)  # see signals_deferred
        if os.getppid() != parent_pid:
            os._exit(1)
        if memory_limit is not None:
            set_data_cap(memory_limit)

    return prepare


@contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM while children are started and recorded, then let them land.

    An interrupt raised inside ``subprocess.Popen`` (between fork and the end of
    its bookkeeping) or between taking the spare and recording it as the running
    child would lose track of a process that is already alive. Blocked here, the
    signal is delivered the moment this block ends, where every child is known
    and the ``finally`` clauses stop them. Children unblock both signals for
    themselves (``prepare_child``): the mask would otherwise survive exec.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name in the same folder, then rename: a reader sees all of it or nothing."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def import_timeout(trial_timeout: float) -> float:
    """How long a child may take to import before its request: ``IMPORT_TIMEOUT_SECONDS``, or the trial's
    own timeout where that is longer (who allows a trial an hour allows its import as long)."""
    return max(IMPORT_TIMEOUT_SECONDS, trial_timeout)


def stderr_tail(path: Path) -> str:
    """The end of a child's stderr, with faulthandler's headline kept even if the dump is long.

    A crash dump lists every thread's stack and the loaded extension modules after
    its first line ("Fatal Python error: Segmentation fault"); the first line is the
    evidence, so it is put in front when the tail alone would cut it off.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _STDERR_SCAN_BYTES))
            end = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    tail = end[-_STDERR_TAIL_CHARS:]
    headline = next((line for line in reversed(end.splitlines()) if line.startswith("Fatal Python error:")), None)
    if headline is not None and headline not in tail:
        tail = f"{headline}\n[...]\n{tail}"
    return tail
