"""The child's entry: open the events channel, import, wait for the request, run it, leave fast.

Run as ``python -m isoprobe.child --wait [--idle]`` by the parent's executor
(through its keeper, ``system.keeper``), and as ``python -m isoprobe.child
REQUEST.json`` by hand. It reports through a dedicated events file (path in
``protocol.EVENTS_ENV``), one complete JSON line per event written with a
single ``write``, because the user's model may print anything on stdout and a
half-written line must be detectable. The variable is removed from the
environment as soon as the file is open, and the descriptor is not inherited:
neither the model nor anything it starts finds the channel by looking there.

Events, in order: ``started``, (warm only: ``warm``, ``request``), then the
request's own: a trial's ``imported``, ``model_built``, ``step`` (one per
completed step), ``eval``, then exactly one ``result``; the environment check's
one ``inspected``. A process that ends without its verdict is classified by the
parent (crashed, timed out).

Started with ``--wait`` it imports torch and the model library first (the
modules in ``protocol.PRELOAD_ENV``), reports ``warm``, then reads the request's
path from stdin. The executor starts *every* child so, a spare ahead of time
(``--idle``: importing at idle priority beside the running trial) or one on
demand, and delivers the request only after ``warm``: a trial's timeout runs
from delivery and covers the same work whether its process was started early
or not, and a cold trial has imported exactly what a warm one has.

Until the preload is imported, this module and what it imports use the
standard library only: isoprobe's own modules (pydantic, the protocol, the
trial's code) come after torch, so that what they add to the process can be
measured and credited to the CPU cap (``child.own_modules.import_own``). The
``started`` line is therefore written by hand (``started_line``).

Nothing here keeps the child from outliving its parent: its keeper does, from
outside (a trial holding the GIL or stopped cannot run a watchdog of its own).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

from isoprobe.child.events import Events
from isoprobe.child.own_modules import import_own
from isoprobe.child.preload import import_modules, preload_names, read_modules
from isoprobe.child.request import cuda_initialized, run_request
from isoprobe.child.source_only import compile_own_from_source
from isoprobe.protocol.wiring import (
    CHILD_MODULE,
    EVENTS_ENV,
    IDLE_ARGUMENT,
    IMPORT_LINE,
    PRELOAD_ENV,
    SERVE_ARGUMENT,
    WAIT_ARGUMENT,
    WARM_PLAN_ENV,
)
from isoprobe.system import primitives

USAGE = (
    f"usage: python -m {CHILD_MODULE} REQUEST.json | {WAIT_ARGUMENT} [{IDLE_ARGUMENT}] | {SERVE_ARGUMENT} FD   "
    f"(with ${EVENTS_ENV} naming the events file)"
)


def started_line(pid: int) -> bytes:
    """The ``started`` event (``protocol.Started``) without pydantic, which is not imported yet (see above)."""
    return json.dumps({"t": time.time(), "event": "started", "pid": pid}).encode() + b"\n"


def wait_for_request(events: Events, idle: bool) -> str | None:
    """Import what the trial will need, then block until the parent sends the request's path.

    Importing torch does not initialise CUDA, and nothing here touches a device:
    the ``warm`` event records ``cuda_initialized`` so that a test (and a
    suspicious user) can see it stayed that way. An import that fails is not
    this child's verdict: the modules after it are skipped, and the trial meets
    the same failure in its own import, where it is classified as the trial's
    (``warm.modules`` lists what was imported). EOF on stdin means the parent no
    longer needs this child: it exits quietly. A line ``IMPORT_LINE`` + a file
    naming modules, before the path: import those too, then report ``warm`` again.
    """
    niced = _lower_priority() if idle else None
    wanted = len(preload_names())
    modules, seconds = import_preload()
    own = load_own()
    if niced is not None:
        # Back to normal before waiting: blocked, the child needs no CPU, and a spare that is
        # stopped instead of used must not die at idle priority (its exit could wait for minutes
        # behind a busy machine, and the parent with it).
        _restore_priority(niced)
    complete = len(modules) == wanted
    _start_command_ahead()
    events.emit(warm_event(modules, seconds, idle_priority=niced is not None, own_data_bytes=own.data))
    while True:
        line = sys.stdin.readline().strip()
        if not line.startswith(IMPORT_LINE):
            return line or None
        # Started before the environment check, this child learns the model's imports after it: it imports
        # them as a child started with them in its preload would (after the rest, up to the first that fails),
        # and reports warm again, so that no second process imports torch while the first trial waits.
        started = time.perf_counter()
        more = read_modules(line[len(IMPORT_LINE) :])
        imported = import_modules(more) if complete else []
        complete = complete and len(imported) == len(more)
        modules, seconds = modules + imported, seconds + time.perf_counter() - started
        events.emit(warm_event(modules, seconds, idle_priority=False, own_data_bytes=own.data))


def import_preload() -> tuple[list[str], float]:
    """Import the modules of ``PRELOAD_ENV`` (up to the first that fails; see ``wait_for_request``): the modules
    imported, and the seconds it took."""
    started = time.perf_counter()
    modules = preload_names()
    os.environ.pop(PRELOAD_ENV, None)
    imported = import_modules(modules)
    return imported, time.perf_counter() - started


#: isoprobe's own modules that every trial runs: with them the protocol, the spec's models, pydantic.
OWN_MODULES = ("isoprobe.protocol.messages", "isoprobe.child.core.trial")


def load_own(*more: str):
    """Import ``OWN_MODULES`` and ``more`` (after the preload), counting what they take (``own_modules.import_own``)."""
    return import_own(lambda: [importlib.import_module(name) for name in (*OWN_MODULES, *more)])


def warm_event(modules: list[str], seconds: float, **fields):
    """The ``warm`` event, once isoprobe's own modules are imported (``load_own``)."""
    from isoprobe.protocol.messages import Warm

    return Warm(modules=modules, seconds=seconds, cuda_initialized=cuda_initialized(), **fields)


