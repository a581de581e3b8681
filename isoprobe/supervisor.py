"""One child process per trial: start it isolated, bound it in time and memory, read its verdict.

This is the only module that starts processes. ``Launcher`` starts them (and
can keep one *warm* spare started ahead, see its docstring). Each child gets:
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
  and the verdict on a separate events file, accepted only as complete lines.

``classify_exit`` turns what the child left behind into a verdict; it is pure,
so every failure shape (signal, exit without result, half a line) is tested
with literal values.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from isoprobe.hardware import visible_devices
from isoprobe.oomkill import memory_cgroup_dir, oom_kill_count
from isoprobe.outcomes import Outcome

#: Below this size glibc serves allocations from its heap and may keep freed memory,
#: which makes an RLIMIT_DATA boundary flaky; above it every block is its own mmap.
MALLOC_MMAP_THRESHOLD = 131072
#: Environment variable naming the child's end of the lifeline pipe (see the module docstring).
LIFELINE_ENV = "ISOPROBE_LIFELINE_FD"
#: Environment variable listing the modules a warm child imports before its request arrives.
PRELOAD_ENV = "ISOPROBE_PRELOAD"
#: The child's argument that means: import, then wait for the request's path on stdin.
WAIT_ARGUMENT = "--wait"
#: Seconds between SIGTERM and SIGKILL when a timed-out child's group is stopped.
KILL_GRACE_SECONDS = 2.0
#: The same when isoprobe itself is interrupted: every group must be gone within 2 s.
INTERRUPT_GRACE_SECONDS = 0.5
_STDERR_TAIL_CHARS = 4000
_STDERR_SCAN_BYTES = 65536
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class ChildRun:
    """Everything a finished child left behind."""

    returncode: int
    timed_out: bool
    seconds: float
    events: list[dict] = field(default_factory=list)
    stderr_tail: str = ""
    oom_kills: int | None = None  # OOM kills the child's memory cgroup counted during the run; None: unknown
    warm: bool = False  # the child had imported torch before its request arrived (see Launcher)


@dataclass(frozen=True)
class Verdict:
    """A child's end, classified."""

    outcome: Outcome
    result: dict | None   # the child's 'result' event, if it wrote one
    phase: str | None
    signal_name: str | None
    evidence: str | None = None  # why the outcome is not what the child itself reported


def classify_exit(run: ChildRun) -> Verdict:
    """fits / out_of_memory / error come from the child's own result; crashed / timed_out from how it ended."""
    result = next((e for e in reversed(run.events) if e.get("event") == "result"), None)
    phase = _last_phase(run.events)
    signal_name = _signal_name(run.returncode)
    if run.timed_out:
        return Verdict(Outcome.TIMED_OUT, result, phase, signal_name)
    if run.returncode == -signal.SIGKILL and run.oom_kills:
        return Verdict(
            Outcome.OUT_OF_MEMORY,
            result,
            phase,
            signal_name,
            f"SIGKILL while the memory cgroup's oom_kill counter rose by {run.oom_kills}: the kernel's OOM killer",
        )
    if result is None:
        return Verdict(Outcome.CRASHED, None, phase, signal_name)
    try:
        outcome = Outcome(result.get("outcome"))
    except ValueError:
        return Verdict(Outcome.CRASHED, result, phase, signal_name)
    if outcome is Outcome.FITS and run.returncode != 0:
        # It said 'fits', then died on the way out: unknown is never 'fits'.
        return Verdict(Outcome.CRASHED, result, phase, signal_name)
    # A failure verdict stands even if the exit was unclean: both say 'not this batch'.
    return Verdict(outcome, result, phase, signal_name)


def _last_phase(events: list[dict]) -> str | None:
    for event in reversed(events):
        kind = event.get("event")
        if kind == "result":
            return event.get("phase")
        if kind == "step":
            return f"step {event.get('step')}"
        if kind in ("started", "imported", "model_built"):
            return kind
    return None


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def read_events(path: Path) -> list[dict]:
    """Complete JSON lines only: a line cut short by a dying child is dropped, not guessed at."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    events = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is incomplete by definition
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def child_environment(
    base: dict[str, str], *, backend: str, allocator: str | None, events_path: Path
) -> dict[str, str]:
    """The environment one trial runs in. Pure, so what each child gets is testable."""
    env = dict(base)
    env["ISOPROBE_EVENTS"] = str(events_path)
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
    if backend == "cpu":
        env["MALLOC_MMAP_THRESHOLD_"] = str(MALLOC_MMAP_THRESHOLD)
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU trial can never create a CUDA context by accident
    else:
        # A Slurm job's GPUs, where only Slurm's variables name them (a batch shell, a hook): cuda:0 of
        # the trial must be the job's first GPU, not the node's.
        visible = visible_devices(base)
        if visible.source != "CUDA_VISIBLE_DEVICES" and visible.value is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible.value
    return env


def _prepare_child(memory_limit: int | None, parent_pid: int):
    """Runs in the child between fork and exec: give up if the parent is gone, and cap memory if asked."""

    def prepare() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _INTERRUPTS)  # see _signals_deferred
        if os.getppid() != parent_pid:
            os._exit(1)
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, memory_limit))

    return prepare


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name in the same folder, then rename: a reader sees all of it or nothing."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def lift_idle_policy(pid: int) -> None:
    """Give a child's idle-class threads the normal policy back, so that a kill ends it promptly.

    A warm spare imports under ``SCHED_IDLE`` (see ``child.wait_for_request``).
    Killed in the middle, its exit (unmapping torch) still runs at idle
    priority, and on a machine whose cores are busy that took longer than 30 s
    (measured: docs/measurements.md), with the parent waiting to reap it. Same
    owner, and the child only went idle where it may come back, so this is
    allowed wherever the child's own switch was; failures are ignored.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for task in tasks:
        try:
            if os.sched_getscheduler(int(task)) == os.SCHED_IDLE:
                os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
        except (OSError, ValueError, AttributeError):
            pass


