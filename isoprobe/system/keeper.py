"""The keeper: a tiny process between the executor and each child, so that nothing a trial starts outlives it.

Two guarantees cannot be kept from inside a trial, because a trial runs the
user's code:

- **Everything the trial started dies with it.** Killing the trial's process
  group misses whatever left it: ``subprocess.Popen(..., start_new_session=True)``
  or a double fork with ``setsid`` makes a new session, hence a new group. The
  keeper is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): every process
  orphaned below it, whatever its session or group, is re-parented to the
  keeper instead of to init, so it stays the keeper's descendant. When the
  trial ends, the keeper SIGKILLs every descendant it has (found in /proc by
  parent PID), reaps them, and repeats until it has no child left.
- **If isoprobe dies, nothing of the trial survives.** A watchdog thread in
  the trial needs the trial's Python to run: a forward spinning in a regex
  holds the GIL, a SIGSTOPped trial runs nothing at all. The keeper runs no
  user code. It blocks in ``poll`` on the *lifeline*, a pipe whose write end
  only isoprobe holds and which the kernel closes however isoprobe ends
  (SIGKILL and SIGHUP included); on EOF it SIGKILLs the tree, stopped
  processes too (SIGKILL needs no cooperation). The trial itself gets
  ``PR_SET_PDEATHSIG=SIGKILL`` towards the keeper, so if the keeper is killed,
  the kernel kills the trial.

Which mechanism where. The subreaper everywhere (Linux 3.4 and later, no
privilege). A cgroup per trial (cgroup v2 ``cgroup.kill``) would also catch a
process re-parented away by a second subreaper of the user's own, but needs
a writable, delegated cgroup subtree, which a Slurm job step, a container
and a v1/hybrid host (like the one this was written on) usually do not give;
it would also move the trial out of the memory cgroup whose OOM-kill counter
the executor reads (``isoprobe.system.oomkill``). So no cgroup is used.

How the executor uses it (``command``): ``python -I -S standalone.py system/keeper FD [--on-stop FILE] -- CHILD
ARGV`` (``system.standalone``, the one loader of the standard-library-only code).
``--on-stop``: commands the keeper runs when it is stopped while the child still
runs (or the child ended and left processes behind), before it kills the tree,
for what the child had started where the keeper cannot see (a Slurm job step's
tasks: ``executors.srun_gang``). For the same reason a keeper about to kill an
``srun`` in its tree (a probed command's) cancels that srun's job steps through
Slurm first (``primitives.cancel_slurm_steps``).
It imports the standard library only, and loads ``system.primitives`` through the loader (no pydantic, no torch, no
site-packages), which keeps its start-up at about 10 ms. It starts the child with
its own stdin, stdout, stderr and environment, in a session of its own, waits,
cleans up, and then exits *as the child did*: the same exit code, or death by
the same signal. The probe therefore classifies the child's end, never the
keeper's. Closing the lifeline is also how the executor stops a trial (a
timeout, an interrupt, a spare not needed): one path for every end. A
SIGTERM, SIGINT, SIGHUP or SIGQUIT sent to the keeper itself (a job step's
teardown) stops it the same way.
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
import sys
import time

TYPE_CHECKING = False  # typing's flag without importing typing (start-up): mypy reads the branch below as taken
if TYPE_CHECKING or __package__:
    from isoprobe.system import primitives, standalone
else:  # run by the standalone loader (python -I -S standalone.py system/keeper): isoprobe is not importable here
    standalone = sys.modules["_isoprobe_standalone"]
    primitives = standalone.load("system/primitives")

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

#: Signals that stop the keeper as a closed lifeline does (the tree is killed first).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: Exit code when the keeper could not start the child at all (as a shell reports "cannot execute").
CANNOT_START = 127


#: The keeper's option naming a file of commands (a JSON list of argv lists) it runs when it is stopped (its
#: lifeline closed, a stop signal) while its child still runs, or finds the child ended with processes left below
#: it, before it kills the tree (``run_on_stop``).
ON_STOP_OPTION = "--on-stop"
#: How long each on-stop command may take before the keeper gives up on it and kills the tree anyway.
ON_STOP_SECONDS = 10.0
#: How long a stopped keeper waits for the Slurm steps it cancelled to leave ``squeue -s``, asking again every
#: ``ON_STOP_RECANCEL_SECONDS``, before it kills its tree anyway (their srun then dies with it).
ON_STOP_STEPS_GONE_SECONDS = 20.0
ON_STOP_RECANCEL_SECONDS = 0.5


def command(lifeline_fd: int, child_argv: list[str], on_stop: str | None = None) -> list[str]:
    """The argv that runs ``child_argv`` under a keeper watching ``lifeline_fd`` (isolated, no site-packages).

    ``on_stop``: a file the caller may fill, while the child runs, with the commands that end what the
    child started elsewhere (a Slurm job step's tasks on other nodes are no descendants of the keeper:
    ``executors.srun_gang`` writes ``scancel --ctld --signal=KILL JOB.STEP`` there).
    """
    options = [ON_STOP_OPTION, on_stop] if on_stop is not None else []
    return standalone.command("system/keeper", str(lifeline_fd), *options, "--", *child_argv)


def _live_descendants(root: int) -> bool:
    return any(state not in ("Z", "X") for _, state in primitives.descendants(root))


class Keeper:
    """One child, its lifeline, and the statuses reaped so far."""

    def __init__(self, lifeline: int, child_argv: list[str] | None, child_main=None):
        self.lifeline = lifeline
        self.child_argv = child_argv
        #: Instead of ``child_argv``: run this in the forked child, which then exits (the fork server's trials,
        #: ``isoprobe.child.server``). It must never return into the caller's code.
        self.child_main = child_main
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.child = -1
        self.child_status: int | None = None
        self.stop_requested = False

    def prctl(self, option: int, value: int) -> None:
        if self.libc.prctl(option, value, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl({option}): {os.strerror(error)}")

    def start(self) -> None:
        """Fork and exec the child: a session of its own, killed by the kernel if the keeper dies."""
        handled = {signal.SIGCHLD, *STOP_SIGNALS}
        keeper = os.getpid()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, handled)  # no handler may run in the forked copy
        pid = os.fork()
        if pid == 0:
            try:
                for signum in (*handled, signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(signum, signal.SIG_DFL)  # as subprocess.Popen leaves them for a child
                signal.set_wakeup_fd(-1)
                os.setsid()
                self.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != keeper:  # the keeper died before the line above: nobody would kill us
                    os._exit(CANNOT_START)
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
                if self.child_main is not None:
                    self.child_main()  # exits itself
                    os._exit(CANNOT_START)
                if self.child_argv is None:  # neither given: reported below, as any failure to start
                    raise ValueError("no child_argv and no child_main")
                os.execv(self.child_argv[0], self.child_argv)
            except BaseException as error:
                what = self.child_argv[0] if self.child_argv else "the forked child"
                os.write(2, f"isoprobe keeper: cannot start {what}: {error}\n".encode())
            os._exit(CANNOT_START)
        self.child = pid
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def reap(self) -> bool:
        """Reap every child that has ended (orphans included); False once the keeper has no child at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.child:
                self.child_status = status

    def supervise(self) -> None:
        """Wait until the child ends, the lifeline reads EOF, or a stop signal comes; reap orphans meanwhile."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        poller = select.poll()
        poller.register(self.lifeline, select.POLLIN | select.POLLHUP | select.POLLERR)
        poller.register(wake_read, select.POLLIN)
        while True:
            self.reap()
            if self.child_status is not None or self.stop_requested:
                return
            for fd, _ in poller.poll(1000):  # 1 s: a backstop only, signals and EOF wake it at once
                if fd == wake_read:
                    while _read_some(wake_read):
                        pass
                elif not _read_some(self.lifeline):  # EOF (or an error): isoprobe is gone or wants us gone
                    self.stop_requested = True

    def kill_tree(self) -> None:
        """SIGKILL every descendant (stopped ones too), reap, repeat until the keeper has no child left."""
        me = os.getpid()
        lifted: set[int] = set()
        pause = 0.001
        while True:
            if not self.reap():
                return
            live = [pid for pid, state in primitives.descendants(me) if state not in ("Z", "X")]
            for pid in live:
                if pid not in lifted:
                    primitives.lift_idle_policy(pid)
                    lifted.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(pause)  # processes take a moment to exit (torch unmaps a lot); zombies to be reaped
            pause = min(pause * 2, 0.02)


def _read_some(fd: int) -> bool:
    """Read what is there; False at EOF or on an error (a lifeline that fails is a lifeline that is gone)."""
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False
    except OSError:
        return False


def exit_as(status: int) -> None:
    """End this process the way a wait status says: the same exit code, or death by the same signal."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    signum = -code
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a core of the keeper is nobody's evidence
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be changed, and need not be
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default is not to terminate: as a shell would report it


