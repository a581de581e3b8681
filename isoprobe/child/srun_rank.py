"""One rank of a trial's Slurm job step: cap it, give it its files and GPU, run the child entry, record its end.

``srun`` starts this on every node as ``python -I -S standalone.py child/srun_rank STEP_DIR
[SOFT HARD]`` (``executors.srun_plan.srun_command``; ``system.standalone`` is the loader). It stands where a local
rank's keeper and ``processes.prepare_child`` stand, so that a rank started by
Slurm is the process a local rank is:

- its rank is Slurm's task id (``SLURM_PROCID``), its files are that rank's in
  the step's folder (request, events, the task's facts, its end);
- on the CPU backend, ``RLIMIT_DATA`` is set here, before exec, to the same
  soft and hard limits the local executor sets (the child credits isoprobe's own
  modules and fixes both before any user code, as a local child does);
- on CUDA, one GPU: Slurm's binding for the task (``--gpus-per-task=1``), or,
  where the task sees the node's GPUs, the one at its local rank
  (``SLURM_LOCALID``); the trial then runs on ``cuda:0``;
- the child is ``python -m isoprobe.child --wait``, the entry every local child
  runs, fed its request's path on stdin, so it reports ``warm`` when its imports
  are done, exactly as a local rank does; the parent's timeout runs from there.

Started ahead (``srun_rank.py --ahead STEP_DIR ...``: the next trial's step,
started while the current one runs, ``executors.srun_gang``), the child
imports at idle priority (``--idle``, as a local spare) and the wrapper waits
for one line on its stdin, which srun forwards from isoprobe to every rank
when the requests are written; end of file instead means the step is not
needed, and the child is told so (its stdin closed) and ends quietly.

It forks rather than execs, to write the child's wait status to
``rankN.exit`` when it ends: the parent, on another node, cannot wait for it,
and needs to tell a rank that ended from one still running (the gang's rule,
``executors.gang.first_failure``). The child dies with it (``PR_SET_PDEATHSIG``),
and Slurm kills every process of the step when the step ends (``scancel``, a
bad exit, srun gone).

The wrapper never leaves its child behind. Stopped by a signal it can catch (Slurm's SIGTERM at a job's end or
cancel, KillWait before its SIGKILL), it SIGKILLs the child, lifted from idle priority first, and reaps it before it
ends, so the rank is gone when its task is. And it watches its own parent, the node's step daemon (slurmstepd),
through ``PR_SET_PDEATHSIG``: a step daemon lost mid-trial (killed, crashed) leaves its tasks running outside
Slurm's tracking, and the step listed for good (nothing on that node will say it ended). The wrapper then writes
``rankN.lost`` (its node, the lost daemon's pid), kills its child and ends, and the parent, which reads that file at
every look, stops waiting at once and names the node (``executors.srun_gang``).

Standard library only, run isolated (``-I -S``): nothing here may count
against the rank's cap or depend on the user's site-packages.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing's flag without importing typing (start-up): mypy reads the branch below as taken
if TYPE_CHECKING or __package__:
    from isoprobe.protocol import wiring
    from isoprobe.system import data_cap, primitives
else:  # run by the standalone loader (python -I -S standalone.py child/srun_rank): isoprobe is not importable here
    _loader = sys.modules["_isoprobe_standalone"]
    wiring = _loader.load("protocol/wiring")
    data_cap = _loader.load("system/data_cap")
    primitives = _loader.load("system/primitives")

PR_SET_PDEATHSIG = 1
#: How often a child whose turn came is lifted from idle priority until it reports ``warm`` (``lift_until_warm``).
LIFT_SECONDS = 0.02
#: The signal the kernel sends this wrapper when its parent, the node's slurmstepd, ends (``PR_SET_PDEATHSIG``).
STEPD_LOST = signal.SIGUSR2
#: Signals that stop the wrapper, its child first (Slurm's job end and cancel send SIGCONT and SIGTERM, then SIGKILL).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The rank's child once forked (None before): what the wrapper ends before it ends itself.
_child: int | None = None
_files: dict[str, str] = {}


def rank_files(step_dir: str, rank: int) -> dict[str, str]:
    """The files of one rank in the step's folder (the parent names them the same way: ``srun_gang``)."""
    stem = os.path.join(step_dir, f"rank{rank}")
    return {name: f"{stem}.{name}" for name in ("request.json", "events.jsonl", "task.json", "exit", "lost")}


