"""The local executor: each request in its own isolated child process on this machine.

Each child runs under a *keeper* (``system.keeper``), a tiny process that
runs no user code, and gets:
- a session and process group of its own, and ``PR_SET_PDEATHSIG`` towards its
  keeper;
- a keeper that is a child subreaper: whatever the trial starts, in whatever
  session (``start_new_session=True``, a double fork), stays below the keeper,
  and is killed and reaped before the keeper exits; the keeper then exits as
  the child did, so the probe classifies the child's end;
- a *lifeline*: the read end of a pipe whose write end only the parent holds.
  When the parent dies, however it dies (SIGKILL included), the pipe reads EOF
  and the keeper SIGKILLs the whole tree, even if the trial holds the GIL or is
  stopped. Closing it is also how this executor stops a child (a timeout, an
  interrupt, an unused spare);
- on the CPU backend, ``RLIMIT_DATA`` = the budget plus ``MALLOC_MMAP_THRESHOLD_``
  so that exceeding the budget is a real, repeatable allocation failure
  (measured: shared/notes/processes-and-memory.md);
- its own environment: the allocator setting, no GPU for the CPU backend;
- stdout and stderr to files (a pipe nobody reads can block a chatty model),
  and its events on a separate file, read back as complete lines only.

Every child starts by importing (``Conditions.preload``) and reporting
``warm``; only then is its request delivered, and the request's timeout runs
from delivery. The import has a bound of its own (``processes.import_timeout``).
So a trial's timeout means the same whether its process was started ahead (a
*spare*, see ``LocalExecutor``) or on demand, and the two import the same
modules. A child that had written its verdict when its deadline came keeps it:
it gets a short grace to exit, and if it is killed all the same, the run says
so (``ChildRun.verdict_at_timeout``). Those steps on one started child (its
record, the waits, the delivery, the stop) are ``child_process``; this module
decides which child serves which request.

The fork server is isoprobe's own machinery: when it fails, the trial it was
running did not. A fork that ends or falls silent before its first report (the
server lost meanwhile, or the fork could not set itself up) is replaced by a
spawned child for the same request before it is delivered; a delivered trial
whose end the server lost (``ChildRun.lost``) is run again from the start, on a
fresh server, or spawned once ``SERVER_LOSSES`` servers were lost (``executors.rounds``, which every
``run`` and every parallel round goes through, so that a single trial and a slot are run again alike). A child that
left no event at all while the scratch folder has no room is the system's
refusal (an ``OSError`` out of ``collect``), not the trial's crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from isoprobe.executors import ChildRun, Conditions
from isoprobe.executors.child_process import StartedChild, await_warm, deliver, extend_imports, modules_file, stop_child
from isoprobe.executors.fork_server_channel import ForkedProcess
from isoprobe.executors.fork_server_choice import ForkServers, added_imports
from isoprobe.executors.processes import (
    child_environment,
    import_timeout,
    prepare_child,
    signals_deferred,
    stderr_tail,
    write_atomically,
)
from isoprobe.protocol.messages import (
    CHILD_MODULE,
    IDLE_ARGUMENT,
    PRELOAD_ENV,
    SERVE_ARGUMENT,
    WAIT_ARGUMENT,
    TrialRequest,
    Warm,
    last_of,
    read_events,
)
from isoprobe.protocol.wiring import WARM_PLAN_ENV
from isoprobe.system import keeper
from isoprobe.system.oomkill import memory_cgroup_dir, oom_kill_count

#: How much a child that left no event at all must be able to write to the scratch folder now, for its
#: silence to be its own and not the disk's (an events line is ~100 bytes; a trial's files, kilobytes).
_ROOM_BYTES = 65536


@dataclass
class Launch:
    """One request's process between its start and its collection (``LocalExecutor.launch``)."""

    began: float
    cgroup: Path | None = None
    kills_before: int | None = None
    child: StartedChild | None = None
    delivered: float | None = None  # when the request reached a process that had finished its imports
    timed_out: bool = False
    verdict_at_timeout: bool = False

    @property
    def events_path(self) -> Path | None:
        return self.child.events_path if self.child is not None else None

    @property
    def pid(self) -> int | None:
        """The keeper's pid: its tree is the trial's (``rounds.BusyClock`` reads the CPU it got)."""
        return self.child.process.pid if self.child is not None else None

    def poll(self) -> int | None:
        """The keeper's exit status (the child's), or None while it runs."""
        return self.child.process.poll() if self.child is not None else -1