def kill_group(pid: int, grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left after ``grace`` seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class _Started:
    """A child process and the files it writes; ``warm`` ones wait for their request on stdin."""

    process: subprocess.Popen
    lifeline_write: int
    events_path: Path
    stderr_path: Path
    memory_limit: int | None
    warm: bool


class Launcher:
    """Starts the children of one probe; with ``warm=True`` it keeps one started ahead.

    A warm spare is started while the current trial runs: it imports Python,
    torch and the model library (``preload``), then blocks reading its
    request's path from stdin. It never touches CUDA before that (importing
    torch does not create a context), so two contexts never share the GPU and
    the running trial's measurement is undisturbed. When its turn comes it gets
    the request and only builds and trains: the import, seconds per trial, is
    off the critical path. The spare has the same memory cap and environment a
    cold child would have; a request with a different cap (a memory check) runs
    cold, and a spare that died while waiting is replaced by a cold start, so a
    warm start can change how fast a verdict comes, never what it is.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        backend: str,
        allocator: str | None,
        preload: tuple[str, ...] = (),
        warm: bool = False,
    ):
        self.workdir = workdir
        self.backend = backend
        self.allocator = allocator
        self.preload = preload
        self.warm = warm
        self._spare: _Started | None = None
        self._count = 0

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, memory_limit: int | None) -> None:
        """Start the spare now (warm launchers only), e.g. while the environment is being checked."""
        if self.warm and self._spare is None:
            with _signals_deferred():
                self._spare = self._spawn(memory_limit, None)

    def close(self) -> None:
        """Stop the spare, if any: nothing outlives the probe."""
        spare, self._spare = self._spare, None
        if spare is not None:
            _stop(spare, grace=INTERRUPT_GRACE_SECONDS)

    def run(self, request: dict, *, timeout: float, memory_limit: int | None, name: str) -> ChildRun:
        """Run one request in a fresh process (the spare if it fits) and wait for it, killing its group on timeout."""
        request_path = self.workdir / f"{name}.request.json"
        write_atomically(request_path, json.dumps(request))
        cgroup = memory_cgroup_dir()  # the child starts in the parent's cgroup
        kills_before = oom_kill_count(cgroup)
        child: _Started | None = None
        started = time.monotonic()
        timed_out = False
        try:
            with _signals_deferred():
                child = self._take_spare(memory_limit)
                if child is not None and not _deliver(child, request_path):
                    _stop(child, grace=0)
                    child = None
                if child is None:
                    child = self._spawn(memory_limit, request_path)
                started = time.monotonic()
                if self.warm and self._spare is None:
                    self._spare = self._spawn(memory_limit, None)  # the next trial's child imports while this one runs
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
            stderr_tail=_tail(child.stderr_path),
            oom_kills=None if kills_before is None or kills_after is None else kills_after - kills_before,
            warm=child.warm,
        )

    def _take_spare(self, memory_limit: int | None) -> _Started | None:
        spare = self._spare
        if spare is None or spare.memory_limit != memory_limit:
            return None  # a different cap: run cold, keep the spare for the next ordinary trial
        self._spare = None
        if spare.process.poll() is not None:  # died while waiting (killed, or its import failed)
            _stop(spare, grace=0)
            return None
        return spare

    def _spawn(self, memory_limit: int | None, request_path: Path | None) -> _Started:
        """Start a child: with a request path it runs it at once (cold), without it waits (warm)."""
        self._count += 1
        stem = self.workdir / f"child{self._count:03d}"
        events_path = stem.with_suffix(".events.jsonl")
        stderr_path = stem.with_suffix(".stderr")
        env = child_environment(os.environ, backend=self.backend, allocator=self.allocator, events_path=events_path)
        if self.preload:
            env[PRELOAD_ENV] = ",".join(self.preload)
        lifeline_read, lifeline_write = os.pipe()
        env[LIFELINE_ENV] = str(lifeline_read)
        warm = request_path is None
        argv = [sys.executable, "-m", "isoprobe.child", WAIT_ARGUMENT if warm else str(request_path)]
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
                    preexec_fn=_prepare_child(memory_limit, os.getpid()),
                )
            except BaseException:
                os.close(lifeline_write)
                raise
            finally:
                os.close(lifeline_read)
        return _Started(process, lifeline_write, events_path, stderr_path, memory_limit, warm)


#: The signals that interrupt isoprobe (KeyboardInterrupt, errors.Terminated).
_INTERRUPTS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _signals_deferred():
    """Hold SIGINT and SIGTERM while children are started and recorded, then let them land.

    An interrupt raised inside ``subprocess.Popen`` (between fork and the end of
    its bookkeeping) or between taking the spare and recording it as the running
    child would lose track of a process that is already alive. Blocked here, the
    signal is delivered the moment this block ends, where every child is known
    and the ``finally`` clauses stop them. Children unblock both signals for
    themselves (``_prepare_child``): the mask would otherwise survive exec.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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


def run_child(
    request: dict,
    workdir: Path,
    *,
    backend: str,
    timeout: float,
    memory_limit: int | None,
    allocator: str | None,
    name: str,
) -> ChildRun:
    """One cold child for one request (the inspect child, and callers that need no spare)."""
    with Launcher(workdir, backend=backend, allocator=allocator) as launcher:
        return launcher.run(request, timeout=timeout, memory_limit=memory_limit, name=name)


def _tail(path: Path) -> str:
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
