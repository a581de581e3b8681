"""What Slurm says of the allocation's nodes, for the messages of a probe whose gangs are job steps.

A node lost under a trial (its slurmd killed, the machine gone) shows up in isoprobe first as its consequence:
Slurm cancels the job after its node timeout, and isoprobe gets SIGTERM like any cancelled job. Before, the probe
then said only "stopped by SIGTERM" (exit 143). ``executors.srun_gang`` asks here, when it is signalled mid-step
and when it finds a node's step daemon lost, which of the job's nodes Slurm no longer counts as healthy (``sinfo``:
down, drained, failing, not responding) and names them; ``pipeline.explain`` adds the same words to the result's
message (``stop_context``).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping

from isoprobe.errors import ProbeError
from isoprobe.protocol.wiring import CHILD_MODULE
from isoprobe.system.primitives import ask_slurm

#: Node states (``sinfo %T``, without the flags it appends) of a node that is in service.
HEALTHY = {"allocated", "mixed", "idle", "completing", "planned", "reserved"}
#: How long ``sinfo`` may take: this runs while a signal ends the probe.
SINFO_SECONDS = 5.0

_context: str | None = None


def allocation_nodes(environ: Mapping[str, str]) -> str | None:
    """The job's nodes as Slurm lists them (``n[1-2]``), from its environment."""
    return environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or None


def troubled(listing: str) -> list[str]:
    """From ``sinfo -h -N -o '%N|%T|%E'`` lines, each node Slurm does not count as in service, in words (pure).
    A state ending in ``*`` means the node's slurmd does not answer."""
    found = []
    for line in listing.splitlines():
        node, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if not node or not state:
            continue
        bare = state.rstrip("*~#!%$@^-+")
        if state.endswith("*") or bare not in HEALTHY:
            answering = ", its slurmd not answering" if state.endswith("*") else ""
            said = f", reason: {reason.strip()}" if reason.strip() and reason.strip() != "none" else ""
            found.append(f"{node} is {bare}{answering}{said}")
    return found


def node_trouble(nodes: str | None, sinfo: str = "sinfo") -> list[str]:
    """Which of ``nodes`` (a Slurm node list) are out of service now, in words; [] when none, or when sinfo is
    missing or does not answer within ``SINFO_SECONDS`` (nothing more can be known)."""
    program = shutil.which(sinfo)
    if not nodes or program is None:
        return []
    listed = ask_slurm([program, "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"], SINFO_SECONDS)
    return troubled(listed.stdout) if listed is not None and listed.returncode == 0 else []


def record_stop_context(words: str | None) -> None:
    """What the probe saw of the allocation when a signal stopped it (``stop_context``)."""
    global _context
    _context = words


def stop_context() -> str | None:
    """The words ``record_stop_context`` kept, for the result's message (``pipeline.explain``); None: nothing seen."""
    return _context


def signalled_words(environ: Mapping[str, str] | None = None, sinfo: str = "sinfo") -> str | None:
    """A stop signal came mid-step: the job's nodes Slurm counts out of service, as one sentence, or None."""
    trouble = node_trouble(allocation_nodes(os.environ if environ is None else environ), sinfo)
    if not trouble:
        return None
    return (
        f"Slurm counts a node of this job out of service ({'; '.join(trouble)}): a job that loses a node is "
        "cancelled by Slurm after its node timeout, which is the signal that stopped the probe; resubmit the job "
        "on healthy nodes"
    )


def held_tasks(probe_pid: int, proc: str = "/proc") -> list[str]:
    """The processes on this machine that stand where a trial step's rank should be: they carry this probe's trial
    mark (``ISOPROBE_TRIAL``) and a Slurm step id, so Slurm started them for the step's tasks, but they are no rank of
    it (a TaskProlog that has not ended: Slurm starts a task only after its prolog). Each as "pid N on NODE: COMMAND"
    for the message of a step whose ranks did not start. Only this machine's (and this user's) processes are seen."""
    mark = f"ISOPROBE_TRIAL={probe_pid}".encode()
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/environ", "rb") as file:
                environ = file.read().split(b"\0")
            if mark not in environ or not any(v.startswith(b"SLURM_STEP_ID=") for v in environ):
                continue
            with open(f"{proc}/{name}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if CHILD_MODULE in command:
            continue  # a rank's own wrapper or child: it started
        node = next(
            (v.split(b"=", 1)[1].decode(errors="replace") for v in environ if v.startswith(b"SLURMD_NODENAME=")),
            "this machine",
        )
        found.append(f"pid {name} on {node}: {command[:160]}")
    return sorted(found)


def task_prolog_words(probe_pid: int) -> str:
    """What to add to "Slurm started no rank of the step": the processes standing in the ranks' place, if any."""
    held = held_tasks(probe_pid)
    if not held:
        return ""
    return (
        "; Slurm started the step's tasks, but they have not left their TaskProlog: "
        + "; ".join(held[:4])
        + ". A TaskProlog that runs isoprobe must do nothing in a probe's own trial steps (ISOPROBE_TRIAL is set "
        "in them; isoprobe run --format env|taskprolog does so itself; docs/slurm.md)"
    )


def name_lost_nodes(sinfo: str = "sinfo") -> None:
    """A signal stops the probe mid-step: if Slurm counts a node of the job out of service (the usual reason a
    running job is cancelled under a probe: a node lost, Slurm's node timeout passed), say which, at once and in
    the result's message (``stop_context``)."""
    words = signalled_words(sinfo=sinfo)
    record_stop_context(words)
    if words:
        sys.stderr.write(f"isoprobe: {words}\n")
        sys.stderr.flush()


def daemon_lost_error(
    gone: Mapping, step_id: str | None, world: int, batch_size: int | None, sinfo: str = "sinfo"
) -> ProbeError:
    """A node's step daemon ended under the step (a rank's wrapper saw its parent go, and wrote ``gone``:
    ``child.srun_rank``): nothing on that node will tell Slurm the step ended, so it stays listed until the job
    ends, and waiting for it (the trial's timeout, then the wait for the listing) would only delay the same end.
    The error that stops the probe now, naming the node (``srun_gang`` ends the step on the other nodes first)."""
    node = gone.get("node") or "its node"
    step_id = step_id or "(its id unknown)"
    batch = f"batch {batch_size}, " if batch_size is not None else ""
    trouble = node_trouble(gone.get("node"), sinfo)
    state = f" Slurm says: {'; '.join(trouble)}." if trouble else ""
    words = (
        f"Slurm lost the step daemon (slurmstepd) of node {node} under the trial's job step {step_id} "
        f"({batch}{world} ranks): rank {gone.get('rank')}'s parent there (pid {gone.get('stepd_pid')}) "
        f"ended mid-trial.{state} Nothing on {node} can end the step now, and Slurm lists it until the job "
        "ends: that is the node, not the batch, so the probe stops without an answer"
    )
    return ProbeError(
        f"{words}. Check {node} (its slurmd log; dmesg, for a step daemon the kernel's OOM killer "
        "ended) and resubmit the job on healthy nodes",
        evidence=words,
    )