class LocalExecutor:
    """Starts the children of one probe; with ``warm=True`` it keeps one started ahead.

    A warm spare is started while the current trial runs: it imports Python,
    torch and the model library (``Conditions.preload``) at idle priority, then
    blocks reading its request's path from stdin. It never touches CUDA before
    that (importing torch does not create a context), so two contexts never
    share the GPU and the running trial's measurement is undisturbed. When its
    turn comes it gets the request and only builds and trains: the import,
    seconds per trial, is off the critical path. The spare is started under the
    conditions the probe announced (``prestart``); announced conditions that
    only add modules to its preload (the model's imports, known after the
    environment check) are imported by the waiting spare (``IMPORT_LINE``)
    instead of a new one starting over; a request under other
    conditions (a memory check with a larger cap, the environment check) gets a
    child started on demand and leaves the spare for the next ordinary trial,
    and a spare that died while waiting is replaced by one started on demand,
    so a warm start can change how fast a verdict comes, never what it is.
    """

    def __init__(self, workdir: Path | None = None, *, warm: bool = False, fork: Iterable[str] = ()):
        self._scratch = None
        if workdir is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="isoprobe-")
            workdir = Path(self._scratch.name)
        self.workdir = workdir
        self.warm = warm
        self.fork = frozenset(fork)  # the backends whose children are forked from a fork server
        self._expected: Conditions | None = None
        self._spare: StartedChild | None = None
        self.servers = ForkServers(self.fork, lambda key, fd: self._spawn(key, spare=False, serve=fd), self._next_files)
        self._count = 0

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, conditions: Conditions) -> None:
        """The next trials run under ``conditions``: (warm only) replace a spare started for others, start one."""
        self._expected = conditions
        if self.servers.forks(conditions):
            with signals_deferred():
                self.servers.server_for(conditions)  # imports while the probe goes on
            return
        if not self.warm:
            return
        with signals_deferred():
            if (
                self._spare is not None
                and self._spare.conditions != conditions
                and not self._extend(self._spare, conditions)
            ):
                spare, self._spare = self._spare, None
                stop_child(spare)
            if self._spare is None:
                self._spare = self._spawn(conditions, spare=True)

    def close(self) -> None:
        """Stop the spare, if any, and remove the scratch folder: nothing outlives the probe."""
        spare, self._spare = self._spare, None
        if spare is not None:
            stop_child(spare)
        self.servers.stop()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def run(self, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
        """Run one request in a fresh process (the spare if it matches); ``timeout`` counts from its delivery.

        A round of one (``executors.rounds``): a run the fork server lost is run
        again (see the module's docstring), and the returned run names the
        attempts lost before it (``lost_before``).
        """
        from isoprobe.executors.rounds import run_round

        runs: list[ChildRun] = []
        run_round(self, [(request, conditions, timeout, name)], lambda slot, run: runs.append(run))
        return runs[0]

    def launch(self, request, conditions: Conditions, *, timeout: float, name: str) -> Launch:
        """Start (or take) a process for ``request`` and deliver it; the caller waits, then ``stop`` and ``collect``.

        The pieces of ``run``, for an executor that runs several children at
        once (``gang``). If this raises, nothing it started is left running.
        """
        request_path = self.workdir / f"{name}.request.json"
        write_atomically(request_path, request.model_dump_json())
        cgroup = memory_cgroup_dir()  # the child starts in the parent's cgroup
        launch = Launch(began=time.monotonic(), cgroup=cgroup, kills_before=oom_kill_count(cgroup))
        if self._expected is None and isinstance(request, TrialRequest):
            self._expected = conditions  # nobody announced the trials' conditions: the first trial's
        try:
            if self.servers.forks(conditions):
                launch.child = self.servers.fork(request_path, conditions, timeout)
            if launch.child is not None:
                # A fork sets itself up (threads, pages, files, cap) before it reports warm: the timeout runs
                # from then, as a spawned child's runs from after its imports.
                if await_warm(launch.child, import_timeout(timeout)):
                    launch.delivered = time.monotonic()
                else:
                    self.servers.unfit(launch.child)
                    launch.child = None
            while launch.delivered is None:
                if launch.child is None:
                    with signals_deferred():
                        launch.child = self._take_spare(conditions)
                if launch.child is None:
                    with signals_deferred():
                        launch.child = self._spawn(conditions, spare=False)
                ready = await_warm(launch.child, import_timeout(timeout))
                if ready and launch.child.warm and self._made_a_context(launch.child):
                    stop_child(launch.child)  # its context sat on the card beside the trial before: none again
                    launch.child = None
                    continue
                if ready and deliver(launch.child, request_path):
                    launch.delivered = time.monotonic()
                    break
                if launch.child.warm and ready is not None:
                    stop_child(launch.child)  # a spare that died while waiting: one started now takes its place
                    launch.child = None
                    continue
                # Started for this request and gone before it could be delivered, or not ready in time.
                launch.timed_out = ready is None
                break
            if launch.delivered is not None and launch.child is not None:  # delivered: to a child
                with signals_deferred():
                    if self.warm and not launch.child.forked and self._spare is None and conditions == self._expected:
                        self._spare = self._spawn(conditions, spare=True)  # imports while this one runs
        except BaseException:
            self.stop(launch)
            raise
        return launch

    @staticmethod
    def stop(launch: Launch) -> None:
        """End the launch's process tree (if still running) and reap its keeper; safe to call twice."""
        if launch.child is not None:
            stop_child(launch.child)

    @staticmethod
    def collect(launch: Launch) -> ChildRun:
        """What a stopped launch's child left behind (``lost``: why the fork server could not say how it ended).

        Raises the ``OSError`` of a scratch folder without room when the child left no event at all.
        """
        child = launch.child
        assert child is not None, "a launch returns with a child (or raises)"
        seconds = time.monotonic() - (launch.delivered if launch.delivered is not None else launch.began)
        kills_after = oom_kill_count(launch.cgroup)
        events = read_events(child.events_path)
        lost = child.process.lost if isinstance(child.process, ForkedProcess) else None
        if not events and lost is None:
            _check_room(child.events_path.parent)
        returncode = child.process.returncode
        assert returncode is not None, "stopped: its keeper was reaped (stop_child raises if it cannot be)"
        return ChildRun(
            returncode=returncode,
            timed_out=launch.timed_out,
            seconds=seconds,
            events=events,
            stderr_tail=stderr_tail(child.stderr_path),
            oom_kills=None if launch.kills_before is None or kills_after is None else kills_after - launch.kills_before,
            warm=child.warm,
            verdict_at_timeout=launch.verdict_at_timeout,
            forked=child.forked,
            lost=lost,
        )

    def _next_files(self) -> tuple[Path, Path, Path]:
        """The next child's file stem (stdout is ``.stdout``), its events file and its stderr file."""
        self._count += 1
        stem = self.workdir / f"child{self._count:03d}"
        return stem, stem.with_suffix(".events.jsonl"), stem.with_suffix(".stderr")

    def _extend(self, spare: StartedChild, conditions: Conditions) -> bool:
        """Make a spare one of ``conditions`` by telling it to import what they add to its preload (the model's
        imports, once the environment check has run), if that is all they change; whether it now is."""
        more = added_imports(spare.conditions, conditions)
        return bool(more) and extend_imports(spare, conditions, modules_file(self._next_files()[0], more))

    def _made_a_context(self, spare: StartedChild) -> bool:
        """Whether a CUDA spare's imports created a CUDA context (a preloaded module's ``torch.zeros(...,
        device="cuda")``): that context took memory on the card while the trial before it ran, beside it, and
        every later spare would again. Then this probe starts its trials cold from here on (``warm`` off), and
        says so. What the trial beside it read counted that memory as its own (a CUDA reading is the card's use):
        a reading too high, never a batch credited that did not fit."""
        if spare.conditions.backend != "cuda":
            return False
        warm = last_of(read_events(spare.events_path), Warm)
        if warm is None or not warm.cuda_initialized:
            return False
        self.warm = False
        sys.stderr.write(
            "isoprobe: a warm spare created a CUDA context while importing (a module of the model's "
            "makes CUDA tensors at import?): it held memory on the card beside the running trial, so "
            "trials start cold from now on\n"
        )
        return True

    def _take_spare(self, conditions: Conditions) -> StartedChild | None:
        spare = self._spare
        if spare is None or spare.conditions != conditions:
            return None  # other conditions: start one on demand, keep the spare for the next ordinary trial
        self._spare = None
        if spare.process.poll() is not None:  # died while waiting (killed, say)
            stop_child(spare)
            return None
        return spare

    def _spawn(self, conditions: Conditions, *, spare: bool, serve: int | None = None) -> StartedChild:
        """Start a keeper and its child, which imports ``conditions.preload`` and then waits for its request
        (or, with ``serve``, its channel's descriptor: becomes a fork server)."""
        stem, events_path, stderr_path = self._next_files()
        env = child_environment(
            os.environ,
            backend=conditions.backend,
            allocator=conditions.allocator,
            events_path=events_path,
            threads=conditions.threads,
        )
        if conditions.preload:
            env[PRELOAD_ENV] = ",".join(conditions.preload)
        if conditions.command_plan:
            env[WARM_PLAN_ENV] = conditions.command_plan
        child_argv = [sys.executable, "-m", CHILD_MODULE, WAIT_ARGUMENT] + ([IDLE_ARGUMENT] if spare else [])
        if serve is not None:
            child_argv = [sys.executable, "-m", CHILD_MODULE, SERVE_ARGUMENT, str(serve)]
        lifeline_read, lifeline_write = os.pipe()
        with open(stem.with_suffix(".stdout"), "wb") as out, open(stderr_path, "wb") as err:
            try:
                process = subprocess.Popen(
                    keeper.command(lifeline_read, child_argv),
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=self.workdir,
                    start_new_session=True,
                    pass_fds=(lifeline_read,) if serve is None else (lifeline_read, serve),
                    preexec_fn=prepare_child(conditions.memory_limit, os.getpid()),
                )
            except BaseException:
                os.close(lifeline_write)
                raise
            finally:
                os.close(lifeline_read)
        return StartedChild(process, lifeline_write, events_path, stderr_path, conditions, spare)


def _check_room(folder: Path) -> None:
    """Raise the ``OSError`` (ENOSPC, EDQUOT...) of a folder that cannot take ``_ROOM_BYTES`` now."""
    probe = folder / ".room"
    try:
        with open(probe, "wb") as handle:
            handle.write(bytes(_ROOM_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def run_once(request, conditions: Conditions, *, timeout: float, workdir: Path | None = None) -> ChildRun:
    """One child started on demand for one request, in a throwaway executor (tests, benchmarks)."""
    with LocalExecutor(workdir) as executor:
        return executor.run(request, conditions, timeout=timeout, name="once")