#: How long a waiting trial process waits for its command's interpreter to reach its wait before it says ``warm``
#: all the same (an interpreter's start: tens of milliseconds on a quiet node). One not at its wait when the trial
#: is due is ended and the trial starts the command cold (``warm_command.take``): a spare never makes a trial wait.
AHEAD_READY_SECONDS = 10.0


def _start_command_ahead() -> None:
    """A command trial's process whose executor planned it (``protocol.warm_command``): start the command's
    interpreter now and wait, a while, for it to reach its wait. Nothing planned, or a shape that cannot: nothing."""
    plan = os.environ.pop(WARM_PLAN_ENV, None)
    if not plan:
        return
    from isoprobe.child.command_trial.warm import start_ahead, wait_ready

    ahead = start_ahead(plan)
    if ahead is not None:
        wait_ready(ahead, AHEAD_READY_SECONDS)


#: The autogroup nice value the imports ran under was lowered from (``_lower_priority``), to be given back.
_autogroup_restore: int | None = None


def _restore_priority(value: int) -> None:
    """Give every thread of this process the normal policy and its nice value back, not only this one; and the
    session's autogroup its nice value.

    Scheduling policy and nice value are per thread on Linux, and the imports
    start threads of their own (measured: one, which OpenMP then uses as a
    compute worker). Left idle-class, that one thread would stall every step.
    """
    global _autogroup_restore
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, int(task), value)
        except (OSError, ValueError):
            pass
    if _autogroup_restore is not None and primitives.set_autogroup_nice(_autogroup_restore):
        _autogroup_restore = None


def _lower_priority() -> int | None:
    """Run the imports under SCHED_IDLE, only where the policy can be switched back; the old nice value, or None.

    The import competes with the running trial for the CPU. A nice value of +10
    was not enough: the trial's OpenMP threads wait for each other at every
    barrier, and one of them sharing a core with the import made the steps of a
    small CNN 1.8 times slower (measured). SCHED_IDLE runs only on a core
    nothing else wants. Switching back needs root or a permissive RLIMIT_NICE;
    without either the child keeps its priority, because a trial at a lower
    priority would run slower on a shared machine.
    """
    import resource

    current = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    # RLIMIT_NICE = r lets a thread go down to nice 20 - r, and back from SCHED_IDLE at nice >= 20 - r.
    allowed = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20 - current
    if not allowed or not hasattr(os, "SCHED_IDLE"):
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return None
    _lower_autogroup()
    return current


def _lower_autogroup() -> None:
    """The session's autogroup at nice 19 while the imports run (given back in ``_restore_priority``).

    SCHED_IDLE orders threads within one autogroup, and the kernel shares the
    CPU fairly between autogroups first: every session is one (a local spare's
    keeper and a Slurm task each start a session), so, measured on this
    project's machine (autogroups on), the idle imports of the next step took
    40 to 46 % of a core each (ps) beside the running trial's ranks at 50 %, whose run took 1.9
    times slower. At nice 19 the group's weight is 15 against 1024. A nice
    value of 0 or more is anyone's to set, so giving it back needs no privilege.
    """
    global _autogroup_restore
    before = primitives.autogroup_nice()
    if before is not None and before < 19 and primitives.set_autogroup_nice(19):
        _autogroup_restore = before


def main(argv: list[str]) -> int:
    compile_own_from_source()  # what isoprobe's modules leave in the process must not depend on bytecode caches
    waits = len(argv) in (2, 3) and argv[1] == WAIT_ARGUMENT and argv[2:] in ([], [IDLE_ARGUMENT])
    serves = len(argv) == 3 and argv[1] == SERVE_ARGUMENT and argv[2].isdigit()
    if not (waits or serves or (len(argv) == 2 and not argv[1].startswith("-"))) or EVENTS_ENV not in os.environ:
        sys.stderr.write(USAGE + "\n")
        return 2
    events = Events(os.environ.pop(EVENTS_ENV))
    events.write(started_line(os.getpid()))
    if serves:
        wanted = len(preload_names())
        modules, seconds = import_preload()
        own = load_own("isoprobe.child.server")  # the server's code is in every fork too
        from isoprobe.child.server import serve

        # The server stays uncapped; each fork caps itself (system.data_cap.set_data_cap), then credits ``own``
        # (run_request).
        return serve(
            int(argv[2]),
            events,
            warm_event(modules, seconds, idle_priority=False, own_data_bytes=own.data),
            complete=len(modules) == wanted,
        )
    request_path = argv[1]
    if waits:
        waited = wait_for_request(events, idle=argv[2:] == [IDLE_ARGUMENT])
        if waited is None:
            return 0
        request_path = waited
        from isoprobe.protocol.messages import RequestReceived

        events.emit(RequestReceived(path=request_path))
    else:
        import_preload()
        load_own()
    run_request(request_path, events)
    return 0
