"""The local executor: each request in its own isolated child process on this machine.

Each child gets:
- its own session and process group (``start_new_session``), so a timeout or an
  interrupt kills the child *and* anything it started (DataLoader workers);
- a *lifeline*: the read end of a pipe whose write end only the parent holds.
  When the parent dies, however it dies (SIGKILL included), the pipe reads EOF
  and a watchdog thread in the child kills the child's whole process group.
  (``PR_SET_PDEATHSIG`` would kill the child alone and orphan its grandchildren.);
- on the CPU backend, ``RLIMIT_DATA`` = the budget plus ``MALLOC_MMAP_THRESHOLD_``
  so that exceeding the budget is a real, repeatable allocation failure
  (measured: shared/notes/processes-and-memory.md);
- its own environment: the allocator setting, no GPU for the CPU backend;
- stdout and stderr to files (a pipe nobody reads can block a chatty model),
  and its events on a separate file, read back as complete lines only.

With ``warm=True`` it keeps one *spare* started ahead (see ``LocalExecutor``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from isoprobe.executors import ChildRun, Conditions
from isoprobe.executors.processes import (
    INTERRUPT_GRACE_SECONDS,
    child_environment,
    kill_group,
    lift_idle_policy,
    prepare_child,
    signals_deferred,
    stderr_tail,
    write_atomically,
)
from isoprobe.oomkill import memory_cgroup_dir, oom_kill_count
from isoprobe.protocol import CHILD_MODULE, LIFELINE_ENV, PRELOAD_ENV, WAIT_ARGUMENT, TrialRequest, read_events


@dataclass
class _Started:
    """A child process and the files it writes; ``warm`` ones wait for their request on stdin."""

    process: subprocess.Popen
    lifeline_write: int
    events_path: Path
    stderr_path: Path
    conditions: Conditions
    warm: bool


class LocalExecutor:
    """Starts the children of one probe; with ``warm=True`` it keeps one started ahead.

    A warm spare is started while the current trial runs: it imports Python,
    torch and the model library (``Conditions.preload``), then blocks reading
    its request's path from stdin. It never touches CUDA before that (importing
    torch does not create a context), so two contexts never share the GPU and
    the running trial's measurement is undisturbed. When its turn comes it gets
    the request and only builds and trains: the import, seconds per trial, is
    off the critical path. The spare is started under the conditions the probe
    announced (``prestart``); a request under other conditions (a memory check
    with a larger cap, the environment check) runs cold and leaves the spare
    for the next ordinary trial, and a spare that died while waiting is
    replaced by a cold start, so a warm start can change how fast a verdict
    comes, never what it is.
    """

    def __init__(self, workdir: Path | None = None, *, warm: bool = False):
        self._scratch = None
        if workdir is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="isoprobe-")
            workdir = Path(self._scratch.name)
        self.workdir = workdir
        self.warm = warm
        self._expected: Conditions | None = None
        self._spare: _Started | None = None
        self._count = 0

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, conditions: Conditions) -> None:
        """The next trials run under ``conditions``: (warm only) replace a spare started for others, start one."""
        self._expected = conditions
        if not self.warm:
            return
        with signals_deferred():
            if self._spare is not None and self._spare.conditions != conditions:
                spare, self._spare = self._spare, None
                _stop(spare, grace=0)
            if self._spare is None:
                self._spare = self._spawn(conditions, None)

    def close(self) -> None:
        """Stop the spare, if any, and remove the scratch folder: nothing outlives the probe."""
        spare, self._spare = self._spare, None
        if spare is not None:
            _stop(spare, grace=INTERRUPT_GRACE_SECONDS)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def run(self, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
        """Run one request in a fresh process (the spare if it matches) and wait, killing its group on timeout."""
        request_path = self.workdir / f"{name}.request.json"
        write_atomically(request_path, request.model_dump_json())
        cgroup = memory_cgroup_dir()  # the child starts in the parent's cgroup
        kills_before = oom_kill_count(cgroup)
        if self._expected is None and isinstance(request, TrialRequest):
            self._expected = conditions  # nobody announced the trials' conditions: the first trial's
        child: _Started | None = None
        started = time.monotonic()
        timed_out = False
        try:
            with signals_deferred():
                child = self._take_spare(conditions)
                if child is not None and not _deliver(child, request_path):
                    _stop(child, grace=0)
                    child = None
                if child is None:
                    child = self._spawn(conditions, request_path)
                started = time.monotonic()
                if self.warm and self._spare is None and conditions == self._expected:
                    self._spare = self._spawn(conditions, None)  # the next trial's child imports while this one runs
            try:
                returncode = child.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(child.process.pid)
                returncode = child.process.wait()
        finally:
            # Also on KeyboardInterrupt, and after a normal exit: nothing the trial started may outlive it.
            if child is not None:
                _stop(child, grace=INTERRUPT_GRACE_SECONDS)
        seconds = time.monotonic() - started
        kills_after = oom_kill_count(cgroup)
        return ChildRun(
            returncode=returncode,
            timed_out=timed_out,
            seconds=seconds,
            events=read_events(child.events_path),
            stderr_tail=stderr_tail(child.stderr_path),
            oom_kills=None if kills_before is None or kills_after is None else kills_after - kills_before,
            warm=child.warm,
        )

    def _take_spare(self, conditions: Conditions) -> _Started | None:
        spare = self._spare
        if spare is None or spare.conditions != conditions:
            return None  # other conditions: run cold, keep the spare for the next ordinary trial
        self._spare = None
        if spare.process.poll() is not None:  # died while waiting (killed, or its import failed)
            _stop(spare, grace=0)
            return None
        return spare

    def _spawn(self, conditions: Conditions, request_path: Path | None) -> _Started:
        """Start a child: with a request path it runs it at once (cold), without it waits (warm)."""
        self._count += 1
        stem = self.workdir / f"child{self._count:03d}"
        events_path = stem.with_suffix(".events.jsonl")
        stderr_path = stem.with_suffix(".stderr")
        env = child_environment(os.environ, backend=conditions.backend, allocator=conditions.allocator,
                                events_path=events_path)
        if conditions.preload:
            env[PRELOAD_ENV] = ",".join(conditions.preload)
        lifeline_read, lifeline_write = os.pipe()
        env[LIFELINE_ENV] = str(lifeline_read)
        warm = request_path is None
        argv = [sys.executable, "-m", CHILD_MODULE, WAIT_ARGUMENT if warm else str(request_path)]
        with open(stem.with_suffix(".stdout"), "wb") as out, open(stderr_path, "wb") as err:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE if warm else subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=self.workdir,
                    start_new_session=True,
                    pass_fds=(lifeline_read,),
                    preexec_fn=prepare_child(conditions.memory_limit, os.getpid()),
                )
            except BaseException:
                os.close(lifeline_write)
                raise
            finally:
                os.close(lifeline_read)
        return _Started(process, lifeline_write, events_path, stderr_path, conditions, warm)


def _deliver(child: _Started, request_path: Path) -> bool:
    """Hand a waiting child its request; False if it is gone (its pipe is closed)."""
    if child.process.poll() is not None:
        return False
    try:
        child.process.stdin.write(f"{request_path}\n".encode())
        child.process.stdin.close()
    except (BrokenPipeError, OSError):
        return False
    return True


def _stop(child: _Started, grace: float) -> None:
    """Kill the child's whole group (if still there), reap it, and close what the parent held."""
    if child.process.poll() is None:
        lift_idle_policy(child.process.pid)
        kill_group(child.process.pid, grace=grace)
    child.process.wait()
    try:
        os.killpg(child.process.pid, signal.SIGKILL)  # a grandchild that outlived the child
    except (ProcessLookupError, PermissionError):
        pass
    if child.process.stdin is not None and not child.process.stdin.closed:
        try:
            child.process.stdin.close()
        except OSError:
            pass
    if child.lifeline_write >= 0:
        os.close(child.lifeline_write)
        child.lifeline_write = -1


def run_once(request, conditions: Conditions, *, timeout: float, workdir: Path | None = None) -> ChildRun:
    """One cold child for one request, in a throwaway executor (tests, benchmarks)."""
    with LocalExecutor(workdir) as executor:
        return executor.run(request, conditions, timeout=timeout, name="once")
