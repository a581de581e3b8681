"""The processes' primitives of the standard-library-only code: a process's state, its scheduler autogroup, and the
end of the Slurm job steps an srun started. One definition each, for the keeper, a Slurm rank's wrapper, the child,
a command trial's supervisor and the parent alike.

Standard library only, and part of the standalone layer (``system.standalone``): the keeper and a rank's wrapper
load it by its file. Linux's /proc is read directly, never through a library: a process's state is the field after
its command's name in ``/proc/PID/stat`` (the name may hold spaces and parentheses, hence the last ``)``).

Slurm. A step's tasks run under each node's slurmstepd, not below the srun that started them: no SIGKILL of a
process tree reaches them, and they outlive a killed srun (measured on Slurm 22.05). Whoever is about to kill an
srun (the keeper, a command trial's supervisor, the gang executor) ends its steps through Slurm first, with
``scancel`` here.
"""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False  # typing's flag without importing typing (the keeper's start-up): mypy reads it as True
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping

# --------------------------------------------------------------------------- a process's state, from /proc


def state_of(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and parent's pid, from ``/proc/PID/stat``; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
        return state.decode(), int(ppid)
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    found = state_of(pid)
    return found is not None and found[0] not in ("Z", "X")


def lift_idle_policy(pid: int) -> None:
    """Give a process's idle-class threads the normal policy back, so that a kill ends it promptly.

    A warm spare imports under ``SCHED_IDLE`` (see ``child.main``). Killed in
    the middle, its exit (unmapping torch) still runs at idle priority, and on a
    machine whose cores are busy that took longer than 30 s (measured:
    docs/measurements.md). Same owner, and the child only went idle where it
    may come back, so this is allowed wherever the child's own switch was;
    failures are ignored.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    lifted = False
    for task in tasks:
        try:
            if os.sched_getscheduler(int(task)) == os.SCHED_IDLE:
                os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
                lifted = True
        except (OSError, ValueError, AttributeError):
            pass
    if lifted:
        autogroup_back(pid)


def descendants(root: int) -> list[tuple[int, str]]:
    """Every process below ``root`` as (pid, state), from /proc by parent PID: by ancestry, whatever the session."""
    children: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        found_state = state_of(name)
        if found_state is not None:  # else gone meanwhile
            children.setdefault(found_state[1], []).append((int(name), found_state[0]))
    found: list[tuple[int, str]] = []
    frontier = [root]
    while frontier:
        for pid, pid_state in children.get(frontier.pop(), ()):
            found.append((pid, pid_state))
            frontier.append(pid)
    return found


def sigkill_below(root: int, *, also: tuple[int, ...] = (), sweeps: int = 3, pause: float = 0.05) -> None:
    """SIGKILL ``also`` and every live process below ``root`` (by ancestry, whatever its session), a few sweeps
    for processes forked meanwhile; returns once a sweep finds none below ``root``. For a caller that cannot
    reap them all itself (the parent's last resort on a keeper, a command trial's supervisor on its command)."""
    for _ in range(sweeps):
        pids = [pid for pid, state in descendants(root) if state not in ("Z", "X")]
        for pid in [*also, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not pids:
            return
        time.sleep(pause)


def srun_processes(root: int) -> set[int]:
    """The live ``srun`` processes below ``root`` (by ancestry, whatever their session)."""
    found = set()
    for pid, state in descendants(root):
        if state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{pid}/comm", "rb") as handle:
                if handle.read().strip() == b"srun":
                    found.add(pid)
        except OSError:
            continue
    return found


# --------------------------------------------------------------------------- the scheduler's autogroup

#: Writes of an autogroup's nice value tried before giving up: the kernel takes one such write every 100 ms,
#: machine-wide (``proc_sched_autogroup_set_nice``: EAGAIN otherwise), and a gang's ranks start their imports at once.
AUTOGROUP_TRIES = 20
#: The same, where the write is a courtesy on the way to a kill (``autogroup_back``).
AUTOGROUP_BACK_TRIES = 3


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The nice value of the scheduler autogroup of ``pid`` (Linux, ``sched_autogroup_enabled``), where ``pid`` leads
    its own session: an autogroup is a session, and changing one that holds other processes (isoprobe's own shell)
    would change them too. None: no autogroups here, a shared session, or the process is gone."""
    try:
        target = os.getpid() if pid == "self" else int(pid)
        if os.getsid(target) != target:
            return None
        with open(f"/proc/{pid}/autogroup", encoding="ascii") as handle:
            return int(handle.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(value: int, pid: int | str = "self", tries: int = AUTOGROUP_TRIES) -> bool:
    """Set the nice value of the autogroup of ``pid`` (a value of 0 or more is anyone's to set); False if it could
    not be. Tried again, apart, while another write of the last 100 ms anywhere on the machine holds it off."""
    for _ in range(tries):
        try:
            with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as handle:
                handle.write(str(value))
            return True
        except BlockingIOError:
            time.sleep(0.03 + (os.getpid() % 7) / 100)  # processes that collided try again apart
        except OSError:
            return False
    return False


def autogroup_back(pid: int) -> None:
    """The nice value of the autogroup a lowered child leads back to 0 (``child.main`` set 19 for its imports).

    Only a process that leads its own session (every child isoprobe starts) has
    its autogroup to itself; a new session's autogroup starts at 0, and 0 is
    anyone's to set. With its threads back to normal but its autogroup at 19,
    the child would still get 15/1024 of what a trial beside it gets. On the
    kill path (the keeper's) a write lost to collisions costs only speed, so it
    is tried ``AUTOGROUP_BACK_TRIES`` times, not ``AUTOGROUP_TRIES``.
    """
    if autogroup_nice(pid) not in (None, 0):
        set_autogroup_nice(0, pid, tries=AUTOGROUP_BACK_TRIES)


# --------------------------------------------------------------------------- the Slurm job steps an srun started

#: How long one call of Slurm's clients (scontrol, scancel, squeue) may take before the caller goes on without it.
CLIENT_SECONDS = 10.0


def ask_slurm(
    argv: list[str], seconds: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run one of Slurm's clients (scontrol, squeue, sinfo, scancel) once, its output captured; None where it could
    not start or did not answer within ``seconds`` (a busy slurmctld). Never raises: what Slurm did not say is
    unknown, and each caller says what unknown means for it (its bound too: a SIGTERM's reader has 2 s, the end of a
    step ``CLIENT_SECONDS``)."""
    import subprocess

    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.SubprocessError):
        return None


def steps_of_sruns(listing: str, sruns: set[int], host: str) -> list[str]:
    """From ``scontrol show step -o``'s lines, the steps whose srun ran on ``host`` as one of ``sruns`` (pure)."""
    import re

    found = []
    for line in listing.splitlines():
        fields = dict(re.findall(r"(\S+?)=(\S*)", line))
        step, srun = fields.get("StepId"), fields.get("SrunHost:Pid", "")
        srun_host, _, pid = srun.rpartition(":")
        if step and pid.isdigit() and int(pid) in sruns and srun_host.split(".")[0] == host.split(".")[0]:
            found.append(step)
    return found


def slurm_steps_of(sruns: set[int]) -> list[str]:
    """The job steps whose srun is one of ``sruns`` on this host (``scontrol show step``'s ``SrunHost:Pid``);
    none where Slurm's clients are missing or do not answer within ``CLIENT_SECONDS``."""
    if not sruns:
        return []
    import shutil
    import socket

    scontrol = shutil.which("scontrol")
    listed = None if scontrol is None else ask_slurm([scontrol, "show", "step", "-o"], CLIENT_SECONDS)
    return [] if listed is None else steps_of_sruns(listed.stdout, sruns, socket.gethostname())


#: How isoprobe has Slurm SIGKILL a step's tasks: through slurmctld (REQUEST_SIGNAL_TASKS to each node). Without
#: ``--ctld``, ``scancel --signal=KILL JOB.STEP`` sends REQUEST_TERMINATE_TASKS to each slurmd itself (Slurm 22.05:
#: scancel.c calls ``slurm_terminate_job_step``), and slurmstepd's ``_handle_terminate`` starts its unkillable-step
#: monitor: a task not reaped ``UnkillableStepTimeout`` (60 s) later drains the node ("Kill task failed"). The same
#: SIGKILL reaches the same processes either way (proctrack's ``kill_proc_tree``); only the terminate request arms
#: the monitor, and a probe must never be what drains a site's node.
KILL_THROUGH_SLURMCTLD = ("--ctld", "--signal=KILL")


def cancel_slurm_steps(steps: list[str], scancel: str = "scancel") -> None:
    """Kill the tasks of ``steps`` on every node, then cancel the steps, through slurmctld; never raise.

    Killing their srun does not end them: the tasks run under each node's slurmstepd (measured on Slurm 22.05:
    a step whose srun was SIGKILLed kept its tasks running on both nodes)."""
    if not steps:
        return
    import shutil

    program = shutil.which(scancel)
    if program is None:
        return
    scancel_now(program, *KILL_THROUGH_SLURMCTLD, *steps)
    scancel_now(program, *steps)


def scancel_now(program: str, *arguments: str) -> None:
    """Run ``scancel ARGUMENTS`` once, bounded by ``CLIENT_SECONDS``; never raise (the step's end is checked with
    squeue after, and asked for again there: ``wait_slurm_steps_gone``)."""
    ask_slurm([program, *arguments], CLIENT_SECONDS)


def wait_slurm_steps_gone(
    steps: list[str],
    seconds: float,
    *,
    recancel_after: float,
    recancel_every: float,
    squeue: str = "squeue",
    scancel: str = "scancel",
    job: str | None = None,
) -> list[str]:
    """Wait until ``squeue -s`` lists none of ``steps`` (ended already), asking Slurm again to kill and cancel those
    still listed ``recancel_after`` seconds in and then every ``recancel_every``: a loaded machine can hold up
    Slurm's end of a killed step. The steps still listed after ``seconds``; none once they are gone, or where
    squeue is missing or says it failed (nothing more can be known). A squeue that does not answer within
    ``CLIENT_SECONDS`` (slurmctld busy) says nothing: the steps count as still listed, and the wait goes on."""
    import shutil

    program = shutil.which(squeue)
    began = time.monotonic()
    next_cancel = began + recancel_after
    left = list(steps)
    while program is not None and time.monotonic() < began + seconds:
        listed = ask_slurm([program, "-h", "-s", *(["-j", job] if job else []), "-o", "%i"], CLIENT_SECONDS)
        if listed is not None:
            left = [step for step in steps if step in listed.stdout.split()]
            if listed.returncode != 0 or not left:
                return []
        if time.monotonic() > next_cancel:
            cancel_slurm_steps(left, scancel)
            next_cancel = time.monotonic() + recancel_every
        time.sleep(0.1)
    return [] if program is None else left
