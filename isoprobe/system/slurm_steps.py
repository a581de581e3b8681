"""The Slurm job steps an ``srun`` started, and how isoprobe ends them: through slurmctld, never by a terminate
request that can drain a node.

A step's tasks run under each node's slurmstepd, not below the srun that started them: no SIGKILL of a
process tree reaches them, and they outlive a killed srun (measured on Slurm 22.05). Whoever is about to kill
an srun (the keeper, a command trial's supervisor, the gang executor) ends its steps through Slurm first.
Standard library only: the keeper loads this module by path (it runs isolated, without isoprobe on its path).
"""

from __future__ import annotations

import time

#: How long one call of Slurm's clients (scontrol, scancel, squeue) may take before the caller goes on without it.
CLIENT_SECONDS = 10.0


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
    import subprocess

    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return []
    try:
        listed = subprocess.run(
            [scontrol, "show", "step", "-o"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLIENT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return steps_of_sruns(listed.stdout, sruns, socket.gethostname())


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
    import subprocess

    program = shutil.which(scancel)
    if program is None:
        return
    for args in ([*KILL_THROUGH_SLURMCTLD, *steps], steps):
        try:
            subprocess.run(
                [program, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=CLIENT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass


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
    squeue is missing or fails (nothing more can be known)."""
    import shutil
    import subprocess

    program = shutil.which(squeue)
    began = time.monotonic()
    next_cancel = began + recancel_after
    left = list(steps)
    while program is not None and time.monotonic() < began + seconds:
        listed = subprocess.run(
            [program, "-h", "-s", *(["-j", job] if job else []), "-o", "%i"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        left = [step for step in steps if step in listed.stdout.split()]
        if listed.returncode != 0 or not left:
            return []
        if time.monotonic() > next_cancel:
            cancel_slurm_steps(left, scancel)
            next_cancel = time.monotonic() + recancel_every
        time.sleep(0.1)
    return [] if program is None else left
