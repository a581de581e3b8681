"""The fork server: one process per probe imports torch once, and every trial is a fork of it.

Why: a spawned trial pays ``import torch`` (and torch._dynamo) before its
first step, seconds of CPU, and on a small machine even a warm spare's import
competes with the running trial. A fork costs milliseconds and
still gives every trial a fresh process: a fresh address space, a fresh
allocator, its own rlimit (its budget plus the measured size of isoprobe's
own modules, which the server imported after torch: ``child.own_modules.credit_own``),
and (on CUDA) a fresh context, because the server never creates one. The
server imports only (``protocol.PRELOAD_ENV``), runs no torch operation, and so
has started no OpenMP pool a forked child could hang on; ``serve`` checks both
before it answers anything.

For each ``ForkOrder`` the server forks a *keeper* (``system.keeper.Keeper``,
the same code as the spawned path's keeper, run in the fork instead of exec'd):
a child subreaper that watches the order's lifeline and forks the trial under
it. So a forked trial is contained exactly as a spawned one is: its keeper
kills and reaps everything below it when it ends or when the parent closes the
lifeline, and the server itself runs under a keeper of its own, whose lifeline
the parent holds, so that if the server dies its trials die with it.

Orders may overlap (a gang's ranks run at once): the server replies
``Forked`` (the keeper's PID) to each, and ``Ended`` with a keeper's wait
status, which is the trial's, when it reaps it, in whatever order they end.
EOF on the channel ends the server.

What each fidelity measure below was measured to fix, and by how much: docs/measurements.md#the-fork-servers-fidelity.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import socket
import sys
import time
import traceback
from array import array
from dataclasses import dataclass

from pydantic import ValidationError

from isoprobe.child.events import Events
from isoprobe.child.preload import import_modules, read_modules
from isoprobe.child.request import cuda_initialized, driver_initialised, exit_now, run_request
from isoprobe.protocol.messages import (
    SERVER_ORDER,
    Ended,
    Extended,
    Forked,
    ForkOrder,
    ImportOrder,
    RequestReceived,
    Started,
    Warm,
)
from isoprobe.system.data_cap import set_data_cap
from isoprobe.system.keeper import Keeper, keep

_ORDER_BYTES = 65536
#: How often a server with trials running looks for ended keepers (a gang's kill latency is not at stake:
#: the parent stops ranks through their lifelines, and only learns their statuses from here).
_REAP_SECONDS = 0.02


@dataclass
class _Preloaded:
    """What the server has imported and every fork inherits: the ``Warm`` each trial reports, whether all of the
    preload was imported (after one that failed none more is), the threads the imports started (parked again in
    each fork) and the resident file pages (mapped again in each fork). An ``ImportOrder`` extends them."""

    warm: Warm
    complete: bool
    threads: int
    resident: array


def serve(channel_fd: int, events: Events, warm: Warm, complete: bool = True) -> int:
    """Report ``warm`` (the imports are done: ``child.main``), then fork one keeper and trial per order until the
    channel closes; an ``ImportOrder`` (the model's modules, after the environment check) extends the imports.

    ``complete``: every module of the preload was imported (after one that failed, none more is, as in a
    spawned child, whose preload stops there too)."""
    if driver_initialised():  # an import ran torch.cuda.is_available() (cuInit) or made a context: forks would fail
        sys.stderr.write(
            "isoprobe fork server: CUDA's driver was initialised by an import (torch.cuda.is_available() "
            "or a context); its forks would fail with 'initialization error': this probe spawns its "
            "trials\n"
        )
        return 3
    # The threads the imports started (measured: one, waiting on a futex), counted before the first fork: a
    # library's fork handler stops it (measured: none left after the canary), and its stack then waits in
    # glibc's cache for the next thread, in the server and in every fork (see _park_threads).
    threads = len(os.listdir("/proc/self/task")) - 1
    if not forks_safely():
        sys.stderr.write(
            "isoprobe fork server: a fork of this process hangs or fails in a parallel torch "
            "operation (an import started OpenMP's thread pool?): this probe spawns its trials\n"
        )
        return 4
    preloaded = _Preloaded(warm, complete, threads, resident_file_ranges())
    events.emit(warm)
    channel = socket.socket(fileno=channel_fd)
    channel.set_inheritable(False)
    running: set[int] = set()  # keepers forked and not yet reported ended (a gang's ranks run at once)
    while True:
        readable, _, _ = select.select([channel], [], [], _REAP_SECONDS if running else None)
        if not _report_ended(channel, running):
            return 0
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(channel, _ORDER_BYTES, 1)
        except OSError:
            return 0
        if not data:
            return 0  # the parent closed the channel: no more trials
        try:
            order = SERVER_ORDER.validate_json(data)
        except ValidationError as error:
            sys.stderr.write(f"isoprobe fork server: bad order: {error}\n")
            return 2
        if isinstance(order, ImportOrder):
            status = _import_order(channel, order, fds, preloaded)
            if status is not None:
                return status
            continue
        if len(fds) != 1:
            sys.stderr.write("isoprobe fork server: an order came without its lifeline\n")
            return 2
        pid = _fork_keeper(channel, events, order, fds[0], preloaded)
        running.add(pid)
        if not _reply(channel, Forked(pid=pid)):
            return 0  # the parent is gone: its lifelines are closed, so the keepers end their trials


def _import_order(channel: socket.socket, order: ImportOrder, fds: list[int], preloaded: _Preloaded) -> int | None:
    """Import an ``ImportOrder``'s modules into the server (``import_more``), so that the next forks inherit them,
    and reply ``Extended``; the server's exit status where it must stop (the parent is gone: 0; forks are no
    longer safe: 4, the probe spawns its trials), else None."""
    for fd in fds:
        os.close(fd)
    modules = read_modules(order.modules_file)
    imported, more_threads, safe = import_more(modules, preloaded.complete)
    preloaded.complete = preloaded.complete and len(imported) == len(modules)
    preloaded.threads += more_threads
    preloaded.warm = preloaded.warm.model_copy(update={"modules": [*preloaded.warm.modules, *imported]})
    if safe:
        preloaded.resident = resident_file_ranges()  # the new modules' pages too
    if not _reply(channel, Extended(imported=len(imported), safe=safe)):
        return 0
    if not safe:
        sys.stderr.write(
            "isoprobe fork server: after importing the model's modules, CUDA was initialised or a "
            "fork hangs or fails in a parallel torch operation: this probe spawns its trials\n"
        )
        return 4
    return None


def _fork_keeper(channel: socket.socket, events: Events, order: ForkOrder, lifeline: int, preloaded: _Preloaded) -> int:
    """Fork the order's keeper, which forks its trial (``_run_forked``) under it and contains it; the keeper's PID.
    The trial's arguments are bound here, when the order comes (not read later from the server's state)."""
    trial = functools.partial(
        _run_forked,
        order,
        lifeline,
        preloaded.warm.modules,
        preloaded.threads,
        preloaded.resident,
        preloaded.warm.own_data_bytes,
    )
    pid = os.fork()
    if pid == 0:
        try:
            channel.close()
            events.close()  # the server's channel, not the trial's
            keep(Keeper(lifeline, None, child_main=trial))
        finally:
            os._exit(127)
    os.close(lifeline)
    return pid


def _report_ended(channel: socket.socket, running: set[int]) -> bool:
    """Reap the keepers that ended and reply ``Ended`` for each; False if the parent's end is closed."""
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return True
        if pid in running:
            running.discard(pid)
            if not _reply(channel, Ended(pid=pid, status=status)):
                return False
    return True