def run_on_stop(path: str | None) -> None:
    """Run the commands in ``path`` (a JSON list of argv lists), each bounded by ``ON_STOP_SECONDS``; never raise.

    What the tree's SIGKILL cannot reach: processes the child had another machine start (a job step's tasks).
    A missing or unreadable file means there is nothing to run (the child had not got that far).
    """
    if path is None:
        return
    import json
    import subprocess

    try:
        with open(path, encoding="utf-8") as handle:
            commands = json.load(handle)
    except (OSError, ValueError):
        return
    for argv in commands if isinstance(commands, list) else []:
        try:
            subprocess.run(
                [str(part) for part in argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=ON_STOP_SECONDS,
                check=False,
            )
        except (OSError, ValueError, subprocess.SubprocessError):
            pass


def main(argv: list[str]) -> None:
    on_stop = None
    if len(argv) >= 4 and argv[2] == ON_STOP_OPTION:
        on_stop, argv = argv[3], argv[:2] + argv[4:]
    if len(argv) < 4 or argv[2] != "--" or not argv[1].isdigit():
        os.write(2, b"usage: standalone.py system/keeper LIFELINE_FD [--on-stop FILE] -- CHILD_ARGV...\n")
        os._exit(2)
    keep(Keeper(int(argv[1]), argv[3:]), on_stop)


def keep(keeper: Keeper, on_stop: str | None = None) -> None:
    """Be ``keeper``: start its child, supervise it, kill what is left, exit as the child did. Never returns."""
    lifeline = keeper.lifeline
    try:
        os.set_inheritable(lifeline, False)  # the child must not hold it: only the keeper watches it
        keeper.prctl(PR_SET_CHILD_SUBREAPER, 1)
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: setattr(keeper, "stop_requested", True))
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD wakes the poll
        keeper.start()
    except OSError as error:
        os.write(2, f"isoprobe keeper: {error}\n".encode())
        os._exit(CANNOT_START)
    # The request pipe (stdin) is the child's: the keeper lets go of its copy.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    keeper.supervise()
    # Stopped while the child runs, or the child ended and left processes behind: either way the child did not
    # finish its own cleanup, and the tree about to be killed may hold what no SIGKILL of it ends. The second case
    # is not rare: when isoprobe dies, the fork server (this keeper's child) reads EOF and exits in the same instant
    # as the lifeline closes, and a trial's keeper below it, busy ending its command's job step, would be killed
    # by this keeper's sweep before it had asked Slurm (measured on the two-node test cluster under CPU load:
    # 2 runs in 7 of isoprobe SIGKILLed mid-command left the step's tasks running on both nodes).
    steps = []
    if keeper.child_status is None or _live_descendants(os.getpid()):
        run_on_stop(on_stop)
        # A probed command that runs srun (``isoprobe run -- srun python train.py``) started job steps whose
        # tasks no SIGKILL of this tree reaches: end them through Slurm, before their srun dies with the tree.
        steps = primitives.slurm_steps_of(primitives.srun_processes(os.getpid()))
        primitives.cancel_slurm_steps(steps)
    keeper.kill_tree()
    # A task that slurmstepd was still launching misses the kill, and the cancel can miss it too (measured on the
    # two-node test cluster: 1 run in 6 of isoprobe SIGKILLed right as its command's srun started the step, whose
    # tasks then ran on): with srun gone, ask again until squeue -s drops the steps, for a bounded while.
    if steps:
        primitives.wait_slurm_steps_gone(
            steps,
            ON_STOP_STEPS_GONE_SECONDS,
            recancel_after=ON_STOP_RECANCEL_SECONDS,
            recancel_every=ON_STOP_RECANCEL_SECONDS,
        )
    exit_as(keeper.child_status if keeper.child_status is not None else signal.SIGKILL)