def one_gpu(visible: str | None, local_rank: int) -> str | None:
    """The task's GPU: Slurm's single binding as it is; of several visible, the one at ``local_rank``."""
    if visible is None:
        return None
    entries = [entry for entry in visible.split(",") if entry.strip()]
    if len(entries) <= 1:
        return visible
    return entries[local_rank % len(entries)]


def write_atomically(path: str, text: str) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def wait_for_turn(stdin) -> bool:
    """Started ahead: block until isoprobe says the requests are written (a line), or that the step is not needed
    (end of file, also what a dead isoprobe's closed pipe gives). True: the trial is this step's."""
    try:
        return bool(stdin.readline())
    except (OSError, ValueError):
        return False


def warm_reported(events_path: str) -> bool:
    try:
        with open(events_path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            if json.loads(line).get("event") == "warm":
                return True
        except (ValueError, AttributeError):
            continue
    return False


def lift_until_warm(pid: int, events_path: str) -> int | None:
    """The trial is due and the child may still import at idle priority: it is on the trial's path now. Lift it (its
    threads' policy, its session's autogroup) until it reports ``warm``, again at every look, because the child
    lowers its priority itself once its imports start, which may be after its turn came (as a local spare's, in
    ``executors.child_process.await_warm``). The child's wait status if it ended meanwhile (reaped here), else None."""
    while not warm_reported(events_path):
        primitives.lift_idle_policy(pid)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(LIFT_SECONDS)
    return None


def end_child() -> None:
    """SIGKILL the child (lifted from idle priority first: its exit then runs at normal priority) and reap it."""
    if _child is None:
        return
    try:
        primitives.lift_idle_policy(_child)
    except Exception:
        pass
    try:
        os.kill(_child, signal.SIGKILL)
        while True:
            try:
                os.waitpid(_child, 0)
                break
            except InterruptedError:
                continue
    except (ProcessLookupError, ChildProcessError):
        pass


def stopped(signum: int, _frame) -> None:
    """A stop signal (Slurm ending the step or the job): the child first, then this wrapper, by the same signal."""
    end_child()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def stepd_lost(_signum: int, _frame) -> None:
    """The node's step daemon ended under the step: say so in ``rankN.lost``, end the child, end."""
    try:
        write_atomically(
            _files["lost"],
            json.dumps(
                {
                    "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
                    "stepd_pid": _files.get("stepd_pid"),
                    "step_id": os.environ.get("SLURM_STEP_ID"),
                }
            ),
        )
    except OSError:
        pass
    end_child()
    os._exit(128 + STEPD_LOST)


def watch_step_daemon(files: dict[str, str]) -> None:
    """Have the kernel signal this wrapper when its parent (the node's slurmstepd) ends, and catch stop signals."""
    _files.update(files, stepd_pid=str(os.getppid()))
    for signum in STOP_SIGNALS:
        signal.signal(signum, stopped)
    signal.signal(STEPD_LOST, stepd_lost)
    step_daemon = int(_files["stepd_pid"])
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, STEPD_LOST, 0, 0, 0)
    if os.getppid() != step_daemon:  # it ended before the line above: no signal will come
        stepd_lost(STEPD_LOST, None)


def write_task(files: dict[str, str], local_rank: int) -> None:
    """The rank's ``task.json``: where it runs (node, Slurm job and step, local rank) and the wrapper's PID, for
    the parent to find and end it."""
    write_atomically(
        files["task.json"],
        json.dumps(
            {
                "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
                "job_id": os.environ.get("SLURM_JOB_ID"),
                "step_id": os.environ.get("SLURM_STEP_ID"),
                "local_rank": local_rank,
                "pid": os.getpid(),
            }
        ),
    )