def import_more(modules: list[str], complete: bool) -> tuple[list[str], int, bool]:
    """An ``ImportOrder``: the modules imported (up to the first that fails; none after an earlier failure), the
    threads their imports started (parked in each fork, as the preload's are), and whether forks are still safe.

    The order is the one a server started with them in its preload would have imported them in: after the
    rest of the preload. isoprobe's own modules came before them here (``child.main``); they are the
    standard library's, pydantic's and isoprobe's, which a model's imports do not share.
    """
    before = len(os.listdir("/proc/self/task"))
    imported = import_modules(modules) if complete else []
    started = max(0, len(os.listdir("/proc/self/task")) - before)
    return imported, started, not driver_initialised() and forks_safely()


def _reply(channel: socket.socket, reply: Forked | Ended | Extended) -> bool:
    """Send one reply; False if the parent's end is closed (it is going: nothing is left to tell it)."""
    try:
        channel.send(reply.model_dump_json().encode())
    except OSError:
        return False
    return True


#: How long the canary fork (``forks_safely``) may take: a 1 Mi-element tanh takes milliseconds.
CANARY_SECONDS = 10.0


def forks_safely(timeout: float = CANARY_SECONDS) -> bool:
    """Whether a fork of this process can run a parallel torch operation: the proof, before any trial is forked.

    GNU OpenMP's thread pool does not survive a fork: once a process has run a
    parallel region, a forked child's first parallel region waits for ever for
    workers that were not copied. The server runs no torch operation, but
    an import could (a model library computing a table at import time). So a
    canary is forked and runs one parallel operation over the intra-op pool; if
    it does not finish in ``timeout`` seconds, or fails, no trial is forked and
    the executor spawns them instead. A fork runs the canary, never the server.
    """
    pid = os.fork()
    if pid == 0:
        try:
            import torch

            torch.ones(1 << 20).tanh_().sum()  # 32 chunks of torch's 32768-element grain: every worker is asked
            os._exit(0)
        except BaseException:
            os._exit(1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status == 0
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def _run_forked(
    order: ForkOrder, lifeline: int, modules: list[str], threads: int, resident: array, own_data_bytes: int
) -> None:
    """The trial, in the keeper's fork of the server: its own files, cap and events, then the request. Exits."""
    code = 1
    try:
        os.close(lifeline)  # the keeper's to watch (a fork keeps what an exec would have closed)
        _park_threads(threads)
        populate(resident)
        _redirect(order)
        if order.memory_limit is not None:
            set_data_cap(order.memory_limit)  # raised by isoprobe's own share once the request is read (run_request)
        events = Events(order.events)
        events.emit(Started(pid=os.getpid()))
        events.emit(
            Warm(
                modules=modules,
                seconds=0.0,
                cuda_initialized=cuda_initialized(),
                idle_priority=False,
                forked=True,
                own_data_bytes=own_data_bytes,
            )
        )
        events.emit(RequestReceived(path=order.request))
        run_request(order.request, events)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        exit_now(code)


#: /proc/self/pagemap: one 64-bit entry per page; bit 63 says the page is present (readable unprivileged).
_PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = 1 << 63
#: madvise(2) MADV_POPULATE_READ (Linux 5.14): map the pages, as reading each would, without reading them.
_MADV_POPULATE_READ = 22


def resident_file_ranges() -> array:
    """The server's resident pages of mapped files (the libraries' code and data), as (address, length) runs laid
    flat in one array: address, length, address, length...

    Why: resident memory is a CPU trial's ``peak_bytes`` and the line the
    recommendation is drawn on. A fork does not copy the page-table entries of
    file mappings it never wrote (the kernel maps them again on the first
    touch), so a forked trial starts with its libraries' pages uncounted, and
    its resident peaks (and the recommendation) come out low. ``populate`` maps
    these runs in the fork. The map is read once.

    One array, not a list of tuples, because every fork inherits it: tuples of
    ints are small Python objects, in the 1 MiB arenas of Python's allocator,
    which RLIMIT_DATA counts, and one arena more than the user's own process has
    can be what a batch at the edge runs out by. The array is one malloc'd block
    of 16 bytes a run. Figures: docs/measurements.md#the-fork-servers-fidelity.
    """
    runs = array("Q")
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[5].startswith("/") or fields[1][0] != "r":
                    continue
                start, end = (int(value, 16) for value in fields[0].split("-"))
                pagemap.seek(start // _PAGE * 8)
                entries = memoryview(pagemap.read((end - start) // _PAGE * 8)).cast("Q")
                run = None
                for index, entry in enumerate(entries):
                    if entry & _PRESENT:
                        run = index if run is None else run
                    elif run is not None:
                        runs.extend((start + run * _PAGE, (index - run) * _PAGE))
                        run = None
                if run is not None:
                    runs.extend((start + run * _PAGE, (len(entries) - run) * _PAGE))
    except (OSError, ValueError):
        return array("Q")
    return runs


def populate(runs: array) -> None:
    """Map ``runs`` into this process's page tables (see ``resident_file_ranges``); a failure only costs fidelity."""
    if not runs:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    flat = iter(runs)
    for address, length in zip(flat, flat, strict=False):  # one iterator twice: (address, length) pairs
        if libc.madvise(address, length, _MADV_POPULATE_READ) != 0:
            for page in range(address, address + length, _PAGE):  # before Linux 5.14: touch each page
                ctypes.string_at(page, 1)


def _park_threads(count: int) -> None:
    """Start ``count`` threads that wait for ever, as the threads the imports started wait in a spawned trial.

    Why: the memory a CPU trial is capped on must be what a spawned process
    (the user's own) would use. The thread ``import torch`` starts is stopped
    by a fork handler in the server at its first fork, and a fork has only the
    forking thread anyway: that thread's stack waits in glibc's stack cache, and
    the first thread the trial starts (an OpenMP worker) reuses it instead of
    mapping a new one, where a spawned trial, whose import thread lives on,
    maps one: the forked trial's data segment would be one thread's stack below
    a spawned one's, and its edge too high (docs/measurements.md#the-fork-servers-fidelity).
    Parked threads take those cached stacks back, so the
    trial's own threads map theirs as in a spawned process.

    Native threads in ``pause()`` with every signal blocked, not Python ones:
    a Python thread allocates, and its first allocation maps a new malloc arena
    whose reservation lifts VmPeak, from which the data peak is estimated
    (``child.core.memory``); ``pause`` allocates nothing and, with no signal to
    wake it, never returns.
    """
    if count <= 0:
        return
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    start = ctypes.cast(libc.pause, ctypes.c_void_p)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # the threads inherit the mask
    try:
        for _ in range(count):
            thread = ctypes.c_ulong()
            libc.pthread_create(ctypes.byref(thread), None, start, None)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _redirect(order: ForkOrder) -> None:
    """The forked child's standard streams: stdin from /dev/null, stdout and stderr to the order's files."""
    for target, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, order.stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, order.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        fd = os.open(path, flags, 0o600)
        os.dup2(fd, target)
        os.close(fd)