def exec_child(
    env: dict[str, str],
    pipe: tuple[int, int],
    handled: set[signal.Signals],
    previous: set[int | signal.Signals],
    wrapper: int,
    ahead: bool,
) -> None:
    """In the wrapper's fork: become the rank's child (``python -m isoprobe.child --wait``), its request's path to
    come on stdin from ``pipe``; never returns (exits 127 where it cannot start). It dies with the wrapper
    (``PR_SET_PDEATHSIG``), and exits at once if the wrapper died before that was set."""
    read_end, write_end = pipe
    try:
        for signum in handled:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        os.dup2(read_end, 0)
        os.close(read_end)
        os.close(write_end)
        if ahead:
            # A session of its own, as a local child's (its keeper's setsid): Slurm's task session also holds
            # the step daemon's launcher process, and the child's priority while it imports ahead is set per
            # session (its scheduler autogroup, ``child.main._lower_autogroup``). Slurm still ends it: by its
            # process tree (proctrack), and by the death signal below when this wrapper dies. A step started
            # when due keeps the child in the task's session, as before steps ahead existed.
            os.setsid()
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != wrapper:
            os._exit(127)
        idle = [wiring.IDLE_ARGUMENT] if ahead else []
        os.execve(sys.executable, [sys.executable, "-m", wiring.CHILD_MODULE, wiring.WAIT_ARGUMENT, *idle], env)
    except BaseException as error:
        os.write(2, f"isoprobe srun rank: cannot start the child: {error}\n".encode())
    os._exit(127)


def main(argv: list[str]) -> None:
    ahead = argv[1:2] == [wiring.AHEAD_ARGUMENT]
    if ahead:
        argv = argv[:1] + argv[2:]
    if len(argv) not in (2, 4) or not all(value.isdigit() for value in argv[2:]):
        os.write(
            2,
            b"usage: standalone.py child/srun_rank [--ahead] STEP_DIR [SOFT_DATA_LIMIT HARD_DATA_LIMIT] (by srun)\n",
        )
        os._exit(2)
    step_dir = argv[1]
    rank = int(os.environ["SLURM_PROCID"])
    local_rank = int(os.environ.get("SLURM_LOCALID", "0"))
    files = rank_files(step_dir, rank)
    watch_step_daemon(files)
    write_task(files, local_rank)
    env = dict(os.environ)
    env[wiring.EVENTS_ENV] = files["events.jsonl"]
    gpu = one_gpu(env.get("CUDA_VISIBLE_DEVICES"), local_rank)
    if gpu is not None and env.get("CUDA_VISIBLE_DEVICES"):
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if len(argv) == 4:
        # the parent's limits, never above the ones this rank inherited
        data_cap.set_limits(*data_cap.within_inherited(int(argv[2]), int(argv[3])))
    read_end, write_end = os.pipe()
    wrapper = os.getpid()
    handled = {*STOP_SIGNALS, STEPD_LOST}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, handled)  # no handler of the wrapper's may run in the fork
    pid = os.fork()
    if pid == 0:
        exec_child(env, (read_end, write_end), handled, previous, wrapper, ahead)
    global _child
    _child = pid
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    os.close(read_end)
    turn = not ahead or wait_for_turn(sys.stdin)
    if turn:
        try:
            os.write(write_end, f"{files['request.json']}\n".encode())
        except OSError:  # the child ended while it waited: its end is recorded below, as any other
            pass
    os.close(write_end)  # without a line first: the child reads end of file and ends quietly
    status = lift_until_warm(pid, files["events.jsonl"]) if ahead and turn else None
    while status is None:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
    _child = None  # reaped: nothing of it is left to end
    write_atomically(files["exit"], str(os.waitstatus_to_exitcode(status)))
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)
